#include "transforms/transform_search.h"

#include <cblas.h>
#include <lapacke.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "common/checked_math.h"
#include "common/error.h"
#include "formats/feedback_group.h"
#include "formats/round_trip.h"
#include "transforms/basis.h"
#include "transforms/rng.h"

namespace wush {

namespace {

// Jitter of the surrogate's Cholesky factor, relative to tr(M_X)/G: only there to factor a
// rank-deficient moment, far below any damping that changes the transform.
constexpr double kSurrogateJitter = 1e-6;

// Row indices of an even stride over d_out, at most `limit` of them.
std::vector<std::size_t> strided_rows(std::size_t d_out, std::size_t limit) {
    const std::size_t r = std::min(d_out, std::max<std::size_t>(1, limit));
    std::vector<std::size_t> rows(r);
    for (std::size_t i = 0; i < r; ++i) rows[i] = i * d_out / r;
    return rows;
}

void fill_weight_rows(BlockSample& s, std::span<const double> w_slice, std::size_t d_out, std::size_t g,
                      std::size_t limit) {
    require(w_slice.size() == checked_mul(d_out, g, "weight slice"), "search: weight slice must be d_out x G");
    const std::vector<std::size_t> rows = strided_rows(d_out, limit);
    s.rows = rows.size();
    s.w.resize(s.rows * g);
    for (std::size_t i = 0; i < s.rows; ++i)
        for (std::size_t j = 0; j < g; ++j) s.w[i * g + j] = float(w_slice[rows[i] * g + j]);
}

// c (G x G) = a^T b for n x G row-major float64 a, b.
void gram(const std::vector<double>& a, const std::vector<double>& b, std::size_t n, std::size_t g, double* c) {
    cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(g), int(g), int(n), 1.0, a.data(), int(g), b.data(), int(g),
                0.0, c, int(g));
}

// The float64 weight rows (GPTQ's pass) and ||X W^T||_F^2 = tr(X^T X W^T W), which every score
// needs.
void fill_reference(BlockSample& s, std::size_t g) {
    const std::vector<double> x(s.x.begin(), s.x.end());
    s.wd.assign(s.w.begin(), s.w.end());
    std::vector<double> gx(g * g), gw(g * g);
    gram(x, x, s.n, g, gx.data());
    gram(s.wd, s.wd, s.rows, g, gw.data());
    s.y_norm2 = 0.0;
    for (std::size_t i = 0; i < g * g; ++i) s.y_norm2 += gx[i] * gw[i];
}

// RTN round trip of n rows of G values in place (each row one group): false if a value is not
// finite (the quantizers require finite input).
bool quantize_dequantize_rows(const formats::FormatSpec& format, float* v, std::size_t n, std::size_t g) {
    for (std::size_t i = 0; i < n * g; ++i)
        if (!std::isfinite(v[i])) return false;
    for (std::size_t r = 0; r < n; ++r) formats::round_trip_group(format, v + r * g, int(g));
    return true;
}

std::vector<float> to_storage(const std::vector<double>& m, wush_dtype storage) {
    std::vector<float> out(m.size());
    for (std::size_t i = 0; i < m.size(); ++i) out[i] = round_for_storage(float(m[i]), storage);
    return out;
}

}  // namespace

BlockSample surrogate_sample(std::span<const double> m_x, std::span<const double> w_slice, std::size_t d_out,
                             std::size_t g, const SearchOptions& options, std::uint64_t seed, std::size_t block) {
    require(m_x.size() == g * g, "search: M_X must be G x G");
    require(options.sample_tokens > 0, "search: the sample needs at least one token");
    BlockSample s;
    fill_weight_rows(s, w_slice, d_out, g, options.weight_rows);
    double tr = 0.0;
    for (std::size_t i = 0; i < g; ++i) tr += m_x[i * g + i];
    std::vector<double> l(m_x.begin(), m_x.end());
    const double jitter = tr > 0.0 && std::isfinite(tr) ? kSurrogateJitter * tr / double(g) : 1.0;
    for (std::size_t i = 0; i < g; ++i) l[i * g + i] += jitter;
    if (LAPACKE_dpotrf(LAPACK_ROW_MAJOR, 'L', int(g), l.data(), int(g)) != 0) {
        // Not even the jittered moment factors (non-finite sums): score against white tokens.
        l.assign(g * g, 0.0);
        for (std::size_t i = 0; i < g; ++i) l[i * g + i] = 1.0;
    }
    s.n = options.sample_tokens;
    s.x.resize(checked_mul(s.n, g, "search sample"));
    rng::Rng r(rng::mix_seed(seed ^ 0x5EA2C4ull) + block);
    std::vector<double> z(g);
    for (std::size_t t = 0; t < s.n; ++t) {
        for (double& v : z) v = r.gaussian();
        for (std::size_t i = 0; i < g; ++i) {
            double v = 0.0;
            for (std::size_t k = 0; k <= i; ++k) v += l[i * g + k] * z[k];  // lower triangle of L
            s.x[t * g + i] = float(v);
        }
    }
    fill_reference(s, g);
    return s;
}

BlockSample token_sample(std::span<const float> x_block, std::size_t n, std::span<const double> w_slice,
                         std::size_t d_out, std::size_t g, const SearchOptions& options) {
    require(n > 0 && x_block.size() == checked_mul(n, g, "search sample"), "search: token sample must be n x G");
    BlockSample s;
    fill_weight_rows(s, w_slice, d_out, g, options.weight_rows);
    s.n = n;
    s.x.assign(x_block.begin(), x_block.end());
    fill_reference(s, g);
    return s;
}

namespace {

// The buffers of one block's scores, allocated once per block rather than per candidate (the
// larger ones would otherwise be fresh pages from the allocator every time). xcat and wcat hold
// the rows [Xq_i X_i] and [Wq_i W_i]: the right halves, the sample, are filled once.
struct Workspace {
    std::vector<float> xq, wq;
    std::vector<double> xcat, wcat, gx, gw, row;
    Workspace(const BlockSample& s, std::size_t g)
        : xq(s.n * g), wq(s.rows * g), xcat(2 * s.n * g), wcat(2 * s.rows * g), gx(2 * g * g), gw(2 * g * g), row(g) {
        for (std::size_t r = 0; r < s.n; ++r) std::copy_n(s.x.begin() + r * g, g, xcat.begin() + (2 * r + 1) * g);
        for (std::size_t r = 0; r < s.rows; ++r) std::copy_n(s.w.begin() + r * g, g, wcat.begin() + (2 * r + 1) * g);
    }
};

// Copies n x G rows into the left halves of the n x 2G rows of cat.
template <class T>
void fill_left(const T* v, std::size_t n, std::size_t g, std::vector<double>& cat) {
    for (std::size_t r = 0; r < n; ++r) std::copy_n(v + r * g, g, cat.begin() + 2 * r * g);
}

// Wq = GPTQ's in-block pass over the transformed weight rows Wt = W T_w^T (float64), with the
// error feedback of the block's transformed inverse-Hessian factor: what GPTQ will leave of this
// block (before later blocks compensate its error), into the left halves of ws.wcat. False
// where the factor does not exist or a value is not finite.
bool gptq_rows(const formats::FormatSpec& format, const float* t_wf, std::size_t g, const BlockSample& s,
               Workspace& ws) {
    const std::vector<double> t_w(t_wf, t_wf + g * g);
    const std::vector<double> ubar = transformed_inverse_factor(t_w, s.u_bb, g);
    if (ubar.empty()) return false;
    // Wt into the left halves (ldc 2G).
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(s.rows), int(g), int(g), 1.0, s.wd.data(), int(g),
                t_w.data(), int(g), 0.0, ws.wcat.data(), int(2 * g));
    std::uint8_t codes[kMaxGroupSize / 2], scale[4];
    for (std::size_t r = 0; r < s.rows; ++r) {
        double* out = ws.wcat.data() + 2 * r * g;
        for (std::size_t j = 0; j < g; ++j)
            if (!std::isfinite(out[j])) return false;
        std::copy_n(out, g, ws.row.begin());
        formats::quantize_group_feedback(format, ws.row.data(), int(g), ubar.data(), codes, scale, out);
    }
    return true;
}

// The score with the weight side given (t_w = t_act^{-T}, float32), as traces of G x G Gram
// matrices: with Xq, Wq the quantized operands and Y = X W^T,
//   ||Xq Wq^T - Y||^2 = tr(Xq^T Xq Wq^T Wq) - 2 tr(Xq^T X W^T Wq) + tr(X^T X W^T W),
// (n + r) G^2 work instead of the n r G of forming the product (and r can grow cheaply).
double score_pair(const formats::FormatSpec& format, const float* t_act, const float* t_wf, std::size_t g,
                  const BlockSample& s, Workspace& ws) {
    const int ig = int(g);
    // Xt = X T_act^T (float32, as the runtime applies it), then the RTN round trip.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(s.n), ig, ig, 1.0f, s.x.data(), ig, t_act, ig, 0.0f,
                ws.xq.data(), ig);
    if (!quantize_dequantize_rows(format, ws.xq.data(), s.n, g)) return std::numeric_limits<double>::infinity();
    fill_left(ws.xq.data(), s.n, g, ws.xcat);
    if (s.u_bb.empty()) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(s.rows), ig, ig, 1.0f, s.w.data(), ig, t_wf, ig,
                    0.0f, ws.wq.data(), ig);
        if (!quantize_dequantize_rows(format, ws.wq.data(), s.rows, g)) return std::numeric_limits<double>::infinity();
        fill_left(ws.wq.data(), s.rows, g, ws.wcat);
    } else if (!gptq_rows(format, t_wf, g, s, ws)) {
        return std::numeric_limits<double>::infinity();
    }
    // [Xq X]^T Xq and [Wq W]^T Wq, one product per side: rows 0..G-1 Xq^T Xq, rows G..2G-1 X^T Xq.
    cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, 2 * ig, ig, int(s.n), 1.0, ws.xcat.data(), 2 * ig,
                ws.xcat.data(), 2 * ig, 0.0, ws.gx.data(), ig);
    cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, 2 * ig, ig, int(s.rows), 1.0, ws.wcat.data(), 2 * ig,
                ws.wcat.data(), 2 * ig, 0.0, ws.gw.data(), ig);
    const double* xqxq = ws.gx.data();
    const double* xxq = ws.gx.data() + g * g;  // X^T Xq
    const double* wqwq = ws.gw.data();
    const double* wwq = ws.gw.data() + g * g;  // W^T Wq
    // tr(Xq^T X W^T Wq) = sum_ij (Xq^T X)_ij (W^T Wq)_ji = sum_ij (X^T Xq)_ji (W^T Wq)_ji
    double sum = s.y_norm2;
    for (std::size_t i = 0; i < g * g; ++i) sum += xqxq[i] * wqwq[i] - 2.0 * xxq[i] * wwq[i];
    // Rounding can leave a tiny negative where the error is ~0 (an exactly representable block).
    return std::isfinite(sum) ? std::max(sum, 0.0) : std::numeric_limits<double>::infinity();
}

}  // namespace

std::vector<double> transformed_inverse_factor(std::span<const double> t_w, std::span<const double> u_bb, std::size_t g) {
    require(t_w.size() == g * g && u_bb.size() == g * g, "transformed_inverse_factor: T_w and U_bb must be G x G");
    std::vector<double> a(g * g), hinv(g * g);
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(g), int(g), int(g), 1.0, t_w.data(), int(g), u_bb.data(),
                int(g), 0.0, a.data(), int(g));  // T_w U^T
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(g), int(g), int(g), 1.0, a.data(), int(g), a.data(), int(g),
                0.0, hinv.data(), int(g));  // (T_w U^T)(U T_w^T)
    if (LAPACKE_dpotrf(LAPACK_ROW_MAJOR, 'U', int(g), hinv.data(), int(g)) != 0) return {};
    for (std::size_t r = 0; r < g; ++r) std::fill_n(hinv.begin() + r * g, r, 0.0);
    return hinv;
}

double block_score(const formats::FormatSpec& format, const float* t_act, std::size_t g, const BlockSample& s) {
    const std::vector<double> t_w = inverse_transpose(t_act, g);
    if (t_w.empty()) return std::numeric_limits<double>::infinity();
    const std::vector<float> t_wf(t_w.begin(), t_w.end());
    Workspace ws(s, g);
    return score_pair(format, t_act, t_wf.data(), g, s, ws);
}

SearchResult search_block(TransformKind kind, const BlockSolution& solution, const formats::FormatSpec& format,
                          const BlockSample& sample, wush_dtype storage, const SearchOptions& options,
                          std::uint64_t seed, std::size_t block) {
    require(kind == TransformKind::WUS || kind == TransformKind::WUSH, "search: only WUS and WUSH have free parameters");
    require(format.group == sample.x.size() / std::max<std::size_t>(1, sample.n),
            std::string("search: format ") + format.name + "'s group size differs from the block size");
    const std::size_t g = format.group, gg = g * g;
    require(solution.t_act.size() == gg, "search: the solution must be G x G");
    require(options.scale_steps >= 1 && options.scale_steps <= 64, "search: scale_steps must be in [1, 64]");
    require(options.sign_patterns <= 64, "search: at most 64 sign patterns");

    // A = P^T T_act with P = H (WUSH, H symmetric and orthogonal) or I (WUS).
    const std::vector<double> h = hadamard_matrix(g);
    std::vector<double> a(gg, 0.0);
    if (kind == TransformKind::WUSH)
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(g), int(g), int(g), 1.0, h.data(), int(g),
                    solution.t_act.data(), int(g), 0.0, a.data(), int(g));
    else
        a = solution.t_act;
    // Every candidate is c P D M with P, D orthogonal and symmetric, so its inverse-transpose is
    // c^{-1} P D M^{-T}: one inversion per block (of A) instead of one LU per candidate, which
    // would dominate the search's cost. (The stored matrix is the storage-rounded c P D A; its
    // exact inverse differs from this one by the storage rounding, far below what separates
    // candidates; the weight side actually used is always re-derived from the stored matrix.)
    const std::vector<float> af(a.begin(), a.end());
    std::vector<double> a_it = inverse_transpose(af.data(), g);
    if (a_it.empty()) a_it.assign(gg, 0.0);  // singular A (never from Algorithm 1): its candidates score +Inf
    const bool a_ok = std::any_of(a_it.begin(), a_it.end(), [](double v) { return v != 0.0; });
    // P D M for a sign vector d: row i of M scaled by d_i, then P applied.
    const auto apply_pd = [&](const std::vector<double>& m, const std::vector<double>& d) {
        std::vector<double> dm(m);
        for (std::size_t i = 0; i < g; ++i)
            for (std::size_t j = 0; j < g; ++j) dm[i * g + j] *= d[i];
        if (kind == TransformKind::WUS) return dm;
        std::vector<double> t(gg);
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(g), int(g), int(g), 1.0, h.data(), int(g), dm.data(),
                    int(g), 0.0, t.data(), int(g));
        return t;
    };
    Workspace ws(sample, g);
    struct Candidate {
        std::vector<double> t, t_w;  // activation side and its inverse-transpose
    };
    const auto score = [&](const Candidate& c, double scale) {
        if (c.t_w.empty()) return std::numeric_limits<double>::infinity();
        std::vector<double> t(c.t);
        for (double& v : t) v *= scale;
        const std::vector<float> st = to_storage(t, storage);
        std::vector<float> tw(gg);
        for (std::size_t i = 0; i < gg; ++i) tw[i] = float(c.t_w[i] / scale);
        return score_pair(format, st.data(), tw.data(), g, sample, ws);
    };

    // Stage 1: base matrix and sign pattern at c = 1.
    const std::vector<double> ones(g, 1.0);
    Candidate best{solution.t_act, a_ok ? apply_pd(a_it, ones) : std::vector<double>{}};  // canonical signs
    BlockChoice choice;
    double best_score = score(best, 1.0);
    choice.plain_score = best_score;
    const auto consider = [&](Candidate c, SearchBase base, std::size_t pattern) {
        const double sc = score(c, 1.0);
        if (sc < best_score) {
            best_score = sc;
            best = std::move(c);
            choice.base = base;
            choice.sign_pattern = std::uint8_t(pattern);
        }
    };
    rng::Rng r(rng::mix_seed(seed ^ 0x516E5ull) + block);
    std::vector<double> d(g);
    for (std::size_t k = 1; k <= options.sign_patterns; ++k) {
        for (double& v : d) v = r.uniform() < 0.5 ? -1.0 : 1.0;
        if (a_ok) consider({apply_pd(a, d), apply_pd(a_it, d)}, SearchBase::Solution, k);
    }
    // The data-free fall-backs, orthogonal (their own inverse-transpose). R is the Random
    // transform's block b for the same seed, so a block falling back to R stores R's block.
    for (auto [fallback, base] : {std::pair{TransformKind::Hadamard, SearchBase::Hadamard},
                                  {TransformKind::Identity, SearchBase::Identity},
                                  {TransformKind::Random, SearchBase::Random}}) {
        std::vector<double> m = data_free_block(fallback, g, seed, block);
        consider({m, m}, base, 0);
    }

    // Stage 2: the scale of the winner (k = 0 is the winner itself, already scored).
    double best_scale = 1.0;
    for (std::size_t k = 1; k < options.scale_steps; ++k) {
        const double c = std::exp2(double(k) / double(options.scale_steps));
        const double sc = score(best, c);
        if (sc < best_score) {
            best_score = sc;
            best_scale = c;
            choice.scale_step = std::uint8_t(k);
        }
    }
    choice.score = best_score;
    std::vector<double> t(best.t);
    for (double& v : t) v *= best_scale;
    return {to_storage(t, storage), choice};
}

SearchResult search_layer_block(const TransformOptions& options, const formats::FormatSpec& format,
                                const BlockSolution& solution, std::span<const double> m_x,
                                std::span<const double> w_slice, std::size_t d_out, std::span<const float> tokens,
                                std::size_t n_tokens, std::size_t d_in, std::size_t block, std::span<const double> u_bb) {
    const std::size_t g = format.group;
    BlockSample sample;
    if (n_tokens > 0) {
        const std::size_t n = std::min(n_tokens, std::max<std::size_t>(1, options.search.sample_tokens));
        std::vector<float> xb(checked_mul(n, g, "search sample"));
        for (std::size_t i = 0; i < n; ++i) {
            const std::size_t t = i * n_tokens / n;
            std::copy_n(tokens.data() + t * d_in + block * g, g, xb.begin() + i * g);
        }
        sample = token_sample(xb, n, w_slice, d_out, g, options.search);
    } else {
        sample = surrogate_sample(m_x, w_slice, d_out, g, options.search, options.seed, block);
    }
    sample.u_bb.assign(u_bb.begin(), u_bb.end());
    return search_block(options.kind, solution, format, sample, options.storage, options.search, options.seed, block);
}

}  // namespace wush
