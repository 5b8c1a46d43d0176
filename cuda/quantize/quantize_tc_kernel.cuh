// The fused transform + quantization with the G x G product on tensor cores (sm_80+), for BF16 and
// F16 activations; device code in a header of its own so that the CPU emulation test
// (tests/unit/test_quantize_tc_emulation.cpp) runs the same source through
// tests/unit/cuda_host_emulation.h. F32 input, identity transforms and older GPUs keep the CUDA-core
// kernels (cuda/quantize/quantize_kernel.cuh); cuda/quantize/quantize_tc.cu says when this one is selected.
//
// The product: Y = X T^T by BF16 mma.sync.m16n8k16 with FP32 accumulation. T was split at prepare
// time into T_hi + T_mid + T_lo exactly (bf16_fragments.h) and laid out in B-fragment
// order; BF16 x goes into the A fragments as its own bits, F16 x as x_hi + x_lo (exact BF16
// parts). The passes are accumulated smallest first into one FP32 accumulator, and
// mma_error_bound.h bounds the result under a stated accumulator model.
//
// The rule that keeps the bytes the CPU's float64 definition's: per (token, group), the group's
// scale is certified from the FP32 values (formats::certify_scaling with that bound); if it is not,
// the whole warp recomputes the group in float64 (recompute_group). If it is, every element is
// certified on its own (formats::certify_element_grid: E2M1 by its integer grid, one rounding
// and one distance test); an element within its tolerance of a rounding
// boundary is recomputed in float64 by the lane that owns it and encoded under the certified
// scale (formats::encode_element): the scale is the float64 definition's, so the element's code is.
//
// Layout: a block = 4 warps, 32 tokens x 4 groups (the tile kernel's grid); a warp = one group x
// 32 tokens = 2 m-tiles of 16 tokens. In the MMA's C layout a lane holds, per m-tile, outputs
// 2 tig, 2 tig + 1 (+ 8 per n-tile) of tokens gid and gid + 8: a token's group lives in the 4 lanes
// of a quad, so its amax and sum of squares are two shuffles away.
#pragma once

#include <cstddef>
#include <cstdint>

#include "bf16_fragments.h"
#include "mma_error_bound.h"
#include "quantize_kernel.cuh"

namespace wush::cuda::quantize_detail {

// d += A B, m16n8k16, BF16 inputs, FP32 accumulator. (row0, col0): where the tile's outputs go in
// Y (tokens, columns), read only by the emulation's adversarial mode.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1,
                                         std::size_t row0, std::size_t col0) {
#if defined(WUSH_CUDA_HOST_EMULATION)
    wush_emu::mma_bf16(d, a, b0, b1, row0, col0);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    (void)row0;
    (void)col0;
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    (void)d, (void)a, (void)b0, (void)b1, (void)row0, (void)col0;  // never launched below sm_80
#endif
}

// Element (token, col) of x as its 16 bits (BF16 or F16), 0 past the last token.
__device__ __forceinline__ std::uint16_t x_bits(const QuantizeArgs& a, std::size_t token, std::size_t col) {
    if (token >= a.n_tokens) return 0;
    return static_cast<const std::uint16_t*>(a.x)[token * a.d_in + col];
}

// The float64 definition of output i of one (token, group): sum_j T[i][j] x_j, j ascending, in the
// owning lane (T transposed in global memory, as QuantizeArgs holds it).
__device__ __forceinline__ double element_f64(const QuantizeArgs& a, const float* t, int g, std::size_t token,
                                              std::size_t col0, int i) {
    double s = 0.0;
    for (int j = 0; j < g; ++j)
        s = fma(double(t[j * g + i]), double(load_element(a.x_dtype, a.x, token * a.d_in + col0 + std::size_t(j))), s);
    return s;
}

// kSplitX: x is F16 (split in two BF16 parts); else BF16. A template parameter, so that the BF16
// instantiation holds one set of A fragments in registers. At least 3 blocks per SM caps it at 170
// registers: with the bare block size, ptxas (CUDA 13, sm_90) held the BF16 MXFP4 and MXFP4_OCP
// instantiations at 96 registers and spilled 18-22 bytes; capped at 128 (4 blocks), 8 bytes. With
// this cap none spills (146-153 registers), which tests/cuda/check_ptxas.sh checks.
template <wush_format F, bool kSplitX>
__global__ void __launch_bounds__(kThreads, 3) quantize_tc_kernel(const QuantizeArgs a) {
#if defined(WUSH_CUDA_HOST_EMULATION) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800)
    constexpr int G = Fmt<F>::G, SB = Fmt<F>::SB, CB = Fmt<F>::kCodeBytes;
    constexpr int KS = tc::k_steps(G), NT = tc::n_tiles(G);
    __shared__ float xs_s[kWarps * 32];  // a recomputed group's inputs, per warp
    __shared__ double yd_s[kWarps * 32];

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int gid = lane >> 2, tig = lane & 3;
    const std::size_t groups_total = a.d_in / std::size_t(G);
    const std::size_t group = std::size_t(blockIdx.y) * kTileGroups + std::size_t(warp);
    if (group >= groups_total) return;  // whole warps; the kernel has no block barrier
    const std::size_t tok0 = std::size_t(blockIdx.x) * kTileTokens, col0 = group * std::size_t(G);
    const std::size_t m = a.use == MatrixUse::PerBlock ? group : 0;
    constexpr bool split_x = kSplitX;

    // A fragments (hi; lo for F16) and, per token slot s = (m-tile, row half), the lane's sum of
    // squares of x and whether it saw a NaN/Inf.
    std::uint32_t ahi[2][KS][4], alo[2][KS][4];
    float xss[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    bool bad[4] = {false, false, false, false};
#  pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#  pragma unroll
        for (int ks = 0; ks < KS; ++ks)
#  pragma unroll
            for (int r = 0; r < 4; ++r) {
                const int slot = mt * 2 + (r & 1);
                const std::size_t token = tok0 + std::size_t(mt * 16 + tc::a_row(lane, r));
                std::uint32_t hi = 0, lo = 0;
#  pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const std::size_t col = col0 + std::size_t(ks * 16 + tc::a_col(lane, r, h));
                    const std::uint16_t raw = x_bits(a, token, col);
                    const float v = split_x ? bits::f16_decode(raw) : bits::bf16_decode(raw);
                    if (!finite_f(v)) {
                        bad[slot] = true;
                        report_non_finite(a.non_finite, token, col);
                    }
                    xss[slot] = fmaf(v, v, xss[slot]);
                    // BF16 goes in as it is; F16 as its two exact BF16 parts.
                    const std::uint16_t vh = split_x ? tc::bf16_rne(v) : raw;
                    hi |= std::uint32_t(vh) << (16 * h);
                    if (split_x) lo |= std::uint32_t(tc::bf16_rne(v - tc::bf16_value(vh))) << (16 * h);
                }
                ahi[mt][ks][r] = hi;
                alo[mt][ks][r] = lo;
            }

    // The product, passes smallest first: (x_lo,) then x_hi; within each T_lo, T_mid, T_hi.
    float acc[2][NT][4];
#  pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#  pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#  pragma unroll
            for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.0f;
    const std::uint32_t* frag = a.tc_fragments + m * tc::fragment_words(G);
#  pragma unroll
    for (int q = 0; q < 2; ++q) {  // unrolled, so that the fragments stay in registers
        if (q == 0 && !split_x) continue;
#  pragma unroll
        for (int p = 0; p < tc::kParts; ++p)
#  pragma unroll
            for (int ks = 0; ks < KS; ++ks) {
                std::uint32_t b[NT][2];
                const uint4* src = reinterpret_cast<const uint4*>(frag + tc::fragment_index(G, p, ks, lane, 0, 0));
#  pragma unroll
                for (int v = 0; v < NT / 2; ++v) {
                    const uint4 w = __ldg(src + v);
                    b[2 * v][0] = w.x;
                    b[2 * v][1] = w.y;
                    b[2 * v + 1][0] = w.z;
                    b[2 * v + 1][1] = w.w;
                }
#  pragma unroll
                for (int mt = 0; mt < 2; ++mt)
#  pragma unroll
                    for (int nt = 0; nt < NT; ++nt)
                        mma_bf16(acc[mt][nt], q == 0 ? alo[mt][ks] : ahi[mt][ks], b[nt][0], b[nt][1],
                                 tok0 + std::size_t(mt * 16), col0 + std::size_t(nt * 8));
            }
    }

    // Certification, per token slot. The quad's 4 lanes hold the same token: reduce over them. A
    // certified slot's codes (byte nt: elements nt * 8 + 2 tig, + 1) and scale are kept in registers
    // until the elements near a rounding boundary have been recomputed below.
    const float* t = a.matrices + m * std::size_t(G * G);
    const tc::PartNorms norms = a.tc_norms[m];
    bool regroup[4] = {false, false, false, false};
    bool certified[4] = {false, false, false, false};
    std::uint32_t words[4] = {0u, 0u, 0u, 0u};
    std::uint8_t scales[4][2] = {{0, 0}, {0, 0}, {0, 0}, {0, 0}};
    std::uint32_t near_mask = 0u;  // bit slot * 8 + nt * 2 + e: that element is recomputed in float64
#  pragma unroll
    for (int slot = 0; slot < 4; ++slot) {
        const int mt = slot >> 1, half = slot & 1;
        const std::size_t token = tok0 + std::size_t(mt * 16 + gid + 8 * half);
        const unsigned quad_bad = (__ballot_sync(kFullWarp, bad[slot]) >> (lane & ~3)) & 0xFu;
        float ss = xss[slot];
        ss += __shfl_xor_sync(kFullWarp, ss, 1);
        ss += __shfl_xor_sync(kFullWarp, ss, 2);
        float amax = 0.0f, yss = 0.0f;
#  pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#  pragma unroll
            for (int e = 0; e < 2; ++e) {
                const float y = acc[mt][nt][2 * half + e];
                amax = fmaxf(amax, fabsf(y));
                yss = fmaf(y, y, yss);
            }
        amax = fmaxf(amax, __shfl_xor_sync(kFullWarp, amax, 1));
        amax = fmaxf(amax, __shfl_xor_sync(kFullWarp, amax, 2));
        yss += __shfl_xor_sync(kFullWarp, yss, 1);
        yss += __shfl_xor_sync(kFullWarp, yss, 2);
        if (token >= a.n_tokens || quad_bad != 0u) continue;  // nothing written (NON_FINITE reported)
        const float x_norm = ss <= 0x1p126f ? sqrtf(ss) : INFINITY;
        const float bound = tc::split_product_error_bound(norms, x_norm, split_x, G, a.tc_bound_scale);
        formats::certify_detail::GroupScaling sc;
        if (!formats::certify_scaling(F, amax, yss, G, bound, sc)) {
            regroup[slot] = true;
            continue;
        }
        certified[slot] = true;
        scales[slot][0] = sc.scale[0];
        scales[slot][1] = sc.scale[1];
#  pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#  pragma unroll
            for (int e = 0; e < 2; ++e) {
                bool near = false;
                const std::uint8_t code = formats::certify_element_grid(F, acc[mt][nt][2 * half + e], sc, near);
                words[slot] |= std::uint32_t(code) << (8 * nt + 4 * e);
                if (near) near_mask |= 1u << (slot * 8 + nt * 2 + e);
            }
    }

    // Elements within their tolerance of a rounding boundary: recomputed in float64 by the lane that
    // owns them and encoded under the certified scale, which is the float64 definition's. One call
    // site for every slot and element, so the float64 loop is compiled once, not once per element.
    while (near_mask != 0u) {
        const int bit = __ffs(int(near_mask)) - 1;
        near_mask &= near_mask - 1u;
        const int slot = bit >> 3, nt = (bit >> 1) & 3, e = bit & 1;
        const std::size_t token = tok0 + std::size_t((slot >> 1) * 16 + gid + 8 * (slot & 1));
        std::uint8_t scale[2] = {0, 0};
#  pragma unroll
        for (int s = 0; s < 4; ++s)  // selects, not an indexed register array (no local memory)
            if (s == slot) scale[0] = scales[s][0], scale[1] = scales[s][1];
        const std::uint32_t code =
            formats::encode_element(F, element_f64(a, t, G, token, col0, nt * 8 + 2 * tig + e), scale);
        const int shift = 8 * nt + 4 * e;
#  pragma unroll
        for (int s = 0; s < 4; ++s)
            if (s == slot) words[s] = (words[s] & ~(0xFu << shift)) | (code << shift);
    }
#  pragma unroll
    for (int slot = 0; slot < 4; ++slot) {
        if (!certified[slot]) continue;
        const std::size_t token = tok0 + std::size_t((slot >> 1) * 16 + gid + 8 * (slot & 1));
        std::uint8_t* dst = a.codes + token * (a.d_in / 2) + group * CB;
#  pragma unroll
        for (int nt = 0; nt < NT; ++nt) dst[nt * 4 + tig] = std::uint8_t(words[slot] >> (8 * nt));
        if (tig == 0) store_scale(a.scales + (token * groups_total + group) * SB, scales[slot], SB);
    }

    // Groups whose scale was not certified: the whole warp recomputes them in float64, one by one.
#  pragma unroll
    for (int slot = 0; slot < 4; ++slot) {
        unsigned pending = __ballot_sync(kFullWarp, regroup[slot] && tig == 0);
        while (pending != 0u) {
            const int owner = __ffs(int(pending)) - 1;
            pending &= pending - 1u;
            const std::size_t token = tok0 + std::size_t((slot >> 1) * 16 + (owner >> 2) + 8 * (slot & 1));
            float* xs = xs_s + warp * 32;
            if (lane < G) xs[lane] = load_element(a.x_dtype, a.x, token * a.d_in + col0 + std::size_t(lane));
            __syncwarp();
            std::uint8_t codes[CB];
            std::uint8_t scale[2] = {0, 0};
            recompute_group<F>(xs, t, 1, G, false, yd_s + warp * 32, lane, codes, scale);
            if (lane == 0) {
                std::uint8_t* dst = a.codes + token * (a.d_in / 2) + group * CB;
#  pragma unroll
                for (int b = 0; b < CB; ++b) dst[b] = codes[b];
                store_scale(a.scales + (token * groups_total + group) * SB, scale, SB);
            }
        }
    }
#endif
}

}  // namespace wush::cuda::quantize_detail
