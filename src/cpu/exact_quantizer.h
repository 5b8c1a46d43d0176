// The float64 definition of the fused transform + quantization, one (token, block) at a time:
// y = T_b x_b computed in float64 (the identity takes x_b as it is), then the format's scale rule
// and RNE applied to the float64 values (include/wush/wush.h, wush_format). It is the portable
// (scalar) path of the runtime and the fallback of the SIMD kernels for the groups they cannot
// certify, so every ISA writes the same codes and scales.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "cpu/kernels/kernels.h"
#include "wush/wush.h"

namespace wush::cpu {

// Quantizes n = G float64 values into n/2 code bytes and one scale (1 or 2 bytes), `format`'s
// rules evaluated in float64. Values must be finite.
void quantize_group_f64(wush_format format, const double* y, int n, std::uint8_t* codes, std::uint8_t* scale);

// Recomputes lane `lane` (0 <= lane < tile.rows) of `tile` exactly and writes its codes and scale.
// Returns the linear index into x (token * d_in + column) of the first NaN/Inf of the group's
// input, writing nothing then.
std::optional<std::size_t> quantize_block_exact(const QuantTile& tile, int lane);

}  // namespace wush::cpu
