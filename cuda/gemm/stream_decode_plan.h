// The streaming decode kernel's host side (cuda/gemm/stream_decode.cu): the prepare-time layout of the
// weight, the schedule of its persistent blocks, its shared-memory budget and the opt-in switch.
// Plain C++ (no CUDA headers), so that the CPU tests (tests/unit/test_stream_decode.cpp) check the
// layout, the partition and the sizes without a device.
//
// Layout ("stages"): the weight is cut into tiles of 16 rows (the existing decode kernel's block
// rows, plan::kDecodeRowsPerBlock) and chunks of 1024 elements. Stage (tile, chunk) is one
// contiguous run of bytes, in the order the kernel's threads consume it:
//   codes:  16 rows x 32 units x 16 bytes; tile row t = 2 * warp + j, unit = lane: the 16 bytes a
//           lane loads with one LDS.128 are exactly its fragment (32 codes of row t, elements
//           32 * lane .. 32 * lane + 31 of the chunk, packed as in wush_quantize_rows);
//   scales: 16 rows x 32 units x unit_scale_bytes: the group scale bytes of the same units, in the
//           same order (a row's chunk scales, as stored, one row after another).
// Rows past n and units past k are zero bytes (the kernel masks them as the existing one does).
// Stages are stored tile-major (tile * chunks + chunk), so a split of one tile is one contiguous run.
//
// Schedule: work item i = (tile i / splits, split i % splits); block b of a persistent grid of P
// blocks takes items b, b + P, b + 2P, ... and streams all of their stages through one ring,
// whatever P is. The k partition is the persistent grid's own (split_plan): about one work item
// per resident block of an H100 or H200 (132 SMs), a fixed number, so that the partition, and
// with it the summation order and the bits, depend on the shape only, never on the GPU. Per split
// the arithmetic is the existing decode kernel's, so that kernel run with this partition
// (launch_decode_gemm_split) gives the same bits: the reference the tests compare with.
//
// Activations: where the block's share fits (resident_chunks), a work item's activations are
// decoded into shared memory once, at its start, and kept while the block's next item has the same
// k range (always, without split-K); else one chunk per stage, as the decode kernel does. The bits
// are the same either way.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gemm_plan.h"
#include "wush/wush.h"

namespace wush::cuda::stream {

constexpr int kWarps = plan::kDecodeWarps;                         // 8
constexpr int kThreads = kWarps * 32;                              // 256
constexpr int kRowsPerWarp = plan::kDecodeRowsPerWarp;             // 2
constexpr int kTileRows = plan::kDecodeRowsPerBlock;               // 16
constexpr int kChunk = int(plan::kDecodeChunk);                    // 1024 elements per stage
constexpr int kUnitsPerRow = kChunk / 32;                          // 32: one per lane
constexpr int kCodeStageBytes = kTileRows * kChunk / 2;            // 8192
constexpr int kStages = 8;                                         // the ring's depth
constexpr int kMaxRows = 32;                                       // activation rows of one pass (m <= 32)
constexpr int kMaxScaleStageBytes = kTileRows * kUnitsPerRow * 2;  // 1024 (NVFP4, INT4)
constexpr int kSlotBytes = kCodeStageBytes + kMaxScaleStageBytes;  // one ring slot in shared memory
// Bytes of stages in flight per SM the design asks for (issue 41: 48-64 KB); checked from the
// compiled kernels' occupancy by tests/cuda/check_ptxas.sh.
constexpr int kInFlightBudgetBytes = 48 * 1024;

inline int group_of(wush_format f) {
    return f == WUSH_FORMAT_NVFP4 ? 16 : 32;
}
inline int scale_bytes_of(wush_format f) {
    return f == WUSH_FORMAT_INT4 ? 2 : 1;
}
// Scale bytes of one lane's 32-element unit: 1 (MXFP4, OCP), 2 (NVFP4: two groups; INT4: BF16).
inline int unit_scale_bytes(wush_format f) {
    return 32 / group_of(f) * scale_bytes_of(f);
}
inline int scale_stage_bytes(wush_format f) {
    return kTileRows * kUnitsPerRow * unit_scale_bytes(f);
}
// Bytes of one stage in global memory (a multiple of 16: copied with 16-byte cp.async).
inline int stage_bytes(wush_format f) {
    return kCodeStageBytes + scale_stage_bytes(f);
}

struct Layout {
    std::size_t tiles = 0, chunks = 0;
    int stage_bytes = 0;
    std::size_t bytes() const { return tiles * chunks * std::size_t(stage_bytes); }
    std::size_t stage_offset(std::size_t tile, std::size_t chunk) const {
        return (tile * chunks + chunk) * std::size_t(stage_bytes);
    }
};

inline Layout layout_of(wush_format f, std::size_t n, std::size_t k) {
    return Layout{plan::ceil_div(n, kTileRows), plan::ceil_div(k, kChunk), stage_bytes(f)};
}

// Where byte `b` (0 <= b < k / 2) of row `row`'s codes lies in the staged buffer, and where scale
// byte `s` (0 <= s < k / G * scale bytes) of that row lies.
inline std::size_t staged_code_offset(const Layout& l, std::size_t row, std::size_t b) {
    const std::size_t chunk = b / (kChunk / 2), in = b % (kChunk / 2);
    return l.stage_offset(row / kTileRows, chunk) + (row % kTileRows) * (kChunk / 2) + in;
}
inline std::size_t staged_scale_offset(wush_format f, const Layout& l, std::size_t row, std::size_t s) {
    const std::size_t per_chunk = std::size_t(kUnitsPerRow * unit_scale_bytes(f));
    const std::size_t chunk = s / per_chunk, in = s % per_chunk;
    return l.stage_offset(row / kTileRows, chunk) + kCodeStageBytes + (row % kTileRows) * per_chunk + in;
}

// Visits every (staged offset, packed offset, length) run of codes and of scales of a weight of n
// rows and k elements (k a multiple of 32): one run per row and chunk for each.
template <class Codes, class Scales>
void for_each_run(wush_format f, std::size_t n, std::size_t k, const Codes& run_codes, const Scales& run_scales) {
    const Layout l = layout_of(f, n, k);
    const std::size_t row_bytes = k / 2, row_scales = k / group_of(f) * scale_bytes_of(f);
    const std::size_t chunk_scales = std::size_t(kUnitsPerRow * unit_scale_bytes(f));
    for (std::size_t row = 0; row < n; ++row)
        for (std::size_t c = 0; c < l.chunks; ++c) {
            const std::size_t b0 = c * (kChunk / 2), s0 = c * chunk_scales;
            run_codes(staged_code_offset(l, row, b0), row * row_bytes + b0,
                      std::min(row_bytes - b0, std::size_t(kChunk / 2)));
            run_scales(staged_scale_offset(f, l, row, s0), row * row_scales + s0,
                       std::min(row_scales - s0, chunk_scales));
        }
}

// The staged copy of a packed weight (n rows of k / 2 code bytes and k / G scales; k a multiple of
// 32). Done once, at prepare time, on the host.
inline std::vector<std::uint8_t> stage_weights(wush_format f, std::size_t n, std::size_t k, const std::uint8_t* codes,
                                               const std::uint8_t* scales) {
    std::vector<std::uint8_t> out(layout_of(f, n, k).bytes(), 0);
    for_each_run(
        f, n, k, [&](std::size_t to, std::size_t from, std::size_t len) { std::memcpy(&out[to], codes + from, len); },
        [&](std::size_t to, std::size_t from, std::size_t len) { std::memcpy(&out[to], scales + from, len); });
    return out;
}

// Its inverse (for the round-trip test): the packed codes and scales back from the staged copy.
inline void unstage_weights(wush_format f, std::size_t n, std::size_t k, const std::uint8_t* staged,
                            std::uint8_t* codes, std::uint8_t* scales) {
    for_each_run(
        f, n, k,
        [&](std::size_t to, std::size_t from, std::size_t len) { std::memcpy(codes + from, staged + to, len); },
        [&](std::size_t to, std::size_t from, std::size_t len) { std::memcpy(scales + from, staged + to, len); });
}

// ---- schedule --------------------------------------------------------------------------------

struct Schedule {
    std::size_t tiles = 0, chunks = 0;
    std::size_t splits = 1, chunks_per_split = 1;  // split_plan's partition of k
    std::size_t items = 0;                         // tiles x splits
    int mr = 1;                                    // activation rows of the template: 1, 2, 4, 8, 16, 32
};

inline int stream_mr(std::size_t m) {
    int mr = 1;
    while (std::size_t(mr) < m && mr < kMaxRows) mr *= 2;
    return mr;
}

// Resident blocks per SM the kernel is built for (its launch bounds) and the work items the split
// rule aims for: one per resident block of a 132-SM GPU (H100 SXM, H200). Constants, not the
// device's figures: the partition must not depend on the GPU.
constexpr int blocks_per_sm_bound(int mr) {
    return mr <= 8 ? 2 : 1;
}
constexpr std::size_t kTargetSms = 132;
inline std::size_t target_items(int mr) {
    return kTargetSms * std::size_t(blocks_per_sm_bound(mr));
}

// The persistent grid's partition of k: splits so that tiles x splits stays within one item per
// target slot (so one round of items, not a round and a fraction), never more splits than chunks,
// no empty split; one split where the tiles alone fill the slots. The decode kernel's own rule
// (plan::plan_decode) aims at 528 short-lived blocks instead and stays its default.
inline plan::DecodePlan split_plan(std::size_t m, std::size_t n, std::size_t k) {
    const plan::DecodePlan p = plan::plan_decode(m, n, k);  // tiles, chunks, row passes of the decode kernel
    const std::size_t want = std::clamp<std::size_t>(target_items(stream_mr(m)) / p.blocks_n, 1, p.chunks);
    return plan::with_chunks_per_split(p, plan::ceil_div(p.chunks, want));
}

inline Schedule schedule_of(std::size_t m, std::size_t n, std::size_t k) {
    const plan::DecodePlan p = split_plan(m, n, k);
    Schedule s;
    s.tiles = p.blocks_n;
    s.chunks = p.chunks;
    s.splits = p.splits;
    s.chunks_per_split = p.chunks_per_split;
    s.items = s.tiles * s.splits;
    s.mr = stream_mr(m);
    return s;
}

// Chunks [*c0, *c1) of work item `item`.
inline void item_chunks(const Schedule& s, std::size_t item, std::size_t* c0, std::size_t* c1) {
    const std::size_t split = item % s.splits;
    *c0 = split * s.chunks_per_split;
    *c1 = std::min(s.chunks, *c0 + s.chunks_per_split);
}

// Persistent blocks to launch: one per resident slot (SMs x blocks per SM), never more than items.
inline std::size_t grid_blocks(const Schedule& s, int sm_count, int blocks_per_sm) {
    const std::size_t slots =
        std::size_t(sm_count > 0 ? sm_count : 1) * std::size_t(blocks_per_sm > 0 ? blocks_per_sm : 1);
    return std::max<std::size_t>(1, std::min(s.items, slots));
}

// The per-tile arrival counters of a split-K launch.
inline std::size_t counter_bytes(std::size_t n) {
    return plan::ceil_div(n, kTileRows) * sizeof(unsigned);
}
// The split partials of a launch: splits x m x n float32 (nothing without split-K).
inline std::size_t partial_bytes(std::size_t m, std::size_t n, std::size_t k) {
    const Schedule s = schedule_of(m, n, k);
    return s.splits > 1 ? s.splits * m * n * sizeof(float) : 0;
}
// Workspace of one launch: the partials and, after them at a 256-byte boundary, the per-tile
// arrival counters, zeroed on the stream before the kernel (zero_stream_decode_counters). They
// live in the call's workspace, not in the layer, so that two forwards of one layer in flight at
// once (two streams, two graph instances), each with its own workspace, cannot count each other's
// arrivals. Nothing without split-K.
inline std::size_t counters_offset(std::size_t m, std::size_t n, std::size_t k) {
    return plan::ceil_div(partial_bytes(m, n, k), 256) * 256;
}
inline std::size_t workspace_bytes(std::size_t m, std::size_t n, std::size_t k) {
    return partial_bytes(m, n, k) > 0 ? counters_offset(m, n, k) + counter_bytes(n) : 0;
}

// ---- shared memory ---------------------------------------------------------------------------

// Activation row bytes of one chunk in shared memory (as the existing decode kernel: 16 bytes of
// padding per 4 units) and their float scales.
constexpr int kARowBytes = kChunk + (kUnitsPerRow / 4) * 16;
constexpr int activation_chunk_bytes(int mr, int group) {
    return mr * kARowBytes + mr * (kChunk / group) * 4;
}
// Shared memory a block may spend on resident activations: with the ring (about 74 KB) two blocks
// still fit in an SM of 228 KB (sm_90, sm_100); the launch checks the occupancy it keeps
// (StreamDecodeDevice), so a smaller SM simply stages per chunk.
constexpr int kResidentActivationBytes = 32 * 1024;

// Chunks of activations a block holds at once: a work item's whole k range where it fits the
// budget, else 1 (one chunk per stage).
inline int resident_chunks(const Schedule& s, int group) {
    const std::size_t span = s.chunks_per_split;
    return span > 1 && span * std::size_t(activation_chunk_bytes(s.mr, group)) <= std::size_t(kResidentActivationBytes)
               ? int(span)
               : 1;
}
// The most chunks resident_chunks can give for <mr, group> (0: none beyond one).
constexpr int max_resident_chunks(int mr, int group) {
    return kResidentActivationBytes / activation_chunk_bytes(mr, group);
}

// The dynamic shared memory of the <MR, G> instantiation holding `act_chunks` chunks of
// activations: the ring, the activations, their scales, one flag.
constexpr int smem_bytes(int mr, int group, int act_chunks = 1) {
    return kStages * kSlotBytes + act_chunks * activation_chunk_bytes(mr, group) + 16;
}

}  // namespace wush::cuda::stream
