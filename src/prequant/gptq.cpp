#include "prequant/gptq.h"

#include <cblas.h>
#include <lapacke.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/checked_math.h"
#include "common/dtype.h"
#include "common/error.h"
#include "formats/feedback_group.h"
#include "formats/group_quantizer.h"
#include "transforms/transform_search.h"

namespace wush::gptq {

namespace {

// Columns per lazy batch: the later blocks are updated once per batch with one BLAS-3 call
// (the GPTQ paper's choice of 128).
constexpr std::size_t kBatchColumns = 128;
// A calibrator GPTQ can use: full moments (its error propagation uses the off-diagonal blocks of
// the Hessian) and at least one token.
void require_hessian(const Calibrator& hessian) {
    require(hessian.mode() == MomentMode::Full,
            "GPTQ needs a full-mode calibrator (WUSH_MOMENTS_FULL): its error propagation uses the off-diagonal "
            "blocks of the Hessian, which a block-diagonal calibrator does not keep");
    require(hessian.tokens() > 0, "GPTQ: the calibrator has no tokens");
}

// Hessian damping escalation when the damped Hessian is still not positive definite.
constexpr int kDampingEscalations = 3;
constexpr double kDampingStep = 10.0;

using Matrix = std::vector<double>;  // row-major

// U (d_in x d_in, row-major upper triangle, zeros below) with (H + lambda tr(H)/d_in I)^{-1} = U^T U,
// or empty when a factorization fails. Works in place on the moment: a symmetric matrix is its own
// transpose, so the column-major 'L' calls below read and write the row-major upper triangle.
Matrix inverse_hessian_factor(Matrix h, std::size_t n, double lambda) {
    double tr = 0.0;
    for (std::size_t i = 0; i < n; ++i) tr += h[i * n + i];
    for (std::size_t i = 0; i < n; ++i) h[i * n + i] += lambda * tr / double(n);
    const int ni = int(n);
    if (LAPACKE_dpotrf(LAPACK_COL_MAJOR, 'L', ni, h.data(), ni) != 0) return {};  // H = L L^T
    if (LAPACKE_dpotri(LAPACK_COL_MAJOR, 'L', ni, h.data(), ni) != 0) return {};  // H^{-1}
    if (LAPACKE_dpotrf(LAPACK_COL_MAJOR, 'L', ni, h.data(), ni) != 0) return {};  // H^{-1} = Lc Lc^T
    // Column-major Lc is row-major Lc^T = U; below its diagonal lie leftovers of the input.
    for (std::size_t r = 0; r < n; ++r) std::fill_n(h.begin() + r * n, r, 0.0);
    return h;
}

}  // namespace

InverseHessian inverse_hessian(const Calibrator& hessian, double damping) {
    require_hessian(hessian);
    require(damping >= 0.0 && std::isfinite(damping), "GPTQ: damping must be finite and >= 0");
    const std::size_t n = hessian.d_in();
    double lambda = damping;
    for (int attempt = 0; attempt <= kDampingEscalations; ++attempt) {
        // Fetched again per attempt (the factorization works in place): one d_in^2 matrix at a time.
        Matrix h = hessian.full_second_moment();
        if (attempt == 0) {
            double tr = 0.0;
            for (std::size_t i = 0; i < n; ++i) tr += h[i * n + i];
            if (!(tr > 0.0) || !std::isfinite(tr))
                fail(WUSH_ERR_NUMERICAL,
                     "GPTQ: the Hessian X^T X / n is zero or not finite (all calibration activations zero?)");
        }
        Matrix u = inverse_hessian_factor(std::move(h), n, lambda);
        if (!u.empty()) return {std::move(u), damping, lambda};
        lambda = (lambda > 0.0 ? lambda : 1e-6) * kDampingStep;
    }
    fail(WUSH_ERR_NUMERICAL, "GPTQ: the Hessian is not positive definite even with damping " +
                                 std::to_string(lambda / kDampingStep) + " (requested " + std::to_string(damping) +
                                 "; " + std::to_string(kDampingEscalations) + " tenfold escalations)");
}

namespace {

// c (m x n, ldc) = alpha a (m x k, lda) b (k x n, ldb) + beta c, row-major, optional transposes.
void dgemm(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, double alpha, const double* a,
           std::size_t lda, const double* b, std::size_t ldb, double beta, double* c, std::size_t ldc) {
    cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(m), int(n), int(k),
                alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}

// Everything the block loop produces, in the layouts of the result.
struct Output {
    std::vector<float> act;  // C x G x G
    std::vector<std::uint8_t> codes, scales;
    TransformStats stats;
};

class BlockLoop {
public:
    BlockLoop(const TransformOptions& options, const formats::FormatSpec& format, const Calibrator& hessian,
              std::span<const float> weight, std::size_t d_out, std::span<const double> u,
              std::span<const float> sample)
        : opt_(options), format_(format), d_in_(hessian.d_in()), g_(hessian.group()), d_out_(d_out), u_(u),
          w_(weight.begin(), weight.end()) {
        const std::size_t c = d_in_ / g_;
        if (options.kind == TransformKind::WUS || options.kind == TransformKind::WUSH) {
            m_x_.resize(c * g_ * g_);
            for (std::size_t b = 0; b < c; ++b) {
                const std::vector<double> m = hessian.second_moment(b);
                std::copy(m.begin(), m.end(), m_x_.begin() + b * g_ * g_);
            }
        } else {
            const BlockTransform fixed = build_data_free_transform(options, d_in_, g_);
            fixed_.assign(fixed.activation_matrices().begin(), fixed.activation_matrices().end());
        }
        const formats::PackedSizes sizes = formats::packed_sizes(format, d_out, d_in_);
        out_.act.resize(c * g_ * g_);
        out_.codes.assign(sizes.codes, 0);
        out_.scales.assign(sizes.scales, 0);
        out_.stats.singular_values.assign(c * g_, 0.0);
        if (opt_.search.enabled && !m_x_.empty()) {
            out_.stats.search.resize(c);
            if (!opt_.search.replay.empty()) {  // a replay scores nothing: no sample, no noise
                require(opt_.search.replay.size() == c, "GPTQ: the replayed choices must be one per block");
            } else {
                // The given sample, else the calibrator's (empty unless it keeps one).
                sample_ = sample.empty() ? hessian.sample() : std::vector<float>(sample.begin(), sample.end());
                if (sample_.empty()) noise_ = surrogate_noise(opt_.search.sample_tokens, g_, opt_.seed);
            }
        }
    }

    Output run(Progress* progress) {
        const std::size_t c = d_in_ / g_, per_batch = std::max<std::size_t>(1, kBatchColumns / g_);
        Matrix f_batch(d_out_ * per_batch * g_);
        for (std::size_t b0 = 0; b0 < c; b0 += per_batch) {
            const std::size_t b1 = std::min(c, b0 + per_batch), width = (b1 - b0) * g_;
            for (std::size_t b = b0; b < b1; ++b) {
                const Matrix f = process_block(b);
                // Later blocks of this batch now; the rest after the batch (lazy batch update).
                const std::size_t col = (b + 1) * g_, end = b1 * g_;
                if (end > col)
                    dgemm(false, false, d_out_, end - col, g_, 1.0, f.data(), g_, u_row(b) + col, d_in_, 1.0,
                          w_.data() + col, d_in_);
                for (std::size_t r = 0; r < d_out_; ++r)
                    std::copy_n(f.begin() + r * g_, g_, f_batch.begin() + r * width + (b - b0) * g_);
                if (progress && !progress->report(double(b + 1), double(c))) progress->throw_if_cancelled();
            }
            const std::size_t start = b1 * g_;
            if (start < d_in_)
                dgemm(false, false, d_out_, d_in_ - start, width, 1.0, f_batch.data(), width, u_row(b0) + start, d_in_,
                      1.0, w_.data() + start, d_in_);
        }
        if (progress) progress->finish();
        return std::move(out_);
    }

private:
    // Row b * G of U.
    const double* u_row(std::size_t b) const { return u_.data() + b * g_ * d_in_; }

    // Steps 1-4 of the header for block b; returns F = E U_bb^{-1} (d_out x G).
    Matrix process_block(std::size_t b) {
        const std::size_t gg = g_ * g_;
        Matrix wi(d_out_ * g_);
        for (std::size_t r = 0; r < d_out_; ++r) std::copy_n(w_.begin() + r * d_in_ + b * g_, g_, wi.begin() + r * g_);

        float* t_act = out_.act.data() + b * gg;
        build_block_transform(b, wi, t_act);
        const std::vector<double> t_w = inverse_transpose(t_act, g_);
        if (t_w.empty()) fail(WUSH_ERR_NUMERICAL, "GPTQ: the transform of block " + std::to_string(b) + " is singular");

        Matrix wbar(d_out_ * g_);  // W_i T_w^T
        dgemm(false, true, d_out_, g_, g_, 1.0, wi.data(), g_, t_w.data(), g_, 0.0, wbar.data(), g_);
        const Matrix ubar = transformed_factor(b, t_w);
        Matrix q = quantize_block(b, wbar, ubar);

        // E = Q T_act - W_i in the original space, then F = E U_bb^{-1}.
        const Matrix t(t_act, t_act + gg);
        Matrix f(wi);
        dgemm(false, false, d_out_, g_, g_, 1.0, q.data(), g_, t.data(), g_, -1.0, f.data(), g_);
        cblas_dtrsm(CblasRowMajor, CblasRight, CblasUpper, CblasNoTrans, CblasNonUnit, int(d_out_), int(g_), 1.0,
                    u_row(b) + b * g_, int(d_in_), f.data(), int(g_));
        return f;
    }

    // The block's activation transform into t_act (G x G floats, rounded to the storage dtype;
    // the data-free matrices come rounded from build_data_free_transform).
    void build_block_transform(std::size_t b, const Matrix& wi, float* t_act) {
        const std::size_t gg = g_ * g_;
        if (m_x_.empty()) {
            std::copy_n(fixed_.begin() + b * gg, gg, t_act);
        } else {
            // M_W from the updated weights.
            const BlockSolution s = solve_block(opt_.kind, slice_second_moment(wi, d_out_, g_),
                                                std::span<const double>(m_x_).subspan(b * gg, gg), g_, opt_.damping);
            if (opt_.search.enabled) {
                // Each candidate's weight side is scored by the intra-block GPTQ pass it would get
                // (error feedback through its transformed U_bb), not by RTN.
                const SearchResult r =
                    search_layer_block(opt_, format_, s, std::span<const double>(m_x_).subspan(b * gg, gg), wi, d_out_,
                                       sample_, sample_.size() / d_in_, d_in_, b, noise_, u_block(b));
                std::copy(r.t_act.begin(), r.t_act.end(), t_act);
                out_.stats.search[b] = r.choice;
            } else {
                std::transform(s.t_act.begin(), s.t_act.end(), t_act,
                               [&](double v) { return round_for_storage(float(v), opt_.storage); });
            }
            std::copy(s.singular_values.begin(), s.singular_values.end(), out_.stats.singular_values.begin() + b * g_);
            if (s.fell_back) out_.stats.fallback_blocks.push_back(b);
            if (s.rank_deficient) out_.stats.rank_deficient_blocks.push_back(b);
        }
    }

    // The block's G x G diagonal block U_bb of U.
    Matrix u_block(std::size_t b) const {
        Matrix u_bb(g_ * g_);
        for (std::size_t r = 0; r < g_; ++r) std::copy_n(u_row(b) + r * d_in_ + b * g_, g_, u_bb.begin() + r * g_);
        return u_bb;
    }

    // Upper Cholesky factor of the transformed inverse Hessian T_w (U_bb^T U_bb) T_w^T.
    Matrix transformed_factor(std::size_t b, const std::vector<double>& t_w) const {
        Matrix f = transformed_inverse_factor(t_w, u_block(b), g_);
        if (f.empty())
            fail(WUSH_ERR_NUMERICAL,
                 "GPTQ: the transformed Hessian of block " + std::to_string(b) + " is not positive definite");
        return f;
    }

    // Intra-block GPTQ on wbar (d_out x G, consumed): fixes each row's scale, then quantizes column
    // by column with error feedback through ubar. Writes the codes and scales; returns the
    // dequantized values. Rows are independent, so they run in parallel.
    Matrix quantize_block(std::size_t b, Matrix& wbar, const Matrix& ubar) {
        Matrix q(d_out_ * g_);
        const std::size_t row_codes = d_in_ / 2, sb = format_.scale_bytes, c = d_in_ / g_;
        const int g = int(g_);
#pragma omp parallel for schedule(static)
        for (std::size_t r = 0; r < d_out_; ++r) {
            double* w = wbar.data() + r * g_;
            std::uint8_t* codes = out_.codes.data() + r * row_codes + b * g_ / 2;
            std::uint8_t* scale = out_.scales.data() + (r * c + b) * sb;
            formats::quantize_group_feedback(format_, w, g, ubar.data(), codes, scale, q.data() + r * g_);
        }
        return q;
    }

    const TransformOptions opt_;
    const formats::FormatSpec& format_;
    const std::size_t d_in_, g_, d_out_;
    const std::span<const double> u_;  // the shared inverse factor (InverseHessian::u)
    Matrix w_;                         // d_out x d_in, updated in place by the error propagation
    Matrix m_x_;                       // C x G x G diagonal blocks of H (WUS/WUSH)
    std::vector<float> fixed_;         // C x G x G matrices of a data-free kind
    std::vector<float> sample_;        // the calibrator's token sample (search only; may be empty)
    std::vector<double> noise_;        // the surrogate's white noise, without a token sample (search only)
    Output out_;
};

// quantize()'s argument checks, before any work.
void check_inputs(const TransformOptions& options, const formats::FormatSpec& format, const Calibrator& hessian,
                  std::span<const float> weight, std::size_t d_out, std::span<const float> sample) {
    require_hessian(hessian);
    const std::size_t d_in = hessian.d_in(), g = hessian.group();
    require(format.group == g, "GPTQ: format " + std::string(format.name) + " has group size " +
                                   std::to_string(format.group) + ", the calibrator G = " + std::to_string(g));
    require(g <= kMaxGroupSize, "GPTQ: G = " + std::to_string(g) + " exceeds " + std::to_string(kMaxGroupSize));
    require(d_out > 0, "GPTQ: d_out must be positive");
    require(weight.size() == checked_mul(d_out, d_in, "weight size"),
            "GPTQ: weight has " + std::to_string(weight.size()) +
                " values, expected d_out x d_in = " + std::to_string(d_out) + " x " + std::to_string(d_in));
    require(options.damping >= 0.0 && std::isfinite(options.damping), "GPTQ: damping must be finite and >= 0");
    require(options.gptq_damping() >= 0.0 && std::isfinite(options.gptq_damping()),
            "GPTQ: the Hessian damping must be finite and >= 0");
    require_finite(WUSH_DTYPE_F32, weight.data(), d_out, d_in, "weight");
    round_for_storage(0.0f, options.storage);  // rejects an unknown storage dtype up front
    require(sample.size() % d_in == 0, "GPTQ: the token sample must be rows x d_in");
}

// The checked quantize() with its factor.
Result run(const TransformOptions& options, const formats::FormatSpec& format, const Calibrator& hessian,
           const InverseHessian& inverse, std::span<const float> weight, std::size_t d_out, Progress* progress,
           std::span<const float> sample) {
    const std::size_t d_in = hessian.d_in(), g = hessian.group();
    TransformOptions opts = options;
    opts.search.format = format.id;  // the search scores candidates in the format being quantized
    Output out = BlockLoop(opts, format, hessian, weight, d_out, inverse.u, sample).run(progress);
    BlockTransform transform(d_in, g, options.kind, std::move(out.act), options.damping, std::move(out.stats));
    formats::require_decodable(format, out.codes, out.scales, d_out, d_in);  // as RTN (eval/layer_loss.h)
    formats::PackedMatrix weights{format.id, d_out, d_in, formats::ByteView(std::move(out.codes)),
                                  formats::ByteView(std::move(out.scales))};
    return {std::move(transform), std::move(weights), inverse.lambda};
}

}  // namespace

Result quantize(const TransformOptions& options, const formats::FormatSpec& format, const Calibrator& hessian,
                std::span<const float> weight, std::size_t d_out, Progress* progress, std::span<const float> sample) {
    check_inputs(options, format, hessian, weight, d_out, sample);
    return run(options, format, hessian, inverse_hessian(hessian, options.gptq_damping()), weight, d_out, progress,
               sample);
}

Result quantize(const TransformOptions& options, const formats::FormatSpec& format, const Calibrator& hessian,
                const InverseHessian& inverse, std::span<const float> weight, std::size_t d_out, Progress* progress,
                std::span<const float> sample) {
    check_inputs(options, format, hessian, weight, d_out, sample);
    require(inverse.u.size() == hessian.d_in() * hessian.d_in() && inverse.requested == options.gptq_damping(),
            "GPTQ: the inverse Hessian factor was computed for another layer or damping");
    return run(options, format, hessian, inverse, weight, d_out, progress, sample);
}

}  // namespace wush::gptq
