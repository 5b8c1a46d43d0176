#include "pipeline/layer_pipeline.h"

#include <utility>
#include <vector>

#include "eval/layer_loss.h"
#include "prequant/gptq.h"
#include "prequant/rtn.h"

namespace wush::pipeline {

bool is_data_free(TransformKind kind) {
    return kind == TransformKind::Identity || kind == TransformKind::Hadamard || kind == TransformKind::Random;
}

QuantizedLayer quantize_layer(const TransformOptions& options, const formats::FormatSpec& format, Method method,
                              const Calibrator& calibration, std::span<const float> w, std::size_t d_out,
                              Progress* progress) {
    if (method == Method::Gptq) {
        gptq::Result r = gptq::quantize(options, format, calibration, w, d_out, progress);
        return {std::move(r.transform), std::move(r.weights)};
    }
    BlockTransform t = is_data_free(options.kind)
                           ? build_data_free_transform(options, calibration.d_in(), calibration.group())
                           : build_transform(options, calibration, w, d_out, progress);
    formats::PackedMatrix q = prequantize_rtn(t, format, w, d_out);
    return {std::move(t), std::move(q)};
}

QuantizedLayer guarded_layer(const TransformOptions& options, const formats::FormatSpec& format, Method method,
                             const Calibrator& calibration, std::span<const float> w, std::size_t d_out,
                             Progress* progress) {
    QuantizedLayer best = quantize_layer(options, format, method, calibration, w, d_out, progress);
    if (!options.search.enabled || is_data_free(options.kind) || calibration.validation_count() == 0) return best;
    const std::vector<float> x = calibration.validation();
    const std::size_t n = calibration.validation_count();
    double best_loss = eval::layer_loss(best.transform, best.weights, w, x, n);
    for (TransformKind alt : {TransformKind::Identity, TransformKind::Hadamard, TransformKind::Random}) {
        TransformOptions data_free = options;
        data_free.kind = alt;
        data_free.search = {};
        QuantizedLayer candidate = quantize_layer(data_free, format, method, calibration, w, d_out, progress);
        const double loss = eval::layer_loss(candidate.transform, candidate.weights, w, x, n);
        if (loss < best_loss) {
            best = std::move(candidate);
            best_loss = loss;
        }
    }
    return best;
}

}  // namespace wush::pipeline
