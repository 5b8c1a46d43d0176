#include "pipeline/layer_pipeline.h"

#include <cmath>
#include <utility>
#include <vector>

#include "eval/layer_loss.h"
#include "prequant/gptq.h"
#include "prequant/rtn.h"

namespace wush::pipeline {

namespace {

// One layer with an explicit search sample (empty: the calibrator's own).
QuantizedLayer build(const TransformOptions& options, const formats::FormatSpec& format, Method method,
                     const Calibrator& calibration, std::span<const float> w, std::size_t d_out, Progress* progress,
                     std::span<const float> sample) {
    if (method == Method::Gptq) {
        gptq::Result r = gptq::quantize(options, format, calibration, w, d_out, progress, sample);
        return {std::move(r.transform), std::move(r.weights)};
    }
    BlockTransform t = is_data_free(options.kind)
                           ? build_data_free_transform(options, calibration.d_in(), calibration.group())
                           : build_transform(options, calibration, w, d_out, progress, sample,
                                             sample.size() / calibration.d_in());
    formats::PackedMatrix q = prequantize_rtn(t, format, w, d_out);
    return {std::move(t), std::move(q)};
}

// Tokens the guard scores on, and the search's own sample when the guard takes part of it.
struct GuardTokens {
    std::vector<float> held;    // n x d_in
    std::size_t n = 0;
    std::vector<float> search;  // the rest of the token sample (empty: the search's default)
};

GuardTokens guard_tokens(const Calibrator& calibration, const GuardSettings& guard) {
    GuardTokens g;
    if (calibration.validation_count() > 0) {
        g.held = calibration.validation();
        g.n = calibration.validation_count();
        return g;
    }
    const std::size_t n = calibration.sample_count(), d = calibration.d_in();
    if (!guard.hold_out_sample || n / 2 < kGuardMinTokens) return g;
    // The sample is in the order of random priorities, so every second token is a random half.
    const std::vector<float> all = calibration.sample();
    for (std::size_t t = 0; t < n; ++t) {
        std::vector<float>& to = t % 2 == 1 ? g.held : g.search;
        to.insert(to.end(), all.begin() + std::ptrdiff_t(t * d), all.begin() + std::ptrdiff_t((t + 1) * d));
    }
    g.n = n / 2;
    return g;
}

struct Scored {
    QuantizedLayer layer;
    std::vector<double> token_errors;
    double mean = 0.0;
};

Scored score(QuantizedLayer layer, std::span<const float> w, const GuardTokens& tokens) {
    Scored s{std::move(layer), std::vector<double>(tokens.n, 0.0), 0.0};
    s.mean = eval::layer_loss(s.layer.transform, s.layer.weights, w, tokens.held, tokens.n, s.token_errors);
    return s;
}

// Whether `alt` beats `base` by a margin the held-out sample supports: its mean lower by more
// than 1%, and the mean of the paired differences above two of its standard errors.
bool clearly_better(const Scored& alt, const Scored& base) {
    if (!(alt.mean < 0.99 * base.mean)) return false;
    const std::size_t n = base.token_errors.size();
    double mean = 0.0;
    for (std::size_t t = 0; t < n; ++t) mean += base.token_errors[t] - alt.token_errors[t];
    mean /= double(n);
    double var = 0.0;
    for (std::size_t t = 0; t < n; ++t) {
        const double d = base.token_errors[t] - alt.token_errors[t] - mean;
        var += d * d;
    }
    var /= double(n - 1);
    return mean > 2.0 * std::sqrt(var / double(n));
}

}  // namespace

bool is_data_free(TransformKind kind) {
    return kind == TransformKind::Identity || kind == TransformKind::Hadamard || kind == TransformKind::Random;
}

QuantizedLayer guarded_layer(const TransformOptions& options, const formats::FormatSpec& format, Method method,
                             const Calibrator& calibration, std::span<const float> w, std::size_t d_out,
                             Progress* progress, const GuardSettings& guard) {
    const GuardTokens tokens = options.search.enabled && !is_data_free(options.kind)
                                   ? guard_tokens(calibration, guard)
                                   : GuardTokens{};
    QuantizedLayer searched = build(options, format, method, calibration, w, d_out, progress, tokens.search);
    if (tokens.n < 2) return searched;

    Scored searched_scored = score(std::move(searched), w, tokens);
    TransformOptions plain = options;  // Algorithm 1 itself, unsearched
    plain.search = {};
    std::vector<TransformOptions> alternatives{plain};
    for (TransformKind k : {TransformKind::Identity, TransformKind::Hadamard, TransformKind::Random}) {
        TransformOptions data_free = plain;
        data_free.kind = k;
        alternatives.push_back(data_free);
    }
    std::vector<Scored> winners;
    winners.reserve(alternatives.size());  // `chosen` points into it
    for (const TransformOptions& alt : alternatives) {
        Scored s = score(build(alt, format, method, calibration, w, d_out, progress, {}), w, tokens);
        if (clearly_better(s, searched_scored)) winners.push_back(std::move(s));
    }
    Scored* chosen = &searched_scored;
    for (Scored& s : winners)
        if (s.mean < chosen->mean) chosen = &s;
    return std::move(chosen->layer);
}

}  // namespace wush::pipeline
