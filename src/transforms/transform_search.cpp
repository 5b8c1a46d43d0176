#include "transforms/transform_search.h"

#include <cblas.h>
#include <lapacke.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "common/checked_math.h"
#include "common/error.h"
#include "formats/group_quantizer.h"
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

// y = X W^T in float64 from the float32 samples.
void fill_reference(BlockSample& s, std::size_t g) {
    const std::vector<double> x(s.x.begin(), s.x.end()), w(s.w.begin(), s.w.end());
    s.y.assign(s.n * s.rows, 0.0);
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(s.n), int(s.rows), int(g), 1.0, x.data(), int(g), w.data(),
                int(g), 0.0, s.y.data(), int(s.rows));
}

// RTN round trip of n rows of G values in place (each row one group): false if a value is not
// finite (the quantizers require finite input).
bool quantize_dequantize_rows(const formats::FormatSpec& format, float* v, std::size_t n, std::size_t g) {
    std::uint8_t codes[kMaxGroupSize / 2], scale[4];
    for (std::size_t r = 0; r < n; ++r) {
        float* row = v + r * g;
        for (std::size_t j = 0; j < g; ++j)
            if (!std::isfinite(row[j])) return false;
        formats::quantize_group(format.id, row, int(g), codes, scale);
        const float unit = float(double(formats::decode_scale(format.id, scale)) / format.tensor_divisor);
        for (std::size_t j = 0; j < g; ++j)
            row[j] = formats::decode_element(format.id, formats::get_nibble(codes, int(j))) * unit;
    }
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

// The score with the weight side given (t_w = t_act^{-T}, float32).
double score_pair(const formats::FormatSpec& format, const float* t_act, const float* t_wf, std::size_t g,
                  const BlockSample& s) {
    const int ig = int(g);
    std::vector<float> xq(s.n * g), wq(s.rows * g), prod(s.n * s.rows);
    // Xt = X T_act^T, Wt = W T_w^T (float32, as the runtime applies them), then the RTN round trip.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(s.n), ig, ig, 1.0f, s.x.data(), ig, t_act, ig, 0.0f,
                xq.data(), ig);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(s.rows), ig, ig, 1.0f, s.w.data(), ig, t_wf, ig,
                0.0f, wq.data(), ig);
    if (!quantize_dequantize_rows(format, xq.data(), s.n, g) || !quantize_dequantize_rows(format, wq.data(), s.rows, g))
        return std::numeric_limits<double>::infinity();
    // Float32 product of the quantized operands: its rounding (~1e-7 relative) is far below the
    // 4-bit errors being compared.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(s.n), int(s.rows), ig, 1.0f, xq.data(), ig, wq.data(), ig,
                0.0f, prod.data(), int(s.rows));
    double sum = 0.0;
    for (std::size_t i = 0; i < prod.size(); ++i) {
        const double e = double(prod[i]) - s.y[i];
        sum += e * e;
    }
    return std::isfinite(sum) ? sum : std::numeric_limits<double>::infinity();
}

}  // namespace

double block_score(const formats::FormatSpec& format, const float* t_act, std::size_t g, const BlockSample& s) {
    const std::vector<double> t_w = inverse_transpose(t_act, g);
    if (t_w.empty()) return std::numeric_limits<double>::infinity();
    const std::vector<float> t_wf(t_w.begin(), t_w.end());
    return score_pair(format, t_act, t_wf.data(), g, s);
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
        return score_pair(format, st.data(), tw.data(), g, sample);
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
    consider({h, h}, SearchBase::Hadamard, 0);
    const std::vector<double> eye = identity_matrix(g);
    consider({eye, eye}, SearchBase::Identity, 0);

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
                                std::size_t n_tokens, std::size_t d_in, std::size_t block) {
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
    return search_block(options.kind, solution, format, sample, options.storage, options.search, options.seed, block);
}

}  // namespace wush
