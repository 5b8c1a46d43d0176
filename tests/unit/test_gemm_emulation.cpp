// The W4A4 GEMM kernels' own device source (cuda/gemm/gemm_decode_kernel.cuh, gemm_prefill_kernel.cuh)
// run on the CPU through tests/unit/cuda_host_emulation.h (threads, barriers, warp exchanges,
// deferred cp.async, mma.sync from the PTX fragment layouts), on small random products of every
// format, against a float64 product of the dequantized values. The launch parameters are set up as
// cuda/gemm/gemm_decode.cu and cuda/gemm/gemm_prefill.cu set them (cuda/gemm/gemm_plan.h). The bias of the final
// store (cuda/gemm/output_bias.cuh; decode, split-K reduction, prefill epilogue): y with a bias equals
// y without it plus the bias, added and rounded here, bit for bit; a NaN/Inf bias is reported.
#include "cuda_host_emulation.h"  // first: defines the CUDA spellings

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "formats/group_quantizer.h"
#include "gemm/gemm_decode_kernel.cuh"
#include "gemm/gemm_plan.h"
#include "gemm/gemm_prefill_kernel.cuh"
#include "gemm/output_bias.h"
#include "quantize/quantize_params.h"

namespace {

using namespace wush;
namespace plan = wush::cuda::plan;

const wush_format kFormats[] = {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4, WUSH_FORMAT_INT4, WUSH_FORMAT_MXFP4_OCP};
int group_of(wush_format f) {
    return f == WUSH_FORMAT_NVFP4 ? 16 : 32;
}
double tensor_factor(wush_format f) {
    return f == WUSH_FORMAT_MXFP4 ? 1.0 / 3.0 : f == WUSH_FORMAT_NVFP4 ? 0.1 : 1.0;
}

struct Operand {
    std::vector<std::uint8_t> codes, scales;
    std::vector<double> values;
};

Operand random_operand(wush_format f, std::size_t rows, std::size_t k, std::mt19937& rng, int force_e8m0 = -1) {
    const int G = group_of(f), sb = tile::scale_bytes(f);
    const std::size_t groups = k / G;
    Operand o;
    o.codes.resize(rows * k / 2);
    o.scales.resize(rows * groups * sb);
    for (auto& c : o.codes) c = std::uint8_t(rng());
    for (std::size_t i = 0; i < rows * groups; ++i) {
        std::uint8_t* s = &o.scales[i * sb];
        if (f == WUSH_FORMAT_NVFP4) {
            s[0] = std::uint8_t(0x20 + rng() % 0x40);
        } else if (f == WUSH_FORMAT_INT4) {
            const std::uint16_t b = std::uint16_t(0x3E00 + rng() % 0x0200);
            s[0] = std::uint8_t(b & 0xFF);
            s[1] = std::uint8_t(b >> 8);
        } else {
            s[0] = std::uint8_t(force_e8m0 >= 0 ? force_e8m0 : int(120 + rng() % 14));
        }
    }
    o.values.resize(rows * k);
    for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t i = 0; i < k; ++i)
            o.values[r * k + i] = double(formats::decode_element(f, formats::get_nibble(&o.codes[r * k / 2], int(i)))) *
                                  double(formats::decode_scale(f, &o.scales[(r * groups + i / G) * sb])) *
                                  tensor_factor(f);
    return o;
}

// 16-byte aligned copies (the kernels' contract for code rows).
struct Aligned {
    std::vector<std::uint8_t> buf;
    std::uint8_t* p;
    explicit Aligned(const std::vector<std::uint8_t>& v) : buf(v.size() + 16) {
        p = buf.data() + ((16 - reinterpret_cast<std::uintptr_t>(buf.data()) % 16) % 16);
        std::memcpy(p, v.data(), v.size());
    }
};

void compare(const Operand& a, const Operand& w, std::size_t m, std::size_t n, std::size_t k,
             const std::vector<float>& y) {
    int bad = 0;
    for (std::size_t i = 0; i < m; ++i)
        for (std::size_t j = 0; j < n; ++j) {
            double ref = 0, abs_sum = 0;
            for (std::size_t e = 0; e < k; ++e) {
                ref += a.values[i * k + e] * w.values[j * k + e];
                abs_sum += std::fabs(a.values[i * k + e] * w.values[j * k + e]);
            }
            const float got = y[i * n + j];
            if (!(std::fabs(double(got) - ref) <= 1e-5 * abs_sum + 1e-30) && bad++ < 5)
                ADD_FAILURE() << "y[" << i << "][" << j << "] = " << got << ", float64 " << ref;
        }
    EXPECT_EQ(bad, 0);
}

template <int MR, int G>
void run_decode(const cuda::decode_detail::DecodeParams& p, wush_emu::Dim grid) {
    wush_emu::launch(grid, plan::kDecodeWarps * 32, 0, [&] { cuda::decode_detail::decode_gemm_kernel<MR, G>(p); });
}

// The decode kernel (and the split-K reduction) into y (F32, or BF16 with `bf16`), as
// cuda/gemm/gemm_decode.cu launches them.
void decode_into(wush_format f, std::size_t m, std::size_t n, std::size_t k, const Operand& a, const Operand& w,
                 void* y, bool bf16, const cuda::OutputBias& bias) {
    const Aligned ac(a.codes), wc(w.codes);
    const plan::DecodePlan pl = plan::plan_decode(m, n, k);
    std::vector<float> partial(pl.splits * m * n, NAN);
    cuda::decode_detail::DecodeParams p;
    p.format = f;
    p.m = int(m);
    p.n = int(n);
    p.k = (long long)k;
    p.a_codes = ac.p;
    p.a_scales = a.scales.data();
    p.w_codes = wc.p;
    p.w_scales = w.scales.data();
    p.alpha_q = float(tensor_factor(f) * tensor_factor(f)) * 0.25f;
    p.y = y;
    p.y_bf16 = bf16 ? 1 : 0;
    p.partial = pl.splits > 1 ? partial.data() : nullptr;
    p.split_len = (long long)(pl.chunks_per_split * plan::kDecodeChunk);
    p.bias = bias;
    const wush_emu::Dim grid{unsigned(pl.blocks_n), unsigned(pl.splits), unsigned(pl.row_passes)};
    ASSERT_TRUE(pl.mr == 1 || pl.mr == 4 || pl.mr == 16) << pl.mr;  // the instantiations below
    if (group_of(f) == 16) {
        if (pl.mr == 16) run_decode<16, 16>(p, grid);
        else if (pl.mr == 4) run_decode<4, 16>(p, grid);
        else run_decode<1, 16>(p, grid);
    } else {
        if (pl.mr == 16) run_decode<16, 32>(p, grid);
        else if (pl.mr == 4) run_decode<4, 32>(p, grid);
        else run_decode<1, 32>(p, grid);
    }
    if (pl.splits > 1) {
        const std::size_t mn = m * n;
        wush_emu::launch(wush_emu::Dim{2, 1, 1}, 64, 0, [&] {
            cuda::decode_detail::splitk_reduce_kernel(partial.data(), int(pl.splits), mn, n, y, p.y_bf16, bias);
        });
    }
}

// Round to nearest even, float32 to bf16 bits (finite values), from the definition.
std::uint16_t bf16_rne(float v) {
    std::uint32_t u;
    std::memcpy(&u, &v, 4);
    return std::uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// A product `run(y, bf16, bias)` with biases of each dtype (values exact in all three, one -0.0)
// equals the bias-free y0 plus the bias in float32, then (BF16 y) rounded; a NaN and an Inf in the
// bias are reported with the bias row and the smallest bad column.
template <typename Run>
void check_bias(std::size_t m, std::size_t n, const std::vector<float>& y0, std::mt19937& rng, Run run) {
    std::vector<float> b(n);
    std::vector<std::uint16_t> b16(n), h16(n);
    for (std::size_t j = 0; j < n; ++j) {
        const int q = int(rng() % 511) - 255;  // q / 64: at most 8 significant bits
        b[j] = j == 1 ? -0.0f : float(q) / 64.0f;
        std::uint32_t u;
        std::memcpy(&u, &b[j], 4);
        b16[j] = std::uint16_t(u >> 16);
        // binary16 of q / 64: the same value (|q| < 2^8 fits the 11-bit significand)
        int e = 0;
        const double fr = std::frexp(std::fabs(double(b[j])), &e);
        h16[j] = std::uint16_t((std::signbit(b[j]) ? 0x8000u : 0u) |
                               (b[j] == 0.0f ? 0u : (unsigned(e - 1 + 15) << 10 | unsigned((2 * fr - 1) * 1024))));
    }
    unsigned long long flag = cuda::kNoNonFinite;
    const void* data[] = {b.data(), h16.data(), b16.data()};
    const wush_dtype dtypes[] = {WUSH_DTYPE_F32, WUSH_DTYPE_F16, WUSH_DTYPE_BF16};
    for (int d = 0; d < 3; ++d) {
        SCOPED_TRACE(::testing::Message() << "bias dtype " << int(dtypes[d]));
        const cuda::OutputBias bias{data[d], dtypes[d], &flag};
        std::vector<float> y(m * n, NAN);
        std::vector<std::uint16_t> yh(m * n, 0xFFFF);
        run(y.data(), false, bias);
        run(yh.data(), true, bias);
        int bad = 0;
        for (std::size_t i = 0; i < m * n; ++i) {
            const float want = y0[i] + b[i % n];
            if ((std::memcmp(&y[i], &want, 4) != 0 || yh[i] != bf16_rne(want)) && bad++ < 5)
                ADD_FAILURE() << "y[" << i << "] = " << y[i] << " (bf16 " << yh[i] << "), want " << want;
        }
        EXPECT_EQ(bad, 0);
        EXPECT_EQ(flag, cuda::kNoNonFinite);
    }
    b[n - 1] = INFINITY;
    b[n / 2] = NAN;
    std::vector<float> y(m * n);
    run(y.data(), false, cuda::OutputBias{b.data(), WUSH_DTYPE_F32, &flag});
    EXPECT_EQ(flag, (cuda::kBiasReportRow << 32) | (n / 2));
}

void check_decode(wush_format f, std::size_t m, std::size_t n, std::size_t k, std::mt19937& rng, int force_a = -1,
                  bool with_bias = false) {
    SCOPED_TRACE(::testing::Message() << "decode format " << int(f) << " m " << m << " n " << n << " k " << k);
    const Operand a = random_operand(f, m, k, rng, force_a), w = random_operand(f, n, k, rng);
    std::vector<float> y(m * n, NAN);
    decode_into(f, m, n, k, a, w, y.data(), false, {});
    compare(a, w, m, n, k, y);
    if (with_bias)
        check_bias(m, n, y, rng, [&](void* out, bool bf16, const cuda::OutputBias& bias) {
            decode_into(f, m, n, k, a, w, out, bf16, bias);
        });
}

template <int G>
void run_prefill(const cuda::prefill_detail::PrefillParams& p, wush_emu::Dim grid) {
    wush_emu::launch(grid, plan::kPrefillThreads, cuda::prefill_detail::Layout<G>::kSmem,
                     [&] { cuda::prefill_detail::prefill_gemm_kernel<G>(p); });
}

// The prefill kernels into y (F32, or BF16 with `bf16`), as cuda/gemm/gemm_prefill.cu launches them.
void prefill_into(wush_format f, std::size_t m, std::size_t n, std::size_t k, const Operand& a, const Operand& w,
                  int force_a, void* y, bool bf16, const cuda::OutputBias& bias) {
    const int G = group_of(f);
    const Aligned ac(a.codes), wc(w.codes);
    const std::size_t stride = plan::prefill_scale_stride(k, G);
    std::vector<float> ws((plan::prefill_workspace_bytes(m, n, k, G) + 3) / 4, NAN);
    int* flag =
        reinterpret_cast<int*>(reinterpret_cast<std::uint8_t*>(ws.data()) + plan::prefill_flag_offset(m, n, k, G));
    *flag = 0;
    const float alpha_q = float(tensor_factor(f) * tensor_factor(f)) * 0.25f;
    wush_emu::launch(wush_emu::Dim{3, 1, 1}, 64, 0, [&] {
        cuda::prefill_detail::prefill_scales_kernel(f, int(m), int(n), (long long)(k / G), (long long)stride,
                                                    a.scales.data(), w.scales.data(), alpha_q, ws.data(), flag);
    });
    EXPECT_EQ(*flag, force_a > 127 + 99 ? 1 : 0);
    cuda::prefill_detail::PrefillParams p;
    p.m = int(m);
    p.n = int(n);
    p.k = (long long)k;
    p.format = f;
    p.a_codes = ac.p;
    p.w_codes = wc.p;
    p.a_scales = ws.data();
    p.w_scales = ws.data() + m * stride;
    p.stride = (long long)stride;
    p.flag = flag;
    p.y = y;
    p.y_bf16 = bf16 ? 1 : 0;
    p.bias = bias;
    const wush_emu::Dim grid{unsigned(plan::ceil_div(n, plan::kPrefillBN)),
                             unsigned(plan::ceil_div(m, plan::kPrefillBM)), 1};
    if (G == 16) run_prefill<16>(p, grid);
    else run_prefill<32>(p, grid);
}

void check_prefill(wush_format f, std::size_t m, std::size_t n, std::size_t k, std::mt19937& rng, int force_a = -1,
                   bool with_bias = false) {
    SCOPED_TRACE(::testing::Message() << "prefill format " << int(f) << " m " << m << " n " << n << " k " << k);
    const Operand a = random_operand(f, m, k, rng, force_a), w = random_operand(f, n, k, rng);
    std::vector<float> y(m * n, NAN);
    prefill_into(f, m, n, k, a, w, force_a, y.data(), false, {});
    compare(a, w, m, n, k, y);
    if (with_bias)
        check_bias(m, n, y, rng, [&](void* out, bool bf16, const cuda::OutputBias& bias) {
            prefill_into(f, m, n, k, a, w, force_a, out, bf16, bias);
        });
}

TEST(GemmEmulation, DecodeEveryFormat) {
    std::mt19937 rng(21);
    for (wush_format f : kFormats) {
        check_decode(f, 1, 13, 96, rng);    // one chunk, ragged units, n not a multiple of 16
        check_decode(f, 3, 40, 2080, rng);  // 3 chunks -> 3 splits, ragged last chunk
        check_decode(f, 17, 8, 160, rng);   // two row passes (16 + 1)
    }
    check_decode(WUSH_FORMAT_MXFP4, 3, 9, 96, rng, 127 + 103);  // huge activation scales
}

TEST(GemmEmulation, PrefillEveryFormat) {
    std::mt19937 rng(22);
    for (wush_format f : kFormats) {
        check_prefill(f, 130, 24, 96, rng);   // 2 row tiles, k = 32 * 3 (partial stage)
        check_prefill(f, 20, 136, 416, rng);  // 2 column tiles, 4 stages (pipeline wrap-around)
    }
    check_prefill(WUSH_FORMAT_MXFP4, 17, 9, 96, rng, 127 + 103);  // flagged: the FADD + FMUL + FFMA path
}

TEST(GemmEmulation, BiasInTheFinalStore) {
    std::mt19937 rng(23);
    check_decode(WUSH_FORMAT_MXFP4, 3, 40, 96, rng, -1, true);     // one split: the kernel's store
    check_decode(WUSH_FORMAT_NVFP4, 3, 40, 2080, rng, -1, true);   // 3 splits: the reduction's store
    check_prefill(WUSH_FORMAT_MXFP4, 20, 136, 96, rng, -1, true);  // the epilogue, 2 column tiles
}

}  // namespace
