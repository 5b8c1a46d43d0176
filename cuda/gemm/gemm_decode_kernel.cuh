// The decode kernel's device code (see cuda/gemm/gemm_decode.cu), in a header of its own so that the
// CPU emulation test (tests/unit/test_gemm_emulation.cpp) compiles the same source against
// tests/unit/cuda_host_emulation.h.
#pragma once

#include <cstdint>

#if !defined(WUSH_CUDA_HOST_EMULATION)
#  include <cuda_bf16.h>
#endif

#include "decode_group_dot.cuh"
#include "gemm_plan.h"
#include "output_bias.cuh"
#include "tile_decode.h"

namespace wush::cuda::decode_detail {

using namespace wush::tile;

constexpr int kThreads = plan::kDecodeWarps * 32;
constexpr int kChunk = int(plan::kDecodeChunk);
constexpr int kUnitsPerChunk = kChunk / 32;                     // one per lane
constexpr int kARowBytes = kChunk + (kUnitsPerChunk / 4) * 16;  // 16 bytes of padding per 4 units

struct DecodeParams : DecodeOperands {
    const std::uint8_t* w_codes;
    const std::uint8_t* w_scales;
    float* partial;       // splits x m x n, or null when the block writes y
    long long split_len;  // elements per split (a multiple of kChunk)
};

template <int MR, int G>
__global__ void __launch_bounds__(kThreads, 2) decode_gemm_kernel(const DecodeParams p) {
    constexpr int kGroupsPerUnit = 32 / G;
    constexpr int kGroupsPerChunk = kChunk / G;
    constexpr int R = plan::kDecodeRowsPerWarp;
    __shared__ __align__(16) std::uint8_t s_a[MR * kARowBytes];
    __shared__ float s_sa[MR * kGroupsPerChunk];

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const long long row_a0 = (long long)blockIdx.z * plan::kDecodeMaxM;
    const int rows_a = int(min((long long)MR, (long long)p.m - row_a0));
    const int n0 = blockIdx.x * plan::kDecodeRowsPerBlock + warp * R;
    const long long k0 = (long long)blockIdx.y * p.split_len;
    const long long k1 = min(p.k, k0 + p.split_len);
    const long long kbytes = p.k / 2, groups = p.k / G;
    const int sb = scale_bytes(p.format);
    const DoubledLut lut = doubled_lut(p.format);

    float acc[R][MR];
#pragma unroll
    for (int j = 0; j < R; ++j)
#pragma unroll
        for (int r = 0; r < MR; ++r) acc[j][r] = 0.0f;

    for (long long kc = k0; kc < k1; kc += kChunk) {
        // 1. The weight codes and scales (times alpha / 4, as in the prefill kernel) of this lane's
        // unit, issued before the staging below.
        const long long ue = kc + 32 * lane;
        const bool uvalid = ue < k1;
        uint4 wv[R];
        float sw[R][kGroupsPerUnit];
#pragma unroll
        for (int j = 0; j < R; ++j) {
            const int row = n0 + j;
            const bool valid = uvalid && row < p.n;
            wv[j] = valid ? __ldg(reinterpret_cast<const uint4*>(p.w_codes + (long long)row * kbytes + ue / 2))
                          : make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int h = 0; h < kGroupsPerUnit; ++h)
                sw[j][h] =
                    valid ? scale_value(p.format, p.w_scales + ((long long)row * groups + ue / G + h) * sb) * p.alpha_q
                          : 0.0f;
        }

        // 2. Stage the chunk's activations: doubled int8 codes and scales (zeros past
        // k1 and past the last row, so that padded lanes and rows add exact zeros).
        __syncthreads();
        stage_activation_chunk<MR, G, kChunk, kARowBytes, kThreads>(
            p, lut, row_a0, rows_a, kc, int(min((long long)kChunk, k1 - kc)), s_a, s_sa, tid);
        __syncthreads();

        // 3. Decode the weight words once, then one exact group dot per activation row.
        std::uint32_t wd[R][8];
#pragma unroll
        for (int j = 0; j < R; ++j) decode_unit(lut, wv[j], wd[j]);
        accumulate_group_dots<MR, R, G, kARowBytes, kGroupsPerChunk>(s_a, s_sa, lane, wd, sw, acc);
    }

    // 4. Warp reduction; lane 0 writes (y, or this split's partial).
    float* partial = p.partial ? p.partial + std::size_t(blockIdx.y) * std::size_t(p.m) * p.n : nullptr;
    write_warp_sums<R, MR>(acc, p, lane, row_a0, rows_a, n0, partial);
}

// y = sum over splits of the partials, in split order (+ the bias of column i % n).
__global__ void splitk_reduce_kernel(const float* partial, int splits, std::size_t mn, std::size_t n, void* y, int bf16,
                                     OutputBias bias) {
    for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < mn;
         i += std::size_t(gridDim.x) * blockDim.x) {
        float s = 0.0f;
        for (int sp = 0; sp < splits; ++sp) s += partial[std::size_t(sp) * mn + i];
        store_out(y, bf16, i, add_bias(bias, i % n, s));
    }
}

}  // namespace wush::cuda::decode_detail
