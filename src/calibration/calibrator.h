// Streaming second-moment accumulator for a linear layer's input activations (docs/ARCHITECTURE.md: calibration,
// M_X). Sums S = sum_t x_t x_t^T are kept in float64 and divided by the token count only when a
// moment is read, so shards can be merged (or all-reduced) exactly by adding sums and counts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "calibration/token_sample.h"
#include "wush/wush.h"

namespace wush {

// BlockDiagonal keeps the C = d_in / G diagonal G x G blocks (all WUSH needs); Full keeps the whole
// d_in x d_in matrix (the GPTQ Hessian, whose diagonal blocks are the same moments).
enum class MomentMode : int { BlockDiagonal = 1, Full = 2 };

// Exported calibrator state: a flat vector<double> that ranks can SUM-all-reduce elementwise.
//
//   [0] r                 replica count: 1 in a fresh export, R after summing R exports
//   [1] r * version       layout version (kCalibratorStateVersion) times r
//   [2] r * mode          MomentMode code (1 = block diagonal, 2 = full) times r
//   [3] r * d_in
//   [4] r * G
//   [5] tokens            total token count (exact as a double up to 2^53)
//   [6 ...] sums          block diagonal: C blocks of G x G, row-major, block after block;
//                         full: d_in x d_in row-major. Both triangles are written (symmetric).
//
// Under an elementwise SUM over R ranks the header fields become R times their value, which the
// reader divides out after checking [0] is a positive integer and each field is an exact multiple;
// the token count and the sums add, which is exactly the merged state. The header fields must
// therefore be identical across ranks (the same layer geometry), which import checks.
//
// Version 2 (only when the calibrator keeps a token sample, sample_capacity() > 0) appends
//   [.] k                 sample capacity
//   [.] m                 tokens in the sample (m <= k)
//   [.] keys              k priorities (the first m used, ascending; the rest 0)
//   [.] rows              k x d_in float32 values as doubles (the first m rows used)
// Version 3 (only when the calibrator keeps a validation sample, validation_capacity() > 0)
// is version 2's layout with the sample block present even when empty ([0, 0] for k = 0),
// followed by the validation sample's block in the same form (its k >= 1).
// A sample is not additive: a version-2 or -3 state must have r = 1 (gather the states and merge
// them instead of summing them); import rejects r > 1.
inline constexpr double kCalibratorStateVersion = 1.0;
inline constexpr double kCalibratorSampleStateVersion = 2.0;
inline constexpr double kCalibratorValidationStateVersion = 3.0;

// Largest block size G. The formats' groups are 16 and 32; the bound keeps every G x G and
// d_in x G product far from size_t overflow and lets per-group scratch live on the stack.
inline constexpr std::size_t kMaxGroupSize = 256;
inline constexpr std::size_t kCalibratorStateHeader = 6;

class Calibrator {
public:
    // Throws INVALID_ARGUMENT unless G is a power of two <= kMaxGroupSize dividing d_in (d_in > 0).
    Calibrator(std::size_t d_in, std::size_t group, MomentMode mode);

    // Streams n_tokens x d_in row-major activations of `dtype`. Rejects a batch holding NaN/Inf
    // (NON_FINITE) or with zero tokens / null data (INVALID_ARGUMENT) before changing any state.
    // sequence_length > 0: the tokens are whole sequences (documents) of that many tokens, back
    // to back (INVALID_ARGUMENT unless it divides n_tokens); the token sample then remembers each
    // sampled token's sequence (TokenSample), which the search's guard holds out whole.
    // Inside a DocumentScope the tokens all belong to its document instead (sequence_length is
    // then ignored).
    void add(wush_dtype dtype, const void* x, std::size_t n_tokens, std::size_t sequence_length = 0);

    // While one lives, add() marks its tokens as the caller's document `document` (any 64-bit
    // id; the windows of one document, added in several calls, share it): the token sample keeps
    // each sampled token's document, which the search's guard holds out whole. Scoped so that
    // the backends, which call add(), need not know of documents (wush_calibrator_add_document).
    class DocumentScope {
    public:
        DocumentScope(Calibrator& c, std::uint64_t document) : c_(c) { c_.document_ = document; }
        ~DocumentScope() { c_.document_.reset(); }
        DocumentScope(const DocumentScope&) = delete;
        DocumentScope& operator=(const DocumentScope&) = delete;

    private:
        Calibrator& c_;
    };

    // Adds another calibrator's sums and count (same d_in, G and mode, else INVALID_ARGUMENT),
    // and unites the token samples and the validation samples (keeping this one's capacities).
    void merge(const Calibrator& other);

    // TOKEN SAMPLE. A bounded sample of the calibration tokens (for the transform search's
    // scores; memory k x d_in floats), by TokenSample's bottom-k rule. Capacity 0 (the default)
    // keeps none. INVALID_ARGUMENT once tokens were added, or for k > kMaxSampleTokens.
    void set_sample_capacity(std::size_t k);
    std::size_t sample_capacity() const noexcept { return sample_.capacity(); }
    std::size_t sample_count() const noexcept { return sample_.count(); }
    // The sample, sample_count() x d_in row-major, in ascending priority (a deterministic order).
    std::vector<float> sample() const { return sample_.rows(); }
    // The sequence id of each sample() row (TokenSample::sequence_ids).
    std::vector<std::uint32_t> sample_sequences() const { return sample_.sequence_ids(); }

    // VALIDATION SAMPLE. Tokens of held-out documents (add_validation), kept in a second bounded
    // sample and never added to the sums or the token count: the search's per-layer guard scores
    // on them. INVALID_ARGUMENT once validation tokens were added, or for k > kMaxSampleTokens.
    void set_validation_capacity(std::size_t k);
    std::size_t validation_capacity() const noexcept { return validation_.capacity(); }
    std::size_t validation_count() const noexcept { return validation_.count(); }
    std::vector<float> validation() const { return validation_.rows(); }
    // Offers n_tokens x d_in activations to the validation sample. INVALID_ARGUMENT without a
    // validation capacity, for zero tokens or null data; NON_FINITE for NaN/Inf (state unchanged).
    void add_validation(wush_dtype dtype, const void* x, std::size_t n_tokens);

    // Adds sums accumulated elsewhere (the CUDA backend's float64 device sums) for `tokens` more
    // tokens: accumulators() square matrices of side G (block diagonal) or d_in (full), row-major,
    // at least the upper triangle valid. INVALID_ARGUMENT for a wrong size or non-finite sums.
    void add_sums(std::span<const double> sums, std::uint64_t tokens);

    std::size_t d_in() const noexcept { return d_in_; }
    std::size_t group() const noexcept { return group_; }
    std::size_t blocks() const noexcept { return d_in_ / group_; }
    MomentMode mode() const noexcept { return mode_; }
    std::uint64_t tokens() const noexcept { return tokens_; }

    // M_X of diagonal block `block` (G x G row-major, symmetric) = S_block / tokens. Works in both
    // modes. INVALID_ARGUMENT for a bad block or before any token was added.
    std::vector<double> second_moment(std::size_t block) const;
    // The whole d_in x d_in moment (Full mode only).
    std::vector<double> full_second_moment() const;

    // Raw state (see the layout above) and its size for a given geometry.
    std::vector<double> export_state() const;
    static std::size_t state_size(std::size_t d_in, std::size_t group, MomentMode mode, std::size_t sample_capacity = 0,
                                  std::size_t validation_capacity = 0);
    // Validates everything (header, integer counts, finite sums) and throws INVALID_ARGUMENT on any
    // violation; never reads past state.size().
    // An older layout imports with empty samples for the blocks it lacks: of capacity
    // `default_sample_capacity` (version 1) and `default_validation_capacity` (versions 1, 2).
    static Calibrator import_state(std::span<const double> state, std::size_t default_sample_capacity = 0,
                                   std::size_t default_validation_capacity = 0);

private:
    // Upper-triangle accumulator of block b (full mode: b must be 0, the whole matrix).
    double* sums_of(std::size_t b) noexcept { return sums_.data() + b * side() * side(); }
    const double* sums_of(std::size_t b) const noexcept { return sums_.data() + b * side() * side(); }
    std::size_t side() const noexcept { return mode_ == MomentMode::Full ? d_in_ : group_; }
    std::size_t accumulators() const noexcept { return mode_ == MomentMode::Full ? 1 : blocks(); }
    // Sums with both triangles filled (dsyrk only maintains the upper one).
    std::vector<double> symmetric_sums() const;

    std::size_t d_in_;
    std::size_t group_;
    MomentMode mode_;
    std::uint64_t tokens_ = 0;
    std::vector<double> sums_;               // accumulators() square matrices, upper triangle valid
    TokenSample sample_;                     // of the calibration tokens
    TokenSample validation_;                 // of held-out documents' tokens (not in the sums)
    std::optional<std::uint64_t> document_;  // set by a live DocumentScope
};

}  // namespace wush
