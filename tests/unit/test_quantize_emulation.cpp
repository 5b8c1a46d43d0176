// The fused quantize kernels' own device source (cuda/quantize/quantize_kernel.cuh: the tile kernel and
// the small-m kernel) run on the CPU through tests/unit/cuda_host_emulation.h, launched as
// cuda/quantize/quantize_kernel.cu launches them, against the CPU runtime's bytes
// (cpu::quantize_activations, which equals the float64 definition): every format, identity /
// shared / per-block matrices, F32 / BF16 / F16 inputs, ragged token and group counts, aligned and
// misaligned x and codes (vector and scalar paths), and NaN/Inf groups (not written, reported).
//
// Built twice: as is, and with the host compiler contracting a * b + c into FMAs
// (-mfma -ffp-contract=fast, target wush_quantize_emulation_fma_tests), which stands for nvcc's
// default --fmad=true: equal bytes there are the evidence that quantize_kernel.cu needs no
// --fmad=false (docs/record/cuda-gemm-notes.md).
#include "cuda_host_emulation.h"  // first: defines the CUDA spellings

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/float_bits.h"
#include "cpu/activation_quantizer.h"
#include "formats/block_format.h"
#include "quantize/quantize_kernel.cuh"
#include "transforms/block_transform.h"

namespace {

using namespace wush;
namespace qd = wush::cuda::quantize_detail;

const wush_format kFormats[] = {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4, WUSH_FORMAT_INT4, WUSH_FORMAT_MXFP4_OCP};

// The launcher's rule (quantize_kernel.cu), run through the emulation.
template <wush_format F>
void emulate(const cuda::QuantizeArgs& a) {
    const std::size_t groups = a.d_in / std::size_t(qd::Fmt<F>::G);
    const int vec_codes = reinterpret_cast<std::uintptr_t>(a.codes) % qd::Fmt<F>::kCodeBytes == 0;
    if (a.n_tokens <= qd::kSmallMaxTokens) {
        const int per_block = qd::small_groups_per_block(a.n_tokens);
        const wush_emu::Dim grid{unsigned((groups + std::size_t(per_block) - 1) / std::size_t(per_block)), 1, 1};
        wush_emu::launch(grid, qd::kThreads, 0, [&] { qd::quantize_small_kernel<F>(a, per_block, vec_codes); });
    } else {
        const int vec_x = reinterpret_cast<std::uintptr_t>(a.x) % 16 == 0;
        const wush_emu::Dim grid{unsigned((a.n_tokens + qd::kTileTokens - 1) / qd::kTileTokens),
                                 unsigned((groups + qd::kTileGroups - 1) / qd::kTileGroups), 1};
        wush_emu::launch(grid, qd::kThreads, 0, [&] { qd::quantize_tile_kernel<F>(a, vec_x, vec_codes); });
    }
}

void emulate_any(const cuda::QuantizeArgs& a) {
    switch (a.format) {
        case WUSH_FORMAT_MXFP4: return emulate<WUSH_FORMAT_MXFP4>(a);
        case WUSH_FORMAT_NVFP4: return emulate<WUSH_FORMAT_NVFP4>(a);
        case WUSH_FORMAT_INT4: return emulate<WUSH_FORMAT_INT4>(a);
        default: return emulate<WUSH_FORMAT_MXFP4_OCP>(a);
    }
}

// Gaussian values with an outlier, and every 5th token on E2M1 thresholds (the float64 fallback).
std::vector<float> make_x(std::size_t n, std::size_t d_in, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> gauss(0.0f, 1.0f);
    std::vector<float> x(n * d_in);
    for (float& v : x) v = gauss(rng);
    for (std::size_t t = 0; t < n; t += 5)
        for (std::size_t j = 0; j < d_in; ++j) x[t * d_in + j] = float(0.25 * double(1 + j % 20) / 3.0);
    if (n > 3) x[3 * d_in + 5] = 900.0f;
    return x;
}

// Nearest F16 of a finite float inside F16's range (round to 10 mantissa bits, exponent >= -14).
std::uint16_t f16_of(float v) {
    const std::uint16_t sign = std::signbit(v) ? 0x8000 : 0;
    const double r = bits::round_to_format(std::fabs(double(v)), 10, -14);
    if (r < 0x1p-14) return std::uint16_t(sign | std::uint16_t(r * 0x1p24));
    const int e = bits::floor_log2(r);
    return std::uint16_t(sign | ((e + 15) << 10) | int((r / std::ldexp(1.0, e) - 1.0) * 1024.0));
}

// x in `dtype` bytes, placed `offset` bytes into a 16-byte aligned buffer.
struct Input {
    std::vector<std::uint8_t> buf;
    const void* p = nullptr;
    std::vector<float> as_float;  // the values the kernel sees
};

Input make_input(const std::vector<float>& x, wush_dtype dt, std::size_t offset) {
    Input in;
    const std::size_t es = dt == WUSH_DTYPE_F32 ? 4 : 2;
    in.buf.resize(x.size() * es + 32);
    std::uint8_t* base = in.buf.data() + ((16 - reinterpret_cast<std::uintptr_t>(in.buf.data()) % 16) % 16) + offset;
    in.as_float.resize(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
        if (dt == WUSH_DTYPE_F32) {
            std::memcpy(base + 4 * i, &x[i], 4);
            in.as_float[i] = x[i];
        } else {
            const std::uint16_t h = dt == WUSH_DTYPE_BF16 ? bits::bf16_encode(double(x[i])) : f16_of(x[i]);
            std::memcpy(base + 2 * i, &h, 2);
            in.as_float[i] = dt == WUSH_DTYPE_BF16 ? bits::bf16_decode(h) : bits::f16_decode(h);
        }
    }
    in.p = base;
    return in;
}

struct Result {
    std::vector<std::uint8_t> codes, scales;
    unsigned long long flag = cuda::kNoNonFinite;
};

constexpr std::uint8_t kSentinel = 0xA5;

Result run_kernel(const BlockTransform& t, const formats::FormatSpec& f, const Input& in, wush_dtype dt, std::size_t n,
                  std::size_t codes_offset) {
    const std::size_t d_in = t.d_in();
    const formats::PackedSizes s = formats::packed_sizes(f, n, d_in);
    std::vector<std::uint8_t> cbuf(s.codes + 32, kSentinel), sbuf(s.scales + 1, kSentinel);
    std::uint8_t* codes = cbuf.data() + ((16 - reinterpret_cast<std::uintptr_t>(cbuf.data()) % 16) % 16) + codes_offset;
    const MatrixUse use = classify_matrices(t);
    const int g = int(f.group);
    const std::size_t count = use == MatrixUse::Shared ? 1 : t.blocks();
    std::vector<float> norms(count);
    for (std::size_t b = 0; b < count; ++b)
        norms[b] = formats::max_row_norm_bound(t.activation_matrices().data() + b * g * g, g);
    Result r;
    cuda::QuantizeArgs a;
    a.format = f.id;
    a.group = g;
    a.x_dtype = dt;
    a.x = in.p;
    a.n_tokens = n;
    a.d_in = d_in;
    a.use = use;
    const std::vector<float> matrices = cuda::kernel_matrices(t.activation_matrices().data(), count, g);
    a.matrices = matrices.data();
    a.row_norms = norms.data();
    a.codes = codes;
    a.scales = sbuf.data();
    a.non_finite = &r.flag;
    emulate_any(a);
    r.codes.assign(codes, codes + s.codes);
    r.scales.assign(sbuf.begin(), sbuf.begin() + std::ptrdiff_t(s.scales));
    return r;
}

Result run_cpu(const BlockTransform& t, const formats::FormatSpec& f, const std::vector<float>& x, std::size_t n) {
    const formats::PackedSizes s = formats::packed_sizes(f, n, t.d_in());
    Result r;
    r.codes.resize(s.codes);
    r.scales.resize(s.scales);
    const MatrixUse use = classify_matrices(t);
    std::vector<float> scratch(cpu::quantize_scratch_floats(t, use));
    cpu::quantize_activations(t, use, f, WUSH_DTYPE_F32, x.data(), n, r.codes, r.scales, best_isa(), scratch, 1);
    return r;
}

// The FMA build runs only where the CPU has FMA.
#if defined(WUSH_TEST_NEEDS_FMA)
#  define REQUIRE_FMA() \
    if (!__builtin_cpu_supports("fma")) GTEST_SKIP() << "no FMA on this CPU"
#else
#  define REQUIRE_FMA()
#endif

TEST(QuantizeEmulation, EqualsCpuBytes) {
    REQUIRE_FMA();
    const TransformKind kinds[] = {TransformKind::Identity, TransformKind::Hadamard, TransformKind::Random};
    struct Shape {
        std::size_t n, d_in;
    };
    // small-m kernel: n <= 16, each way of sharing a block's groups among its warps (1, 2 or 4
    // warps per group; group counts that leave the last block partial: 3 or 5 groups of 32, 6 or
    // 10 of 16; tokens not a multiple of the warps per group); tile kernel: ragged tokens and a
    // partial last column tile.
    const Shape shapes[] = {{1, 96}, {2, 96}, {3, 160}, {5, 96}, {16, 64}, {17, 96}, {40, 256}};
    for (wush_format format : kFormats) {
        const formats::FormatSpec& f = formats::spec(format);
        for (TransformKind kind : kinds) {
            for (const Shape& sh : shapes) {
                const BlockTransform t = build_data_free_transform({kind, 0.01, 7}, sh.d_in, f.group);
                const std::vector<float> x = make_x(sh.n, sh.d_in, unsigned(sh.n * 31 + sh.d_in));
                for (wush_dtype dt : {WUSH_DTYPE_F32, WUSH_DTYPE_BF16, WUSH_DTYPE_F16}) {
                    // aligned, then misaligned x (element-aligned only) and codes (byte stores)
                    for (int variant = 0; variant < 2; ++variant) {
                        const Input in = make_input(x, dt, variant ? (dt == WUSH_DTYPE_F32 ? 4 : 2) : 0);
                        const Result want = run_cpu(t, f, in.as_float, sh.n);
                        const Result got = run_kernel(t, f, in, dt, sh.n, variant ? 3 : 0);
                        const std::string what = std::string(f.name) + " kind " + std::to_string(int(kind)) + " n " +
                                                 std::to_string(sh.n) + " d_in " + std::to_string(sh.d_in) + " dtype " +
                                                 std::to_string(int(dt)) + " variant " + std::to_string(variant);
                        ASSERT_EQ(got.flag, cuda::kNoNonFinite) << what;
                        ASSERT_EQ(got.codes, want.codes) << what;
                        ASSERT_EQ(got.scales, want.scales) << what;
                    }
                }
            }
        }
    }
}

// A NaN / Inf leaves its group unwritten and reports the first (row, column); the other groups
// are quantized as usual.
TEST(QuantizeEmulation, NonFiniteGroupsAreReportedAndSkipped) {
    REQUIRE_FMA();
    for (wush_format format : kFormats) {
        const formats::FormatSpec& f = formats::spec(format);
        const std::size_t g = f.group, d_in = 4 * g;
        // n = 9: the small-m kernel's warps take several tokens each, one after a skipped group
        for (std::size_t n : {std::size_t(3), std::size_t(9), std::size_t(20)}) {
            const BlockTransform t = build_data_free_transform({TransformKind::Random, 0.01, 7}, d_in, g);
            std::vector<float> x = make_x(n, d_in, 9);
            const std::size_t r1 = 1, c1 = 2 * g + 3, r2 = 2, c2 = 1;
            x[r1 * d_in + c1] = NAN;
            x[r2 * d_in + c2] = INFINITY;
            const Input in = make_input(x, WUSH_DTYPE_F32, 0);
            const Result got = run_kernel(t, f, in, WUSH_DTYPE_F32, n, 0);
            EXPECT_EQ(got.flag, (static_cast<unsigned long long>(r1) << 32) | c1) << f.name;
            std::vector<float> clean = x;  // the same groups, made finite, for the other groups' bytes
            for (std::size_t j = 0; j < g; ++j) clean[r1 * d_in + 2 * g + j] = clean[r2 * d_in + j] = 0.0f;
            const Result want = run_cpu(t, f, clean, n);
            const std::size_t cb = g / 2, sb = format == WUSH_FORMAT_INT4 ? 2 : 1;
            for (std::size_t r = 0; r < n; ++r)
                for (std::size_t b = 0; b < 4; ++b) {
                    const bool bad = (r == r1 && b == 2) || (r == r2 && b == 0);
                    for (std::size_t i = 0; i < cb; ++i) {
                        const std::size_t at = r * d_in / 2 + b * cb + i;
                        ASSERT_EQ(got.codes[at], bad ? kSentinel : want.codes[at])
                            << f.name << " row " << r << " block " << b;
                    }
                    for (std::size_t i = 0; i < sb; ++i) {
                        const std::size_t at = (r * 4 + b) * sb + i;
                        ASSERT_EQ(got.scales[at], bad ? kSentinel : want.scales[at])
                            << f.name << " row " << r << " block " << b;
                    }
                }
        }
    }
}

}  // namespace
