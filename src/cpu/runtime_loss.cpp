#include "cpu/runtime_loss.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <string>
#include <vector>

#include "common/checked_math.h"
#include "common/error.h"
#include "cpu/linear_forward.h"

namespace wush::runtime {

namespace {

// Held-out tokens per step, as in the reference loss: bounds the float64 scratch.
constexpr std::size_t kTileTokens = 256;

}  // namespace

double runtime_layer_loss(Isa isa, const BlockTransform& transform, const formats::PackedMatrix& q,
                          std::span<const float> w, std::span<const float> x, std::size_t n_tokens) {
    require_layer(transform, q);
    const std::size_t d_in = q.d_in, d_out = q.d_out;
    require(w.size() == checked_mul(d_out, d_in, "weight size"), "runtime loss: weight shape does not match d_out x d_in");
    require(n_tokens > 0 && x.size() == checked_mul(n_tokens, d_in, "activation size"),
            "runtime loss: activations do not match n_tokens x d_in");
    const std::vector<double> wd(w.begin(), w.end());
    const std::size_t tile = std::min(kTileTokens, n_tokens);
    std::vector<std::byte> workspace(
        linear_forward_workspace_bytes(transform, q, tile, std::size_t(omp_get_max_threads())));
    std::vector<float> yq(tile * d_out);
    std::vector<double> xd(tile * d_in), y(tile * d_out);
    const MatrixUse use = classify_matrices(transform);
    double sum_sq = 0.0;
    for (std::size_t t0 = 0; t0 < n_tokens; t0 += tile) {
        const std::size_t rows = std::min(tile, n_tokens - t0);
        const float* xt = x.data() + t0 * d_in;
        linear_forward(isa, transform, use, q, WUSH_DTYPE_F32, xt, rows, WUSH_DTYPE_F32, yq.data(), workspace);
        std::copy(xt, xt + rows * d_in, xd.begin());
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(rows), int(d_out), int(d_in), 1.0, xd.data(), int(d_in),
                    wd.data(), int(d_in), 0.0, y.data(), int(d_out));
        for (std::size_t i = 0; i < rows * d_out; ++i) {
            const double e = double(yq[i]) - y[i];
            sum_sq += e * e;
        }
    }
    return sum_sq / (double(d_out) * double(n_tokens));
}

}  // namespace wush::runtime
