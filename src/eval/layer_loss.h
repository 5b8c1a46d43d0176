// Layerwise quality of a transform + block format (docs/ARCHITECTURE.md "Math conventions", paper
// eq. blockwise_loss_definition_empirical summed over blocks): weights are RTN pre-quantized after
// the weight-side transform, held-out activations are transformed and RTN-quantized with the same
// format, and loss = ||Y_q - Y||_F^2 / (d_out * n_tokens) against the float64 product Y = X W^T.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "formats/block_format.h"
#include "formats/packed_matrix.h"
#include "transforms/block_transform.h"

namespace wush::eval {

// Held-out tokens per step of the loss: bounds the float64 scratch (tile x (d_in + d_out)).
inline constexpr std::size_t kTileTokens = 256;

// Packed RTN codes and group scales of the transformed weights.
using QuantizedWeights = formats::PackedMatrix;

// Computes Y_q for `rows` tokens of activations `x_tile` (rows x d_in floats) into `yq`
// (rows x d_out, float64).
using QuantizedOutput = std::function<void(const float* x_tile, std::size_t rows, std::span<double> yq)>;

// The loss definition shared by every path: ||Y_q - Y||_F^2 / (d_out * n_tokens), with the
// reference Y = X W^T in float64, over tiles of tokens so that long inputs need bounded scratch.
// w (d_out x d_in) and x (n_tokens x d_in) must be finite; throws NON_FINITE if the loss is not.
// `token_errors`, if not empty (n_tokens zeros on entry), gets each token's ||y_q - y||^2 / d_out
// added (their mean is the loss; the paired comparisons of the search's guard read them).
// `reference`, if not empty, is reference_output() of the same w and x: the reference product is
// then read from it instead of computed again (the same values, so the same loss).
double tiled_loss(std::span<const float> w, std::size_t d_out, std::size_t d_in, std::span<const float> x,
                  std::size_t n_tokens, const QuantizedOutput& quantized_output, std::span<double> token_errors = {},
                  std::span<const double> reference = {});

// The reference product Y = X W^T (n_tokens x d_out float64) exactly as tiled_loss computes it,
// tile by tile: for several losses of one layer on the same tokens (the search's guard).
std::vector<double> reference_output(std::span<const float> w, std::size_t d_out, std::size_t d_in,
                                     std::span<const float> x, std::size_t n_tokens);

// Dequantized transformed weights (d_out x d_in floats, tensor factor applied).
std::vector<float> dequantize(const QuantizedWeights& q);

// Loss of already pre-quantized weights (RTN or GPTQ) against the original weights `w`
// (d_out x d_in) on held-out activations `x` (n x d_in), both float32, finite.
double layer_loss(const BlockTransform& transform, const QuantizedWeights& q, std::span<const float> w,
                  std::span<const float> x, std::size_t n_tokens, std::span<double> token_errors = {},
                  std::span<const double> reference = {});

// RTN end to end: prequantize_rtn (prequant/rtn.h) then the loss above.
double layer_loss(const BlockTransform& transform, const formats::FormatSpec& format, std::span<const float> w,
                  std::size_t d_out, std::span<const float> x, std::size_t n_tokens);

}  // namespace wush::eval
