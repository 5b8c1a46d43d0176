// What the two prefill kernels share (cuda/gemm/gemm_prefill_kernel.cuh: INT8 MMAs on the decoded
// codes; cuda/gemm/gemm_bf16_prefill_kernel.cuh: BF16 MMAs on exact dequantized values): a block
// tile of 2 (m) x 4 (n) warp tiles, each 4 x 4 MMA tiles of 16 x 8, its k-loop over a ring of
// shared-memory stages filled by cp.async, and the epilogue that writes a warp tile's
// accumulators. What a stage holds and how it is multiplied stays in each kernel.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cp_async.cuh"
#include "mma_fragments.h"
#include "output_bias.cuh"

namespace wush::cuda {

// A warp tile's accumulators (4 x 4 MMA tiles of 4 floats per thread), zeroed.
__device__ __forceinline__ void zero_warp_tile(float (&acc)[4][4][4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
}

// The cp.async main loop over kt_count k-tiles through kStages stage slots of kStageBytes at smem:
// kStages - 1 tiles in flight before the first, then per tile one wait (this thread's copies of
// tile kt have landed), one barrier (everyone's have, and the slot the next load refills was
// consumed in the previous iteration), the load of tile kt + kStages - 1 (past the end an empty
// commit group, so the wait count stays right) and the compute on tile kt. load(stage, kt) issues
// the copies of tile kt into `stage`; compute(stage, kt) consumes it.
template <int kStages, int kStageBytes, class Load, class Compute>
__device__ __forceinline__ void cp_async_main_loop(std::uint8_t* smem, long long kt_count, Load&& load,
                                                   Compute&& compute) {
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
        if (s < kt_count) load(smem + s * kStageBytes, (long long)s);
        cp_async_commit();
    }
    for (long long kt = 0; kt < kt_count; ++kt) {
        cp_async_wait<kStages - 2>();
        __syncthreads();
        {
            const long long next = kt + kStages - 1;
            if (next < kt_count) load(smem + int(next % kStages) * kStageBytes, next);
            cp_async_commit();
        }
        compute(static_cast<const std::uint8_t*>(smem + int(kt % kStages) * kStageBytes), kt);
    }
    cp_async_wait<0>();
}

// The epilogue of warp tile (wm, wn) of block tile (bm, bn): every accumulator inside p.m x p.n,
// through value(col, acc) (the kernel's bias or alpha step), to p.y as float32 or BF16. The C
// fragment of each 16 x 8 tile: rows gid / gid + 8, columns 2 tig / 2 tig + 1. p (either kernel's
// parameters) by reference and the row as the kernels wrote it (bm + wm * 64 + ...): so the
// compiled code is the kernels' own loop, instruction for instruction (a by-value copy of p's
// fields, or a precomputed row0, compiled to a different schedule).
template <class Params, class Value>
__device__ __forceinline__ void store_warp_tile(const float (&acc)[4][4][4], const Params& p, int bm, int bn, int wm,
                                                int wn, int lane, Value&& value) {
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = bm + wm * 64 + mt * 16 + mma::c_row(lane, e);
                const int col = bn + wn * 32 + nt * 8 + mma::c_col(lane, e);
                if (row < p.m && col < p.n) {
                    const std::size_t idx = std::size_t(row) * p.n + col;
                    store_out(p.y, p.y_bf16, idx, value(col, acc[mt][nt][e]));
                }
            }
}

}  // namespace wush::cuda
