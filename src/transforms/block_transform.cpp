#include "transforms/block_transform.h"

#include <cblas.h>
#include <lapacke.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <optional>
#include <string>
#include <string_view>

#include "common/checked_math.h"
#include "common/dtype.h"
#include "common/error.h"
#include "common/float_bits.h"
#include "transforms/basis.h"
#include "transforms/block_loop.h"
#include "transforms/rng.h"

namespace wush {

namespace {

// Below this ratio s_min / s_max the S^{-1/2} factor would amplify rounding noise without bound.
constexpr double kMinSingularRatio = 1e-12;
// A Cholesky pivot below this fraction of the mean diagonal marks a numerically singular moment.
constexpr double kRankTolerance = 1e-10;

using Matrix = std::vector<double>;  // row-major square G x G

double trace(std::span<const double> m, std::size_t g) {
    double t = 0.0;
    for (std::size_t i = 0; i < g; ++i) t += m[i * g + i];
    return t;
}

// Lower Cholesky factor of M + damping * tr(M)/G * I, or empty on failure (including tr <= 0).
Matrix damped_cholesky(std::span<const double> m, std::size_t g, double damping) {
    const double tr = trace(m, g);
    if (!(tr > 0.0) || !std::isfinite(tr)) return {};
    Matrix l(m.begin(), m.end());
    for (std::size_t i = 0; i < g; ++i) l[i * g + i] += damping * tr / double(g);
    if (LAPACKE_dpotrf(LAPACK_ROW_MAJOR, 'L', int(g), l.data(), int(g)) != 0) return {};
    for (std::size_t i = 0; i < g; ++i)
        for (std::size_t j = i + 1; j < g; ++j) l[i * g + j] = 0.0;  // dpotrf leaves the upper part as is
    return l;
}

// True when the undamped moment is not numerically positive definite.
bool is_rank_deficient(std::span<const double> m, std::size_t g) {
    const double tr = trace(m, g);
    if (!(tr > 0.0)) return true;
    Matrix l = damped_cholesky(m, g, 0.0);
    if (l.empty()) return true;
    for (std::size_t i = 0; i < g; ++i)
        if (l[i * g + i] * l[i * g + i] <= kRankTolerance * tr / double(g)) return true;
    return false;
}

// c = op(a) * op(b) for G x G row-major matrices.
Matrix gemm(const Matrix& a, bool ta, const Matrix& b, bool tb, std::size_t g) {
    Matrix c(g * g);
    const int n = int(g);
    cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, n, n, n, 1.0, a.data(),
                n, b.data(), n, 0.0, c.data(), n);
    return c;
}

BlockSolution fallback_solution(TransformKind kind, std::size_t g, bool rank_deficient) {
    BlockSolution s;
    s.t_act = kind == TransformKind::WUSH ? hadamard_matrix(g) : identity_matrix(g);
    s.t_weight = s.t_act;  // orthogonal: the inverse-transpose is the matrix itself
    s.singular_values.assign(g, 0.0);
    s.fell_back = true;
    s.rank_deficient = rank_deficient;
    return s;
}

// diag(s^{-1/2}) * m, then H * that for WUSH.
Matrix finish_side(Matrix m, const std::vector<double>& s, TransformKind kind, std::size_t g) {
    for (std::size_t i = 0; i < g; ++i) {
        const double f = 1.0 / std::sqrt(s[i]);
        for (std::size_t j = 0; j < g; ++j) m[i * g + j] *= f;
    }
    return kind == TransformKind::WUSH ? gemm(hadamard_matrix(g), false, m, false, g) : m;
}

// An SVD fixes each singular pair (u_i, v_i) only up to a common sign, and LAPACK's choice can
// flip under a rounding-level change of the input (e.g. moments summed in another order by
// distributed calibration). The flip changes the transform and its quantized weights, so every
// pair is made canonical: the largest-magnitude entry of u_i is positive (first one on ties).
void canonicalize_signs(Matrix& u, Matrix& vt, std::size_t g) {
    for (std::size_t i = 0; i < g; ++i) {
        std::size_t k = 0;
        for (std::size_t r = 1; r < g; ++r)
            if (std::fabs(u[r * g + i]) > std::fabs(u[k * g + i])) k = r;
        if (u[k * g + i] >= 0.0) continue;
        for (std::size_t r = 0; r < g; ++r) u[r * g + i] = -u[r * g + i];
        for (std::size_t c = 0; c < g; ++c) vt[i * g + c] = -vt[i * g + c];
    }
}

}  // namespace

const char* transform_kind_name(TransformKind kind) {
    const std::string_view name = name_of<TransformKind>(kTransformKindNames, kind);
    return name.empty() ? "unknown" : name.data();  // the table's literals are NUL-terminated
}

std::optional<TransformKind> transform_kind_from_name(std::string_view name) {
    return parse_name<TransformKind>(kTransformKindNames, name);
}

BlockSolution solve_block(TransformKind kind, std::span<const double> m_w, std::span<const double> m_x, std::size_t g,
                          double damping) {
    require(kind == TransformKind::WUS || kind == TransformKind::WUSH,
            "solve_block: only WUS and WUSH are data-driven");
    require(m_w.size() == g * g && m_x.size() == g * g, "solve_block: moments must be G x G");
    require(damping >= 0.0 && std::isfinite(damping), "solve_block: damping must be finite and >= 0");
    const bool deficient = is_rank_deficient(m_w, g) || is_rank_deficient(m_x, g);
    // Undamped, a singular moment has no meaningful Cholesky factor: what dpotrf returns would be
    // shaped by rounding noise, so such a block falls back instead.
    if (deficient && damping == 0.0) return fallback_solution(kind, g, deficient);
    const Matrix wp = damped_cholesky(m_w, g, damping);  // W'
    const Matrix xp = damped_cholesky(m_x, g, damping);  // X'
    if (wp.empty() || xp.empty()) return fallback_solution(kind, g, deficient);

    Matrix k = gemm(wp, true, xp, false, g);  // W'^T X' = U S V^T
    Matrix u(g * g), vt(g * g);
    std::vector<double> s(g), superb(g);
    const int n = int(g);
    if (LAPACKE_dgesvd(LAPACK_ROW_MAJOR, 'A', 'A', n, n, k.data(), n, s.data(), u.data(), n, vt.data(), n,
                       superb.data()) != 0)
        return fallback_solution(kind, g, deficient);
    if (!(s[g - 1] > kMinSingularRatio * s[0]) || !std::isfinite(s[0])) return fallback_solution(kind, g, deficient);
    canonicalize_signs(u, vt, g);

    BlockSolution out;
    out.t_act = finish_side(gemm(u, true, wp, true, g), s, kind, g);       // H S^{-1/2} U^T W'^T
    out.t_weight = finish_side(gemm(vt, false, xp, true, g), s, kind, g);  // H S^{-1/2} V^T X'^T
    out.singular_values = std::move(s);
    out.rank_deficient = deficient;
    return out;
}

std::vector<double> weight_slice(std::span<const float> w, std::size_t d_out, std::size_t d_in, std::size_t g,
                                 std::size_t block) {
    return std::move(weight_slices(w, d_out, d_in, g, block, 1).front());
}

std::vector<std::vector<double>> weight_slices(std::span<const float> w, std::size_t d_out, std::size_t d_in,
                                               std::size_t g, std::size_t first, std::size_t count) {
    std::vector<std::vector<double>> slices(count);
    fill_weight_slices(w, d_out, d_in, g, first, slices);
    return slices;
}

void fill_weight_slices(std::span<const float> w, std::size_t d_out, std::size_t d_in, std::size_t g, std::size_t first,
                        std::span<std::vector<double>> slices) {
    const std::size_t count = slices.size();
    require(g > 0 && d_in % g == 0 && count > 0 && first < d_in / g && count <= d_in / g - first,
            "weight_slice: bad block geometry");
    require(d_out > 0 && w.size() >= checked_mul(d_out, d_in, "weight size"), "weight_slice: weight too small");
    for (std::vector<double>& s : slices) s.resize(checked_mul(d_out, g, "slice size"));
    for (std::size_t r = 0; r < d_out; ++r) {
        const float* row = w.data() + r * d_in + first * g;
        for (std::size_t k = 0; k < count; ++k)
            for (std::size_t j = 0; j < g; ++j) slices[k][r * g + j] = row[k * g + j];
    }
}

std::vector<double> weight_second_moment(std::span<const float> w, std::size_t d_out, std::size_t d_in, std::size_t g,
                                         std::size_t block) {
    return slice_second_moment(weight_slice(w, d_out, d_in, g, block), d_out, g);
}

std::vector<double> slice_second_moment(std::span<const double> slice, std::size_t d_out, std::size_t g) {
    require(d_out > 0 && slice.size() == checked_mul(d_out, g, "slice size"), "slice_second_moment: bad slice");
    std::vector<double> m(g * g, 0.0);
    cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, int(g), int(d_out), 1.0 / double(d_out), slice.data(), int(g),
                0.0, m.data(), int(g));
    for (std::size_t i = 0; i < g; ++i)
        for (std::size_t j = 0; j < i; ++j) m[i * g + j] = m[j * g + i];
    return m;
}

namespace {

// Also bounds G (kMaxGroupSize) and the size of all C matrices, d_in x G values, so that no later
// size product can wrap: an absurd d_in fails here, not as a wrapped allocation.
void check_layer_geometry(std::size_t d_in, std::size_t group) {
    require(group > 0 && (group & (group - 1)) == 0,
            "transform: G = " + std::to_string(group) + " is not a power of two");
    require(group <= kMaxGroupSize, "transform: G = " + std::to_string(group) + " exceeds the largest block size " +
                                        std::to_string(kMaxGroupSize));
    require(d_in > 0 && d_in % group == 0,
            "transform: G = " + std::to_string(group) + " does not divide d_in = " + std::to_string(d_in));
    // A transform holds d_in x G floats and as many doubles. Beyond the 47-bit user address space
    // no allocation can succeed: say so, rather than ask the allocator (a sanitizer aborts on
    // such a request instead of failing it).
    constexpr std::size_t kAddressSpace = std::size_t(1) << 47;
    const std::size_t bytes = checked_mul(checked_mul(d_in, group, "transform size d_in x G"), 12, "transform bytes");
    if (bytes > kAddressSpace)
        fail(WUSH_ERR_OUT_OF_MEMORY, "transform: d_in x G = " + std::to_string(d_in) + " x " + std::to_string(group) +
                                         " needs " + std::to_string(bytes) + " bytes, beyond any address space");
}

}  // namespace

std::vector<double> inverse_transpose(const float* t, std::size_t g) {
    std::vector<double> a(t, t + g * g);
    std::vector<lapack_int> piv(g);
    const int n = int(g);
    if (LAPACKE_dgetrf(LAPACK_ROW_MAJOR, n, n, a.data(), n, piv.data()) != 0) return {};
    if (LAPACKE_dgetri(LAPACK_ROW_MAJOR, n, a.data(), n, piv.data()) != 0) return {};
    for (std::size_t i = 0; i < g; ++i)
        for (std::size_t j = i + 1; j < g; ++j) std::swap(a[i * g + j], a[j * g + i]);
    return a;
}

namespace {

// Rows per tile of apply_weights: its two float64 copies of the rows within about 1 MiB.
std::size_t weight_row_tile(std::size_t d_out, std::size_t d_in) {
    constexpr std::size_t kBytes = std::size_t(1) << 20;
    return std::clamp<std::size_t>(kBytes / (2 * d_in * sizeof(double)), 1, d_out);
}

}  // namespace

float round_for_storage(float v, wush_dtype storage) {
    switch (storage) {
        case WUSH_DTYPE_F32: return v;
        case WUSH_DTYPE_BF16: return bits::bf16_decode(bits::bf16_encode(v));
        case WUSH_DTYPE_F16: {
            // binary16: 10 stored mantissa bits, minimum normal exponent -14, max finite 65504.
            const double r = bits::round_to_format(std::fabs(double(v)), 10, -14);
            require(r <= 65504.0, "transform: entry " + std::to_string(v) + " overflows f16 storage");
            return float(std::signbit(v) ? -r : r);
        }
        default: break;
    }
    fail(WUSH_ERR_INVALID_ARGUMENT, "transform: unknown storage dtype " + std::to_string(int(storage)));
}

BlockTransform::BlockTransform(std::size_t d_in, std::size_t group, TransformKind kind, std::vector<float> activation,
                               double damping, TransformStats stats)
    : d_in_(d_in), group_(group), kind_(kind), damping_(damping), act_(std::move(activation)),
      stats_(std::move(stats)) {
    check_layer_geometry(d_in, group);
    const std::size_t per_block = group * group;
    require(act_.size() == checked_mul(blocks(), per_block, "transform size"),
            "transform: expected " + std::to_string(blocks()) + " x " + std::to_string(group) + " x " +
                std::to_string(group) + " activation matrices, got " + std::to_string(act_.size()) + " values");
    if (auto bad = find_non_finite(WUSH_DTYPE_F32, act_.data(), act_.size()))
        fail(WUSH_ERR_NON_FINITE, "transform: block " + std::to_string(*bad / per_block) + " holds NaN or Inf");
    weight_.resize(act_.size());
    block_loop::parallel_blocks(blocks(), [&](std::size_t b) {
        const std::vector<double> tw = inverse_transpose(act_.data() + b * per_block, group_);
        if (tw.empty())
            fail(WUSH_ERR_NUMERICAL, "transform: activation matrix of block " + std::to_string(b) + " is singular");
        std::copy(tw.begin(), tw.end(), weight_.begin() + b * per_block);
    });
}

BlockTransform BlockTransform::rounded_to(wush_dtype storage) const {
    std::vector<float> act = act_;
    for (float& v : act) v = round_for_storage(v, storage);
    return BlockTransform(d_in_, group_, kind_, std::move(act), damping_, stats_);
}

void BlockTransform::apply_activations(std::span<const float> x, std::size_t n, std::span<float> out) const {
    const std::size_t need = checked_mul(n, d_in_, "activation size");
    require(x.size() >= need && out.size() >= need, "apply_activations: buffers smaller than n x d_in");
    require(n <= std::size_t(INT_MAX), "apply_activations: more than INT_MAX tokens in one call");
    if (n == 0) return;
    const int g = int(group_);
    const int ld = int(d_in_);
    // Block b of all tokens at once: Out_b (n x G) = X_b (n x G) * T_b^T.
    for (std::size_t b = 0; b < blocks(); ++b)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n), g, g, 1.0f, x.data() + b * group_, ld,
                    act_.data() + b * group_ * group_, g, 0.0f, out.data() + b * group_, ld);
}

void BlockTransform::apply_weights(std::span<const float> w, std::size_t d_out, std::span<float> out) const {
    const std::size_t need = checked_mul(d_out, d_in_, "weight size");
    require(w.size() >= need && out.size() >= need, "apply_weights: buffers smaller than d_out x d_in");
    require(d_out <= std::size_t(INT_MAX), "apply_weights: d_out exceeds INT_MAX");
    if (d_out == 0) return;
    const std::size_t g = group_;
    // Tiles of whole rows in float64 (one per parallel item): the input is read and the output
    // written front to back, and each block's product reads its columns of the tile in place
    // (lda = d_in). A whole-height pass per block would touch every row's page for 128 bytes per
    // block, which the prefetchers cannot follow.
    const std::size_t tile = weight_row_tile(d_out, d_in_), tiles = (d_out + tile - 1) / tile;
    block_loop::parallel_blocks(tiles, [&](std::size_t t) {
        const std::size_t r0 = t * tile, n = std::min(tile, d_out - r0) * d_in_;
        std::vector<double> rows(w.begin() + std::ptrdiff_t(r0 * d_in_), w.begin() + std::ptrdiff_t(r0 * d_in_ + n));
        std::vector<double> result(n);
        for (std::size_t b = 0; b < blocks(); ++b)
            cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n / d_in_), int(g), int(g), 1.0,
                        rows.data() + b * g, int(d_in_), weight_.data() + b * g * g, int(g), 0.0, result.data() + b * g,
                        int(d_in_));
        std::transform(result.begin(), result.end(), out.begin() + std::ptrdiff_t(r0 * d_in_),
                       [](double v) { return float(v); });
    });
}

std::vector<double> data_free_block(TransformKind kind, std::size_t g, std::uint64_t seed, std::size_t block) {
    switch (kind) {
        case TransformKind::Identity: return identity_matrix(g);
        case TransformKind::Hadamard: return hadamard_matrix(g);
        case TransformKind::Random: return random_rotation(g, rng::mix_seed(seed) + block);
        default:
            fail(WUSH_ERR_INVALID_ARGUMENT,
                 std::string("transform kind ") + transform_kind_name(kind) + " needs calibration data and weights");
    }
}

BlockTransform build_data_free_transform(const TransformOptions& options, std::size_t d_in, std::size_t group) {
    check_layer_geometry(d_in, group);
    round_for_storage(0.0f, options.storage);  // rejects an unknown storage dtype up front
    const std::size_t c = d_in / group, per_block = group * group;
    std::vector<float> act(checked_mul(c, per_block, "transform size"));
    for (std::size_t b = 0; b < c; ++b) {
        const std::vector<double> t = data_free_block(options.kind, group, options.seed, b);
        std::transform(t.begin(), t.end(), act.begin() + b * per_block,
                       [&](double v) { return round_for_storage(float(v), options.storage); });
    }
    return BlockTransform(d_in, group, options.kind, std::move(act));
}

namespace {

// build_transform's checks of every kind, then (WUS/WUSH) of the data they are solved from.
void check_build(const TransformOptions& options, const Calibrator& calibration, std::span<const float> weight,
                 std::size_t d_out) {
    const std::size_t d_in = calibration.d_in();
    require(d_out > 0, "build_transform: d_out must be positive");
    require(weight.size() == checked_mul(d_out, d_in, "weight size"),
            "build_transform: weight has " + std::to_string(weight.size()) +
                " values, expected d_out x d_in = " + std::to_string(d_out) + " x " + std::to_string(d_in));
    if (options.kind != TransformKind::WUS && options.kind != TransformKind::WUSH) return;
    require(options.damping >= 0.0 && std::isfinite(options.damping),
            "build_transform: damping must be finite and >= 0");
    require(calibration.tokens() > 0, "build_transform: the calibrator has no tokens");
    require_finite(WUSH_DTYPE_F32, weight.data(), d_out, d_in, "weight");
    round_for_storage(0.0f, options.storage);  // rejects an unknown storage dtype up front
}

}  // namespace

LayerSolution solve_layer(const TransformOptions& options, const Calibrator& calibration, std::span<const float> weight,
                          std::size_t d_out, Progress* progress, std::span<const double> weight_moments) {
    require(options.kind == TransformKind::WUS || options.kind == TransformKind::WUSH,
            "solve_layer: only WUS and WUSH are data-driven");
    check_build(options, calibration, weight, d_out);
    const std::size_t d_in = calibration.d_in(), g = calibration.group(), c = calibration.blocks(), gg = g * g;
    const bool given = !weight_moments.empty();  // else computed from the weight slices
    if (given) require(weight_moments.size() == c * gg, "build_transform: weight_moments must be C x G x G");
    std::vector<double> m_w(weight_moments.begin(), weight_moments.end());
    if (!given) m_w.assign(c * gg, 0.0);
    std::vector<BlockSolution> blocks(c);
    std::vector<float> act(c * gg);
    block_loop::blocks_with_slices(
        weight, d_out, d_in, g, !given,
        [&](std::size_t b, std::span<const double> slice) {
            const std::span<double> m(m_w.data() + b * gg, gg);
            if (!given) std::ranges::copy(slice_second_moment(slice, d_out, g), m.begin());
            blocks[b] = solve_block(options.kind, m, calibration.second_moment(b), g, options.damping);
            std::ranges::transform(blocks[b].t_act, act.begin() + b * gg,
                                   [&](double v) { return round_for_storage(float(v), options.storage); });
        },
        progress);
    TransformStats stats;
    stats.singular_values.assign(c * g, 0.0);
    for (std::size_t b = 0; b < c; ++b) {
        std::ranges::copy(blocks[b].singular_values, stats.singular_values.begin() + b * g);
        if (blocks[b].fell_back) stats.fallback_blocks.push_back(b);
        if (blocks[b].rank_deficient) stats.rank_deficient_blocks.push_back(b);
    }
    BlockTransform plain(d_in, g, options.kind, std::move(act), options.damping, std::move(stats));
    return {std::move(plain), std::move(blocks), std::move(m_w)};
}

BlockTransform build_transform(const TransformOptions& options, const Calibrator& calibration,
                               std::span<const float> weight, std::size_t d_out, Progress* progress) {
    check_build(options, calibration, weight, d_out);
    if (options.kind != TransformKind::WUS && options.kind != TransformKind::WUSH)
        return build_data_free_transform(options, calibration.d_in(), calibration.group());
    require(!options.search.enabled, "build_transform: a searched build is build_searched_transform's");
    return solve_layer(options, calibration, weight, d_out, progress).transform;
}

}  // namespace wush
