// The lane maps that every mma.sync m16n8kK shape shares, whatever its element type (PTX ISA,
// "Matrix fragments for mma.m16n8k16 / m16n8k32"; gid = lane / 4, tig = lane % 4): A's row, B's
// column, and the C / D accumulators' row and column. The maps that depend on the element width
// (A's column, B's row) stay with their operand type: tc:: in quantize/bf16_fragments.h (BF16),
// tile:: in gemm/tile_decode.h (int8). One definition, used by both kernel families.
#pragma once

#include "common/host_device.h"

namespace wush::mma {

// A (16 x K, row-major): register r's row.
WUSH_HD int a_row(int lane, int reg) {
    return (lane >> 2) + 8 * (reg & 1);
}
// B (K x 8, column-major): every register's column.
WUSH_HD int b_col(int lane) {
    return lane >> 2;
}
// C / D (16 x 8): element i's row and column.
WUSH_HD int c_row(int lane, int i) {
    return (lane >> 2) + 8 * (i >> 1);
}
WUSH_HD int c_col(int lane, int i) {
    return 2 * (lane & 3) + (i & 1);
}

}  // namespace wush::mma
