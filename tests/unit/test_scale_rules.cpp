// The block formats' group quantizers against a float64 reference written independently here:
// brute-force nearest-value search over each format's value set (no thresholds, no frexp), and
// exponents from std::ilogb. Codes and scales must agree bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/float_bits.h"
#include "formats/block_format.h"

namespace {

using Codes = std::vector<std::uint8_t>;

// Index of the nearest of `grid` (ascending, non-negative) to |v|; ties go to the even index.
int nearest_even(const std::vector<double>& grid, double a) {
    int best = 0;
    for (int i = 1; i < int(grid.size()); ++i) {
        const double d = std::fabs(grid[i] - a), db = std::fabs(grid[best] - a);
        if (d < db || (d == db && i % 2 == 0)) best = i;
    }
    return best;
}

const std::vector<double> kE2M1 = {0, 0.5, 1, 1.5, 2, 3, 4, 6};

std::uint8_t ref_e2m1(double v) {
    const double a = std::fmin(std::fabs(v), 6.0);  // saturate
    return std::uint8_t((std::signbit(v) ? 8 : 0) | nearest_even(kE2M1, a));
}

std::vector<double> e4m3_grid() {  // codes 0..126 in order: subnormals m*2^-9, then normals
    std::vector<double> g;
    for (int m = 0; m < 8; ++m) g.push_back(m * std::ldexp(1.0, -9));
    for (int e = 1; e <= 15; ++e)
        for (int m = 0; m < 8; ++m)
            if (!(e == 15 && m == 7)) g.push_back((8 + m) * std::ldexp(1.0, e - 10));
    return g;
}

struct Ref {
    Codes codes;
    std::vector<std::uint8_t> scale;
};

Ref ref_mx(const std::vector<float>& x, bool ocp) {
    double amax = 0;
    for (float v : x) amax = std::fmax(amax, std::fabs(double(v)));
    int e = amax > 0 ? std::ilogb(amax) - (ocp ? 2 : 0) : -127;
    e = std::min(127, std::max(-127, e));
    Ref r{Codes(x.size()), {std::uint8_t(e + 127)}};
    for (std::size_t i = 0; i < x.size(); ++i)
        r.codes[i] = ref_e2m1(double(x[i]) * (ocp ? 1.0 : 3.0) / std::ldexp(1.0, e));
    return r;
}

Ref ref_nvfp4(const std::vector<float>& x) {
    static const std::vector<double> grid = e4m3_grid();
    double amax = 0;
    for (float v : x) amax = std::fmax(amax, std::fabs(double(v)));
    const int code = nearest_even(grid, std::fmin(amax * 10.0 / 6.0, 448.0));
    const double s = grid[code];
    Ref r{Codes(x.size()), {std::uint8_t(code)}};
    for (std::size_t i = 0; i < x.size(); ++i)
        r.codes[i] = ref_e2m1(s > 0 ? double(x[i]) * 10.0 / s : double(x[i]) * 0.0);
    return r;
}

// Nearest bf16 by rounding the significand to 8 bits with long double ties-to-even arithmetic.
std::uint16_t ref_bf16(double v) {
    if (v == 0) return 0;
    int e = std::max(std::ilogb(v), -126);
    const long double q = std::ldexp(1.0L, e - 7);
    const long double t = v / q;
    long double r = std::floor(t);
    if (t - r > 0.5L || (t - r == 0.5L && std::fmod(r, 2.0L) != 0)) r += 1;
    const float f = float(r * q);
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    return std::uint16_t(u >> 16);
}

Ref ref_int4(const std::vector<float>& x) {
    double ss = 0;
    for (float v : x) ss += double(v) * double(v);
    const std::uint16_t sb = ref_bf16(2.5139305785684 * 2.0 / 15.0 * std::sqrt(ss / double(x.size())));
    std::uint32_t u = std::uint32_t(sb) << 16;
    float s;
    std::memcpy(&s, &u, 4);
    Ref r{Codes(x.size()), {std::uint8_t(sb & 0xFF), std::uint8_t(sb >> 8)}};
    for (std::size_t i = 0; i < x.size(); ++i) {
        const double q = s > 0 ? std::clamp(std::floor(double(x[i]) / s), -8.0, 7.0) : 0.0;
        r.codes[i] = std::uint8_t(int(q) & 0xF);
    }
    return r;
}

Ref reference(wush_format f, const std::vector<float>& x) {
    switch (f) {
        case WUSH_FORMAT_MXFP4: return ref_mx(x, false);
        case WUSH_FORMAT_MXFP4_OCP: return ref_mx(x, true);
        case WUSH_FORMAT_NVFP4: return ref_nvfp4(x);
        case WUSH_FORMAT_INT4: return ref_int4(x);
        default: break;
    }
    return {};
}

// Groups that exercise the rules: Gaussian, heavy-tailed, exact ties, zeros, subnormals, extremes.
std::vector<std::vector<float>> test_groups(std::size_t g, unsigned seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> normal(0, 1);
    std::uniform_int_distribution<int> exponent(-140, 120);
    std::vector<std::vector<float>> groups;
    for (int k = 0; k < 3000; ++k) {
        std::vector<float> x(g);
        const double scale = std::ldexp(1.0, exponent(rng));
        const int kind = k % 6;
        for (std::size_t i = 0; i < g; ++i) {
            double v = normal(rng);
            if (kind == 1) v = v * v * v;                             // heavy tails
            if (kind == 2) v = std::ldexp(std::round(v * 8) / 8, 0);  // many exact ties
            if (kind == 3 && i % 3 == 0) v = 0.0;                     // zeros among values
            if (kind == 4) v = std::round(v * 4) * 0.75;              // ties after x*3/2^e
            x[i] = float(kind == 5 ? v * 1e-41 : v * scale);          // kind 5: subnormals
        }
        groups.push_back(x);
    }
    groups.push_back(std::vector<float>(g, 0.0f));
    groups.push_back(std::vector<float>(g, -0.0f));
    std::vector<float> extreme(g, std::numeric_limits<float>::max());
    extreme[1] = -std::numeric_limits<float>::max();
    extreme[2] = std::numeric_limits<float>::denorm_min();
    groups.push_back(extreme);
    return groups;
}

class ScaleRules : public ::testing::TestWithParam<wush_format> {};

TEST_P(ScaleRules, CodesAndScalesEqualTheFloat64Reference) {
    const wush::formats::FormatSpec& f = wush::formats::spec(GetParam());
    for (const std::vector<float>& x : test_groups(f.group, 7 + unsigned(f.id))) {
        std::vector<std::uint8_t> codes(f.group / 2), scale(f.scale_bytes);
        wush::formats::quantize_rows(f, x, 1, f.group, codes, scale);
        const Ref r = reference(f.id, x);
        ASSERT_EQ(scale, r.scale) << f.name << " scale, group starting " << x[0];
        for (std::size_t i = 0; i < f.group; ++i) {
            const std::uint8_t code = (i % 2) ? codes[i / 2] >> 4 : codes[i / 2] & 0xF;
            ASSERT_EQ(code, r.codes[i]) << f.name << " element " << i << " = " << x[i];
        }
    }
}

TEST_P(ScaleRules, ZeroGroupDecodesToZeroAndKeepsSigns) {
    const wush::formats::FormatSpec& f = wush::formats::spec(GetParam());
    std::vector<float> x(f.group, 0.0f), y(f.group, 1.0f);
    x[3] = -0.0f;
    std::vector<std::uint8_t> codes(f.group / 2), scale(f.scale_bytes);
    wush::formats::quantize_rows(f, x, 1, f.group, codes, scale);
    wush::formats::dequantize_rows(f, codes, scale, 1, f.group, y);
    for (float v : y) EXPECT_EQ(v, 0.0f);
    for (std::uint8_t s : scale) EXPECT_EQ(s, 0) << "an all-zero group stores scale byte 0";
    if (f.id != WUSH_FORMAT_INT4) {
        EXPECT_EQ(codes[1] & 0xF0, 0x80) << "-0.0 keeps its sign in E2M1";
    }
}

INSTANTIATE_TEST_SUITE_P(AllFormats, ScaleRules,
                         ::testing::Values(WUSH_FORMAT_MXFP4, WUSH_FORMAT_MXFP4_OCP, WUSH_FORMAT_NVFP4,
                                           WUSH_FORMAT_INT4),
                         [](const auto& info) { return std::string(wush::formats::spec(info.param).name); });

}  // namespace

// The bit-built helpers of common/float_bits.h that the group quantizers call per group, against
// the libm functions they replaced: 2^e (ldexp), floor(log2) (frexp, subnormals included) and
// round-half-to-even (floor and fmod's parity).
TEST(FloatBits, BitBuiltHelpersEqualLibm) {
    for (int e = -1100; e <= 1100; ++e) EXPECT_EQ(wush::bits::pow2(e), std::ldexp(1.0, e)) << e;
    std::mt19937_64 rng(11);
    std::vector<double> values = {std::numeric_limits<double>::denorm_min(),
                                  std::numeric_limits<double>::min(),
                                  std::numeric_limits<double>::max(),
                                  1.0,
                                  0.75,
                                  3.0,
                                  0x1p-1030,
                                  0x1.fffffp-1023};
    for (int i = 0; i < 20000; ++i) {
        std::uint64_t u = rng() & 0x7FEFFFFFFFFFFFFFull;  // positive, finite
        double d;
        std::memcpy(&d, &u, sizeof d);
        if (d > 0.0) values.push_back(d);
    }
    for (double a : values) {
        int e = 0;
        std::frexp(a, &e);
        EXPECT_EQ(wush::bits::floor_log2(a), e - 1) << a;
    }
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    for (int i = 0; i < 20000; ++i) {
        // Halves (the ties), small values and values up to 2^52.
        const double t = i % 3 == 0 ? double(i / 3) + 0.5 : i % 3 == 1 ? unit(rng) * 8.0 : std::ldexp(unit(rng), 52);
        double want = std::floor(t);
        const double frac = t - want;
        if (frac > 0.5 || (frac == 0.5 && std::fmod(want, 2.0) != 0.0)) want += 1.0;
        EXPECT_EQ(wush::bits::round_half_even(t), want) << t;
    }
}
