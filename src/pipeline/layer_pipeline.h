// One layer from calibration to a transform and pre-quantized weights: the choice between RTN and
// GPTQ, data-aware and data-free transforms, and the search's per-layer guard. The C API, the CLI
// and the Python package all reach it through wush_layer_quantize, so the rules live here once.
#pragma once

#include <cstddef>
#include <span>

#include "calibration/calibrator.h"
#include "common/progress.h"
#include "formats/block_format.h"
#include "formats/packed_matrix.h"
#include "transforms/block_transform.h"

namespace wush::pipeline {

enum class Method { Rtn, Gptq };

struct QuantizedLayer {
    BlockTransform transform;
    formats::PackedMatrix weights;
};

// Whether a transform kind is built without calibration data (identity, Hadamard, random).
bool is_data_free(TransformKind kind);

// The transform `options` describe (kind, damping, seed, storage, search) for `format`, and the
// weights w (d_out x d_in, float32, finite) pre-quantized against it by `method`. Data-free kinds
// ignore the calibrator's statistics (RTN) and the search settings.
QuantizedLayer quantize_layer(const TransformOptions& options, const formats::FormatSpec& format, Method method,
                              const Calibrator& calibration, std::span<const float> w, std::size_t d_out,
                              Progress* progress);

// quantize_layer, then the search's per-layer guard: when `options` searches a data-aware kind and
// the calibrator holds validation tokens (documents the calibration did not see), the searched
// layer competes with the data-free I, H and R layers built by the same method, and the lowest
// layer loss on those tokens wins (ties keep the searched one). The search's own scores come from
// the fitted documents and cannot see a transform that fits them but not others; a whole-layer
// loss on other documents can, and is far less noisy than a per-block choice on them would be.
QuantizedLayer guarded_layer(const TransformOptions& options, const formats::FormatSpec& format, Method method,
                             const Calibrator& calibration, std::span<const float> w, std::size_t d_out,
                             Progress* progress);

}  // namespace wush::pipeline
