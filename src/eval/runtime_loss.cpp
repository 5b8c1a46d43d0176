#include "eval/runtime_loss.h"

#include <algorithm>
#include <vector>

#include "cpu/linear_forward.h"
#include "eval/layer_loss.h"

namespace wush::eval {

double runtime_layer_loss(Isa isa, std::size_t threads, const BlockTransform& transform, const formats::PackedMatrix& q,
                          std::span<const float> w, std::span<const float> x, std::size_t n_tokens) {
    require_layer(transform, q);
    const std::size_t d_in = q.d_in, d_out = q.d_out;
    const std::size_t tile = std::min(kTileTokens, std::max<std::size_t>(n_tokens, 1));
    std::vector<std::byte> workspace(cpu::linear_forward_workspace_bytes(transform, q, tile, threads));
    std::vector<float> yq(tile * d_out);
    const MatrixUse use = classify_matrices(transform);
    return tiled_loss(w, d_out, d_in, x, n_tokens, [&](const float* xt, std::size_t rows, std::span<double> out) {
        cpu::linear_forward(isa, threads, transform, use, q, WUSH_DTYPE_F32, xt, rows, WUSH_DTYPE_F32, yq.data(),
                            workspace);
        std::copy(yq.begin(), yq.begin() + rows * d_out, out.begin());
    });
}

}  // namespace wush::eval
