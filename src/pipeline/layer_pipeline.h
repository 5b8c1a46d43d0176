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

// The search's per-layer guard (guarded_layer).
struct GuardSettings {
    // Without validation tokens in the calibrator, hold out half of its token sample (every second
    // token in the sample's random order) for the guard, and search on the other half.
    bool hold_out_sample = true;
};

// Fewest held-out tokens the guard decides on; a smaller held-out sample keeps the searched layer.
inline constexpr std::size_t kGuardMinTokens = 32;

// The transform `options` describe (kind, damping, seed, storage, search) for `format`, and the
// weights w (d_out x d_in, float32, finite) pre-quantized against it by `method` (data-free kinds
// ignore the calibrator's statistics and the search settings); then the search's per-layer
// guard, when `options` searches a data-aware kind:
// the searched layer competes with plain (unsearched) WUS/WUSH and the data-free I, H and R
// layers built by the same method, scored on held-out tokens: the calibrator's validation tokens
// (documents the calibration did not see) when it holds some, else, by default, half of its
// token sample, which the search then does not see. The search's own scores come from the tokens
// it fits and cannot see a transform that fits them but not others; a whole-layer loss on other
// tokens can. An alternative replaces the searched layer only when its mean loss is lower by more
// than 1% and by more than two standard errors of the paired per-token differences, so noise on
// a small or unrepresentative held-out sample keeps the searched layer; of several such, the
// lowest mean wins.
QuantizedLayer guarded_layer(const TransformOptions& options, const formats::FormatSpec& format, Method method,
                             const Calibrator& calibration, std::span<const float> w, std::size_t d_out,
                             Progress* progress, const GuardSettings& guard = {});

}  // namespace wush::pipeline
