// One layer from calibration to a transform and pre-quantized weights: the choice between RTN and
// GPTQ, data-aware and data-free transforms, and the search's per-layer guard. The C API, the CLI
// and the Python package all reach it through wush_layer_quantize, so the rules live here once.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "calibration/calibrator.h"
#include "common/progress.h"
#include "formats/block_format.h"
#include "formats/packed_matrix.h"
#include "transforms/block_transform.h"

namespace wush::pipeline {

enum class Method { Rtn, Gptq };

// What the search's per-layer guard (guarded_layer) saw and decided; wush_transform_guard()
// reports it. Candidates in this order (wush_guard_candidate's values): the searched layer, plain
// (unsearched) WUS/WUSH, I, H, R, and plain WUS/WUSH with shrunk moments (kGuardShrunkDamping).
enum class GuardSource { None = 0, Validation = 1, HoldOut = 2, HoldOutSequences = 3, HoldOutDocuments = 4 };
inline constexpr std::size_t kGuardCandidates = 6;
struct GuardCandidateScore {
    double loss = std::numeric_limits<double>::quiet_NaN();  // mean held-out layer loss
    double difference = 0.0;      // mean of the paired per-token differences searched - candidate
    double std_error = 0.0;       // their standard error, sqrt(var / n) (var with n - 1)
    bool clearly_better = false;  // passed the rule against the searched layer
    bool undecided = false;       // lower than the kept layer by the margin, but inside the noise
};
struct GuardReport {
    GuardSource source = GuardSource::None;  // None: no guard ran (the rest is then empty)
    std::size_t n_tokens = 0;                // held-out tokens scored
    std::size_t kept = 0;                    // index of the candidate returned
    std::size_t n_sequences = 0;             // held-out sequences or documents (HoldOutSequences/Documents), else 0
    // Some candidate's held-out loss is below kGuardMargin times the kept layer's, yet it did not
    // pass the rule: the held-out tokens cannot tell (more validation documents would).
    bool undecided = false;
    std::size_t undecided_candidate = 0;  // the lowest such candidate (0 when not undecided)
    std::array<GuardCandidateScore, kGuardCandidates> candidates{};
};

struct QuantizedLayer {
    BlockTransform transform;
    formats::PackedMatrix weights;
    GuardReport guard;  // what the guard decided (source None when none ran)
};

// Whether a transform kind is built without calibration data (identity, Hadamard, random).
bool is_data_free(TransformKind kind);

// The search's per-layer guard (guarded_layer).
struct GuardSettings {
    // Without validation tokens in the calibrator, hold out half of its token sample for the
    // guard, and search on the other half: whole sequences (guard_sequence_split) when the sample
    // knows its tokens' sequences and has at least two, else every second token in the sample's
    // random order. When the marks are documents (Calibrator::DocumentScope) the held-out
    // documents are left out of the data-aware candidates' fit as well (guarded_layer).
    bool hold_out_sample = true;
};

// An alternative must be lower than the searched layer by more than this factor (and by more
// than kGuardStandardErrors standard errors of the paired differences) to replace it.
inline constexpr double kGuardMargin = 0.99;
// The shrunk candidate's damping (lambda of Algorithm 1, relative to tr(M)/G; the options' own
// when larger): both moments halfway to isotropic. For GPTQ it is the transform's damping only:
// the Hessian keeps the options' (TransformOptions::hessian_damping), one factor for every candidate.
inline constexpr double kGuardShrunkDamping = 1.0;
inline constexpr double kGuardStandardErrors = 2.0;
// Under the sequence hold-out with at least kGuardMinSequences held-out sequences, the paired
// per-sequence sums may confirm the margin too (guarded_layer).
inline constexpr bool kGuardSequenceStatistic = true;
inline constexpr std::size_t kGuardMinSequences = 8;

// The sequence hold-out: given each sample token's sequence id (Calibrator::sample_sequences),
// which tokens are held out (true) — whole sequences, each sequence in a seeded random order of
// the distinct ids going to the side with fewer tokens so far (the held-out side on a tie), so
// the two halves are spread over the calibration set and balanced in tokens. Empty when some
// token has no id (0) or there are fewer than two sequences.
std::vector<bool> guard_sequence_split(std::span<const std::uint32_t> ids, std::uint64_t seed);

// Fewest held-out tokens the guard decides on; a smaller held-out sample keeps the searched layer.
inline constexpr std::size_t kGuardMinTokens = 32;

// The output rows whose held-out loss the guard compares: every row of a layer with fewer than
// kGuardAllRowsBelow outputs; otherwise about kGuardRowsTarget of them, one from each run of
// k = d_out / kGuardRowsTarget consecutive rows, at offset i % k in the i-th run (so every
// residue mod k is scored, and rows interleaved with a period dividing k are all represented):
// rows i * k + i % k for i < d_out / k. The loss is a mean over outputs; a fixed subset of them
// estimates it, at a fraction of the cost of the full products (each candidate's weights are
// quantized and scored on these rows only). Each candidate is scored on the same rows, so the
// paired differences compare like with like, and the kept layer is returned whole.
inline constexpr std::size_t kGuardAllRowsBelow = 2048;
inline constexpr std::size_t kGuardRowsTarget = 512;
std::vector<std::size_t> guard_rows(std::size_t d_out);

// The transform `options` describe (kind, damping, seed, storage, search) for `format`, and the
// weights w (d_out x d_in, float32, finite) pre-quantized against it by `method` (data-free kinds
// ignore the calibrator's statistics and the search settings); then the search's per-layer
// guard, when `options` searches a data-aware kind:
// the searched layer competes with plain (unsearched) WUS/WUSH, the same with shrunk moments,
// and the data-free I, H and R layers built by the same method, scored on held-out tokens: the
// calibrator's validation tokens (documents the calibration did not see) when it holds some,
// else, by default, half of its
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
