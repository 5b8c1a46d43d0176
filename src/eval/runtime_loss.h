// The layerwise loss (eval/layer_loss.h) with Y_q computed by the CPU runtime (fused transform +
// quantization and the W4A4 GEMM, float32 accumulation) instead of the float64 reference
// product: what `wush eval --runtime` reports.
#pragma once

#include <cstddef>
#include <span>

#include "common/cpu_isa.h"
#include "formats/packed_matrix.h"
#include "transforms/block_transform.h"

namespace wush::eval {

// ||Y_q - Y||_F^2 / (d_out * n_tokens) with Y = X W^T in float64; w is d_out x d_in, x is
// n_tokens x d_in, both float32 and finite. Throws NON_FINITE if the loss is not finite.
double runtime_layer_loss(Isa isa, const BlockTransform& transform, const formats::PackedMatrix& q,
                          std::span<const float> w, std::span<const float> x, std::size_t n_tokens);

}  // namespace wush::eval
