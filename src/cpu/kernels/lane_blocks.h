// The quantization kernels' lanes = blocks tiles (one token, a block per lane): what the AVX2 and
// AVX-512 files share. Functions here are `static`: each kernel file, compiled with its own
// target flags, gets a private copy (kernels.h says why).
#pragma once

#include <cstddef>
#include <cstdint>

#include "cpu/kernels/kernels.h"

namespace wush::cpu {

// Prefetches `bytes` from p (whole lines) into every cache level (nothing for nullptr).
static inline void prefetch_bytes(const void* p, int bytes) {
    if (p == nullptr) return;
    for (int line = 0; line < bytes; line += 64) __builtin_prefetch(static_cast<const char*>(p) + line, 0, 3);
}

// Prefetches row `row` of a G x G float matrix.
template <int G>
static inline void prefetch_row(const float* matrix, int row) {
    prefetch_bytes(matrix == nullptr ? nullptr : matrix + row * G, G * 4);
}

// Prefetches row `row` of a G x G matrix given as bf16 pairs (G / 2 words a row).
template <int G>
static inline void prefetch_pairs_row(const std::uint32_t* pairs, int row) {
    prefetch_bytes(pairs == nullptr ? nullptr : pairs + row * (G / 2), G * 2);
}

// The matrix that lane `lane` multiplies, and the one to prefetch meanwhile: kMatrixPrefetchBlocks
// blocks ahead, or none for a shared matrix (which stays in L1). Where the tile gives the row-norm
// bounds (tile.row_norms: one per block, or the shared matrix's), writes the lane's into *norm and
// sets `given`; else the kernel computes it while it multiplies. With the tile's bf16 pairs
// (QuantTile::pairs), `pairs` / `pairs_ahead` are the same matrices as pairs (half the bytes: the
// kernel reads those instead; the tile then gives the norms).
struct LaneMatrix {
    const float* t;
    const float* ahead;
    const std::uint32_t* pairs;
    const std::uint32_t* pairs_ahead;
    bool given;
};
static inline LaneMatrix lane_matrix(const QuantTile& tile, int lane, float* norm) {
    const std::size_t stride = tile.matrix_stride, step = std::size_t(lane) * stride;
    const float* t = tile.matrix + step;
    const bool given = tile.row_norms != nullptr;
    if (given) *norm = tile.row_norms[stride != 0 ? lane : 0];
    const std::uint32_t* pairs = tile.pairs == nullptr ? nullptr : tile.pairs + step / 2;
    const std::size_t ahead = kMatrixPrefetchBlocks * stride;
    return {t, stride != 0 ? t + ahead : nullptr, pairs, stride != 0 && pairs ? pairs + ahead / 2 : nullptr, given};
}

}  // namespace wush::cpu
