#include "pipeline/layer_pipeline.h"

#include <cmath>
#include <optional>
#include <utility>
#include <vector>

#include "eval/layer_loss.h"
#include "prequant/gptq.h"
#include "prequant/rtn.h"

namespace wush::pipeline {

namespace {

// One layer with an explicit search sample (empty: the calibrator's own). `plain`, if given, gets
// the unsearched RTN layer when the build computes it anyway (a searched WUS/WUSH RTN build).
QuantizedLayer build(const TransformOptions& options, const formats::FormatSpec& format, Method method,
                     const Calibrator& calibration, std::span<const float> w, std::size_t d_out, Progress* progress,
                     std::span<const float> sample, std::optional<QuantizedLayer>* plain = nullptr) {
    if (method == Method::Gptq) {
        gptq::Result r = gptq::quantize(options, format, calibration, w, d_out, progress, sample);
        return {std::move(r.transform), std::move(r.weights), {}};
    }
    std::optional<BlockTransform> plain_t;
    BlockTransform t = is_data_free(options.kind)
                           ? build_data_free_transform(options, calibration.d_in(), calibration.group())
                           : build_transform(options, calibration, w, d_out, progress, sample,
                                             sample.size() / calibration.d_in(), plain != nullptr ? &plain_t : nullptr);
    formats::PackedMatrix q = prequantize_rtn(t, format, w, d_out);
    if (plain_t) {
        formats::PackedMatrix pq = prequantize_rtn(*plain_t, format, w, d_out);
        plain->emplace(QuantizedLayer{std::move(*plain_t), std::move(pq), {}});
    }
    return {std::move(t), std::move(q), {}};
}

// Tokens the guard scores on, and the search's own sample when the guard takes part of it.
struct GuardTokens {
    GuardSource source = GuardSource::None;
    std::vector<float> held;  // n x d_in
    std::size_t n = 0;
    std::vector<float> search;      // the rest of the token sample (empty: the search's default)
    std::vector<double> reference;  // Y = X W^T on `held` (eval::reference_output), when small enough
};

GuardTokens guard_tokens(const Calibrator& calibration, const GuardSettings& guard) {
    GuardTokens g;
    if (calibration.validation_count() > 0) {
        g.held = calibration.validation();
        g.n = calibration.validation_count();
        g.source = GuardSource::Validation;
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
    g.source = GuardSource::HoldOut;
    return g;
}

// The reference product is the same for every candidate: computed once when it fits this budget
// (else each loss computes it again, tile by tile, with the same values).
inline constexpr std::size_t kReferenceBudgetBytes = std::size_t(256) << 20;

struct Scored {
    QuantizedLayer layer;
    std::vector<double> token_errors;
    double mean = 0.0;
};

Scored score(QuantizedLayer layer, std::span<const float> w, const GuardTokens& tokens) {
    Scored s{std::move(layer), std::vector<double>(tokens.n, 0.0), 0.0};
    s.mean = eval::layer_loss(s.layer.transform, s.layer.weights, w, tokens.held, tokens.n, s.token_errors,
                              tokens.reference);
    return s;
}

// The paired comparison of `alt` with `base`: the mean of the per-token differences base - alt
// and its standard error.
GuardCandidateScore paired(const Scored& alt, const Scored& base) {
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
    GuardCandidateScore c;
    c.loss = alt.mean;
    c.difference = mean;
    c.std_error = std::sqrt(var / double(n));
    // `alt` beats `base` by a margin the held-out sample supports: its mean lower by more than
    // 1%, and the mean of the paired differences above two of its standard errors.
    c.clearly_better = alt.mean < 0.99 * base.mean && mean > 2.0 * c.std_error;
    return c;
}

}  // namespace

bool is_data_free(TransformKind kind) {
    return kind == TransformKind::Identity || kind == TransformKind::Hadamard || kind == TransformKind::Random;
}

QuantizedLayer guarded_layer(const TransformOptions& options, const formats::FormatSpec& format, Method method,
                             const Calibrator& calibration, std::span<const float> w, std::size_t d_out,
                             Progress* progress, const GuardSettings& guard) {
    GuardTokens tokens =
        options.search.enabled && !is_data_free(options.kind) ? guard_tokens(calibration, guard) : GuardTokens{};
    const bool guarded = tokens.n >= 2;
    // A searched RTN build computes plain WUS/WUSH on the way (the same blocks, the same values).
    std::optional<QuantizedLayer> plain_layer;
    QuantizedLayer searched = build(options, format, method, calibration, w, d_out, progress, tokens.search,
                                    guarded && method == Method::Rtn ? &plain_layer : nullptr);
    if (!guarded) return searched;

    const std::size_t d_in = calibration.d_in();
    if (tokens.n * d_out <= kReferenceBudgetBytes / sizeof(double))
        tokens.reference = eval::reference_output(w, d_out, d_in, tokens.held, tokens.n);
    GuardReport report;
    report.source = tokens.source;
    report.n_tokens = tokens.n;
    Scored searched_scored = score(std::move(searched), w, tokens);
    report.candidates[0].loss = searched_scored.mean;
    TransformOptions plain = options;  // Algorithm 1 itself, unsearched
    plain.search = {};
    std::vector<TransformOptions> alternatives{plain};
    for (TransformKind k : {TransformKind::Identity, TransformKind::Hadamard, TransformKind::Random}) {
        TransformOptions data_free = plain;
        data_free.kind = k;
        alternatives.push_back(data_free);
    }
    std::vector<Scored> winners;
    std::vector<std::size_t> winner_index;
    winners.reserve(alternatives.size());  // `chosen` points into it
    for (std::size_t i = 0; i < alternatives.size(); ++i) {
        QuantizedLayer layer = i == 0 && plain_layer
                                   ? std::move(*plain_layer)
                                   : build(alternatives[i], format, method, calibration, w, d_out, progress, {});
        Scored s = score(std::move(layer), w, tokens);
        report.candidates[i + 1] = paired(s, searched_scored);
        if (report.candidates[i + 1].clearly_better) {
            winners.push_back(std::move(s));
            winner_index.push_back(i + 1);
        }
    }
    Scored* chosen = &searched_scored;
    for (std::size_t j = 0; j < winners.size(); ++j)
        if (winners[j].mean < chosen->mean) {
            chosen = &winners[j];
            report.kept = winner_index[j];
        }
    QuantizedLayer out = std::move(chosen->layer);
    out.guard = report;
    return out;
}

}  // namespace wush::pipeline
