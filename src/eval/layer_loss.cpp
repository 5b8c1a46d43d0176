#include "eval/layer_loss.h"

#include <cblas.h>

#include <algorithm>
#include <string>

#include "common/checked_math.h"
#include "common/dtype.h"
#include "common/error.h"

namespace wush::eval {

namespace {

// Held-out tokens per step: bounds the float64 scratch (tile x (d_in + d_out)) for long inputs.
constexpr std::size_t kTileTokens = 256;

std::vector<double> to_double(std::span<const float> v) { return std::vector<double>(v.begin(), v.end()); }

// RTN round trip of n rows of transformed activations, in place.
void quantize_dequantize(const formats::FormatSpec& format, std::span<float> rows, std::size_t n, std::size_t d_in) {
    // quantize_rows requires finite input; a transform can overflow float32 on extreme inputs.
    require_finite(WUSH_DTYPE_F32, rows.data(), n, d_in, "transformed activations");
    const formats::PackedSizes sizes = formats::packed_sizes(format, n, d_in);
    std::vector<std::uint8_t> codes(sizes.codes), scales(sizes.scales);
    formats::quantize_rows(format, rows, n, d_in, codes, scales);
    formats::dequantize_rows(format, codes, scales, n, d_in, rows);
}

}  // namespace

void require_matching_group(const BlockTransform& transform, const formats::FormatSpec& format) {
    if (format.group != transform.group())
        fail(WUSH_ERR_INVALID_ARGUMENT, std::string("format ") + format.name + " has group size " +
                                            std::to_string(format.group) + " but the transform has block size G = " +
                                            std::to_string(transform.group()));
}

QuantizedWeights prequantize_rtn(const BlockTransform& transform, const formats::FormatSpec& format,
                                 std::span<const float> w, std::size_t d_out) {
    require_matching_group(transform, format);
    const std::size_t d_in = transform.d_in();
    require(d_out > 0, "prequantize: d_out must be positive");
    require(w.size() == checked_mul(d_out, d_in, "weight size"),
            "prequantize: weight has " + std::to_string(w.size()) + " values, expected d_out x d_in = " +
                std::to_string(d_out) + " x " + std::to_string(d_in));
    require_finite(WUSH_DTYPE_F32, w.data(), d_out, d_in, "weight");
    std::vector<float> transformed(w.size());
    transform.apply_weights(w, d_out, transformed);
    require_finite(WUSH_DTYPE_F32, transformed.data(), d_out, d_in, "transformed weight");
    const formats::PackedSizes sizes = formats::packed_sizes(format, d_out, d_in);
    std::vector<std::uint8_t> codes(sizes.codes), scales(sizes.scales);
    formats::quantize_rows(format, transformed, d_out, d_in, codes, scales);
    return {format.id, d_out, d_in, formats::ByteView(std::move(codes)), formats::ByteView(std::move(scales))};
}

std::vector<float> dequantize(const QuantizedWeights& q) {
    std::vector<float> out(checked_mul(q.d_out, q.d_in, "weight size"));
    formats::dequantize_rows(formats::spec(q.format), q.codes.span(), q.scales.span(), q.d_out, q.d_in, out);
    return out;
}

double layer_loss(const BlockTransform& transform, const QuantizedWeights& q, std::span<const float> w,
                  std::span<const float> x, std::size_t n_tokens) {
    const formats::FormatSpec& format = formats::spec(q.format);
    require_matching_group(transform, format);
    const std::size_t d_in = transform.d_in(), d_out = q.d_out;
    require(q.d_in == d_in, "layer_loss: quantized weights have d_in = " + std::to_string(q.d_in) +
                                ", the transform " + std::to_string(d_in));
    require(w.size() == checked_mul(d_out, d_in, "weight size"), "layer_loss: weight shape does not match d_out x d_in");
    require(n_tokens > 0 && x.size() == checked_mul(n_tokens, d_in, "activation size"),
            "layer_loss: activations have " + std::to_string(x.size()) + " values, expected n_tokens x d_in = " +
                std::to_string(n_tokens) + " x " + std::to_string(d_in));
    require_finite(WUSH_DTYPE_F32, w.data(), d_out, d_in, "weight");
    require_finite(WUSH_DTYPE_F32, x.data(), n_tokens, d_in, "activations");

    // Both products in float64: Y_q = Xq Wq^T (transformed domain) and the reference Y = X W^T.
    const std::vector<double> wq = to_double(dequantize(q));
    const std::vector<double> wd = to_double(w);
    std::vector<float> xt(kTileTokens * d_in);
    std::vector<double> xq(kTileTokens * d_in), xd(kTileTokens * d_in), y(kTileTokens * d_out), yq(kTileTokens * d_out);
    double sum_sq = 0.0;
    for (std::size_t t0 = 0; t0 < n_tokens; t0 += kTileTokens) {
        const std::size_t rows = std::min(kTileTokens, n_tokens - t0);
        const std::span<const float> tile = x.subspan(t0 * d_in, rows * d_in);
        transform.apply_activations(tile, rows, xt);
        quantize_dequantize(format, std::span<float>(xt).first(rows * d_in), rows, d_in);
        std::copy(xt.begin(), xt.begin() + rows * d_in, xq.begin());
        std::copy(tile.begin(), tile.end(), xd.begin());
        const int m = int(rows), n = int(d_out), k = int(d_in);
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0, xq.data(), k, wq.data(), k, 0.0, yq.data(), n);
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0, xd.data(), k, wd.data(), k, 0.0, y.data(), n);
        for (std::size_t i = 0; i < rows * d_out; ++i) {
            const double e = yq[i] - y[i];
            sum_sq += e * e;
        }
    }
    return sum_sq / (double(d_out) * double(n_tokens));
}

double layer_loss(const BlockTransform& transform, const formats::FormatSpec& format, std::span<const float> w,
                  std::size_t d_out, std::span<const float> x, std::size_t n_tokens) {
    return layer_loss(transform, prequantize_rtn(transform, format, w, d_out), w, x, n_tokens);
}

}  // namespace wush::eval
