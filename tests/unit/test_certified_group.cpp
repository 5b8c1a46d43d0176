// The certified float32 group quantizer (formats/certified_group.h, run per group by the CUDA
// quantize kernel) against the float64 definition (formats::quantize_group<double>): whenever it
// certifies a group, codes and scale must be bit-identical to the definition applied to the exact
// y = T x; and it must certify the bulk of ordinary (Gaussian) groups. Also the exactness of the
// reference GEMM's dequantization to bf16 (cuda/gemm/dequantize.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../../cuda/gemm/dequantize.h"
#include "formats/certified_group.h"
#include "formats/group_quantizer.h"

namespace {

using wush::formats::certify_group;

struct Fmt {
    wush_format id;
    int g;
    int scale_bytes;
    const char* name;
};
const Fmt kFormats[] = {{WUSH_FORMAT_MXFP4, 32, 1, "mxfp4"},
                        {WUSH_FORMAT_NVFP4, 16, 1, "nvfp4"},
                        {WUSH_FORMAT_INT4, 32, 2, "int4"},
                        {WUSH_FORMAT_MXFP4_OCP, 32, 1, "mxfp4_ocp"}};

struct Stats {
    long groups = 0, certified = 0;
};

// Runs one group through both paths; on certification, compares bit for bit.
void check_group(const Fmt& f, const float* t, const std::vector<float>& x, Stats& st, const std::string& what) {
    const int g = f.g;
    double y_exact[32];
    float y[32];
    wush::formats::transform_group_f64(t, x.data(), g, y_exact);
    wush::formats::transform_group_f32(t, x.data(), g, y);
    const float norm = t ? wush::formats::max_row_norm_bound(t, g) : 0.0f;
    const float bound = wush::formats::group_error_bound(x.data(), g, t == nullptr, norm);
    bool finite = true;
    for (int i = 0; i < g; ++i) finite = finite && std::isfinite(x[i]);
    if (finite && bound < INFINITY) {
        for (int i = 0; i < g; ++i)
            ASSERT_LE(std::fabs(double(y[i]) - y_exact[i]), double(bound)) << what << " i=" << i;
    }
    std::uint8_t codes[16] = {}, scale[2] = {}, rcodes[16] = {}, rscale[2] = {};
    const bool ok = certify_group(f.id, y, g, bound, codes, scale);
    ++st.groups;
    if (!ok) return;
    ASSERT_TRUE(finite) << what << ": a non-finite group was certified";
    ++st.certified;
    wush::formats::quantize_group<double>(f.id, y_exact, g, rcodes, rscale);
    ASSERT_EQ(0, std::memcmp(scale, rscale, std::size_t(f.scale_bytes))) << what << ": scale";
    for (int i = 0; i < g; ++i) {
        ASSERT_EQ(wush::formats::get_nibble(codes, i), wush::formats::get_nibble(rcodes, i))
            << what << ": code " << i << " of y = " << std::hexfloat << y[i] << " (exact " << y_exact[i] << "), bound "
            << bound;
    }
}

std::vector<float> random_matrix(std::mt19937_64& rng, int g, double scale) {
    std::normal_distribution<double> n(0.0, scale);
    std::vector<float> t(std::size_t(g * g));
    for (float& v : t) v = float(n(rng));
    return t;
}

// I + eps R: y lands within ~eps of x, so x placed on a boundary puts y_exact next to it.
std::vector<float> near_identity(std::mt19937_64& rng, int g, double eps) {
    std::vector<float> t = random_matrix(rng, g, eps);
    for (int i = 0; i < g; ++i) t[std::size_t(i * g + i)] += 1.0f;
    return t;
}

enum class Dist { Gaussian, HeavyTailed, Outlier, Subnormal, Huge };

std::vector<float> random_group(std::mt19937_64& rng, int g, Dist d) {
    std::normal_distribution<double> n(0.0, 1.0);
    std::uniform_real_distribution<double> u(0.05, 1.0);
    std::vector<float> x(std::size_t(g), 0.0f);
    for (float& v : x) {
        double s = n(rng);
        if (d == Dist::HeavyTailed) s /= u(rng) * u(rng);
        if (d == Dist::Subnormal) s = std::ldexp(s, -135);
        if (d == Dist::Huge) s = std::ldexp(s, 100);
        v = float(s);
    }
    if (d == Dist::Outlier) x[std::size_t(rng() % std::uint64_t(g))] *= 1000.0f;
    return x;
}

// x whose elements sit on (or a few ulps / a relative 1e-7 from) the format's rounding boundaries
// for the scale the group will get.
std::vector<float> boundary_group(std::mt19937_64& rng, const Fmt& f) {
    const int g = f.g;
    std::vector<float> x(static_cast<std::size_t>(g));
    std::uniform_int_distribution<int> pick(0, 7), ulps(-3, 3), ex(-20, 20);
    const double e2m1_thresholds[8] = {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.0};
    const int e = ex(rng);
    // Per group, all, a quarter or 1/32 of the elements sit on boundaries; the others sit on E2M1
    // values (or INT4 half-integers), mid-bucket: a group is then certified or not by few elements.
    const double density[3] = {1.0, 0.25, 1.0 / 32};
    const double p_boundary = density[rng() % 3];
    const auto on_boundary = [&] { return std::uniform_real_distribution<double>(0.0, 1.0)(rng) < p_boundary; };
    const double e2m1_values[5] = {0.5, 1.0, 1.5, 2.0, 3.0};
    const auto nudge = [&](double v) {
        float r = float(v);
        const int k = ulps(rng);
        for (int i = 0; i < std::abs(k); ++i) r = std::nextafter(r, k > 0 ? INFINITY : -INFINITY);
        if (rng() % 4 == 0) r = float(v * (1.0 + 1e-7 * double(ulps(rng))));
        return (rng() & 1) ? r : -r;
    };
    if (f.id == WUSH_FORMAT_MXFP4 || f.id == WUSH_FORMAT_MXFP4_OCP) {
        // amax on / next to 2^e; elements at thresholds of v = y * mult.
        const double mult = std::ldexp(f.id == WUSH_FORMAT_MXFP4 ? 3.0 : 1.0, -(f.id == WUSH_FORMAT_MXFP4 ? e : e - 2));
        // amax on 2^e (or 2^(e+1)): the other elements stay below it (thresholds of v = y * mult
        // up to 2.5 for MXFP4's x3 and 3.5 for OCP's x4 stay under 2^e).
        // A third of the groups keep amax off the exponent boundary (1.5 * 2^e), so that the
        // element thresholds alone decide whether they are certified.
        const int mode = int(rng() % 3);
        x[0] = mode == 2 ? float(std::ldexp(1.5, e)) : nudge(std::ldexp(1.0, mode == 1 ? e + 1 : e));
        const int top = f.id == WUSH_FORMAT_MXFP4 ? 5 : 6;
        for (int i = 1; i < g; ++i)
            x[std::size_t(i)] = on_boundary() ? nudge(e2m1_thresholds[pick(rng) % top] / mult)
                                              : float(e2m1_values[pick(rng) % 5] / mult);
        if (rng() % 3 == 0) x[1] = -0x1p-148f;  // subnormal elements (underflow after scaling)
    } else if (f.id == WUSH_FORMAT_NVFP4) {
        // w = amax * 10 / 6 on an E4M3 value or midpoint; elements at thresholds of y * 10 / sv.
        const double sv = (8 + pick(rng)) * std::ldexp(1.0, std::uniform_int_distribution<int>(-9, 5)(rng));
        const double w = (rng() & 1) ? sv : sv + std::ldexp(1.0, wush::bits::floor_log2(sv) - 4);
        x[0] = nudge(w * 6.0 / 10.0);
        for (int i = 1; i < g; ++i)
            x[std::size_t(i)] = on_boundary() ? nudge(e2m1_thresholds[pick(rng)] * sv / 10.0 * 0.999)
                                              : float(e2m1_values[pick(rng) % 5] * sv / 10.0);
    } else {
        // Fixed-point: elements on integer multiples of the scale the group ends up with.
        for (float& v : x) v = float(std::normal_distribution<double>(0.0, std::ldexp(1.0, e))(rng));
        for (int it = 0; it < 3; ++it) {
            std::uint8_t c[16], s[2];
            wush::formats::quantize_group<float>(f.id, x.data(), g, c, s);
            const double sv = wush::formats::decode_scale(f.id, s);
            for (float& v : x)
                v = on_boundary() ? nudge(std::round(double(v) / sv) * sv)
                                  : float((std::floor(double(v) / sv) + 0.5) * sv);
        }
    }
    return x;
}

class CertifiedGroup : public ::testing::TestWithParam<Fmt> {};

TEST_P(CertifiedGroup, CertifiedEqualsFloat64OnRandomGroups) {
    const Fmt f = GetParam();
    std::mt19937_64 rng(1234 + f.id);
    Stats gauss, other;
    for (int trial = 0; trial < 4000; ++trial) {
        const std::vector<float> t = random_matrix(rng, f.g, 1.0 / std::sqrt(double(f.g)));
        const Dist d = Dist(trial % 5);
        const std::vector<float> x = random_group(rng, f.g, d);
        const std::string what = std::string(f.name) + " trial " + std::to_string(trial);
        check_group(f, t.data(), x, d == Dist::Gaussian ? gauss : other, what);
        check_group(f, nullptr, x, d == Dist::Gaussian ? gauss : other, what + " (identity)");
        if (HasFatalFailure()) return;
    }
    std::printf("%s: certified %ld/%ld Gaussian groups, %ld/%ld others\n", f.name, gauss.certified, gauss.groups,
                other.certified, other.groups);
    // Gaussian groups sit far from boundaries nearly always: certify must not say no by default.
    EXPECT_GT(double(gauss.certified), 0.9 * double(gauss.groups)) << f.name;
    // Tiny (subnormal) and huge groups are never certified; some others are.
    EXPECT_GT(other.certified, 0) << f.name;
}

// x = float(T^-1 y*) by Gaussian elimination with partial pivoting in float64: then
// y_exact = T x lies within about the float32 error of y* (x's rounding), which is exactly where
// the certification must decide carefully.
std::vector<float> solve_for(const std::vector<float>& t, const std::vector<float>& ystar, int g) {
    std::vector<double> a(std::size_t(g * (g + 1)));
    for (int i = 0; i < g; ++i) {
        for (int j = 0; j < g; ++j) a[std::size_t(i * (g + 1) + j)] = t[std::size_t(i * g + j)];
        a[std::size_t(i * (g + 1) + g)] = ystar[std::size_t(i)];
    }
    const auto at = [&](int i, int j) -> double& { return a[std::size_t(i * (g + 1) + j)]; };
    for (int c = 0; c < g; ++c) {
        int p = c;
        for (int r = c + 1; r < g; ++r)
            if (std::fabs(at(r, c)) > std::fabs(at(p, c))) p = r;
        for (int j = 0; j <= g; ++j) std::swap(at(c, j), at(p, j));
        for (int r = c + 1; r < g; ++r) {
            const double f = at(r, c) / at(c, c);
            for (int j = c; j <= g; ++j) at(r, j) -= f * at(c, j);
        }
    }
    std::vector<double> x(std::size_t(g), 0.0);
    for (int i = g - 1; i >= 0; --i) {
        double v = at(i, g);
        for (int j = i + 1; j < g; ++j) v -= at(i, j) * x[std::size_t(j)];
        x[std::size_t(i)] = v / at(i, i);
    }
    return std::vector<float>(x.begin(), x.end());
}

TEST_P(CertifiedGroup, CertifiedEqualsFloat64OnBoundaries) {
    const Fmt f = GetParam();
    std::mt19937_64 rng(99 + f.id);
    Stats st, exact;
    for (int trial = 0; trial < 20000; ++trial) {
        // y* on (or a few ulps from) the boundaries of the scale rule and the element rounding.
        const std::vector<float> ystar = boundary_group(rng, f);
        const std::string what = std::string(f.name) + " boundary trial " + std::to_string(trial);
        check_group(f, nullptr, ystar, exact, what + " (identity)");  // bound 0: y is exact
        const std::vector<float> t = trial % 3 == 0 ? random_matrix(rng, f.g, 1.0 / std::sqrt(double(f.g)))
                                                    : near_identity(rng, f.g, trial % 3 == 1 ? 0x1p-10 : 0x1p-5);
        check_group(f, t.data(), solve_for(t, ystar, f.g), st, what);
        if (HasFatalFailure()) return;
    }
    std::printf("%s: certified %ld/%ld boundary groups with exact y, %ld/%ld through a transform\n", f.name,
                exact.certified, exact.groups, st.certified, st.groups);
}

TEST_P(CertifiedGroup, NonFiniteAndOutOfRangeAreNeverCertified) {
    const Fmt f = GetParam();
    std::mt19937_64 rng(7);
    const std::vector<float> t = random_matrix(rng, f.g, 0.2);
    for (float bad : {NAN, INFINITY, -INFINITY, 3e38f}) {
        std::vector<float> x = random_group(rng, f.g, Dist::Gaussian);
        x[3] = bad;
        for (const float* m : {t.data(), static_cast<const float*>(nullptr)}) {
            float y[32];
            wush::formats::transform_group_f32(m, x.data(), f.g, y);
            const float bound = wush::formats::group_error_bound(x.data(), f.g, m == nullptr, 1.0f);
            std::uint8_t c[16], s[2];
            EXPECT_FALSE(certify_group(f.id, y, f.g, bound, c, s)) << f.name << " value " << bad;
        }
    }
    std::vector<float> zero(std::size_t(f.g), 0.0f);
    std::uint8_t c[16], s[2];
    EXPECT_FALSE(certify_group(f.id, zero.data(), f.g, 0.0f, c, s)) << "all-zero groups go to float64";
}

INSTANTIATE_TEST_SUITE_P(Formats, CertifiedGroup, ::testing::ValuesIn(kFormats),
                         [](const auto& info) { return std::string(info.param.name); });

// Every (code, scale) pair of MXFP4 / NVFP4 dequantizes exactly into bf16 (against the float64
// product), except E8M0 products beyond bf16's range, which must then be infinite.
TEST(DequantizeBf16, EveryCodeScalePairIsExact) {
    for (wush_format f : {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4}) {
        for (int s = 0; s < 256; ++s) {
            const std::uint8_t scale[2] = {std::uint8_t(s), 0};
            const double sv = wush::formats::decode_scale(f, scale);
            if (std::isnan(sv)) continue;
            for (int c = 0; c < 16; ++c) {
                const double exact = double(wush::formats::decode_element(f, std::uint8_t(c))) * sv;
                const float v = wush::cuda::dequantize_element(f, std::uint8_t(c), scale);
                const double back = wush::bits::bf16_decode(wush::cuda::bf16_bits_of_exact(v));
                if (std::fabs(exact) >= 0x1p128) {
                    EXPECT_TRUE(std::isinf(back)) << "format " << f << " scale " << s << " code " << c;
                } else {
                    EXPECT_EQ(back, exact) << "format " << f << " scale " << s << " code " << c;
                }
            }
        }
    }
}

// INT4 levels times bf16 scales are exact in float32 (the reference GEMM's INT4 path).
TEST(DequantizeBf16, Int4IsExactInFloat32) {
    for (int s = 0; s < 0x7F80; s += 7) {
        const std::uint8_t scale[2] = {std::uint8_t(s & 0xFF), std::uint8_t(s >> 8)};
        const double sv = wush::bits::bf16_decode(std::uint16_t(s));
        for (int c = 0; c < 16; ++c) {
            const double exact = double(wush::formats::decode_element(WUSH_FORMAT_INT4, std::uint8_t(c))) * sv;
            const float v = wush::cuda::dequantize_element(WUSH_FORMAT_INT4, std::uint8_t(c), scale);
            if (std::fabs(exact) < 0x1p128) {
                EXPECT_EQ(double(v), exact) << s << " " << c;
            }
        }
    }
}

}  // namespace
