// GPTQ-WUSH: the GPTQ case of the paper's Algorithm 2 (docs/ARCHITECTURE.md: math conventions).
//
// Framework layout (W: d_out x d_in). With H = X^T X / n the full activation moment, damped to
// H + lambda tr(H)/d_in I, and U the upper Cholesky factor of its inverse (H^{-1} = U^T U, GPTQ's
// factor), the blocks i = 0..C-1 of G columns are processed in order:
//   1. the block's transform is built from the *updated* weight slice W_i (M_W = W_i^T W_i / d_out)
//      and the undamped diagonal block of H (M_X), exactly as the RTN path builds it (WUS/WUSH;
//      the data-free kinds use their fixed matrices), rounded to the storage dtype;
//   2. the slice is transformed, Wbar = W_i T_w^T, with the transformed inverse Hessian
//      T_w (U_ii^T U_ii) T_w^T (the paper's T_wush (L_ii L_ii^T)^{-1} T_wush^T, inverted);
//   3. each output row's group scale is fixed from Wbar, then the intra-block GPTQ pass quantizes
//      Wbar column by column, feeding each column's error forward through that Hessian's factor;
//   4. the error in the original space, E = Q T_act - W_i, is propagated to the later blocks,
//      W_j += E U_ii^{-1} U_ij, lazily: within a batch of blocks at once, and to everything after
//      the batch with one BLAS-3 update (the GPTQ paper's lazy batch).
// With the identity transform this is textbook GPTQ with group = block and scales fixed at the
// start of each group.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "calibration/calibrator.h"
#include "common/progress.h"
#include "formats/block_format.h"
#include "formats/packed_matrix.h"
#include "transforms/block_transform.h"

namespace wush::gptq {

struct Result {
    BlockTransform transform;
    formats::PackedMatrix weights;
    double damping_used = 0.0;  // the Hessian damping that made it positive definite (>= requested)
};

// The damped Hessian's inverse factor: U (d_in x d_in, row-major upper triangle) with
// (H + lambda tr(H)/d_in I)^{-1} = U^T U, lambda the requested damping raised tenfold up to 3
// times until the damped Hessian is positive definite (else NUMERICAL). It depends on the
// calibrator and the damping alone, not on the transform: several builds on one calibrator (the
// search's guard builds up to six) share it instead of factoring the d_in x d_in matrix each time.
struct InverseHessian {
    std::vector<double> u;
    double requested = 0.0;  // the damping asked for
    double lambda = 0.0;     // the damping that made it positive definite (>= requested)
};
InverseHessian inverse_hessian(const Calibrator& hessian, double damping);

// Runs Algorithm 2 (GPTQ case) for one layer: `hessian` must be a Full-mode calibrator with at least
// one token, `weight` the d_out x d_in float32 layer weight (finite), `format`'s group size equal to
// the calibrator's G. `options.damping` is Algorithm 1's lambda, options.gptq_damping() the Hessian's; when the
// damped Hessian is not positive definite the Hessian damping is raised tenfold up to 3 times, then
// NUMERICAL. The activation transforms are rounded to options.storage, as every builder does.
// Memory besides the calibrator: one d_in x d_in float64 matrix plus the d_out x d_in float64 weight.
// With options.search.enabled the search scores on `sample` (rows x d_in float32 tokens) when
// given, else on the calibrator's token sample, else on the Gaussian surrogate (as build_transform).
Result quantize(const TransformOptions& options, const formats::FormatSpec& format, const Calibrator& hessian,
                std::span<const float> weight, std::size_t d_out, Progress* progress = nullptr,
                std::span<const float> sample = {});

// The same with the inverse factor computed beforehand by inverse_hessian(hessian,
// options.gptq_damping()): the same result, bit for bit.
Result quantize(const TransformOptions& options, const formats::FormatSpec& format, const Calibrator& hessian,
                const InverseHessian& inverse, std::span<const float> weight, std::size_t d_out,
                Progress* progress = nullptr, std::span<const float> sample = {});

}  // namespace wush::gptq
