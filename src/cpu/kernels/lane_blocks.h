// The quantization kernels' lanes = blocks tiles (one token, a block per lane): what the AVX2 and
// AVX-512 files share. Functions here are `static`: each kernel file, compiled with its own
// target flags, gets a private copy (kernels.h says why).
#pragma once

#include <cstddef>

#include "cpu/kernels/kernels.h"

namespace wush::cpu {

// Prefetches row `row` of a G x G float matrix into every cache level (nothing for nullptr).
template <int G>
static inline void prefetch_row(const float* matrix, int row) {
    if (matrix == nullptr) return;
    const char* p = reinterpret_cast<const char*>(matrix + row * G);
    for (int line = 0; line < G * 4; line += 64) __builtin_prefetch(p + line, 0, 3);
}

// The matrix that lane `lane` multiplies, and the one to prefetch meanwhile: kMatrixPrefetchBlocks
// blocks ahead, or none for a shared matrix (which stays in L1). Where the tile gives the row-norm
// bounds (tile.row_norms: one per block, or the shared matrix's), writes the lane's into *norm and
// sets `given`; else the kernel computes it while it multiplies.
struct LaneMatrix {
    const float* t;
    const float* ahead;
    bool given;
};
static inline LaneMatrix lane_matrix(const QuantTile& tile, int lane, float* norm) {
    const float* t = tile.matrix + std::size_t(lane) * tile.matrix_stride;
    const bool given = tile.row_norms != nullptr;
    if (given) *norm = tile.row_norms[tile.matrix_stride != 0 ? lane : 0];
    return {t, tile.matrix_stride != 0 ? t + kMatrixPrefetchBlocks * tile.matrix_stride : nullptr, given};
}

}  // namespace wush::cpu
