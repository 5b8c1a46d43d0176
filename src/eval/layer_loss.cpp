#include "eval/layer_loss.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "common/checked_math.h"
#include "common/dtype.h"
#include "common/error.h"
#include "eval/quantized_product.h"
#include "prequant/rtn.h"

namespace wush::eval {

namespace {

std::vector<double> to_double(std::span<const float> v) {
    return std::vector<double>(v.begin(), v.end());
}

// RTN quantization of n rows of transformed activations.
void quantize(const formats::FormatSpec& format, std::span<const float> rows, std::size_t n, std::size_t d_in,
              std::vector<std::uint8_t>& codes, std::vector<std::uint8_t>& scales) {
    // quantize_rows requires finite input; a transform can overflow float32 on extreme inputs.
    require_finite(WUSH_DTYPE_F32, rows.data(), n, d_in, "transformed activations");
    const formats::PackedSizes sizes = formats::packed_sizes(format, n, d_in);
    codes.resize(sizes.codes);
    scales.resize(sizes.scales);
    formats::quantize_rows(format, rows, n, d_in, codes, scales);
}

}  // namespace

double tiled_loss(std::span<const float> w, std::size_t d_out, std::size_t d_in, std::span<const float> x,
                  std::size_t n_tokens, const QuantizedOutput& quantized_output, std::span<double> token_errors,
                  std::span<const double> reference) {
    require(d_out > 0 && w.size() == checked_mul(d_out, d_in, "weight size"),
            "layer loss: weight has " + std::to_string(w.size()) +
                " values, expected d_out x d_in = " + std::to_string(d_out) + " x " + std::to_string(d_in));
    require(n_tokens > 0 && x.size() == checked_mul(n_tokens, d_in, "activation size"),
            "layer loss: activations have " + std::to_string(x.size()) +
                " values, expected n_tokens x d_in = " + std::to_string(n_tokens) + " x " + std::to_string(d_in));
    require(token_errors.empty() || token_errors.size() == n_tokens, "layer loss: one token error per token");
    require(reference.empty() || reference.size() == n_tokens * d_out, "layer loss: the reference must be n x d_out");
    require_finite(WUSH_DTYPE_F32, w.data(), d_out, d_in, "weight");
    require_finite(WUSH_DTYPE_F32, x.data(), n_tokens, d_in, "activations");
    const std::vector<double> wd = reference.empty() ? to_double(w) : std::vector<double>{};
    const std::size_t tile = std::min(kTileTokens, n_tokens);
    std::vector<double> xd(reference.empty() ? tile * d_in : 0), y_tile(reference.empty() ? tile * d_out : 0),
        yq(tile * d_out);
    double sum_sq = 0.0;
    for (std::size_t t0 = 0; t0 < n_tokens; t0 += tile) {
        const std::size_t rows = std::min(tile, n_tokens - t0);
        const float* xt = x.data() + t0 * d_in;
        quantized_output(xt, rows, std::span<double>(yq).first(rows * d_out));
        const double* y = y_tile.data();
        if (reference.empty()) {
            std::copy(xt, xt + rows * d_in, xd.begin());
            cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(rows), int(d_out), int(d_in), 1.0, xd.data(),
                        int(d_in), wd.data(), int(d_in), 0.0, y_tile.data(), int(d_out));
        } else {
            y = reference.data() + t0 * d_out;
        }
        for (std::size_t i = 0; i < rows * d_out; ++i) {
            const double e = yq[i] - y[i];
            sum_sq += e * e;
            if (!token_errors.empty()) token_errors[t0 + i / d_out] += e * e / double(d_out);
        }
    }
    const double loss = sum_sq / (double(d_out) * double(n_tokens));
    // Extreme but valid inputs (scales near the top of E8M0, huge transform entries) can overflow
    // the quantized product; a NaN or infinite loss is a failure, on every path alike.
    if (!std::isfinite(loss))
        fail(WUSH_ERR_NON_FINITE, "the layer loss is not finite (the quantized output overflowed)");
    return loss;
}

std::vector<double> reference_output(std::span<const float> w, std::size_t d_out, std::size_t d_in,
                                     std::span<const float> x, std::size_t n_tokens) {
    require(d_out > 0 && w.size() == checked_mul(d_out, d_in, "weight size"), "reference_output: weight size");
    require(n_tokens > 0 && x.size() == checked_mul(n_tokens, d_in, "activation size"), "reference_output: x size");
    require_finite(WUSH_DTYPE_F32, w.data(), d_out, d_in, "weight");
    require_finite(WUSH_DTYPE_F32, x.data(), n_tokens, d_in, "activations");
    // The same tiles, buffers and calls as tiled_loss, so the same values.
    const std::vector<double> wd = to_double(w);
    const std::size_t tile = std::min(kTileTokens, n_tokens);
    std::vector<double> xd(tile * d_in), y(tile * d_out);
    std::vector<double> out(checked_mul(n_tokens, d_out, "reference size"));
    for (std::size_t t0 = 0; t0 < n_tokens; t0 += tile) {
        const std::size_t rows = std::min(tile, n_tokens - t0);
        const float* xt = x.data() + t0 * d_in;
        std::copy(xt, xt + rows * d_in, xd.begin());
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(rows), int(d_out), int(d_in), 1.0, xd.data(),
                    int(d_in), wd.data(), int(d_in), 0.0, y.data(), int(d_out));
        std::copy(y.begin(), y.begin() + rows * d_out, out.begin() + t0 * d_out);
    }
    return out;
}

std::vector<float> dequantize(const QuantizedWeights& q) {
    std::vector<float> out(checked_mul(q.d_out, q.d_in, "weight size"));
    formats::dequantize_rows(formats::spec(q.format), q.codes.span(), q.scales.span(), q.d_out, q.d_in, out);
    return out;
}

double layer_loss(const BlockTransform& transform, const QuantizedWeights& q, std::span<const float> w,
                  std::span<const float> x, std::size_t n_tokens, std::span<double> token_errors,
                  std::span<const double> reference) {
    const formats::FormatSpec& format = formats::spec(q.format);
    formats::require_group(format, transform.group());
    const std::size_t d_in = transform.d_in(), d_out = q.d_out;
    require(q.d_in == d_in, "layer_loss: quantized weights have d_in = " + std::to_string(q.d_in) + ", the transform " +
                                std::to_string(d_in));
    // Y_q = Xq Wq^T in the transformed domain, exact group by group (quantized_product.h).
    formats::require_decodable(format, q.codes.span(), q.scales.span(), q.d_out, q.d_in);
    const QuantizedProduct product(q);
    std::vector<float> xt(std::min(kTileTokens, n_tokens) * d_in);
    std::vector<std::uint8_t> codes, scales;
    return tiled_loss(
        w, d_out, d_in, x, n_tokens,
        [&](const float* tile, std::size_t rows, std::span<double> yq) {
            transform.apply_activations({tile, rows * d_in}, rows, std::span<float>(xt).first(rows * d_in));
            quantize(format, std::span<const float>(xt).first(rows * d_in), rows, d_in, codes, scales);
            product.multiply(codes, scales, rows, yq);
        },
        token_errors, reference);
}

double layer_loss(const BlockTransform& transform, const formats::FormatSpec& format, std::span<const float> w,
                  std::size_t d_out, std::span<const float> x, std::size_t n_tokens) {
    return layer_loss(transform, prequantize_rtn(transform, format, w, d_out), w, x, n_tokens);
}

}  // namespace wush::eval
