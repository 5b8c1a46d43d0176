// The prefill kernel's device code (see cuda/gemm/gemm_prefill.cu), in a header of its own so that the
// CPU emulation test (tests/unit/test_gemm_emulation.cpp) compiles the same source against
// tests/unit/cuda_host_emulation.h (WUSH_CUDA_HOST_EMULATION: cp.async and mma.sync emulated).
#pragma once

#include <cstdint>

#if !defined(WUSH_CUDA_HOST_EMULATION)
#  include <cuda_bf16.h>
#endif

#include "gemm_plan.h"
#include "output_bias.cuh"
#include "prefill_tile.cuh"
#include "tile_decode.h"

namespace wush::cuda::prefill_detail {

using namespace wush::tile;

constexpr int BM = plan::kPrefillBM, BN = plan::kPrefillBN, BK = plan::kPrefillBK;
constexpr int kStages = plan::kPrefillStages;
constexpr int kThreads = plan::kPrefillThreads;
constexpr int kRowBytes = BK / 2 + 16;  // 64 code bytes + 16 padding

template <int G>
struct Layout {
    static constexpr int kSpr = BK / G;            // scales per row per stage
    static constexpr int kCodes = BM * kRowBytes;  // bytes of one operand's codes
    static constexpr int kScales = BM * kSpr * 4;  // bytes of one operand's scales
    static constexpr int kStage = 2 * kCodes + 2 * kScales;
    static constexpr int kSmem = kStages * kStage;
};

struct PrefillParams {
    int m, n;
    long long k;
    wush_format format;
    const std::uint8_t* a_codes;
    const std::uint8_t* w_codes;
    const float* a_scales;  // m x stride, scale * alpha / 4
    const float* w_scales;  // n x stride
    long long stride;
    const int* flag;  // set by prefill_scales_kernel: some |scale_a| >= tile::kScaledDotMaxScale
    void* y;
    int y_bf16;
    OutputBias bias;  // added in the epilogue
};

// d = A B + magic (tile::kPromoteMagicBits in all four C registers): the C operand is one register
// read by every MMA, so the 64 accumulators of a group need no per-MMA initialization moves.
__device__ __forceinline__ void mma_k32_magic(int (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                              std::uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(kPromoteMagicBits));
#elif defined(WUSH_CUDA_HOST_EMULATION)
    d[0] = d[1] = d[2] = d[3] = kPromoteMagicBits;
    wush_emu::mma(d, a, 4, b0, b1);
#endif
}
__device__ __forceinline__ void mma_k16_magic(int (&d)[4], std::uint32_t a0, std::uint32_t a1, std::uint32_t b0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(b0), "r"(kPromoteMagicBits));
#elif defined(WUSH_CUDA_HOST_EMULATION)
    d[0] = d[1] = d[2] = d[3] = kPromoteMagicBits;
    const std::uint32_t a[4] = {a0, a1, 0, 0};
    wush_emu::mma(d, a, 2, b0, 0);
#endif
}

template <int G>
__device__ __forceinline__ void load_stage(const PrefillParams& p, std::uint8_t* stage, int bm, int bn, long long kt) {
    using L = Layout<G>;
    const int tid = threadIdx.x;
    const long long ke = kt * BK;
    const long long kbytes = p.k / 2;
    std::uint8_t* s_ac = stage;
    std::uint8_t* s_wc = stage + L::kCodes;
    float* s_as = reinterpret_cast<float*>(stage + 2 * L::kCodes);
    float* s_ws = reinterpret_cast<float*>(stage + 2 * L::kCodes + L::kScales);
    // Codes: 128 rows x 4 copies of 16 bytes (32 elements) per operand.
#pragma unroll
    for (int i = 0; i < (BM * 4) / kThreads; ++i) {
        const int c = tid + i * kThreads, row = c >> 2, q = c & 3;
        const bool kin = ke + 32 * q < p.k;
        const bool va = kin && bm + row < p.m, vw = kin && bn + row < p.n;
        const long long off = ke / 2 + 16 * q;
        cp_async16(s_ac + row * kRowBytes + 16 * q, va ? p.a_codes + (long long)(bm + row) * kbytes + off : p.a_codes,
                   va);
        cp_async16(s_wc + row * kRowBytes + 16 * q, vw ? p.w_codes + (long long)(bn + row) * kbytes + off : p.w_codes,
                   vw);
    }
    // Scales: 128 rows x kSpr floats per operand (padded groups are zeros in the workspace).
    constexpr int kCopiesPerRow = L::kSpr / 4;
    for (int c = tid; c < BM * kCopiesPerRow; c += kThreads) {
        const int row = c / kCopiesPerRow, q = c % kCopiesPerRow;
        const long long off = kt * L::kSpr + 4 * q;
        const bool va = bm + row < p.m, vw = bn + row < p.n;
        cp_async16(s_as + row * L::kSpr + 4 * q, va ? p.a_scales + (long long)(bm + row) * p.stride + off : p.a_scales,
                   va);
        cp_async16(s_ws + row * L::kSpr + 4 * q, vw ? p.w_scales + (long long)(bn + row) * p.stride + off : p.w_scales,
                   vw);
    }
}

// One group of a warp's 64 x 32 tile: fragments, 16 MMAs from the magic start, promotion.
// FAST: t = fma(acc_bits, sa, -magic * sa) is dot * sa exactly (tile::scaled_dot), then one FFMA
// with sw (alpha / 4 folded in): 2 FP32 ops per element. Otherwise FADD + FMUL + FFMA (any scale).
template <int G, bool FAST>
__device__ __forceinline__ void group_step(float (&acc)[4][4][4], const DoubledLut& lut, const std::uint8_t* s_ac,
                                           const std::uint8_t* s_wc, const float* s_as, const float* s_ws, int g,
                                           int gid, int t) {
    constexpr int kSpr = BK / G;
    float sa[4][2], ca[4][2], sw[4][2];
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            sa[mt][h] = s_as[(mt * 16 + gid + 8 * h) * kSpr + g];
            ca[mt][h] = kPromoteMagic * sa[mt][h];  // exact when FAST (tile::scaled_dot)
        }
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
        sw[nt][0] = s_ws[(nt * 8 + 2 * t) * kSpr + g];
        sw[nt][1] = s_ws[(nt * 8 + 2 * t + 1) * kSpr + g];
    }
    std::uint32_t a[4][4], b[4][2];
#pragma unroll
    for (int mt = 0; mt < 4; ++mt) {
        const std::uint8_t* r0 = s_ac + (mt * 16 + gid) * kRowBytes;
        const std::uint8_t* r8 = s_ac + (mt * 16 + gid + 8) * kRowBytes;
        if constexpr (G == 32) {
            a_frag_k32(lut, r0 + g * 16, r8 + g * 16, t, a[mt]);
        } else {
            std::uint32_t a2[2];
            a_frag_k16(lut, r0 + g * 8, r8 + g * 8, t, a2);
            a[mt][0] = a2[0];
            a[mt][1] = a2[1];
        }
    }
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
        const std::uint8_t* c0 = s_wc + (nt * 8 + gid) * kRowBytes;
        if constexpr (G == 32) b_frag_k32(lut, c0 + g * 16, t, b[nt]);
        else b[nt][0] = b_frag_k16(lut, c0 + g * 8, t);
    }
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
            int d[4];
            if constexpr (G == 32) mma_k32_magic(d, a[mt], b[nt][0], b[nt][1]);
            else mma_k16_magic(d, a[mt][0], a[mt][1], b[nt][0]);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                if constexpr (FAST)
                    acc[mt][nt][e] =
                        fmaf(scaled_dot(d[e], sa[mt][e >> 1], ca[mt][e >> 1]), sw[nt][e & 1], acc[mt][nt][e]);
                else acc[mt][nt][e] = fmaf(promoted_dot(d[e]), sa[mt][e >> 1] * sw[nt][e & 1], acc[mt][nt][e]);
            }
        }
}

template <int G>
__global__ void __launch_bounds__(kThreads, 1) prefill_gemm_kernel(const PrefillParams p) {
    using L = Layout<G>;
#if defined(WUSH_CUDA_HOST_EMULATION)
    std::uint8_t* smem = wush_emu::dynamic_smem();
#else
    extern __shared__ __align__(16) std::uint8_t smem[];
#endif
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int gid = lane >> 2, t = lane & 3;
    const int wm = warp >> 2, wn = warp & 3;  // 2 x 4 warps of 64 x 32
    const int bm = blockIdx.y * BM, bn = blockIdx.x * BN;
    const long long kt_count = (p.k + BK - 1) / BK;
    const DoubledLut lut = doubled_lut(p.format);
    const bool fast = *p.flag == 0;  // no activation scale too large for the exact FMA conversion

    float acc[4][4][4];
    zero_warp_tile(acc);

    cp_async_main_loop<kStages, L::kStage>(
        smem, kt_count, [&](std::uint8_t* stage, long long kt) { load_stage<G>(p, stage, bm, bn, kt); },
        [&](const std::uint8_t* stage, long long kt) {
            const std::uint8_t* s_ac = stage + (wm * 64) * kRowBytes;
            const std::uint8_t* s_wc = stage + L::kCodes + (wn * 32) * kRowBytes;
            const float* s_as = reinterpret_cast<const float*>(stage + 2 * L::kCodes) + (wm * 64) * L::kSpr;
            const float* s_ws =
                reinterpret_cast<const float*>(stage + 2 * L::kCodes + L::kScales) + (wn * 32) * L::kSpr;
            const int groups_here = int(min((long long)L::kSpr, (p.k - kt * BK) / G));
#pragma unroll 1
            for (int g = 0; g < groups_here; ++g) {
                if (fast) group_step<G, true>(acc, lut, s_ac, s_wc, s_as, s_ws, g, gid, t);
                else group_step<G, false>(acc, lut, s_ac, s_wc, s_as, s_ws, g, gid, t);
            }
        });

    store_warp_tile(acc, p, bm, bn, wm, wn, lane,
                    [&](int col, float v) { return add_bias(p.bias, std::size_t(col), v); });
}

// Both operands' group scales as float32 (weight scales times alpha / 4), rows padded with zeros
// to `stride` groups; raises *flag when an activation scale is outside the exact range of
// tile::scaled_dot (|s| >= 2^100, or not finite): the tile kernel then promotes with FADD + FMUL + FFMA.
__global__ void prefill_scales_kernel(wush_format format, int m, int n, long long groups, long long stride,
                                      const std::uint8_t* a_scales, const std::uint8_t* w_scales, float alpha_q,
                                      float* out, int* flag) {
    const int sb = scale_bytes(format);
    const std::size_t total = std::size_t(m + (long long)n) * stride;
    for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
         i += std::size_t(gridDim.x) * blockDim.x) {
        const long long row = (long long)(i / stride), g = (long long)(i % stride);
        float v = 0.0f;
        if (g < groups) {
            if (row < m) {
                v = scale_value(format, a_scales + (row * groups + g) * sb);
                if (!(fabsf(v) < kScaledDotMaxScale)) *flag = 1;  // benign race: every writer writes 1
            } else {
                v = scale_value(format, w_scales + ((row - m) * groups + g) * sb) * alpha_q;
            }
        }
        out[i] = v;
    }
}

}  // namespace wush::cuda::prefill_detail
