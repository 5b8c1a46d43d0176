// The streaming decode kernel's device code (cuda/gemm/stream_decode.cu), in a header of its own so
// that the CPU emulation test (tests/unit/test_stream_decode.cpp) runs the same source against
// tests/unit/cuda_host_emulation.h.
//
// Persistent blocks of 8 warps walk their work items (stream_decode_plan.h: a 16-row tile and one
// split of k) and stream every stage of them through one ring of kStages shared-memory slots filled
// by cp.async (evict-first: the weights are read once), kStages - 1 stages ahead, across item
// boundaries (launch bounds: 2 blocks per SM up to 8 activation rows, 1 above, where 128
// registers spilled). A work item's activations are staged once at its start where they fit
// (act_chunks > 1), else per stage. Per stage the arithmetic is the existing decode kernel's (cuda/gemm/gemm_decode_kernel.cuh)
// term for term: a lane's 16-byte fragment is one 32-element unit of one weight row, decoded once,
// then 8 dp4a per activation row and group promotion by one FADD + FMUL + FFMA, the same
// accumulation order per lane, the same warp reduction. Splits of a tile write partials to the
// workspace; the block that finishes a tile's last split (a counter per tile) sums them in split
// order, from 0, as the existing split-K reduce kernel does, and writes y: no second launch, and the
// same bits as the existing decode path run with the same partition, whatever the grid size.
#pragma once

#include <cstddef>
#include <cstdint>

#if !defined(WUSH_CUDA_HOST_EMULATION)
#  include <cuda_bf16.h>
#endif

#include "cp_async.cuh"
#include "decode_group_dot.cuh"
#include "output_bias.cuh"
#include "stream_decode_plan.h"
#include "tile_decode.h"

namespace wush::cuda::stream_detail {

using namespace wush::tile;
using namespace wush::cuda::stream;

struct StreamParams : DecodeOperands {
    const std::uint8_t* stages;  // the staged weight (stream::stage_weights)
    float* partial;              // splits x m x n (splits > 1)
    unsigned* counters;          // one per tile, in the launch's workspace, zeroed before it (splits > 1)
    int chunks, splits, chunks_per_split, stage_bytes;
    int act_chunks;   // chunks of activations in shared memory: chunks_per_split (resident), or 1
    long long items;  // tiles x splits
};

// A split's arrival at its tile's counter: atomic add at GPU scope with acquire-release semantics
// (one thread; the callers' barriers carry it to the block). Returns the count before it.
__device__ __forceinline__ unsigned arrive_acq_rel(unsigned* counter) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    unsigned old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;\n" : "=r"(old) : "l"(counter) : "memory");
    return old;
#else
    return atomicAdd(counter, 1u);  // older GPUs never run this kernel; the host emulation's lock
#endif
}

// Programmatic dependent launch: waits until the grid this one depends on (the quantize that
// wrote the activations) has completed and its writes are visible. Returns at once when the
// launch has no programmatic dependency; nothing before sm_90 (no griddepcontrol) and in the
// CPU emulation (one launch at a time).
__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// ---- asynchronous copies -----------------------------------------------------------------------

// An L2 policy that evicts the streamed weights first (they are read once per forward).
__device__ __forceinline__ std::uint64_t evict_first_policy() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    std::uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
    return policy;
#else
    return 0;
#endif
}

__device__ __forceinline__ void copy16_async(void* smem, const void* gmem, std::uint64_t policy) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "l"(policy));
#elif defined(__CUDA_ARCH__)
    (void)policy;  // no cp.async before sm_80 (the selection never picks this kernel there)
    *static_cast<uint4*>(smem) = *static_cast<const uint4*>(gmem);
#elif defined(WUSH_CUDA_HOST_EMULATION)
    (void)policy;
    wush_emu::copy16(smem, gmem, true);
#endif
}

// ---- the block's walk over its stages ----------------------------------------------------------

// Position in the block's sequence of stages: item, its current chunk and its chunk end.
struct Cursor {
    long long item;
    int chunk, end;
};

__device__ __forceinline__ Cursor cursor_at(const StreamParams& p, long long item) {
    Cursor c{item, 0, 0};
    if (item < p.items) {
        c.chunk = int(item % p.splits) * p.chunks_per_split;
        c.end = min(p.chunks, c.chunk + p.chunks_per_split);
    }
    return c;
}

__device__ __forceinline__ Cursor next_stage(const StreamParams& p, Cursor c) {
    if (++c.chunk < c.end) return c;
    return cursor_at(p, c.item + gridDim.x);
}

// Copies the stage at `c` into a ring slot: 16 bytes per thread and step, in order.
__device__ __forceinline__ void fetch_stage(const StreamParams& p, const Cursor& c, std::uint8_t* slot,
                                            std::uint64_t policy, int tid) {
    const long long tile = c.item / p.splits;
    const std::uint8_t* src = p.stages + (tile * p.chunks + c.chunk) * (long long)p.stage_bytes;
    for (int off = tid * 16; off < p.stage_bytes; off += kThreads * 16) copy16_async(slot + off, src + off, policy);
}

// The chunk's activations as doubled int8 values and scales, as the existing decode kernel stages
// them (zeros past k and past the last row), at place `j` of the block's activation buffer.
template <int MR, int G>
__device__ __forceinline__ void stage_activations(const StreamParams& p, long long kc, int j, std::uint8_t* s_a,
                                                  float* s_sa, const DoubledLut& lut, int tid) {
    stage_activation_chunk<MR, G, kChunk, kARowBytes, kThreads>(
        p, lut, 0, min(MR, p.m), kc, int(min((long long)kChunk, p.k - kc)), s_a + j * (MR * kARowBytes),
        s_sa + j * (MR * (kChunk / G)), tid);
}

// Makes the activations of the stage at `c` ready in shared memory and returns their place: per
// stage (act_chunks == 1), or the whole item's k range at its first stage, kept while the next
// item's range is the same (`*staged`: the first chunk held, -1 for none). The caller's barrier
// before this call has freed the buffer; the barrier here publishes what was staged. `c` is
// uniform across the block, so every thread takes the same branches.
template <int MR, int G>
__device__ __forceinline__ int ready_activations(const StreamParams& p, const Cursor& c, int* staged, std::uint8_t* s_a,
                                                 float* s_sa, const DoubledLut& lut, int tid) {
    if (p.act_chunks == 1) {
        stage_activations<MR, G>(p, (long long)c.chunk * kChunk, 0, s_a, s_sa, lut, tid);
        __syncthreads();
        return 0;
    }
    const int first = int(c.item % p.splits) * p.chunks_per_split;
    if (first != *staged) {
        for (int ch = first; ch < c.end; ++ch)
            stage_activations<MR, G>(p, (long long)ch * kChunk, ch - first, s_a, s_sa, lut, tid);
        *staged = first;
        __syncthreads();
    }
    return c.chunk - first;
}

// One stage: each lane's fragment of its warp's 2 rows, decoded once, times every activation row.
template <int MR, int G>
__device__ __forceinline__ void multiply_stage(const StreamParams& p, const std::uint8_t* slot, long long tile,
                                               long long kc, const std::uint8_t* s_a, const float* s_sa,
                                               const DoubledLut& lut, int warp, int lane,
                                               float (&acc)[kRowsPerWarp][MR]) {
    constexpr int kGroupsPerUnit = 32 / G;
    constexpr int kGroupsPerChunk = kChunk / G;
    constexpr int R = kRowsPerWarp;
    const int sb = scale_bytes(p.format), usb = kGroupsPerUnit * sb;
    const bool uvalid = kc + 32 * lane < p.k;
    std::uint32_t wd[R][8];
    float sw[R][kGroupsPerUnit];
#pragma unroll
    for (int j = 0; j < R; ++j) {
        const int t = warp * R + j;  // tile row
        const bool valid = uvalid && tile * kTileRows + t < p.n;
        const uint4 wv =
            valid ? *reinterpret_cast<const uint4*>(slot + (t * kUnitsPerRow + lane) * 16) : make_uint4(0, 0, 0, 0);
        const std::uint8_t* sc = slot + kCodeStageBytes + (t * kUnitsPerRow + lane) * usb;
#pragma unroll
        for (int h = 0; h < kGroupsPerUnit; ++h)
            sw[j][h] = valid ? scale_value(p.format, sc + h * sb) * p.alpha_q : 0.0f;
        decode_unit(lut, wv, wd[j]);
    }
    accumulate_group_dots<MR, R, G, kARowBytes, kGroupsPerChunk>(s_a, s_sa, lane, wd, sw, acc);
}

// The end of a work item: warp reduction; y directly (one split), or this split's partial, and
// the tile's last block sums the partials in split order and writes y.
template <int MR>
__device__ __forceinline__ void finish_item(const StreamParams& p, long long item, int* s_last, int tid, int warp,
                                            int lane, float (&acc)[kRowsPerWarp][MR]) {
    const long long tile = item / p.splits;
    const int split = int(item % p.splits);
    const std::size_t mn = std::size_t(p.m) * std::size_t(p.n);
    write_warp_sums<kRowsPerWarp, MR>(acc, p, lane, 0, p.m, tile * kTileRows + warp * kRowsPerWarp,
                                      p.splits > 1 ? p.partial + std::size_t(split) * mn : nullptr);
    if (p.splits == 1) return;
    // The barrier orders the block's partial stores before thread 0's arrival; the arrival is a
    // release (cumulative: it publishes what the barrier ordered before it) and an acquire (the last
    // arrival sees every other split's partials); the second barrier hands that to the block.
    __syncthreads();
    if (tid == 0) *s_last = arrive_acq_rel(&p.counters[tile]) == unsigned(p.splits - 1);
    __syncthreads();
    if (!*s_last) return;
    for (int o = tid; o < kTileRows * p.m; o += kThreads) {
        const int r = o / kTileRows;
        const long long col = tile * kTileRows + o % kTileRows;
        if (col >= p.n) continue;
        const std::size_t idx = std::size_t(r) * p.n + std::size_t(col);
        float s = 0.0f;
        for (int sp = 0; sp < p.splits; ++sp) s += __ldcg(p.partial + std::size_t(sp) * mn + idx);
        store_out(p.y, p.y_bf16, idx, add_bias(p.bias, std::size_t(col), s));
    }
}

template <int MR, int G>
__global__ void __launch_bounds__(kThreads, blocks_per_sm_bound(MR)) stream_decode_kernel(const StreamParams p) {
#if defined(WUSH_CUDA_HOST_EMULATION)
    std::uint8_t* smem = wush_emu::dynamic_smem();
#else
    extern __shared__ __align__(16) std::uint8_t smem[];
#endif
    std::uint8_t* ring = smem;
    std::uint8_t* s_a = smem + kStages * kSlotBytes;
    float* s_sa = reinterpret_cast<float*>(s_a + p.act_chunks * (MR * kARowBytes));
    int* s_last = reinterpret_cast<int*>(s_sa + p.act_chunks * (MR * (kChunk / G)));

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const DoubledLut lut = doubled_lut(p.format);
    const std::uint64_t policy = evict_first_policy();

    // Prologue: the first kStages - 1 stages in flight (one commit group each, empty past the end).
    Cursor fill = cursor_at(p, blockIdx.x), cur = fill;
    for (int s = 0; s < kStages - 1; ++s) {
        if (fill.item < p.items) {
            fetch_stage(p, fill, ring + s * kSlotBytes, policy, tid);
            fill = next_stage(p, fill);
        }
        cp_async_commit();
    }
    // Everything above reads only the staged weights (written at prepare time); the activations,
    // the split counters and y are touched only after the previous grid is done.
    wait_for_previous_grid();

    float acc[kRowsPerWarp][MR];
#pragma unroll
    for (int j = 0; j < kRowsPerWarp; ++j)
#pragma unroll
        for (int r = 0; r < MR; ++r) acc[j][r] = 0.0f;

    int staged = -1;
    for (int slot = 0; cur.item < p.items; slot = slot + 1 == kStages ? 0 : slot + 1) {
        cp_async_wait<kStages - 2>();  // this thread's copies of stage `cur` have landed
        __syncthreads();               // everyone's have, and the previous stage's slot and s_a are free
        if (fill.item < p.items) {
            fetch_stage(p, fill, ring + (slot == 0 ? kStages - 1 : slot - 1) * kSlotBytes, policy, tid);
            fill = next_stage(p, fill);
        }
        cp_async_commit();
        const long long tile = cur.item / p.splits, kc = (long long)cur.chunk * kChunk;
        const int j = ready_activations<MR, G>(p, cur, &staged, s_a, s_sa, lut, tid);
        multiply_stage<MR, G>(p, ring + slot * kSlotBytes, tile, kc, s_a + j * (MR * kARowBytes),
                              s_sa + j * (MR * (kChunk / G)), lut, warp, lane, acc);
        if (cur.chunk + 1 == cur.end) finish_item<MR>(p, cur.item, s_last, tid, warp, lane, acc);
        cur = next_stage(p, cur);
    }
    cp_async_wait<0>();
}

}  // namespace wush::cuda::stream_detail
