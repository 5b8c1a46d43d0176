// Per-block transforms of a linear layer (docs/ARCHITECTURE.md: math conventions; the paper's
// Algorithm 1 and eq. hsuw).
//
// Side convention (paper eq. layer_forward_pass): Y = sum_i q(T_xvsh,i W_i)^T q(T_wush,i X_i), so
//   - the ACTIVATION side gets T_act = T_wush = H S^{-1/2} U^T W'^T (applied online, stored float32);
//   - the WEIGHT side gets T_w = T_act^{-T} (= T_xvsh), folded offline into the weights.
// In framework layout (W: d_out x d_in, X: n x d_in) a token's block slice x_i (length G) becomes
// T_act x_i and an output row's block slice w_i becomes T_w w_i; then (T_w w_i)^T (T_act x_i) =
// w_i^T x_i exactly. The stored T_act is float32, and T_w is the float64 inverse-transpose of that
// rounded matrix, so the unquantized product stays exact up to float64 rounding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "calibration/calibrator.h"
#include "common/names.h"
#include "common/progress.h"

namespace wush {

enum class TransformKind : int { Identity = 0, Hadamard = 1, Random = 2, WUS = 3, WUSH = 4 };
// Every kind, in value order: the one list that loops and name tables are sized from.
inline constexpr TransformKind kTransformKinds[] = {TransformKind::Identity, TransformKind::Hadamard,
                                                    TransformKind::Random, TransformKind::WUS, TransformKind::WUSH};
// The kinds' names as checkpoints store them (common/names.h: read back ignoring case).
inline constexpr Named<TransformKind> kTransformKindNames[] = {{TransformKind::Identity, "identity"},
                                                               {TransformKind::Hadamard, "hadamard"},
                                                               {TransformKind::Random, "random"},
                                                               {TransformKind::WUS, "wus"},
                                                               {TransformKind::WUSH, "wush"}};
static_assert(std::size(kTransformKindNames) == std::size(kTransformKinds));
const char* transform_kind_name(TransformKind kind);
std::optional<TransformKind> transform_kind_from_name(std::string_view name);

// The candidate a searched block got (stage 1: base and sign pattern; stage 2: the scale).
enum class SearchBase : std::uint8_t { Solution = 0, Hadamard = 1, Identity = 2, Random = 3, Rotated = 4 };
struct BlockChoice {
    SearchBase base = SearchBase::Solution;
    std::uint8_t sign_pattern = 0;  // 0 = the canonical signs; for Rotated, which rotation (1..)
    std::uint8_t scale_step = 0;    // c = 2^(scale_step / scale_steps)
    double score = 0.0;             // the chosen candidate's score
    double plain_score = 0.0;       // the unsearched solution's score (canonical signs, c = 1)
                                    // (a replayed choice keeps the scores of the search that made it)
};

// The per-block search over WUSH's free parameters (transforms/transform_search.h).
struct SearchOptions {
    // The candidate counts below default to kByFormat: resolved per format by
    // search_candidate_counts() (transform_search.h), as measured in
    // docs/record/eval-record.md.
    static constexpr std::size_t kByFormat = static_cast<std::size_t>(-1);
    bool enabled = false;                    // WUS / WUSH only; the data-free kinds ignore it
    wush_format format = WUSH_FORMAT_MXFP4;  // the quantizer the candidates are scored with
    std::size_t sample_tokens = 256;         // tokens per block in the score
    std::size_t weight_rows = 256;           // weight rows per block in the score (evenly strided)
    std::size_t sign_patterns = kByFormat;   // seeded random sign patterns besides the canonical one
    std::size_t rotations = kByFormat;       // seeded random rotations Q in place of H (T = Q A)
    std::size_t screen_keep = kByFormat;     // > 0: stage 1 screened on a quarter of the sample, this
                                             // many candidates then scored in full (0 = no screening)
    std::size_t scale_steps = 8;             // scales c = 2^(k / scale_steps), k = 0..scale_steps-1, searched
                                             // coarse to fine (the even k, then the best one's neighbours)
    // With `enabled`, non-empty (one per block): no search; block b gets the candidate replay[b] names, built from
    // this build's own solution (replay_block, transform_search.h), e.g. the choices a search on
    // part of the tokens made, replayed on the moments of all of them (the guard's cross-fit).
    std::vector<BlockChoice> replay;
};

struct TransformOptions {
    // A constructor rather than aggregate initialization: `{kind, damping, seed}` stays valid as
    // fields are added, without -Wmissing-field-initializers noise at every call site.
    TransformOptions() = default;
    TransformOptions(TransformKind k, double d = 0.01, std::uint64_t s = 0, wush_dtype st = WUSH_DTYPE_F32)
        : kind(k), damping(d), seed(s), storage(st) {}

    TransformKind kind = TransformKind::WUSH;
    double damping = 0.01;  // lambda of Algorithm 1 (relative to tr(M)/G); >= 0
    // GPTQ's Hessian damping (relative to tr(H)/d_in; >= 0); unset: `damping` (gptq_damping()).
    std::optional<double> hessian_damping;
    double gptq_damping() const { return hessian_damping.value_or(damping); }
    std::uint64_t seed = 0;  // Random only: block b uses random_rotation(G, mix_seed(seed) + b)
    // The checkpoint storage type of the activation transforms (F32, BF16 or F16). Every builder
    // (build_transform, build_data_free_transform, gptq::quantize) rounds T_act to it before the
    // weight side is derived, so the weights are always quantized against the matrices that will
    // be stored: one rule, in one place (round_for_storage), for RTN and GPTQ alike.
    wush_dtype storage = WUSH_DTYPE_F32;
    SearchOptions search;
};

// Float64 result of Algorithm 1 for one block (WUS or WUSH).
struct BlockSolution {
    std::vector<double> t_act;            // G x G, T_wush (WUS: S^{-1/2} U^T W'^T)
    std::vector<double> t_weight;         // G x G, T_xvsh from its closed form H S^{-1/2} V^T X'^T
    std::vector<double> singular_values;  // S, G values, descending; all zero after a fallback
    bool fell_back = false;
    bool rank_deficient = false;  // undamped M_X or M_W not numerically positive definite
};

// Algorithm 1 on one block's G x G row-major moments. Never throws for numerical trouble:
//
// FALLBACK RULE. The data-dependent factor S^{-1/2} U^T W'^T is replaced by the identity, i.e. the
// block gets T = H for WUSH and T = I for WUS (both orthogonal, so T_w = T), when
//   - tr(M_X) or tr(M_W) is zero or not finite (an all-zero block: damping cannot help), or
//   - dpotrf fails on a damped moment, or dgesvd fails, or
//   - the smallest singular value is not > 1e-12 * the largest (S^{-1/2} would be meaningless), or
//   - damping == 0 and M_X or M_W is rank deficient (a Cholesky pivot^2 <= 1e-10 tr(M)/G).
// Rank-deficient moments are NOT a fallback when damping > 0: damping makes them positive
// definite, and the block is only flagged rank_deficient for the stats.
BlockSolution solve_block(TransformKind kind, std::span<const double> m_w, std::span<const double> m_x, std::size_t g,
                          double damping);

// S^T S / d_out of a d_out x G row-major float64 slice S (G x G row-major, both triangles).
std::vector<double> slice_second_moment(std::span<const double> slice, std::size_t d_out, std::size_t g);

// The d_out x G float64 column slice W_b of block b of the framework weight (d_out x d_in).
std::vector<double> weight_slice(std::span<const float> w, std::size_t d_out, std::size_t d_in, std::size_t g,
                                 std::size_t block);

// The slices of blocks first..first+count-1, in one pass over the rows: a block's columns are
// G floats of every row, one short read per memory page, and reading the neighbours' in the
// same pass costs almost nothing more (the page is already mapped and the lines are adjacent).
std::vector<std::vector<double>> weight_slices(std::span<const float> w, std::size_t d_out, std::size_t d_in,
                                               std::size_t g, std::size_t first, std::size_t count);

// The same into `slices` (one per block from `first`, each resized to d_out x G): a caller that
// reuses its vectors from chunk to chunk keeps their memory, where fresh ones of this size are
// fresh pages from the system each time (page faults were a large part of the plain build's
// time, docs/record/performance-record.md).
void fill_weight_slices(std::span<const float> w, std::size_t d_out, std::size_t d_in, std::size_t g, std::size_t first,
                        std::span<std::vector<double>> slices);

// M_W of block b: W_b^T W_b / d_out with W_b the d_out x G column slice of the framework weight
// (= the paper's W_i W_i^T / d_out). G x G row-major float64.
std::vector<double> weight_second_moment(std::span<const float> w, std::size_t d_out, std::size_t d_in, std::size_t g,
                                         std::size_t block);

struct TransformStats {
    std::vector<std::size_t> fallback_blocks;        // ascending block indices (see FALLBACK RULE)
    std::vector<std::size_t> rank_deficient_blocks;  // ascending; damped, not necessarily fallen back
    std::vector<double> singular_values;             // C x G, row b = S of block b (WUS/WUSH only)
    std::vector<BlockChoice> search;                 // C entries when the search ran or was replayed, else empty
};

class BlockTransform {
public:
    // Takes the stored activation-side matrices, C = d_in / G blocks of G x G row-major float32,
    // and derives the weight side in float64 from exactly these values (T_w = T_act^{-T}).
    // Throws NON_FINITE for NaN/Inf entries, NUMERICAL for a singular block, INVALID_ARGUMENT for
    // a bad shape.
    BlockTransform(std::size_t d_in, std::size_t group, TransformKind kind, std::vector<float> activation,
                   double damping = 0.0, TransformStats stats = {});

    std::size_t d_in() const noexcept { return d_in_; }
    std::size_t group() const noexcept { return group_; }
    std::size_t blocks() const noexcept { return d_in_ / group_; }
    TransformKind kind() const noexcept { return kind_; }
    double damping() const noexcept { return damping_; }
    const TransformStats& stats() const noexcept { return stats_; }

    // The same transform with T_act rounded (RNE) to the storage type of a checkpoint (F32: a
    // copy, BF16 or F16), and the weight side re-derived from the rounded values so that the
    // unquantized product stays exact. INVALID_ARGUMENT for an entry out of the F16 range.
    BlockTransform rounded_to(wush_dtype storage) const;

    // (C, G, G) row-major: block b maps x_b to T_act,b x_b / w_b to T_w,b w_b.
    std::span<const float> activation_matrices() const noexcept { return act_; }
    std::span<const double> weight_matrices() const noexcept { return weight_; }

    // out (n x d_in) = per block x_b -> T_act,b x_b for the n x d_in row-major activations x.
    // float32 arithmetic (sgemm), the precision the runtime kernels use.
    void apply_activations(std::span<const float> x, std::size_t n, std::span<float> out) const;
    // out (d_out x d_in) = per output row and block w_b -> T_w,b w_b, computed in float64 and
    // rounded once to float32.
    void apply_weights(std::span<const float> w, std::size_t d_out, std::span<float> out) const;

private:
    std::size_t d_in_;
    std::size_t group_;
    TransformKind kind_;
    double damping_;
    std::vector<float> act_;
    std::vector<double> weight_;
    TransformStats stats_;
};

// T_w = T_act^{-T} of one G x G row-major block, in float64 from the float32 entries; empty when
// the block is singular.
std::vector<double> inverse_transpose(const float* t_act, std::size_t g);

// One activation-transform entry rounded (RNE) to the storage type of a checkpoint (F32: as is,
// BF16 or F16). INVALID_ARGUMENT for an entry out of the F16 range or an unknown dtype.
float round_for_storage(float v, wush_dtype storage);

// Block `block` of the data-free transform `kind` (Identity, Hadamard, Random) with TransformOptions
// seed `seed`, in float64 before storage rounding: the one definition of these blocks, shared by
// build_data_free_transform and the search's fall-backs (so a block that falls back to R is R's).
std::vector<double> data_free_block(TransformKind kind, std::size_t g, std::uint64_t seed, std::size_t block);

// The Identity / Hadamard / Random transforms need no data. Rounded to options.storage.
BlockTransform build_data_free_transform(const TransformOptions& options, std::size_t d_in, std::size_t group);

// Algorithm 1 on every block of a WUS/WUSH layer: the plain transform, and what a refinement of
// its blocks starts from (the search: search_transform, transforms/transform_search.h).
struct LayerSolution {
    BlockTransform transform;            // T_act rounded to options.storage; stats without `search`
    std::vector<BlockSolution> blocks;   // block b's float64 solution, before the rounding
    std::vector<double> weight_moments;  // M_W of every block (C x G x G, weight_second_moment's values)
};

// WUS/WUSH only, geometry from the calibrator (its diagonal blocks in Full mode), from its moments
// (at least one token) and the d_out x d_in float32 weight (finite). Blocks are solved in
// parallel (OpenMP); `progress`, if given, hears of every finished block and may cancel
// (CANCELLED). options.search is not read. The activation side is rounded to options.storage
// (INVALID_ARGUMENT for an unknown dtype or an entry out of the F16 range).
//
// `weight_moments`, if not empty: M_W of every block (a LayerSolution's weight_moments of the
// same weight), which depends on the weight alone: read instead of computed, so no weight slice
// is read. Builds of one weight on different calibrators or dampings (the guard's cross-fit, then
// the kept layer on every token) compute it once. The result is the same bit for bit.
LayerSolution solve_layer(const TransformOptions& options, const Calibrator& calibration, std::span<const float> weight,
                          std::size_t d_out, Progress* progress = nullptr, std::span<const double> weight_moments = {});

// Any kind: the data-free ones (which only check the shapes) as build_data_free_transform,
// WUS/WUSH as solve_layer's transform. Without the search: a searched build (options.search.enabled,
// WUS/WUSH) is INVALID_ARGUMENT here; it is transforms/transform_search.h's
// (build_searched_transform, or solve_layer then search_transform).
BlockTransform build_transform(const TransformOptions& options, const Calibrator& calibration,
                               std::span<const float> weight, std::size_t d_out, Progress* progress = nullptr);

}  // namespace wush
