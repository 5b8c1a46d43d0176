// The inner product of the two decode kernels (cuda/gemm/gemm_decode_kernel.cuh and the streaming one,
// cuda/gemm/stream_decode_kernel.cuh): one lane's 32-element unit of R weight rows, already decoded to
// doubled int8, times every staged activation row, one exact integer group dot (dp4a from the
// promotion constant) per group, scaled in float32. One definition, so that the two kernels sum
// the same terms in the same order and write the same bits.
#pragma once

#include <cstdint>

#include "tile_decode.h"

namespace wush::cuda {

// Byte offset of unit u's 32 int8 values inside a staged activation row: 16 bytes of padding after
// every 4 units make a quarter-warp's 16-byte reads (8 lanes, 32 bytes apart) hit 32 distinct banks.
__device__ __forceinline__ int a_unit_offset(int u) {
    return u * 32 + (u >> 2) * 16;
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

}  // namespace wush::cuda
