// Round-to-nearest pre-quantization of a layer's weights (paper Algorithm 2, RTN case), beside
// GPTQ (gptq.h): the two ways a layer's weight side becomes packed 4-bit codes.
#pragma once

#include <cstddef>
#include <span>

#include "formats/block_format.h"
#include "formats/packed_matrix.h"
#include "transforms/block_transform.h"

namespace wush {

// q(T_w w_i) per output row and block. w is d_out x d_in row-major float32 and must be finite.
// Throws NON_FINITE if a quantized group would not decode to finite float32 values
// (formats::require_decodable).
formats::PackedMatrix prequantize_rtn(const BlockTransform& transform, const formats::FormatSpec& format,
                                      std::span<const float> w, std::size_t d_out);

}  // namespace wush
