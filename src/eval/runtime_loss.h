// The layerwise loss (eval/layer_loss.h) with Y_q computed by a runtime (fused transform +
// quantization and the W4A4 GEMM, float32 accumulation) instead of the float64 reference
// product: what `wush eval --runtime` reports. The runtime is the caller's (capi/ hands in a
// backend's linear forward), so eval/ stays independent of any backend.
#pragma once

#include <cstddef>
#include <functional>
#include <span>

namespace wush::eval {

// y (rows x d_out, float32) = the runtime's forward of x (rows x d_in, float32), rows at most
// runtime_loss_tile_tokens(n_tokens).
using RuntimeForward = std::function<void(const float* x, std::size_t rows, float* y)>;

// The most rows runtime_layer_loss hands the forward at once.
std::size_t runtime_loss_tile_tokens(std::size_t n_tokens);

// ||Y_q - Y||_F^2 / (d_out * n_tokens) with Y = X W^T in float64 and Y_q from `forward`; w is
// d_out x d_in, x is n_tokens x d_in, both float32 and finite. Throws NON_FINITE if the loss is
// not finite.
double runtime_layer_loss(const RuntimeForward& forward, std::span<const float> w, std::size_t d_out, std::size_t d_in,
                          std::span<const float> x, std::size_t n_tokens);

}  // namespace wush::eval
