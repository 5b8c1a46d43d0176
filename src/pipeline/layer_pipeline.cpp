#include "pipeline/layer_pipeline.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "eval/layer_loss.h"
#include "prequant/gptq.h"
#include "prequant/rtn.h"
#include "transforms/transform_search.h"

namespace wush::pipeline {

namespace {

// splitmix64's finalizer: the sequence hold-out's seeded order.
std::uint64_t mix64(std::uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// An RTN layer's transform alone, with an explicit search sample (empty: the calibrator's own).
// `plain`, if given, gets the unsearched transform when the build computes it anyway (a searched
// WUS/WUSH build starts from it); `weight_moments`, if given, is the weight's M_W shared by the
// builds of one weight (solve_layer's): empty on entry, this build fills it; filled, it is read.
BlockTransform rtn_transform(const TransformOptions& options, const Calibrator& calibration, std::span<const float> w,
                             std::size_t d_out, Progress* progress, std::span<const float> sample = {},
                             std::optional<BlockTransform>* plain = nullptr,
                             std::vector<double>* weight_moments = nullptr) {
    if (is_data_free(options.kind)) return build_data_free_transform(options, calibration.d_in(), calibration.group());
    const bool search = options.search.enabled;
    // A searched build reports the search's progress alone (most of its time), as one pass.
    LayerSolution solution =
        solve_layer(options, calibration, w, d_out, search ? nullptr : progress,
                    weight_moments ? std::span<const double>(*weight_moments) : std::span<const double>());
    if (weight_moments && weight_moments->empty()) *weight_moments = std::move(solution.weight_moments);
    if (!search) return std::move(solution.transform);
    BlockTransform searched = search_transform(options, calibration, w, d_out, solution, progress, sample,
                                               sample.size() / calibration.d_in());
    if (plain) plain->emplace(std::move(solution.transform));
    return searched;
}

// One layer with an explicit search sample (empty: the calibrator's own); `plain` and
// `weight_moments` as above, RTN only; `inverse`, GPTQ only: the calibrator's inverse Hessian
// factor when computed already.
QuantizedLayer build(const TransformOptions& options, const formats::FormatSpec& format, Method method,
                     const Calibrator& calibration, std::span<const float> w, std::size_t d_out, Progress* progress,
                     std::span<const float> sample, const gptq::InverseHessian* inverse = nullptr,
                     std::optional<BlockTransform>* plain = nullptr, std::vector<double>* weight_moments = nullptr) {
    if (method == Method::Gptq) {
        gptq::Result r = inverse ? gptq::quantize(options, format, calibration, *inverse, w, d_out, progress, sample)
                                 : gptq::quantize(options, format, calibration, w, d_out, progress, sample);
        return {std::move(r.transform), std::move(r.weights), {}};
    }
    BlockTransform t = rtn_transform(options, calibration, w, d_out, progress, sample, plain, weight_moments);
    formats::PackedMatrix q = prequantize_rtn(t, format, w, d_out);
    return {std::move(t), std::move(q), {}};
}

// Tokens the guard scores on, and the search's own sample when the guard takes part of it.
struct GuardTokens {
    GuardSource source = GuardSource::None;
    std::vector<float> held;  // n x d_in
    std::size_t n = 0;
    std::vector<float> search;               // the rest of the token sample (empty: the search's default)
    std::vector<double> reference;           // Y = X W^T on `held` (eval::reference_output), when small enough
    std::size_t n_sequences = 0;             // HoldOutSequences/Documents: how many `held` comes from
    std::vector<std::size_t> held_sequence;  // HoldOutSequences/Documents: each held token's, 0..n_sequences-1
};

void append_row(std::vector<float>& to, const std::vector<float>& all, std::size_t t, std::size_t d) {
    to.insert(to.end(), all.begin() + std::ptrdiff_t(t * d), all.begin() + std::ptrdiff_t((t + 1) * d));
}

// The sequence hold-out when the sample allows it (both halves at least kGuardMinTokens).
bool hold_out_sequences(const Calibrator& calibration, std::uint64_t seed, GuardTokens& g) {
    const std::vector<std::uint32_t> ids = calibration.sample_sequences();
    const std::vector<bool> held = guard_sequence_split(ids, seed);
    const std::size_t n_held = std::size_t(std::count(held.begin(), held.end(), true));
    if (held.empty() || n_held < kGuardMinTokens || ids.size() - n_held < kGuardMinTokens) return false;
    const std::vector<float> all = calibration.sample();
    const std::size_t d = calibration.d_in();
    std::vector<std::uint32_t> held_ids;
    for (std::size_t t = 0; t < ids.size(); ++t) {
        append_row(held[t] ? g.held : g.search, all, t, d);
        if (held[t]) held_ids.push_back(ids[t]);
    }
    std::vector<std::uint32_t> distinct = held_ids;
    std::sort(distinct.begin(), distinct.end());
    distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
    g.n_sequences = distinct.size();
    for (std::uint32_t id : held_ids)
        g.held_sequence.push_back(
            std::size_t(std::lower_bound(distinct.begin(), distinct.end(), id) - distinct.begin()));
    g.n = n_held;
    const bool documents = std::all_of(ids.begin(), ids.end(), TokenSample::is_document_id);
    g.source = documents ? GuardSource::HoldOutDocuments : GuardSource::HoldOutSequences;
    return true;
}

GuardTokens guard_tokens(const Calibrator& calibration, const GuardSettings& guard, std::uint64_t seed) {
    GuardTokens g;
    if (calibration.validation_count() > 0) {
        g.held = calibration.validation();
        g.n = calibration.validation_count();
        g.source = GuardSource::Validation;
        return g;
    }
    const std::size_t n = calibration.sample_count(), d = calibration.d_in();
    if (!guard.hold_out_sample || n / 2 < kGuardMinTokens) return g;
    // Tokens held out from the documents the search fits cannot show a transform that fits those
    // documents only; whole documents held out can.
    if (hold_out_sequences(calibration, seed, g)) return g;
    // The sample is in the order of random priorities, so every second token is a random half.
    const std::vector<float> all = calibration.sample();
    for (std::size_t t = 0; t < n; ++t) append_row(t % 2 == 1 ? g.held : g.search, all, t, d);
    g.n = n / 2;
    g.source = GuardSource::HoldOut;
    return g;
}

// The reference product is the same for every candidate: computed once when it fits this budget
// (else each loss computes it again, tile by tile, with the same values).
inline constexpr std::size_t kReferenceBudgetBytes = std::size_t(256) << 20;

// The output rows the guard scores (guard_rows in layer_pipeline.h): their indices, and a copy of
// their weights (none when every row is scored).
struct ScoredRows {
    std::vector<std::size_t> index;
    std::vector<float> w;  // index.size() x d_in
    bool all = true;
};

ScoredRows scored_rows(std::span<const float> w, std::size_t d_out, std::size_t d_in) {
    ScoredRows r;
    r.index = guard_rows(d_out);
    r.all = r.index.size() == d_out;
    if (r.all) return r;
    r.w.reserve(r.index.size() * d_in);
    for (std::size_t o : r.index)
        r.w.insert(r.w.end(), w.begin() + std::ptrdiff_t(o * d_in), w.begin() + std::ptrdiff_t((o + 1) * d_in));
    return r;
}

// The rows `index` of packed weights (quantize_rows' layout: whole rows of codes and scales).
formats::PackedMatrix select_rows(const formats::FormatSpec& format, const formats::PackedMatrix& q,
                                  std::span<const std::size_t> index) {
    const formats::PackedSizes row = formats::packed_sizes(format, 1, q.d_in);
    std::vector<std::uint8_t> codes, scales;
    codes.reserve(index.size() * row.codes);
    scales.reserve(index.size() * row.scales);
    for (std::size_t o : index) {
        const auto c = q.codes.span().subspan(o * row.codes, row.codes);
        const auto s = q.scales.span().subspan(o * row.scales, row.scales);
        codes.insert(codes.end(), c.begin(), c.end());
        scales.insert(scales.end(), s.begin(), s.end());
    }
    return {q.format, index.size(), q.d_in, formats::ByteView(std::move(codes)), formats::ByteView(std::move(scales))};
}

// One candidate of the guard: its transform, its weights on the scored rows, and its whole
// weights when they were built (the searched layer, plain GPTQ-WUSH, or every row scored). An
// RTN alternative is quantized on the scored rows only, and on every row only if it is kept:
// RTN quantizes each row alone, so those rows are the whole layer's rows, byte for byte; so is a
// data-free GPTQ alternative (gptq_rows_candidate).
struct Candidate {
    BlockTransform transform;
    std::optional<formats::PackedMatrix> whole;
    formats::PackedMatrix scored;
    std::vector<double> token_errors;
    double mean = 0.0;
};

Candidate candidate(QuantizedLayer layer, const formats::FormatSpec& format, const ScoredRows& rows) {
    Candidate c{std::move(layer.transform), std::move(layer.weights), {}, {}, 0.0};
    c.scored = rows.all ? *c.whole : select_rows(format, *c.whole, rows.index);
    return c;
}

Candidate rtn_candidate(BlockTransform t, const formats::FormatSpec& format, std::span<const float> w,
                        std::size_t d_out, const ScoredRows& rows) {
    if (rows.all) {
        formats::PackedMatrix q = prequantize_rtn(t, format, w, d_out);
        return candidate({std::move(t), std::move(q), {}}, format, rows);
    }
    formats::PackedMatrix scored = prequantize_rtn(t, format, rows.w, rows.index.size());
    return {std::move(t), std::nullopt, std::move(scored), {}, 0.0};
}

// A data-free GPTQ alternative on the scored rows only: its transform does not depend on the
// weights, and GPTQ quantizes each row alone (its error feedback runs along the row, through the
// shared inverse Hessian), so these are the whole layer's rows, byte for byte
// (capi_validation checks it); it is built on every row only if kept. (A data-aware layer's
// transform depends on every row: plain GPTQ-WUSH is built whole.)
Candidate gptq_rows_candidate(const TransformOptions& options, const formats::FormatSpec& format,
                              const Calibrator& calibration, const gptq::InverseHessian& inverse,
                              const ScoredRows& rows, Progress* progress) {
    QuantizedLayer layer =
        build(options, format, Method::Gptq, calibration, rows.w, rows.index.size(), progress, {}, &inverse);
    return {std::move(layer.transform), std::nullopt, std::move(layer.weights), {}, 0.0};
}

void score(Candidate& c, std::span<const float> w_scored, const GuardTokens& tokens) {
    c.token_errors.assign(tokens.n, 0.0);
    c.mean = eval::layer_loss(c.transform, c.scored, w_scored, tokens.held, tokens.n, c.token_errors, tokens.reference);
}

// The mean and standard error of paired differences d (sample variance with n - 1).
std::pair<double, double> mean_and_error(std::span<const double> d) {
    const double n = double(d.size());
    double mean = 0.0, var = 0.0;
    for (double v : d) mean += v;
    mean /= n;
    for (double v : d) var += (v - mean) * (v - mean);
    var /= n - 1.0;
    return {mean, std::sqrt(var / n)};
}

// The paired comparison of `alt` with `base`: the mean of the per-token differences base - alt
// and its standard error; under the sequence hold-out also that of the per-sequence sums.
GuardCandidateScore paired(const Candidate& alt, const Candidate& base, const GuardTokens& tokens) {
    const std::size_t n = base.token_errors.size();
    std::vector<double> d(n);
    for (std::size_t t = 0; t < n; ++t) d[t] = base.token_errors[t] - alt.token_errors[t];
    GuardCandidateScore c;
    c.loss = alt.mean;
    std::tie(c.difference, c.std_error) = mean_and_error(d);
    const bool lower = alt.mean < kGuardMargin * base.mean;
    // `alt` beats `base` by a margin the held-out sample supports: its mean lower by more than
    // 1%, and the mean of the paired differences above two of its standard errors.
    c.clearly_better = lower && c.difference > kGuardStandardErrors * c.std_error;
    // Whole held-out sequences: a sequence's few heavy tokens (its first, with massive
    // activations) carry most of a layer's loss and make the per-token differences' spread wide;
    // summed per sequence, every unit holds its own, and the sums are the statistic that
    // matches how the documents were drawn. Either statistic may confirm the margin.
    if (kGuardSequenceStatistic && tokens.n_sequences >= kGuardMinSequences) {
        std::vector<double> sums(tokens.n_sequences, 0.0);
        for (std::size_t t = 0; t < n; ++t) sums[tokens.held_sequence[t]] += d[t];
        const auto [mean, error] = mean_and_error(sums);
        c.clearly_better |= lower && mean > kGuardStandardErrors * error;
    }
    return c;
}

// Candidates lower than the kept layer by the margin that the rule could not confirm: the
// held-out tokens cannot tell them apart from the kept layer (said, not silently kept).
void mark_undecided(GuardReport& report, const std::vector<Candidate>& all) {
    for (std::size_t i = 0; i < all.size(); ++i) {
        if (i == report.kept || !(all[i].mean < kGuardMargin * all[report.kept].mean)) continue;
        report.candidates[i].undecided = true;
        if (!report.undecided || all[i].mean < all[report.undecided_candidate].mean) report.undecided_candidate = i;
        report.undecided = true;
    }
}

// The alternatives to the searched layer, in wush_guard_candidate's order after it: plain WUS/WUSH,
// I, H, R, and plain WUS/WUSH with shrunk moments. Shrinking both moments halfway to isotropic
// (damping kGuardShrunkDamping: M + tr(M)/G I) keeps what a layer's second moments share across
// documents and drops what only the calibration documents have; on text unlike the calibration
// text it can beat both the 1%-damped layer and the data-free ones (docs/record/eval-record.md).
std::vector<TransformOptions> alternatives(const TransformOptions& options) {
    TransformOptions plain = options;  // Algorithm 1 itself, unsearched
    plain.search = {};
    std::vector<TransformOptions> out{plain};
    for (TransformKind k : {TransformKind::Identity, TransformKind::Hadamard, TransformKind::Random}) {
        TransformOptions data_free = plain;
        data_free.kind = k;
        out.push_back(data_free);
    }
    TransformOptions shrunk = plain;
    shrunk.damping = std::max(options.damping, kGuardShrunkDamping);
    shrunk.hessian_damping = options.gptq_damping();  // GPTQ's own regularizer, and the shared factor
    out.push_back(shrunk);
    return out;
}

// The data-aware candidates (the searched layer, then each data-aware alternative) built from the
// search half of the token sample alone (its moments and its search sample): under the document
// hold-out, that half is the other documents' tokens. In the report's order, the data-free ones
// left empty. Scored only, never returned, so RTN quantizes just the scored rows. RTN's builds
// also fill `weight_moments` (the weight's M_W, which depends on the weight alone): the kept
// layer, built again on every token, reuses it.
std::vector<std::optional<Candidate>> cross_fit(const TransformOptions& options, std::span<const TransformOptions> alts,
                                                const formats::FormatSpec& format, Method method,
                                                const Calibrator& calibration, std::span<const float> w,
                                                std::size_t d_out, Progress* progress, const GuardTokens& tokens,
                                                const ScoredRows& rows, std::vector<double>& weight_moments) {
    Calibrator fit(calibration.d_in(), calibration.group(), calibration.mode());
    fit.add(WUSH_DTYPE_F32, tokens.search.data(), tokens.search.size() / calibration.d_in());
    std::vector<std::optional<Candidate>> built(alts.size() + 1);
    if (method == Method::Rtn) {
        std::optional<BlockTransform> plain_transform;  // comes with the searched build
        built[0] = rtn_candidate(
            rtn_transform(options, fit, w, d_out, progress, tokens.search, &plain_transform, &weight_moments), format,
            w, d_out, rows);
        for (std::size_t i = 0; i < alts.size(); ++i) {
            if (is_data_free(alts[i].kind)) continue;
            BlockTransform t = i == 0 && plain_transform
                                   ? std::move(*plain_transform)
                                   : rtn_transform(alts[i], fit, w, d_out, progress, {}, nullptr, &weight_moments);
            built[i + 1] = rtn_candidate(std::move(t), format, w, d_out, rows);
        }
        return built;
    }
    const gptq::InverseHessian inverse = gptq::inverse_hessian(fit, options.gptq_damping());
    built[0] =
        candidate(build(options, format, method, fit, w, d_out, progress, tokens.search, &inverse), format, rows);
    for (std::size_t i = 0; i < alts.size(); ++i)
        if (!is_data_free(alts[i].kind))
            built[i + 1] =
                candidate(build(alts[i], format, method, fit, w, d_out, progress, {}, &inverse), format, rows);
    return built;
}

}  // namespace

bool is_data_free(TransformKind kind) {
    return kind == TransformKind::Identity || kind == TransformKind::Hadamard || kind == TransformKind::Random;
}

std::vector<bool> guard_sequence_split(std::span<const std::uint32_t> ids, std::uint64_t seed) {
    std::vector<std::uint32_t> distinct(ids.begin(), ids.end());
    std::sort(distinct.begin(), distinct.end());
    distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
    if (distinct.size() < 2 || distinct.front() == 0) return {};
    // A seeded random order of the sequences, spread over the calibration set.
    const auto order_key = [&](std::uint32_t id) { return mix64(mix64(seed) ^ id); };
    std::sort(distinct.begin(), distinct.end(),
              [&](std::uint32_t a, std::uint32_t b) { return order_key(a) < order_key(b); });
    std::vector<bool> held(ids.size(), false);
    std::size_t n_held = 0, n_search = 0;
    for (std::uint32_t id : distinct) {
        const bool to_held = n_held <= n_search;
        for (std::size_t t = 0; t < ids.size(); ++t) {
            if (ids[t] != id) continue;
            held[t] = to_held;
            ++(to_held ? n_held : n_search);
        }
    }
    return held;
}

std::vector<std::size_t> guard_rows(std::size_t d_out) {
    const std::size_t k = d_out / kGuardRowsTarget;
    if (d_out < kGuardAllRowsBelow || k < 2) {
        std::vector<std::size_t> all(d_out);
        std::iota(all.begin(), all.end(), std::size_t(0));
        return all;
    }
    std::vector<std::size_t> rows(d_out / k);
    for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = i * k + i % k;
    return rows;
}

QuantizedLayer guarded_layer(const TransformOptions& options, const formats::FormatSpec& format, Method method,
                             const Calibrator& calibration, std::span<const float> w, std::size_t d_out,
                             Progress* progress, const GuardSettings& guard) {
    GuardTokens tokens = options.search.enabled && !is_data_free(options.kind)
                             ? guard_tokens(calibration, guard, options.seed)
                             : GuardTokens{};
    const bool guarded = tokens.n >= 2;
    // GPTQ's inverse Hessian factor depends on the calibrator and the damping alone, not on the
    // transform: the guard's up to six builds share one (factoring it is O(d_in^3) each time).
    std::optional<gptq::InverseHessian> inverse;
    if (guarded && method == Method::Gptq) inverse = gptq::inverse_hessian(calibration, options.gptq_damping());
    const gptq::InverseHessian* shared = inverse ? &*inverse : nullptr;
    // Held-out documents that are in the moments cannot show a transform that fits the
    // calibration documents only (it was fit on them too). So under the document hold-out the
    // data-aware candidates (searched, plain, shrunk) are scored as built from the other
    // documents' sampled tokens alone: a cross-fit (cross_fit). The one kept is then built on
    // every token, after the decision: the searched layer with the cross-fit's per-block choices
    // replayed on every token's moments (SearchOptions::replay), so the search runs once, on the
    // fit half; and RTN reuses the weight's M_W from the cross-fit's builds.
    const bool cross_fitted = guarded && tokens.source == GuardSource::HoldOutDocuments;
    // A searched RTN build computes plain WUS/WUSH on the way (the same blocks, the same values),
    // and the weight's M_W, which the other data-aware RTN builds reuse.
    std::optional<BlockTransform> plain_transform;
    std::vector<double> weight_moments;
    const bool rtn_guarded = guarded && method == Method::Rtn;
    std::optional<QuantizedLayer> searched;
    if (!cross_fitted)
        searched = build(options, format, method, calibration, w, d_out, progress, tokens.search, shared,
                         rtn_guarded ? &plain_transform : nullptr, rtn_guarded ? &weight_moments : nullptr);
    if (!guarded) return std::move(*searched);

    const std::size_t d_in = calibration.d_in();
    const ScoredRows rows = scored_rows(w, d_out, d_in);
    const std::span<const float> w_scored = rows.all ? w : std::span<const float>(rows.w);
    if (tokens.n * rows.index.size() <= kReferenceBudgetBytes / sizeof(double))
        tokens.reference = eval::reference_output(w_scored, rows.index.size(), d_in, tokens.held, tokens.n);
    GuardReport report;
    report.source = tokens.source;
    report.n_tokens = tokens.n;
    report.n_sequences = tokens.n_sequences;
    const std::vector<TransformOptions> alts = alternatives(options);
    std::vector<std::optional<Candidate>> fitted;  // cross-fitted data-aware candidates
    if (cross_fitted)
        fitted =
            cross_fit(options, alts, format, method, calibration, w, d_out, progress, tokens, rows, weight_moments);
    std::vector<double>* moments = weight_moments.empty() ? nullptr : &weight_moments;  // RTN's builds fill it
    std::vector<Candidate> all;
    all.reserve(kGuardCandidates);
    all.push_back(cross_fitted ? std::move(*fitted[0]) : candidate(std::move(*searched), format, rows));
    score(all[0], w_scored, tokens);
    report.candidates[0].loss = all[0].mean;
    for (std::size_t i = 0; i < alts.size(); ++i) {
        if (cross_fitted && fitted[i + 1]) all.push_back(std::move(*fitted[i + 1]));
        else if (method == Method::Rtn)
            all.push_back(rtn_candidate(i == 0 && plain_transform ? std::move(*plain_transform)
                                                                  : rtn_transform(alts[i], calibration, w, d_out,
                                                                                  progress, {}, nullptr, moments),
                                        format, w, d_out, rows));
        else if (is_data_free(alts[i].kind) && !rows.all)
            all.push_back(gptq_rows_candidate(alts[i], format, calibration, *inverse, rows, progress));
        else
            all.push_back(
                candidate(build(alts[i], format, method, calibration, w, d_out, progress, {}, shared), format, rows));
        score(all.back(), w_scored, tokens);
        report.candidates[i + 1] = paired(all.back(), all[0], tokens);
    }
    for (std::size_t i = 1; i < all.size(); ++i)
        if (report.candidates[i].clearly_better && all[i].mean < all[report.kept].mean) report.kept = i;
    mark_undecided(report, all);
    const bool data_aware_kept = report.kept == 0 || !is_data_free(alts[report.kept - 1].kind);
    if (cross_fitted && data_aware_kept) {
        TransformOptions replayed = options;
        replayed.search.replay = all[0].transform.stats().search;
        QuantizedLayer whole = build(report.kept == 0 ? replayed : alts[report.kept - 1], format, method, calibration,
                                     w, d_out, progress, {}, shared, nullptr, moments);
        whole.guard = report;
        return whole;
    }
    Candidate& kept = all[report.kept];
    if (kept.whole) return {std::move(kept.transform), std::move(*kept.whole), report};
    if (method == Method::Rtn) {
        formats::PackedMatrix weights = prequantize_rtn(kept.transform, format, w, d_out);  // before the move below
        return {std::move(kept.transform), std::move(weights), report};
    }
    QuantizedLayer whole = build(alts[report.kept - 1], format, method, calibration, w, d_out, progress, {}, shared);
    whole.guard = report;
    return whole;
}

}  // namespace wush::pipeline
