#include "transforms/transform_search.h"

#include <cblas.h>
#include <lapacke.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "common/checked_math.h"
#include "common/dtype.h"
#include "common/error.h"
#include "formats/feedback_group.h"
#include "transforms/basis.h"
#include "transforms/block_loop.h"
#include "transforms/rng.h"
#include "transforms/round_trip_errors.h"

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

std::vector<float> to_storage(const std::vector<double>& m, wush_dtype storage) {
    std::vector<float> out(m.size());
    for (std::size_t i = 0; i < m.size(); ++i) out[i] = round_for_storage(float(m[i]), storage);
    return out;
}

}  // namespace

std::vector<double> surrogate_noise(std::size_t n, std::size_t g, std::uint64_t seed) {
    require(n > 0, "search: the sample needs at least one token");
    std::vector<double> z(checked_mul(n, g, "search sample"));
    rng::Rng r(rng::mix_seed(seed ^ 0x5EA2C4ull));
    for (double& v : z) v = r.gaussian();
    return z;
}

BlockSample surrogate_sample(std::span<const double> m_x, std::span<const double> w_slice, std::size_t d_out,
                             std::size_t g, const SearchOptions& options, std::span<const double> noise) {
    require(m_x.size() == g * g, "search: M_X must be G x G");
    require(!noise.empty() && noise.size() % g == 0, "search: the surrogate noise must be n x G, n > 0");
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
    for (std::size_t i = 0; i < g; ++i) std::fill_n(l.begin() + i * g + i + 1, g - i - 1, 0.0);  // L alone
    s.n = noise.size() / g;
    std::vector<double> x(noise.size());
    // Row t of X is L z_t: X = Z L^T.
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(s.n), int(g), int(g), 1.0, noise.data(), int(g), l.data(),
                int(g), 0.0, x.data(), int(g));
    s.x.assign(x.begin(), x.end());
    return s;
}

BlockSample token_sample(std::span<const float> x_block, std::size_t n, std::span<const double> w_slice,
                         std::size_t d_out, std::size_t g, const SearchOptions& options) {
    require(n > 0 && x_block.size() == checked_mul(n, g, "search sample"), "search: token sample must be n x G");
    BlockSample s;
    fill_weight_rows(s, w_slice, d_out, g, options.weight_rows);
    s.n = n;
    s.real_tokens = true;
    s.x.assign(x_block.begin(), x_block.end());
    return s;
}

namespace {

// The buffers of one block's scores, allocated once per block rather than per candidate (the
// larger ones would otherwise be fresh pages from the allocator every time). xcat and wcat hold
// the rows [Ex_i Xt_i] and [Ew_i Wt_i]: the transformed sample and its quantization error; gx and
// gw their 2G x 2G Grams (cat_gram).
struct Workspace {
    std::vector<float> xcat, wcat, gx, gw;
    std::vector<double> wd, wtd, row;  // GPTQ: W and Wt in float64, one row
    Workspace(const BlockSample& s, std::size_t g)
        : xcat(2 * s.n * g), wcat(2 * s.rows * g), gx(4 * g * g), gw(4 * g * g),
          wd(s.u_bb.empty() ? s.w.end() : s.w.begin(), s.w.end()), wtd(s.u_bb.empty() ? 0 : s.rows * g), row(g) {}
};

// The right halves of the n rows of cat (n x 2G) hold V; the left halves become q(V) - V, the
// RTN round trip's error, each row one group (transforms/round_trip_errors.h: the same bits on every
// ISA, so the ISA is the fastest this CPU has). False if a value is not finite.
bool rtn_errors(const formats::FormatSpec& format, float* cat, std::size_t n, std::size_t g) {
    return round_trip_errors(format, cat, n, g, best_isa());
}

// The weight side by GPTQ's in-block pass over the transformed rows Wt = W T_w^T (float64), with
// the error feedback of the block's transformed inverse-Hessian factor: what GPTQ will leave of
// this block (before later blocks compensate its error). Fills the rows [Ew Wt] of ws.wcat. False
// where the factor does not exist or a value is not finite.
bool gptq_errors(const formats::FormatSpec& format, const float* t_wf, std::size_t g, const BlockSample& s,
                 Workspace& ws) {
    const std::vector<double> t_w(t_wf, t_wf + g * g);
    const std::vector<double> ubar = transformed_inverse_factor(t_w, s.u_bb, g);
    if (ubar.empty()) return false;
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(s.rows), int(g), int(g), 1.0, ws.wd.data(), int(g),
                t_w.data(), int(g), 0.0, ws.wtd.data(), int(g));
    std::uint8_t codes[kMaxGroupSize / 2] = {}, scale[4] = {};  // (initialized: -O3 cannot see they are written)
    double q[kMaxGroupSize];
    for (std::size_t r = 0; r < s.rows; ++r) {
        const double* wt = ws.wtd.data() + r * g;
        for (std::size_t j = 0; j < g; ++j)
            if (!std::isfinite(wt[j])) return false;
        std::copy_n(wt, g, ws.row.begin());
        formats::quantize_group_feedback(format, ws.row.data(), int(g), ubar.data(), codes, scale, q);
        float* cat = ws.wcat.data() + 2 * r * g;
        for (std::size_t j = 0; j < g; ++j) {
            cat[j] = float(q[j] - wt[j]);
            cat[g + j] = float(wt[j]);
        }
    }
    return true;
}

// c = cat^T cat (2G x 2G, all entries) for the n rows of cat = [E V] (n x 2G): E^T E top left,
// E^T V top right, V^T E bottom left, V^T V bottom right. A symmetric rank-n update of the upper
// triangle, then mirrored: one BLAS call per Gram, which at G = 16 costs more in per-call
// overhead than in arithmetic.
void cat_gram(const float* cat, std::size_t n, std::size_t g, float* c) {
    const std::size_t m = 2 * g;
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, int(m), int(n), 1.0f, cat, int(m), 0.0f, c, int(m));
    for (std::size_t i = 1; i < m; ++i)
        for (std::size_t j = 0; j < i; ++j) c[i * m + j] = c[j * m + i];
}

// A candidate's score, split over the two halves of the token sample (the first n/2 tokens and
// the rest); the search ranks by the total and asks both halves to agree before it leaves the
// plain solution (search_block).
struct Score {
    double half[2] = {0.0, 0.0};
    double total() const { return half[0] + half[1]; }
    bool below_on_both(const Score& o) const { return half[0] < o.half[0] && half[1] < o.half[1]; }
};

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr Score kInfScore{{kInf, kInf}};

// The score with the weight side given (t_w = t_act^{-T}, float32). With Xt = X T_act^T,
// Wt = W T_w^T (so Xt Wt^T = X W^T), Xq = Xt + Ex and Wq = Wt + Ew the quantized operands, the
// error is Xq Wq^T - Xt Wt^T = Ex Wq^T + Xt Ew^T and
//   ||E||^2 = tr(Ex^T Ex Wq^T Wq) + 2 tr(Ex^T Xt Ew^T Wq) + tr(Xt^T Xt Ew^T Ew),
// traces of G x G Gram matrices ((n + r) G^2 work instead of the n r G of forming the product),
// all of them blocks of the Grams of [Ex Xt] (per half of the tokens) and [Ew Wt]. Written in the
// errors, no term cancels against another, so float32 Grams (twice the throughput of float64)
// keep the score to about 1e-7 relative (measured); expanding in Xq and Wq instead subtracts
// ||X W^T||^2-sized terms and needs float64.
Score score_pair(const formats::FormatSpec& format, const float* t_act, const float* t_wf, std::size_t g,
                 const BlockSample& s, Workspace& ws) {
    const int ig = int(g), i2g = 2 * ig;
    // Xt = X T_act^T (float32, as the runtime applies it) into the right halves, errors left.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(s.n), ig, ig, 1.0f, s.x.data(), ig, t_act, ig, 0.0f,
                ws.xcat.data() + g, i2g);
    if (!rtn_errors(format, ws.xcat.data(), s.n, g)) return kInfScore;
    if (s.u_bb.empty()) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(s.rows), ig, ig, 1.0f, s.w.data(), ig, t_wf, ig, 0.0f,
                    ws.wcat.data() + g, i2g);
        if (!rtn_errors(format, ws.wcat.data(), s.rows, g)) return kInfScore;
    } else if (!gptq_errors(format, t_wf, g, s, ws)) {
        return kInfScore;
    }
    // Blocks of a 2G x 2G Gram c at (row block, column block), leading dimension 2G.
    const std::size_t ld = 2 * g;
    const auto at = [&](const std::vector<float>& c, std::size_t rb, std::size_t cb, std::size_t i, std::size_t j) {
        return double(c[(rb * g + i) * ld + cb * g + j]);
    };
    cat_gram(ws.wcat.data(), s.rows, g, ws.gw.data());
    Score score;
    for (int h = 0; h < 2; ++h) {
        const std::size_t first = h == 0 ? 0 : s.n / 2, count = h == 0 ? s.n / 2 : s.n - s.n / 2;
        if (count == 0) continue;
        cat_gram(ws.xcat.data() + first * 2 * g, count, g, ws.gx.data());
        // Wq^T Wq = Wt^T Wt + Wt^T Ew + Ew^T Wt + Ew^T Ew and Ew^T Wq = Ew^T Wt + Ew^T Ew; the
        // traces tr(A B) of symmetric A, B are sums of A_ij B_ij, tr((Xt^T Ex)^T (Ew^T Wq)) likewise.
        double sum = 0.0;
        for (std::size_t i = 0; i < g; ++i)
            for (std::size_t j = 0; j < g; ++j) {
                const double ewew = at(ws.gw, 0, 0, i, j), wtew = at(ws.gw, 1, 0, i, j), ewwt = at(ws.gw, 0, 1, i, j);
                const double wqwq = at(ws.gw, 1, 1, i, j) + wtew + ewwt + ewew;
                const double ewwq = ewwt + ewew;
                sum += at(ws.gx, 0, 0, i, j) * wqwq + 2.0 * at(ws.gx, 1, 0, i, j) * ewwq + at(ws.gx, 1, 1, i, j) * ewew;
            }
        // Rounding can leave a tiny negative where the error is ~0 (an exactly representable block).
        if (!std::isfinite(sum)) return kInfScore;
        score.half[h] = std::max(sum, 0.0);
    }
    return score;
}

// Every `factor`-th token and weight row of s (the screening sample).
BlockSample subsample(const BlockSample& s, std::size_t factor, std::size_t g) {
    BlockSample q;
    q.n = s.n / factor;
    q.real_tokens = s.real_tokens;
    q.rows = s.rows / factor;
    for (std::size_t i = 0; i < q.n; ++i)
        q.x.insert(q.x.end(), s.x.begin() + i * factor * g, s.x.begin() + (i * factor + 1) * g);
    for (std::size_t i = 0; i < q.rows; ++i)
        q.w.insert(q.w.end(), s.w.begin() + i * factor * g, s.w.begin() + (i * factor + 1) * g);
    q.u_bb = s.u_bb;
    return q;
}

}  // namespace

CandidateCounts search_candidate_counts(const SearchOptions& options, wush_format format, std::size_t real_tokens) {
    const bool nv = format == WUSH_FORMAT_NVFP4;
    const auto pick = [](std::size_t set, std::size_t by_format) {
        return set == SearchOptions::kByFormat ? by_format : set;
    };
    const std::size_t signs = nv ? 0 : real_tokens >= kWideSignSetTokens ? 16 : 2;
    return {pick(options.sign_patterns, signs), pick(options.rotations, nv ? 8 : 0),
            pick(options.screen_keep, nv ? 2 : 0)};
}

std::vector<double> transformed_inverse_factor(std::span<const double> t_w, std::span<const double> u_bb,
                                               std::size_t g) {
    require(t_w.size() == g * g && u_bb.size() == g * g, "transformed_inverse_factor: T_w and U_bb must be G x G");
    std::vector<double> a(g * g), hinv(g * g);
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(g), int(g), int(g), 1.0, t_w.data(), int(g), u_bb.data(),
                int(g), 0.0, a.data(), int(g));  // T_w U^T
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(g), int(g), int(g), 1.0, a.data(), int(g), a.data(),
                int(g), 0.0, hinv.data(), int(g));  // (T_w U^T)(U T_w^T)
    if (LAPACKE_dpotrf(LAPACK_ROW_MAJOR, 'U', int(g), hinv.data(), int(g)) != 0) return {};
    for (std::size_t r = 0; r < g; ++r) std::fill_n(hinv.begin() + r * g, r, 0.0);
    return hinv;
}

double block_score(const formats::FormatSpec& format, const float* t_act, std::size_t g, const BlockSample& s) {
    const std::vector<double> t_w = inverse_transpose(t_act, g);
    if (t_w.empty()) return std::numeric_limits<double>::infinity();
    const std::vector<float> t_wf(t_w.begin(), t_w.end());
    Workspace ws(s, g);
    return score_pair(format, t_act, t_wf.data(), g, s, ws).total();
}

namespace {

// The pieces every stage-1 candidate is made of, one definition each, shared by the search
// (BlockSearch) and the replay (replay_block), so a replayed choice is the searched matrix.

// A block's solution as its candidates see it: A = P^T T_act (P = H for WUSH, I for WUS; H is
// symmetric), and P D M for a sign vector D.
struct SolutionBasis {
    SolutionBasis(TransformKind kind_, const BlockSolution& solution, std::size_t g_)
        : kind(kind_), g(g_), h(hadamard_matrix(g)), a(g * g, 0.0) {
        if (kind == TransformKind::WUSH)
            cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(g), int(g), int(g), 1.0, h.data(), int(g),
                        solution.t_act.data(), int(g), 0.0, a.data(), int(g));
        else a = solution.t_act;
    }

    // P D M: row i of M scaled by d_i, then P applied.
    std::vector<double> apply_pd(const std::vector<double>& m, const std::vector<double>& d) const {
        std::vector<double> dm(m);
        for (std::size_t i = 0; i < g; ++i)
            for (std::size_t j = 0; j < g; ++j) dm[i * g + j] *= d[i];
        if (kind == TransformKind::WUS) return dm;
        std::vector<double> t(g * g);
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(g), int(g), int(g), 1.0, h.data(), int(g), dm.data(),
                    int(g), 0.0, t.data(), int(g));
        return t;
    }

    TransformKind kind;
    std::size_t g;
    std::vector<double> h, a;
};

// The block's seeded sign patterns D_1..D_count (G signs each), drawn in order from one stream.
std::vector<std::vector<double>> sign_patterns(std::uint64_t seed, std::size_t block, std::size_t count,
                                               std::size_t g) {
    rng::Rng r(rng::mix_seed(seed ^ 0x516E5ull) + block);
    std::vector<std::vector<double>> out(count, std::vector<double>(g));
    for (std::vector<double>& d : out)
        for (double& v : d) v = r.uniform() < 0.5 ? -1.0 : 1.0;
    return out;
}

// The block's k-th seeded rotation Q_k (k >= 1). Each block draws its own: one set shared by all
// blocks of a layer, tried to save the QRs, lost badly on a real FFN down-projection
// (docs/record/eval-record.md) — the layer loss has cross terms between blocks, which the same
// rotation everywhere correlates.
std::vector<double> block_rotation(std::uint64_t seed, std::size_t block, std::size_t k, std::size_t g) {
    return random_rotation(g, rng::mix_seed(seed ^ 0xA07A7Eull) + block * 64 + k);
}

// Q M (G x G).
std::vector<double> rotated(const std::vector<double>& q, const std::vector<double>& m, std::size_t g) {
    std::vector<double> t(g * g);
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(g), int(g), int(g), 1.0, q.data(), int(g), m.data(),
                int(g), 0.0, t.data(), int(g));
    return t;
}

// The data-free fall-backs, in stage 1's order. R is the Random transform's block b for the same
// seed, so a block falling back to R stores R's block.
constexpr std::pair<SearchBase, TransformKind> kDataFreeBases[] = {{SearchBase::Hadamard, TransformKind::Hadamard},
                                                                   {SearchBase::Identity, TransformKind::Identity},
                                                                   {SearchBase::Random, TransformKind::Random}};

// c = 2^(step / steps).
double scale_of(std::size_t step, std::size_t steps) {
    return std::exp2(double(step) / double(steps));
}

// c T rounded to the storage dtype: the matrix a candidate is scored as and stored as.
std::vector<float> scaled_for_storage(const std::vector<double>& t, double c, wush_dtype storage) {
    std::vector<double> ct(t);
    for (double& v : ct) v *= c;
    return to_storage(ct, storage);
}

struct Candidate {
    std::vector<double> t, t_w;  // activation side and its inverse-transpose
};

// A stage-1 candidate: its matrices and what search_block reports about it.
struct Entry {
    Candidate c;
    SearchBase base;
    std::size_t pattern;
};

// The current winner of one block's search.
struct Best {
    Candidate c;
    Score score;
    double scale = 1.0;
    BlockChoice choice;
};

// One block's candidates and their scores. Every candidate is c P D M with P, D orthogonal and
// symmetric (P = H for WUSH, I for WUS; D a sign diagonal), so its inverse-transpose is
// c^{-1} P D M^{-T}: one inversion per block (of A = P^T T_act) instead of one LU per candidate,
// which would dominate the search's cost. (The stored matrix is the storage-rounded c P D A; its
// exact inverse differs from this one by the storage rounding, far below what separates
// candidates; the weight side actually used is always re-derived from the stored matrix.)
class BlockSearch {
public:
    BlockSearch(TransformKind kind, const BlockSolution& solution, const formats::FormatSpec& format,
                const BlockSample& sample, wush_dtype storage)
        : format_(format), sample_(sample), storage_(storage), g_(format.group), basis_(kind, solution, g_),
          ws_(sample, g_) {
        const std::vector<float> af(basis_.a.begin(), basis_.a.end());
        a_it_ = inverse_transpose(af.data(), g_);
        if (a_it_.empty())
            a_it_.assign(g_ * g_, 0.0);  // singular A (never from Algorithm 1): its candidates score +Inf
        a_ok_ = std::any_of(a_it_.begin(), a_it_.end(), [](double v) { return v != 0.0; });
        plain_ = {solution.t_act, a_ok_ ? basis_.apply_pd(a_it_, std::vector<double>(g_, 1.0)) : std::vector<double>{}};
    }

    // The unsearched solution (canonical signs, c = 1).
    const Candidate& plain() const { return plain_; }

    Score score(const Candidate& c, double scale) { return score_on(c, scale, sample_, ws_); }

    // Stage 1's candidates besides the plain one: seeded sign patterns, seeded rotations Q in place
    // of H, and the data-free fall-backs.
    std::vector<Entry> candidates(const CandidateCounts& counts, std::uint64_t seed, std::size_t block) const {
        std::vector<Entry> entries;
        const std::vector<std::vector<double>> signs = sign_patterns(seed, block, counts.sign_patterns, g_);
        for (std::size_t k = 1; a_ok_ && k <= signs.size(); ++k)
            entries.push_back({{basis_.apply_pd(basis_.a, signs[k - 1]), basis_.apply_pd(a_it_, signs[k - 1])},
                               SearchBase::Solution,
                               k});
        // Q A is as exact as H A (Q orthogonal, so its inverse-transpose is Q A^{-T}), and a
        // different spread of the block over the group.
        for (std::size_t k = 1; a_ok_ && k <= counts.rotations; ++k) {
            const std::vector<double> q = block_rotation(seed, block, k, g_);
            entries.push_back({{rotated(q, basis_.a, g_), rotated(q, a_it_, g_)}, SearchBase::Rotated, k});
        }
        // Orthogonal (their own inverse-transpose).
        for (const auto& [base, kind] : kDataFreeBases) {
            std::vector<double> m = data_free_block(kind, g_, seed, block);
            entries.push_back({{m, m}, base, 0});
        }
        return entries;
    }

    // With more candidates than `keep`, each is first scored on a quarter of the sample (every 4th
    // token and weight row) and only the best `keep` stay — what makes NVFP4's 8 rotations
    // affordable (measured to choose about as well, docs/record/eval-record.md).
    void screen(std::vector<Entry>& entries, std::size_t keep) const {
        if (keep == 0 || entries.size() <= keep || sample_.n < 8 || sample_.rows < 8) return;
        const BlockSample quarter = subsample(sample_, 4, g_);
        Workspace wq(quarter, g_);
        std::vector<std::pair<double, std::size_t>> ranked;
        for (std::size_t i = 0; i < entries.size(); ++i)
            ranked.push_back({score_on(entries[i].c, 1.0, quarter, wq).total(), i});
        std::stable_sort(ranked.begin(), ranked.end());
        std::vector<Entry> kept;
        for (std::size_t i = 0; i < keep; ++i) kept.push_back(std::move(entries[ranked[i].second]));
        entries = std::move(kept);
    }

    // Stage 1: the base matrix and sign pattern at c = 1, in the entries' order (ties keep the earlier).
    void pick_base(std::vector<Entry>& entries, Best& best) {
        for (Entry& e : entries) {
            const Score sc = score(e.c, 1.0);
            if (sc.total() < best.score.total()) {
                best.score = sc;
                best.c = std::move(e.c);
                best.choice.base = e.base;
                best.choice.sign_pattern = std::uint8_t(e.pattern);
            }
        }
    }

    // Stage 2: the winner's scale, coarse to fine on the circle of `steps` steps (c and 2c quantize
    // alike: exactly for MXFP4's power-of-two scales, up to range limits for the floating-point
    // scales of NVFP4 and INT4, so step K-1 neighbours step 0): the even steps, then the two
    // neighbours of the best of them. k = 0 is the winner itself, already scored.
    void pick_scale(std::size_t steps, Best& best) {
        std::uint64_t scored = 1;  // bit k: step k scored
        const auto try_step = [&](std::size_t k) {
            if (scored >> k & 1) return;
            scored |= std::uint64_t(1) << k;
            const double c = scale_of(k, steps);
            const Score sc = score(best.c, c);
            if (sc.total() < best.score.total()) {
                best.score = sc;
                best.scale = c;
                best.choice.scale_step = std::uint8_t(k);
            }
        };
        for (std::size_t k = 2; k < steps; k += 2) try_step(k);
        const std::size_t coarse = best.choice.scale_step;
        try_step((coarse + 1) % steps);
        try_step((coarse + steps - 1) % steps);
    }

    std::vector<float> stored(const Best& best) const { return scaled_for_storage(best.c.t, best.scale, storage_); }

private:
    Score score_on(const Candidate& c, double scale, const BlockSample& on, Workspace& w) const {
        if (c.t_w.empty()) return kInfScore;
        const std::vector<float> st = scaled_for_storage(c.t, scale, storage_);
        std::vector<float> tw(g_ * g_);
        for (std::size_t i = 0; i < g_ * g_; ++i) tw[i] = float(c.t_w[i] / scale);
        return score_pair(format_, st.data(), tw.data(), g_, on, w);
    }

    const formats::FormatSpec& format_;
    const BlockSample& sample_;
    wush_dtype storage_;
    std::size_t g_;
    SolutionBasis basis_;
    std::vector<double> a_it_;
    bool a_ok_ = false;
    Candidate plain_;
    Workspace ws_;
};

}  // namespace

SearchResult search_block(TransformKind kind, const BlockSolution& solution, const formats::FormatSpec& format,
                          const BlockSample& sample, wush_dtype storage, const SearchOptions& options,
                          std::uint64_t seed, std::size_t block) {
    require(kind == TransformKind::WUS || kind == TransformKind::WUSH,
            "search: only WUS and WUSH have free parameters");
    require(format.group == sample.x.size() / std::max<std::size_t>(1, sample.n),
            std::string("search: format ") + format.name + "'s group size differs from the block size");
    require(solution.t_act.size() == format.group * format.group, "search: the solution must be G x G");
    require(options.scale_steps >= 1 && options.scale_steps <= 64, "search: scale_steps must be in [1, 64]");
    const CandidateCounts counts = search_candidate_counts(options, format.id, sample.real_tokens ? sample.n : 0);
    require(counts.sign_patterns <= 64 && counts.rotations <= 64, "search: at most 64 sign patterns and 64 rotations");

    BlockSearch search(kind, solution, format, sample, storage);
    const Score plain_score = search.score(search.plain(), 1.0);
    Best best{search.plain(), plain_score, 1.0, BlockChoice{}};
    std::vector<Entry> entries = search.candidates(counts, seed, block);
    search.screen(entries, counts.screen_keep);
    search.pick_base(entries, best);
    search.pick_scale(options.scale_steps, best);
    // The winner replaces the plain solution only if it scores lower on both halves of the
    // sample. The minimum of a dozen noisy scores is biased low; a lead that one half of the
    // tokens does not share is more likely that half's noise than a better transform (on held-out
    // tokens the unchecked choice can end above plain WUSH: docs/record/eval-record.md has the comparison).
    // Samples too small to split rank by the total alone.
    if (sample.n >= 2 && !best.score.below_on_both(plain_score))
        best = Best{search.plain(), plain_score, 1.0, BlockChoice{}};
    best.choice.plain_score = plain_score.total();
    best.choice.score = best.score.total();
    return {search.stored(best), best.choice};
}

std::vector<float> replay_block(TransformKind kind, const BlockSolution& solution, const BlockChoice& choice,
                                std::size_t g, wush_dtype storage, std::size_t scale_steps, std::uint64_t seed,
                                std::size_t block) {
    require(kind == TransformKind::WUS || kind == TransformKind::WUSH,
            "replay: only WUS and WUSH have free parameters");
    require(solution.t_act.size() == g * g, "replay: the solution must be G x G");
    require(scale_steps >= 1 && scale_steps <= 64 && choice.scale_step < scale_steps,
            "replay: the scale step must be below scale_steps (at most 64)");
    require(choice.sign_pattern <= 64, "replay: at most 64 sign patterns and 64 rotations");
    const double c = scale_of(choice.scale_step, scale_steps);
    if (choice.base == SearchBase::Solution && choice.sign_pattern == 0)
        return scaled_for_storage(solution.t_act, c, storage);
    if (choice.base == SearchBase::Solution) {
        const SolutionBasis basis(kind, solution, g);
        return scaled_for_storage(basis.apply_pd(basis.a, sign_patterns(seed, block, choice.sign_pattern, g).back()), c,
                                  storage);
    }
    if (choice.base == SearchBase::Rotated) {
        require(choice.sign_pattern >= 1, "replay: rotations are numbered from 1");
        return scaled_for_storage(
            rotated(block_rotation(seed, block, choice.sign_pattern, g), SolutionBasis(kind, solution, g).a, g), c,
            storage);
    }
    for (const auto& [base, data_free] : kDataFreeBases)
        if (choice.base == base) return scaled_for_storage(data_free_block(data_free, g, seed, block), c, storage);
    fail(WUSH_ERR_INVALID_ARGUMENT, "replay: unknown search base");
}

SearchResult search_layer_block(const TransformOptions& options, const formats::FormatSpec& format,
                                const BlockSolution& solution, std::span<const double> m_x,
                                std::span<const double> w_slice, std::size_t d_out, std::span<const float> tokens,
                                std::size_t n_tokens, std::size_t d_in, std::size_t block,
                                std::span<const double> noise, std::span<const double> u_bb) {
    const std::size_t g = format.group;
    if (!options.search.replay.empty()) {
        require(block < options.search.replay.size(), "search: the replayed choices must be one per block");
        const BlockChoice& choice = options.search.replay[block];
        return {replay_block(options.kind, solution, choice, g, options.storage, options.search.scale_steps,
                             options.seed, block),
                choice};
    }
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
        sample = surrogate_sample(m_x, w_slice, d_out, g, options.search, noise);
    }
    sample.u_bb.assign(u_bb.begin(), u_bb.end());
    return search_block(options.kind, solution, format, sample, options.storage, options.search, options.seed, block);
}

BlockTransform search_transform(const TransformOptions& options, const Calibrator& calibration,
                                std::span<const float> weight, std::size_t d_out, const LayerSolution& plain,
                                Progress* progress, std::span<const float> sample, std::size_t n_sample) {
    const std::size_t d_in = calibration.d_in(), g = calibration.group(), c = calibration.blocks(), gg = g * g;
    require(options.search.enabled && (options.kind == TransformKind::WUS || options.kind == TransformKind::WUSH),
            "search_transform: the search is WUS's and WUSH's, with options.search.enabled");
    require(plain.blocks.size() == c && plain.transform.kind() == options.kind && plain.transform.group() == g &&
                plain.transform.damping() == options.damping,
            "search_transform: the plain solution is not this layer's");
    require(d_out > 0 && weight.size() == checked_mul(d_out, d_in, "weight size"),
            "search_transform: the weight must be d_out x d_in");
    const formats::FormatSpec& format = formats::spec(options.search.format);
    require(format.group == g, std::string("build_transform: the search format ") + format.name + " has group size " +
                                   std::to_string(format.group) + ", the calibrator G = " + std::to_string(g));
    require(n_sample == 0 || sample.size() == checked_mul(n_sample, d_in, "sample size"),
            "build_transform: the token sample must be n_sample x d_in");
    if (n_sample > 0) require_finite(WUSH_DTYPE_F32, sample.data(), n_sample, d_in, "token sample");
    // A replay scores nothing: it needs neither a sample nor the weight. Without an explicit
    // sample, the calibrator's token sample (if it keeps one) beats the Gaussian surrogate: it has
    // the real tokens' tails, which set MXFP4's group scales.
    const bool replay = !options.search.replay.empty();
    if (replay)
        require(options.search.replay.size() == c, "build_transform: the replayed choices must be one per block");
    std::vector<float> kept;
    if (!replay && n_sample == 0 && calibration.sample_count() > 0) {
        kept = calibration.sample();
        sample = kept;
        n_sample = calibration.sample_count();
    }
    const bool surrogate = !replay && n_sample == 0;
    const std::vector<double> noise =
        surrogate ? surrogate_noise(options.search.sample_tokens, g, options.seed) : std::vector<double>{};
    std::vector<float> act(c * gg);
    TransformStats stats = plain.transform.stats();
    stats.search.resize(c);
    block_loop::blocks_with_slices(
        weight, d_out, d_in, g, !replay,
        [&](std::size_t b, std::span<const double> slice) {
            const std::vector<double> m_x = surrogate ? calibration.second_moment(b) : std::vector<double>{};
            const SearchResult r = search_layer_block(options, format, plain.blocks[b], m_x, slice, d_out, sample,
                                                      n_sample, d_in, b, noise);
            std::ranges::copy(r.t_act, act.begin() + b * gg);
            stats.search[b] = r.choice;
        },
        progress);
    return BlockTransform(d_in, g, options.kind, std::move(act), options.damping, std::move(stats));
}

BlockTransform build_searched_transform(const TransformOptions& options, const Calibrator& calibration,
                                        std::span<const float> weight, std::size_t d_out, Progress* progress,
                                        std::span<const float> sample, std::size_t n_sample) {
    if (!options.search.enabled || (options.kind != TransformKind::WUS && options.kind != TransformKind::WUSH))
        return build_transform(options, calibration, weight, d_out, progress);
    // The progress is the search's: it is most of the time, and the caller hears one pass.
    const LayerSolution plain = solve_layer(options, calibration, weight, d_out);
    return search_transform(options, calibration, weight, d_out, plain, progress, sample, n_sample);
}

}  // namespace wush
