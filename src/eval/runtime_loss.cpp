#include "eval/runtime_loss.h"

#include <algorithm>
#include <vector>

#include "eval/layer_loss.h"

namespace wush::eval {

std::size_t runtime_loss_tile_tokens(std::size_t n_tokens) {
    return std::min(kTileTokens, std::max<std::size_t>(n_tokens, 1));
}

double runtime_layer_loss(const RuntimeForward& forward, std::span<const float> w, std::size_t d_out, std::size_t d_in,
                          std::span<const float> x, std::size_t n_tokens) {
    std::vector<float> yq(runtime_loss_tile_tokens(n_tokens) * d_out);
    return tiled_loss(w, d_out, d_in, x, n_tokens, [&](const float* xt, std::size_t rows, std::span<double> out) {
        forward(xt, rows, yq.data());
        std::copy(yq.begin(), yq.begin() + rows * d_out, out.begin());
    });
}

}  // namespace wush::eval
