// cuBLASLt's tiled layout of block-scaling factors (the "128x4" blocks of the cuBLAS
// documentation, 1D block scaling factors layout): plain WUSH_HD code, unit-tested on the CPU.
//
// A (rows x cols) scale matrix (rows = the outer dimension M or N, cols = K / block) is padded to
// multiples of 128 rows and 4 columns and stored as 128 x 4 tiles of 512 bytes, row-tile major.
// Inside a tile, row r (0..127) and column c (0..3) sit at (r % 32) * 16 + (r / 32) * 4 + c.
#pragma once

#include <cstddef>

#include "common/host_device.h"

namespace wush::cuda {

WUSH_HD std::size_t tiled_scale_offset(std::size_t row, std::size_t col, std::size_t cols) {
    const std::size_t col_tiles = (cols + 3) / 4;
    const std::size_t tile = (row / 128) * col_tiles + col / 4;
    const std::size_t r = row % 128;
    return tile * 512 + (r % 32) * 16 + (r / 32) * 4 + col % 4;
}

}  // namespace wush::cuda
