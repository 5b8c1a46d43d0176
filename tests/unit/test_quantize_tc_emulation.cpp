// The tensor-core quantize kernel's own device source (cuda/quantize/quantize_tc_kernel.cuh) run on the CPU
// through tests/unit/cuda_host_emulation.h, launched as cuda/quantize/quantize_tc.cu launches it,
// against the float64 definition of the formats (formats::transform_group_f64 +
// quantize_group<double>, which the CPU runtime equals): every format, shared and per-block
// matrices, BF16 and F16 input, ragged token counts; the MMA in its exact mode and in its
// adversarial mode (each MMA result moved by the whole error the accumulator model allows, toward
// the nearest rounding boundary of the element it feeds). Inputs built to lie just below a
// boundary show the bound is needed: the kernel certifying with half of it writes wrong bytes
// under the adversary.
#include "cuda_host_emulation.h"  // first: defines the CUDA spellings

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/float_bits.h"
#include "formats/block_format.h"
#include "formats/certified_group.h"
#include "quantize/bf16_fragments.h"
#include "quantize/mma_error_bound.h"
#include "quantize/quantize_tc_kernel.cuh"
#include "transforms/block_transform.h"
#include "transforms/runtime_layer.h"

namespace {

using namespace wush;
namespace qd = wush::cuda::quantize_detail;

const wush_format kFormats[] = {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4, WUSH_FORMAT_INT4, WUSH_FORMAT_MXFP4_OCP};

int group_of(wush_format f) {
    return f == WUSH_FORMAT_NVFP4 ? 16 : 32;
}

// A problem: matrices row-major (T[i][j] at i * G + j), one per group (per_block) or one shared.
struct Problem {
    wush_format format = WUSH_FORMAT_MXFP4;
    wush_dtype dtype = WUSH_DTYPE_BF16;
    std::size_t n = 0, d_in = 0;
    bool per_block = true;
    std::vector<float> t;
    std::vector<std::uint16_t> x;  // BF16 or F16 bits
    float x_at(std::size_t i) const {
        return dtype == WUSH_DTYPE_BF16 ? bits::bf16_decode(x[i]) : bits::f16_decode(x[i]);
    }
    const float* matrix(std::size_t group) const {
        const int g = group_of(format);
        return t.data() + (per_block ? group : 0) * std::size_t(g * g);
    }
};

struct Bytes {
    std::vector<std::uint8_t> codes, scales;
    unsigned long long flag = cuda::kNoNonFinite;
    bool operator==(const Bytes& o) const { return codes == o.codes && scales == o.scales; }
};

constexpr std::uint8_t kSentinel = 0xA5;

Bytes sized(const Problem& p) {
    const formats::PackedSizes s = formats::packed_sizes(formats::spec(p.format), p.n, p.d_in);
    Bytes b;
    b.codes.assign(s.codes, kSentinel);
    b.scales.assign(s.scales, kSentinel);
    return b;
}

// The float64 definition, and each element's exact value (for the adversary).
Bytes definition(const Problem& p, std::vector<double>* y_out = nullptr) {
    const int g = group_of(p.format), sb = p.format == WUSH_FORMAT_INT4 ? 2 : 1;
    Bytes b = sized(p);
    if (y_out) y_out->assign(p.n * p.d_in, 0.0);
    for (std::size_t r = 0; r < p.n; ++r)
        for (std::size_t grp = 0; grp < p.d_in / std::size_t(g); ++grp) {
            float x[32];
            bool finite = true;
            for (int j = 0; j < g; ++j) {
                x[j] = p.x_at(r * p.d_in + grp * std::size_t(g) + std::size_t(j));
                finite = finite && std::isfinite(x[j]);
            }
            if (!finite) continue;
            double y[32];
            formats::transform_group_f64(p.matrix(grp), x, g, y);
            formats::quantize_group<double>(p.format, y, g, b.codes.data() + (r * p.d_in + grp * std::size_t(g)) / 2,
                                            b.scales.data() + (r * (p.d_in / std::size_t(g)) + grp) * std::size_t(sb));
            if (y_out)
                for (int i = 0; i < g; ++i) (*y_out)[r * p.d_in + grp * std::size_t(g) + std::size_t(i)] = y[i];
        }
    return b;
}

// +1 / -1 toward the nearest rounding boundary of each element under the definition's scale (and,
// for an MX group's largest element, toward the scale's exponent boundary when that is nearer).
std::vector<int> directions(const Problem& p, const Bytes& want, const std::vector<double>& y) {
    const int g = group_of(p.format), sb = p.format == WUSH_FORMAT_INT4 ? 2 : 1;
    std::vector<int> dir(y.size(), 1);
    const double e2m1_bounds[] = {-5, -3.5, -2.5, -1.75, -1.25, -0.75, -0.25, 0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5};
    for (std::size_t r = 0; r < p.n; ++r)
        for (std::size_t grp = 0; grp < p.d_in / std::size_t(g); ++grp) {
            const std::uint8_t* scale = want.scales.data() + (r * (p.d_in / std::size_t(g)) + grp) * std::size_t(sb);
            const double sv = formats::decode_scale(p.format, scale);
            // value -> code units: MX x 3 / 2^e (OCP 1 / 2^e), NVFP4 x 10 / s, INT4 x / s
            double per = 1.0;
            if (p.format == WUSH_FORMAT_MXFP4) per = 3.0 / sv;
            if (p.format == WUSH_FORMAT_MXFP4_OCP) per = 1.0 / sv;
            if (p.format == WUSH_FORMAT_NVFP4) per = sv > 0 ? 10.0 / sv : 0.0;
            if (p.format == WUSH_FORMAT_INT4) per = sv > 0 ? 1.0 / sv : 0.0;
            double amax = 0.0;
            std::size_t top = 0;
            for (int i = 0; i < g; ++i) {
                const std::size_t at = r * p.d_in + grp * std::size_t(g) + std::size_t(i);
                if (std::fabs(y[at]) > amax) amax = std::fabs(y[at]), top = at;
                const double v = y[at] * per;
                double best = 1e300, target = 0.0;
                if (p.format == WUSH_FORMAT_INT4) {
                    target = std::nearbyint(v);
                } else {
                    for (double t : e2m1_bounds)
                        if (std::fabs(v - t) < best) best = std::fabs(v - t), target = t;
                }
                dir[at] = target >= v ? 1 : -1;
            }
            if ((p.format == WUSH_FORMAT_MXFP4 || p.format == WUSH_FORMAT_MXFP4_OCP) && amax > 0) {
                const double lo = std::ldexp(1.0, bits::floor_log2(amax)), hi = 2 * lo;
                const double v = y[top] * per;
                double best = 1e300;
                for (double t : e2m1_bounds) best = std::min(best, std::fabs(v - t) / per);
                const double to_scale = std::min(amax - lo, hi - amax);
                if (to_scale < best) dir[top] = ((hi - amax < amax - lo) == (y[top] > 0)) ? 1 : -1;
            }
        }
    return dir;
}

// The kernel, launched as quantize_tc.cu launches it, in the emulation.
Bytes run_tc(const Problem& p, const std::vector<int>* dir, float bound_scale) {
    const int g = group_of(p.format);
    const std::size_t count = p.per_block ? p.d_in / std::size_t(g) : 1;
    std::vector<std::uint32_t> frags(count * tc::fragment_words(g));
    std::vector<tc::PartNorms> norms(count);
    for (std::size_t m = 0; m < count; ++m)
        norms[m] = tc::pack_fragments(p.t.data() + m * std::size_t(g * g), g, frags.data() + m * tc::fragment_words(g));
    const std::vector<float> transposed = cuda::kernel_matrices(p.t.data(), count, g);
    Bytes b = sized(p);
    cuda::QuantizeArgs a;
    a.format = p.format;
    a.group = g;
    a.x_dtype = p.dtype;
    a.x = p.x.data();
    a.n_tokens = p.n;
    a.d_in = p.d_in;
    a.use = p.per_block ? MatrixUse::PerBlock : MatrixUse::Shared;
    a.matrices = transposed.data();
    a.codes = b.codes.data();
    a.scales = b.scales.data();
    a.non_finite = &b.flag;
    a.tc_fragments = frags.data();
    a.tc_norms = norms.data();
    a.tc_bound_scale = bound_scale;
    if (dir) {
        const std::size_t d_in = p.d_in;
        wush_emu::g_mma_direction = [dir, d_in](std::size_t row, std::size_t col) {
            return row * d_in + col < dir->size() ? (*dir)[row * d_in + col] : 1;
        };
    }
    const wush_emu::Dim grid{unsigned((p.n + qd::kTileTokens - 1) / qd::kTileTokens),
                             unsigned((p.d_in / std::size_t(g) + qd::kTileGroups - 1) / qd::kTileGroups), 1};
    const bool split = p.dtype == WUSH_DTYPE_F16;
    const auto run = [&](auto kernel) { wush_emu::launch(grid, qd::kThreads, 0, [&] { kernel(a); }); };
    switch (p.format) {
        case WUSH_FORMAT_MXFP4:
            split ? run(qd::quantize_tc_kernel<WUSH_FORMAT_MXFP4, true>)
                  : run(qd::quantize_tc_kernel<WUSH_FORMAT_MXFP4, false>);
            break;
        case WUSH_FORMAT_NVFP4:
            split ? run(qd::quantize_tc_kernel<WUSH_FORMAT_NVFP4, true>)
                  : run(qd::quantize_tc_kernel<WUSH_FORMAT_NVFP4, false>);
            break;
        case WUSH_FORMAT_INT4:
            split ? run(qd::quantize_tc_kernel<WUSH_FORMAT_INT4, true>)
                  : run(qd::quantize_tc_kernel<WUSH_FORMAT_INT4, false>);
            break;
        default:
            split ? run(qd::quantize_tc_kernel<WUSH_FORMAT_MXFP4_OCP, true>)
                  : run(qd::quantize_tc_kernel<WUSH_FORMAT_MXFP4_OCP, false>);
    }
    wush_emu::g_mma_direction = nullptr;
    return b;
}

// Nearest F16 of a finite float inside F16's range.
std::uint16_t f16_of(float v) {
    const std::uint16_t sign = std::signbit(v) ? 0x8000 : 0;
    const double r = bits::round_to_format(std::fabs(double(v)), 10, -14);
    if (r < 0x1p-14) return std::uint16_t(sign | std::uint16_t(r * 0x1p24));
    const int e = bits::floor_log2(r);
    return std::uint16_t(sign | ((e + 15) << 10) | int((r / std::ldexp(1.0, e) - 1.0) * 1024.0));
}

std::uint16_t encode_x(float v, wush_dtype dt) {
    return dt == WUSH_DTYPE_BF16 ? bits::bf16_encode(double(v)) : f16_of(v);
}

// Gaussian values with an outlier, and every 5th token on E2M1 thresholds (many float64 fall-backs).
Problem random_problem(wush_format f, wush_dtype dt, TransformKind kind, std::size_t n, std::size_t d_in,
                       unsigned seed) {
    Problem p;
    p.format = f;
    p.dtype = dt;
    p.n = n;
    p.d_in = d_in;
    const BlockTransform t = build_data_free_transform({kind, 0.01, 7}, d_in, std::size_t(group_of(f)));
    p.per_block = classify_matrices(t) == MatrixUse::PerBlock;
    const std::size_t count = p.per_block ? t.blocks() : 1;
    p.t.assign(t.activation_matrices().begin(),
               t.activation_matrices().begin() + std::ptrdiff_t(count * std::size_t(group_of(f) * group_of(f))));
    std::mt19937 rng(seed);
    std::normal_distribution<float> gauss(0.0f, 1.0f);
    p.x.resize(n * d_in);
    for (std::size_t r = 0; r < n; ++r)
        for (std::size_t j = 0; j < d_in; ++j) {
            float v = gauss(rng);
            if (r % 5 == 0) v = float(0.25 * double(1 + j % 20) / 3.0);
            if (r == 3 && j == 5) v = 900.0f;
            p.x[r * d_in + j] = encode_x(v, dt);
        }
    return p;
}

std::string describe(const Problem& p) {
    return std::string(formats::spec(p.format).name) + " dtype " + std::to_string(int(p.dtype)) + " n " +
           std::to_string(p.n) + " d_in " + std::to_string(p.d_in) + (p.per_block ? " per-block" : " shared");
}

TEST(QuantizeTcEmulation, EqualsDefinitionExactAndAdversarial) {
    for (wush_format f : kFormats)
        for (TransformKind kind : {TransformKind::Hadamard, TransformKind::Random})
            for (wush_dtype dt : {WUSH_DTYPE_BF16, WUSH_DTYPE_F16})
                for (std::size_t n : {std::size_t(7), std::size_t(40)}) {
                    const Problem p = random_problem(f, dt, kind, n, 160, unsigned(n + int(kind)));
                    std::vector<double> y;
                    const Bytes want = definition(p, &y);
                    const std::vector<int> dir = directions(p, want, y);
                    const Bytes exact = run_tc(p, nullptr, 1.0f);
                    ASSERT_EQ(exact.flag, cuda::kNoNonFinite) << describe(p);
                    ASSERT_TRUE(exact == want) << "exact MMA: " << describe(p);
                    const Bytes adv = run_tc(p, &dir, 1.0f);
                    ASSERT_TRUE(adv == want) << "adversarial MMA: " << describe(p);
                }
}

// Tokens whose element (token, i = token % G) of each group lies `at` times the certified bound
// below an E2M1 boundary: x_j = 14/3 T_ij, rows of norm 1 (so y_i is about 14/3, 3.5 in MXFP4 code units, every product is positive and the model's error is large),
// then one T_ij nudged so that y_i lands where wanted. MXFP4, BF16 x, per-block matrices.
Problem near_boundary_problem(double at, unsigned seed, std::size_t n) {
    Problem p;
    p.format = WUSH_FORMAT_MXFP4;
    p.dtype = WUSH_DTYPE_BF16;
    p.n = n;
    const int g = 32;
    p.d_in = 4 * std::size_t(g);
    p.per_block = true;
    std::mt19937 rng(seed);
    std::normal_distribution<float> gauss(0.0f, 1.0f / std::sqrt(float(g)));
    p.t.resize(4 * std::size_t(g * g));
    for (float& v : p.t) v = gauss(rng);
    for (std::size_t row = 0; row < 4 * std::size_t(g); ++row) {  // unit rows: every row has the max norm
        double ss = 0.0;
        for (int j = 0; j < g; ++j)
            ss += double(p.t[row * std::size_t(g) + std::size_t(j)]) * p.t[row * std::size_t(g) + std::size_t(j)];
        for (int j = 0; j < g; ++j)
            p.t[row * std::size_t(g) + std::size_t(j)] =
                float(p.t[row * std::size_t(g) + std::size_t(j)] / std::sqrt(ss));
    }
    p.x.resize(n * p.d_in);
    for (std::size_t r = 0; r < n; ++r)
        for (std::size_t grp = 0; grp < 4; ++grp)
            for (int j = 0; j < g; ++j) {
                const int i = int(r % std::size_t(g));
                p.x[r * p.d_in + grp * std::size_t(g) + std::size_t(j)] =
                    encode_x(p.t[grp * std::size_t(g * g) + std::size_t(i * g + j)] * (14.0f / 3.0f), p.dtype);
            }
    for (int pass = 0; pass < 3; ++pass)  // the norms move a little with T: settle
        for (std::size_t r = 0; r < n; ++r)
            for (std::size_t grp = 0; grp < 4; ++grp) {
                float* t = p.t.data() + grp * std::size_t(g * g);
                const int i = int(r % std::size_t(g));
                std::vector<std::uint32_t> w(tc::fragment_words(g));
                const tc::PartNorms norms = tc::pack_fragments(t, g, w.data());
                float x[32], ss = 0.0f;
                for (int j = 0; j < g; ++j) {
                    x[j] = p.x_at(r * p.d_in + grp * std::size_t(g) + std::size_t(j));
                    ss = std::fma(x[j], x[j], ss);
                }
                double y[32];
                formats::transform_group_f64(t, x, g, y);
                const double bound = tc::split_product_error_bound(norms, std::sqrt(ss), false, g);
                double amax = 0.0;
                for (double v : y) amax = std::max(amax, std::fabs(v));
                // y_i is the group's largest: in code units in [3, 6), between the boundaries 3.5 and 5;
                // put it just below the nearer one.
                const double unit = std::ldexp(1.0, bits::floor_log2(amax)) / 3.0;
                const double edge = std::fabs(y[i] - 3.5 * unit) < std::fabs(y[i] - 5.0 * unit) ? 3.5 : 5.0;
                const double target = edge * unit - at * bound;
                if (target < std::fabs(y[i]) * 0.8 || target > std::fabs(y[i]) * 1.25) continue;
                int jm = 0;  // nudge the entry with the largest input: the smallest change to T
                for (int j = 1; j < g; ++j) jm = std::fabs(x[j]) > std::fabs(x[jm]) ? j : jm;
                t[i * g + jm] = float(double(t[i * g + jm]) + (target - y[i]) / double(x[jm]));
            }
    return p;
}

TEST(QuantizeTcEmulation, NearBoundaryInputsNeedTheWholeBound) {
    int wrong_with_half = 0;
    for (unsigned seed = 1; seed <= 3; ++seed) {
        const Problem p = near_boundary_problem(0.05, seed, 32);
        std::vector<double> y;
        const Bytes want = definition(p, &y);
        const std::vector<int> dir = directions(p, want, y);
        ASSERT_TRUE(run_tc(p, nullptr, 1.0f) == want) << seed;
        ASSERT_TRUE(run_tc(p, &dir, 1.0f) == want) << seed;
        const Bytes half = run_tc(p, &dir, 0.5f);
        for (std::size_t i = 0; i < want.codes.size(); ++i) wrong_with_half += half.codes[i] != want.codes[i];
    }
    // The adversary moves y_i about 3/4 of the bound (the first k-step's instruction sees half the
    // products, the second all): across the boundary and beyond half the bound, where a certification
    // with half the bound no longer sees it (with 0.7 of the bound it still fails; with 0.8 not).
    EXPECT_GT(wrong_with_half, 0);
    std::printf("bytes wrong with half the bound: %d\n", wrong_with_half);
}

TEST(QuantizeTcEmulation, NonFiniteGroupsAreReportedAndSkipped) {
    for (wush_format f : kFormats) {
        Problem p = random_problem(f, WUSH_DTYPE_BF16, TransformKind::Random, 20, 4 * std::size_t(group_of(f)), 9);
        const std::size_t g = std::size_t(group_of(f));
        const std::size_t r1 = 1, c1 = 2 * g + 3, r2 = 2, c2 = 1;
        p.x[r1 * p.d_in + c1] = 0x7FC0;  // NaN
        p.x[r2 * p.d_in + c2] = 0x7F80;  // Inf
        const Bytes got = run_tc(p, nullptr, 1.0f);
        EXPECT_EQ(got.flag, (static_cast<unsigned long long>(r1) << 32) | c1) << describe(p);
        const Bytes want = definition(p);  // leaves the non-finite groups at the sentinel too
        EXPECT_TRUE(got == want) << describe(p);
    }
}

}  // namespace
