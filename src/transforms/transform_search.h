// Per-block search over WUSH's free parameters (the `wush+s` transform, WUSH_OPTION_SEARCH).
//
// Algorithm 1 fixes a block's transform only up to choices that leave the exact product
// (T_w w)^T (T_act x) = w^T x unchanged but change what a real 4-bit quantizer does:
//   - a positive scalar c: T_act -> c T_act (so T_w -> T_w / c); the formats are not scale
//     invariant (MXFP4's power-of-two scales, NVFP4's E4M3 scales, INT4's BF16 scale);
//   - the signs of the singular vectors: T_act = P D A for any diagonal +-1 matrix D, where
//     A = S^{-1/2} U^T W'^T and P = H (WUSH) or I (WUS);
//   - the orthogonal mixing itself: T_act = Q A for any orthogonal Q (P D above is one such Q);
//     seeded random rotations Q are candidates where they pay (NVFP4, below);
//   - and, as fall-backs, the data-free Hadamard, identity and random-rotation blocks, which can
//     beat WUSH on blocks dominated by a few channels (R is the Random transform's own block b
//     for the same seed, so such a block is exactly that transform's).
// For every block the search scores candidates by the block's own term of the layer loss on a
// token sample X_b (n x G) and a row sample W_b (r x G) of the weight:
//     score(T) = || q(X_b T^T) q_w(W_b T^{-1})^T - X_b W_b^T ||_F^2,
// q RTN in the target format (one group per row); q_w the same for RTN weights, and for GPTQ its
// in-block pass with error feedback through the block's transformed inverse-Hessian factor (the
// error GPTQ leaves, which RTN's ranks only loosely). The score is computed from float32 G x G
// Gram matrices of the transformed sample and its quantization errors (written in the errors,
// so no term cancels), (n + r) G^2 work per candidate instead of n r G. The layer loss is
// ||sum_b E_b||^2, so the per-block choice ignores the cross terms <E_b, E_b'>; these are sums of
// products of the blocks' quantization errors, which are nearly uncorrelated across blocks, so
// minimizing each block's own term is the diagonal (block-separable) approximation of the loss.
// The search is greedy in two stages: (1) the base matrix among {P D_k A : D_0 = the canonical
// signs, D_1..D_S seeded random sign patterns}, {Q_k A : k = 1..K seeded random rotations, each
// block its own} and
// {H, I, R_b}, at c = 1 — with screening, every one of them first scored on a quarter of the
// sample and only the best few in full; (2) the scale c = 2^(k/K)
// of the stage-1 winner, coarse to fine on the circle k = 0..K-1 (c and 2c quantize alike): the
// even k, then the two neighbours of the best of them (K/2 + 1 scores instead of K - 1; measured
// no worse than the full grid within held-out noise, docs/record/eval-record.md). The winner replaces the
// plain solution (canonical signs, c = 1) only if it also scores lower on each half of the token
// sample: a guard against picking the sample's noise (the minimum of a dozen noisy scores is
// biased low). Every candidate is rounded to the storage dtype before it is
// scored, so the score is that of the matrix that will be stored.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "common/progress.h"
#include "formats/block_format.h"
#include "transforms/block_transform.h"

namespace wush {

// The scored data of one block.
struct BlockSample {
    std::size_t n = 0;         // tokens
    bool real_tokens = false;  // token_sample (true) or surrogate_sample (false)
    std::size_t rows = 0;      // weight rows
    std::vector<float> x;      // n x G
    std::vector<float> w;      // rows x G
    // GPTQ only (else empty): the G x G upper factor U_bb of the block's inverse Hessian
    // (U^T U = H^{-1}, rows and columns of the block); the weight side is then scored by GPTQ's
    // in-block pass instead of RTN.
    std::vector<double> u_bb;
};

// White noise for the Gaussian surrogate below: n x G independent N(0, 1) values, seeded by
// `seed` alone. A layer draws it once and every block colours it with its own moment: each
// block's sample has exactly its distribution, and as blocks are scored separately, sharing the
// noise costs nothing while drawing it per block was a tenth of the search's time.
std::vector<double> surrogate_noise(std::size_t n, std::size_t g, std::uint64_t seed);

// `rows` weight rows of the d_out x G float64 slice, evenly strided (all of them when d_out <=
// options.weight_rows), with a Gaussian surrogate sample drawn from the block's second moment:
// x = L z for the rows z of `noise` (n x G, surrogate_noise), L the Cholesky factor of
// M_X + 1e-6 tr(M_X)/G I (so a rank-deficient moment still has one). The surrogate has exactly
// the moments the transform was built from; what it lacks is the tails of the real tokens.
BlockSample surrogate_sample(std::span<const double> m_x, std::span<const double> w_slice, std::size_t d_out,
                             std::size_t g, const SearchOptions& options, std::span<const double> noise);

// The same from real tokens: x_block is n x G (e.g. a token sample's columns of the block).
BlockSample token_sample(std::span<const float> x_block, std::size_t n, std::span<const double> w_slice,
                         std::size_t d_out, std::size_t g, const SearchOptions& options);

// score(T) above for one G x G row-major activation matrix (float32 as stored). +Inf for a
// singular T, a non-finite transformed value, or (GPTQ) a transformed factor that does not exist.
double block_score(const formats::FormatSpec& format, const float* t_act, std::size_t g, const BlockSample& sample);

// The stage-1 candidate counts a search scoring `real_tokens` real tokens runs with (0 for the
// Gaussian surrogate): the options' own where set, else the format's measured defaults
// (docs/record/eval-record.md, "Candidate sets" and "Larger samples"): MXFP4 and INT4 2 sign patterns, or 16
// when at least kWideSignSetTokens real tokens are scored (more patterns pay only once the sample
// can tell them apart; the surrogate, which lacks the real tokens' tails, keeps 2), no rotations
// (they never won for MXFP4), no screening; NVFP4 8 rotations, no sign patterns, the best 2 of
// the screened 11 scored in full (rotations are where NVFP4's held-out gain comes from).
struct CandidateCounts {
    std::size_t sign_patterns, rotations, screen_keep;
};
inline constexpr std::size_t kWideSignSetTokens = 4096;
CandidateCounts search_candidate_counts(const SearchOptions& options, wush_format format, std::size_t real_tokens);

// Which candidate a block got.
struct SearchResult {
    std::vector<float> t_act;  // G x G, rounded to the storage dtype
    BlockChoice choice;
};

// Runs the two-stage search for one block given Algorithm 1's solution `solution` of `kind` (WUS
// or WUSH; a fallen-back solution is fine: its A is I).
SearchResult search_block(TransformKind kind, const BlockSolution& solution, const formats::FormatSpec& format,
                          const BlockSample& sample, wush_dtype storage, const SearchOptions& options,
                          std::uint64_t seed, std::size_t block);

// The matrix search_block stores when it picks `choice` for a block whose Algorithm 1 solution is
// `solution` (of `kind`, G x G): Solution with sign pattern 0 is the solution itself, pattern k
// the k-th of the block's seeded sign patterns (P D_k A), Rotated k the k-th seeded rotation
// (Q_k A), Hadamard/Identity/Random the data-free blocks; then scaled by
// c = 2^(choice.scale_step / scale_steps) and rounded to `storage`. The search builds its
// candidates with the same functions, so the matrices agree bit for bit; a choice made on one
// sample or moment (a search on part of the tokens) replayed on another solution is that
// candidate of the other solution, without scoring anything.
std::vector<float> replay_block(TransformKind kind, const BlockSolution& solution, const BlockChoice& choice,
                                std::size_t g, wush_dtype storage, std::size_t scale_steps, std::uint64_t seed,
                                std::size_t block);

// The search for block `block` of a layer, as search_transform and GPTQ run it: the sample is the
// block's columns of `tokens` (n_tokens x d_in, at most options.search.sample_tokens of them,
// evenly strided) when n_tokens > 0, else the surrogate drawn from m_x and `noise` (the layer's
// surrogate_noise(options.search.sample_tokens, G, options.seed)); w_slice is the block's
// d_out x G weight slice (GPTQ: as updated by the earlier blocks); u_bb (GPTQ) the block's G x G
// inverse-Hessian factor (BlockSample::u_bb), empty for RTN. With options.search.replay set, no
// search: replay_block of the block's replayed choice (the result's choice is that one).
SearchResult search_layer_block(const TransformOptions& options, const formats::FormatSpec& format,
                                const BlockSolution& solution, std::span<const double> m_x,
                                std::span<const double> w_slice, std::size_t d_out, std::span<const float> tokens,
                                std::size_t n_tokens, std::size_t d_in, std::size_t block,
                                std::span<const double> noise, std::span<const double> u_bb = {});

// The search's refinement of a layer: `plain` is solve_layer's solution for the same options
// (bar the search), calibrator and weight. With options.search.enabled (WUS/WUSH), each block's
// matrix is the search's choice (search_layer_block) from plain's block, scored in
// options.search.format (whose group must be G) on `sample` (n_sample x d_in row-major float32
// calibration tokens) when given, else on the calibrator's token sample when it keeps one
// (Calibrator::set_sample_capacity), else on a Gaussian surrogate drawn from the block's moment;
// with options.search.replay, each block's replayed choice (no weight is read then). Blocks are
// searched in parallel, in chunks whose weight slices are read in one pass; `progress` as
// solve_layer's. The stats are plain's, with stats().search saying what every block got.
BlockTransform search_transform(const TransformOptions& options, const Calibrator& calibration,
                                std::span<const float> weight, std::size_t d_out, const LayerSolution& plain,
                                Progress* progress = nullptr, std::span<const float> sample = {},
                                std::size_t n_sample = 0);

// A layer's transform with the search when options.search.enabled (WUS/WUSH: solve_layer, then
// search_transform), else build_transform's.
BlockTransform build_searched_transform(const TransformOptions& options, const Calibrator& calibration,
                                        std::span<const float> weight, std::size_t d_out, Progress* progress = nullptr,
                                        std::span<const float> sample = {}, std::size_t n_sample = 0);

// GPTQ's error-feedback factor in the transformed space: the upper Cholesky factor of
// T_w (U_bb^T U_bb) T_w^T (G x G row-major, lower triangle zero); empty if that is not positive
// definite.
std::vector<double> transformed_inverse_factor(std::span<const double> t_w, std::span<const double> u_bb,
                                               std::size_t g);

}  // namespace wush
