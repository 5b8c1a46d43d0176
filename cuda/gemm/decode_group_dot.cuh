// What the two decode kernels (cuda/gemm/gemm_decode_kernel.cuh and the streaming one,
// cuda/gemm/stream_decode_kernel.cuh) share, so that they sum the same terms in the same order and
// write the same bits: the staging of a chunk's activations as doubled int8 values and scales, the
// decode of a lane's 32-element unit of weight codes, the inner product (that unit of R weight
// rows times every staged activation row, one exact integer group dot per group, dp4a from the
// promotion constant, scaled in float32), and the tail (the warp's sums, written to y or to a
// split's partial). Where the kernels differ (where the weights come from: global memory or the
// cp.async ring; how splits are summed) stays in each kernel.
#pragma once

#include <cstddef>
#include <cstdint>

#include "output_bias.cuh"
#include "tile_decode.h"

namespace wush::cuda {

// The operands both decode kernels read alike (their parameters, DecodeParams and StreamParams,
// add where the weights and the split partials are), filled from the launch's GemmArgs by
// fill_decode_operands (gemm/w4a4_gemm.h).
struct DecodeOperands {
    wush_format format;
    int m, n;
    long long k;
    const std::uint8_t* a_codes;
    const std::uint8_t* a_scales;
    float alpha_q;  // alpha / 4 (doubled values on both sides)
    void* y;
    int y_bf16;
    OutputBias bias;  // added where y is written (the kernel, the split-K reduction or the last split)
};

// Byte offset of unit u's 32 int8 values inside a staged activation row: 16 bytes of padding after
// every 4 units make a quarter-warp's 16-byte reads (8 lanes, 32 bytes apart) hit 32 distinct banks.
__device__ __forceinline__ int a_unit_offset(int u) {
    return u * 32 + (u >> 2) * 16;
}

// Stages rows row0 .. row0 + rows - 1 of p's activations (rows <= MR), the chunk of elements
// kc .. kc + len - 1: their codes as doubled int8 values into s_a (MR rows of kARowBytes, units
// laid out by a_unit_offset) and their group scales into s_sa (MR x kChunk / G), zeros past len
// and past the last row, so that padded lanes and rows add exact zeros.
template <int MR, int G, int kChunk, int kARowBytes, int kThreads>
__device__ __forceinline__ void stage_activation_chunk(const DecodeOperands& p, const tile::DoubledLut& lut,
                                                       long long row0, int rows, long long kc, int len,
                                                       std::uint8_t* s_a, float* s_sa, int tid) {
    constexpr int kGroupsPerChunk = kChunk / G;
    const long long kbytes = p.k / 2, groups = p.k / G;
    const int sb = tile::scale_bytes(p.format);
    for (int idx = tid; idx < MR * (kChunk / 8); idx += kThreads) {
        const int r = idx / (kChunk / 8), w = idx % (kChunk / 8), e = 8 * w;
        uint2 v = make_uint2(0, 0);
        if (r < rows && e < len) {
            const std::uint32_t c =
                __ldg(reinterpret_cast<const unsigned*>(p.a_codes + (row0 + r) * kbytes + (kc + e) / 2));
            v.x = tile::decode4(lut, c);
            v.y = tile::decode4(lut, c >> 16);
        }
        *reinterpret_cast<uint2*>(s_a + r * kARowBytes + a_unit_offset(w >> 2) + (w & 3) * 8) = v;
    }
    for (int idx = tid; idx < MR * kGroupsPerChunk; idx += kThreads) {
        const int r = idx / kGroupsPerChunk, g = idx % kGroupsPerChunk;
        float s = 0.0f;
        if (r < rows && g * G < len)
            s = tile::scale_value(p.format, p.a_scales + ((row0 + r) * groups + kc / G + g) * sb);
        s_sa[idx] = s;
    }
}

// A lane's unit of 32 weight codes (16 bytes) as doubled int8 values: 4 per 32-bit word.
__device__ __forceinline__ void decode_unit(const tile::DoubledLut& lut, const uint4& wv, std::uint32_t (&wd)[8]) {
    const std::uint32_t words[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        wd[2 * i] = tile::decode4(lut, words[i]);
        wd[2 * i + 1] = tile::decode4(lut, words[i] >> 16);
    }
}

// acc[j][r] += sum over the unit's groups h of dot(a_r, w_j)_h * scale_a(r, h) * sw[j][h].
// s_a: MR staged rows of kARowBytes; s_sa: MR x kGroupsPerChunk activation scales.
template <int MR, int R, int G, int kARowBytes, int kGroupsPerChunk>
__device__ __forceinline__ void accumulate_group_dots(const std::uint8_t* s_a, const float* s_sa, int lane,
                                                      const std::uint32_t (&wd)[R][8], const float (&sw)[R][32 / G],
                                                      float (&acc)[R][MR]) {
    constexpr int kGroupsPerUnit = 32 / G;
#pragma unroll
    for (int r = 0; r < MR; ++r) {
        const uint4* ap = reinterpret_cast<const uint4*>(s_a + r * kARowBytes + a_unit_offset(lane));
        const uint4 a0 = ap[0], a1 = ap[1];
        const std::uint32_t av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
#pragma unroll
        for (int h = 0; h < kGroupsPerUnit; ++h) {
            const float sa = s_sa[r * kGroupsPerChunk + lane * kGroupsPerUnit + h];
#pragma unroll
            for (int j = 0; j < R; ++j) {
                int d = tile::kPromoteMagicBits;
#pragma unroll
                for (int i = 0; i < 8 / kGroupsPerUnit; ++i)
                    d = tile::dp4a(av[h * (8 / kGroupsPerUnit) + i], wd[j][h * (8 / kGroupsPerUnit) + i], d);
                acc[j][r] = fmaf(tile::promoted_dot(d), sa * sw[j][h], acc[j][r]);
            }
        }
    }
}

// The tail of a unit of work: each warp sums its lanes' acc[j][r] (the same butterfly in both
// kernels) and lane 0 writes row row0 + r (r < rows), column col0 + j (< p.n): into `partial`
// (this split's m x n slice) when there is one, else into y with the bias. acc is zeroed for the
// next unit of work. p and rows by reference: the streaming kernel passes p.m as rows, which then
// stays a parameter load instead of a register held across the unrolled loop (12 registers at
// MR = 32 on sm_90).
template <int R, int MR>
__device__ __forceinline__ void write_warp_sums(float (&acc)[R][MR], const DecodeOperands& p, int lane, long long row0,
                                                const int& rows, long long col0, float* partial) {
#pragma unroll
    for (int j = 0; j < R; ++j) {
#pragma unroll
        for (int r = 0; r < MR; ++r) {
            float v = acc[j][r];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
            acc[j][r] = 0.0f;
            const long long col = col0 + j;
            if (lane == 0 && r < rows && col < p.n) {
                const std::size_t idx = std::size_t(row0 + r) * p.n + std::size_t(col);
                if (partial) partial[idx] = v;
                else store_out(p.y, p.y_bf16, idx, add_bias(p.bias, std::size_t(col), v));
            }
        }
    }
}

}  // namespace wush::cuda
