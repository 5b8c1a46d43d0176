// Launch geometry of the W4A4 GEMM kernels (cuda/gemm/gemm_decode.cu, cuda/gemm/gemm_prefill.cu), as plain
// host functions of the shape only (no device query), so that gemm_workspace_bytes() can answer
// without a device and the CPU test (tests/unit/test_tile_decode.cpp) can check the partitions.
#pragma once

#include <algorithm>
#include <cstddef>

namespace wush::cuda::plan {

// ---------------------------------------------------------------------------------------------
// Decode kernel (small m): 8 warps per block, each warp 2 weight rows; a lane owns one 32-element
// unit (16 code bytes, one uint4 load) per chunk of 1024 elements (one warp-wide pass).
// ---------------------------------------------------------------------------------------------
constexpr int kDecodeWarps = 8;
constexpr int kDecodeRowsPerWarp = 2;
constexpr int kDecodeRowsPerBlock = kDecodeWarps * kDecodeRowsPerWarp;  // 16 weight rows
constexpr int kDecodeMaxM = 16;                                         // activation rows per pass
constexpr std::size_t kDecodeChunk = 1024;                              // elements per chunk
constexpr std::size_t kUnit = 32;                                       // elements per lane load
// Blocks the split-K rule aims for: about 4 resident blocks on each of 132 SMs (H100 SXM); a
// fixed number, so that the partition (and the summation order) depends on the shape only.
constexpr std::size_t kDecodeTargetBlocks = 528;

inline std::size_t ceil_div(std::size_t a, std::size_t b) {
    return (a + b - 1) / b;
}

// Activation rows handled per pass, rounded up to 1, 2, 4, 8 or 16 (the kernel's template).
inline int decode_mr(std::size_t m) {
    const std::size_t r = std::min<std::size_t>(m, kDecodeMaxM);
    int mr = 1;
    while (std::size_t(mr) < r) mr *= 2;
    return mr;
}

struct DecodePlan {
    int mr = 1;                  // activation rows per pass (template parameter)
    std::size_t row_passes = 1;  // grid.z: ceil(m / 16) passes over the weights
    std::size_t blocks_n = 1;    // grid.x: ceil(n / 16)
    std::size_t chunks = 1;      // ceil(k / 1024)
    std::size_t chunks_per_split = 1;
    std::size_t splits = 1;  // grid.y; > 1 writes partials to the workspace
};

// `p` with k cut into splits of `chunks_per_split` chunks (clamped to 1..chunks), no empty split.
inline DecodePlan with_chunks_per_split(DecodePlan p, std::size_t chunks_per_split) {
    p.chunks_per_split = std::clamp<std::size_t>(chunks_per_split, 1, p.chunks);
    p.splits = ceil_div(p.chunks, p.chunks_per_split);
    return p;
}

inline DecodePlan plan_decode(std::size_t m, std::size_t n, std::size_t k) {
    DecodePlan p;
    p.mr = decode_mr(m);
    p.row_passes = std::max<std::size_t>(1, ceil_div(m, kDecodeMaxM));
    p.blocks_n = std::max<std::size_t>(1, ceil_div(n, kDecodeRowsPerBlock));
    p.chunks = std::max<std::size_t>(1, ceil_div(k, kDecodeChunk));
    const std::size_t blocks = p.blocks_n * p.row_passes;
    std::size_t want = blocks >= kDecodeTargetBlocks ? 1 : ceil_div(kDecodeTargetBlocks, blocks);
    want = std::min(want, p.chunks);
    return with_chunks_per_split(p, ceil_div(p.chunks, want));
}

// Element range [k0, k1) of split s.
inline void decode_split_range(const DecodePlan& p, std::size_t k, std::size_t s, std::size_t* k0, std::size_t* k1) {
    *k0 = std::min(k, s * p.chunks_per_split * kDecodeChunk);
    *k1 = std::min(k, (s + 1) * p.chunks_per_split * kDecodeChunk);
}

inline std::size_t decode_workspace_bytes(std::size_t m, std::size_t n, std::size_t k) {
    const DecodePlan p = plan_decode(m, n, k);
    return p.splits > 1 ? p.splits * m * n * sizeof(float) : 0;
}

// ---------------------------------------------------------------------------------------------
// Prefill kernel (large m): block tile 128 (activation rows) x 128 (weight rows) x 128 elements per
// stage, 8 warps as 2 x 4 of 64 x 32, 3 cp.async stages. The group scales are first decoded into
// float32 in the workspace (activation scales times alpha / 4), rows padded to a multiple of 4
// groups so that each stage's scales are one 16-byte copy per row (G = 32) or two (G = 16).
// ---------------------------------------------------------------------------------------------
constexpr int kPrefillBM = 128;
constexpr int kPrefillBN = 128;
constexpr int kPrefillBK = 128;  // elements per stage
constexpr int kPrefillStages = 3;
constexpr int kPrefillThreads = 256;

inline std::size_t prefill_scale_stride(std::size_t k, int group) {
    return ceil_div(ceil_div(k, std::size_t(group)), kPrefillBK / group) * (kPrefillBK / group);
}

// Workspace: (m + n) x stride float scales, then one int flag (tile::scaled_dot's range), 16 bytes.
inline std::size_t prefill_flag_offset(std::size_t m, std::size_t n, std::size_t k, int group) {
    return (m + n) * prefill_scale_stride(k, group) * sizeof(float);
}

inline std::size_t prefill_workspace_bytes(std::size_t m, std::size_t n, std::size_t k, int group) {
    return prefill_flag_offset(m, n, k, group) + 16;
}

}  // namespace wush::cuda::plan
