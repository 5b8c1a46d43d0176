// Transforms: Hadamard and random rotations, Algorithm 1's algebraic properties on random SPD
// moments (identity T_xvsh T_wush^T = I, the equalization T M T^T = H S H^T, WUS diagonalization),
// degenerate blocks, and the exactness of the float32-stored transform with its derived weight side.
#include <gtest/gtest.h>

#include <lapacke.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "calibration/calibrator.h"
#include "common/error.h"
#include "formats/block_format.h"
#include "transforms/basis.h"
#include "transforms/block_transform.h"
#include "transforms/rng.h"

namespace wush {
namespace {

using Mat = std::vector<double>;

// Plain triple-loop products (the oracle side avoids BLAS on purpose).
Mat mul(const Mat& a, const Mat& b, std::size_t n, bool ta = false, bool tb = false) {
    Mat c(n * n, 0.0);
    for (std::size_t i = 0; i < n; ++i)
        for (std::size_t j = 0; j < n; ++j) {
            double s = 0.0;
            for (std::size_t k = 0; k < n; ++k)
                s += (ta ? a[k * n + i] : a[i * n + k]) * (tb ? b[j * n + k] : b[k * n + j]);
            c[i * n + j] = s;
        }
    return c;
}

double max_abs_diff(const Mat& a, const Mat& b) {
    double m = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
    return m;
}

// A random SPD matrix with a wide spectrum: A A^T / n plus a few strong directions.
Mat random_spd(std::size_t g, std::uint64_t seed, double spread) {
    rng::Rng r(seed);
    const std::size_t n = 2 * g;
    Mat a(g * n);
    for (std::size_t i = 0; i < g; ++i)
        for (std::size_t k = 0; k < n; ++k) a[i * n + k] = r.gaussian() * std::exp(spread * double(i % 5) / 4.0);
    Mat m(g * g, 0.0);
    for (std::size_t i = 0; i < g; ++i)
        for (std::size_t j = 0; j < g; ++j)
            for (std::size_t k = 0; k < n; ++k) m[i * g + j] += a[i * n + k] * a[j * n + k] / double(n);
    return m;
}

Mat damped(Mat m, std::size_t g, double lambda) {
    double tr = 0.0;
    for (std::size_t i = 0; i < g; ++i) tr += m[i * g + i];
    for (std::size_t i = 0; i < g; ++i) m[i * g + i] += lambda * tr / double(g);
    return m;
}

Mat identity(std::size_t g) {
    Mat m(g * g, 0.0);
    for (std::size_t i = 0; i < g; ++i) m[i * g + i] = 1.0;
    return m;
}

// Oracle for S: the singular values of W'^T X' are the square roots of the eigenvalues of
// X'^T M_W X' (same spectrum as M_X M_W), computed with dsyev, descending.
std::vector<double> oracle_singular_values(const Mat& m_w, const Mat& m_x, std::size_t g) {
    Mat l = m_x;
    EXPECT_EQ(LAPACKE_dpotrf(LAPACK_ROW_MAJOR, 'L', int(g), l.data(), int(g)), 0);
    for (std::size_t i = 0; i < g; ++i)
        for (std::size_t j = i + 1; j < g; ++j) l[i * g + j] = 0.0;
    Mat k = mul(l, mul(m_w, l, g), g, true, false);
    std::vector<double> ev(g);
    EXPECT_EQ(LAPACKE_dsyev(LAPACK_ROW_MAJOR, 'N', 'U', int(g), k.data(), int(g), ev.data()), 0);
    std::vector<double> s(g);
    for (std::size_t i = 0; i < g; ++i) s[i] = std::sqrt(ev[g - 1 - i]);
    return s;
}

TEST(Basis, HadamardIsNormalizedAndOrthogonal) {
    for (std::size_t g : {1, 2, 4, 16, 32, 64}) {
        const Mat h = hadamard_matrix(g);
        for (double v : h) EXPECT_DOUBLE_EQ(std::fabs(v), 1.0 / std::sqrt(double(g)));
        EXPECT_LT(max_abs_diff(mul(h, h, g, false, true), identity(g)), 1e-14) << g;
        EXPECT_EQ(h, mul(identity(g), h, g, false, true)) << "Sylvester H is symmetric";
    }
    EXPECT_THROW(hadamard_matrix(12), Error);
    EXPECT_THROW(hadamard_matrix(0), Error);
}

// A second implementation of the same Q: LAPACK's Householder QR of the same Gaussian draws,
// the columns of Q flipped where R's diagonal is negative.
Mat lapack_rotation(std::size_t g, std::uint64_t seed) {
    rng::Rng r(seed);
    Mat a(g * g);
    for (double& v : a) v = r.gaussian();
    const int n = int(g);
    std::vector<double> tau(g), sign(g);
    EXPECT_EQ(LAPACKE_dgeqrf(LAPACK_ROW_MAJOR, n, n, a.data(), n, tau.data()), 0);
    for (std::size_t k = 0; k < g; ++k) sign[k] = a[k * g + k] < 0.0 ? -1.0 : 1.0;
    EXPECT_EQ(LAPACKE_dorgqr(LAPACK_ROW_MAJOR, n, n, n, a.data(), n, tau.data()), 0);
    for (std::size_t i = 0; i < g; ++i)
        for (std::size_t k = 0; k < g; ++k) a[i * g + k] *= sign[k];
    return a;
}

TEST(Basis, RandomRotationIsOrthogonalAndSeeded) {
    for (std::size_t g : {1, 2, 16, 32, 128}) {
        const Mat q = random_rotation(g, 42);
        EXPECT_LT(max_abs_diff(mul(q, q, g, true, false), identity(g)), 1e-13);
        EXPECT_EQ(q, random_rotation(g, 42));
        if (g > 1) {
            EXPECT_GT(max_abs_diff(q, random_rotation(g, 43)), 1e-3);
        }
        // The QR with a positive diagonal is unique: Gram-Schmidt and Householder agree to rounding.
        for (std::uint64_t seed : {42, 7, 1234567})
            EXPECT_LT(max_abs_diff(random_rotation(g, seed), lapack_rotation(g, seed)), 1e-12) << g << " " << seed;
    }
}

struct SolveCase {
    TransformKind kind;
    double lambda;
};

class SolveBlock : public ::testing::TestWithParam<SolveCase> {};

TEST_P(SolveBlock, AlgebraicProperties) {
    const auto [kind, lambda] = GetParam();
    for (std::size_t g : {4, 16, 32}) {
        for (std::uint64_t seed = 1; seed <= 3; ++seed) {
            const Mat m_w = random_spd(g, 100 * seed + g, 1.0), m_x = random_spd(g, 200 * seed + g, 2.5);
            const BlockSolution s = solve_block(kind, m_w, m_x, g, lambda);
            ASSERT_FALSE(s.fell_back);
            const Mat& t = s.t_act;
            const Mat& tw = s.t_weight;
            // T_xvsh T_wush^T = I (the closed forms, both in float64).
            const Mat prod = mul(tw, t, g, false, true);
            EXPECT_LT(max_abs_diff(prod, identity(g)), 1e-9) << "g=" << g << " seed=" << seed;
            // The theory holds for the moments Algorithm 1 actually factors: the damped ones.
            const Mat dx = damped(m_x, g, lambda), dw = damped(m_w, g, lambda);
            const std::vector<double> sv = oracle_singular_values(dw, dx, g);
            for (std::size_t i = 0; i < g; ++i) EXPECT_NEAR(s.singular_values[i], sv[i], 1e-9 * sv[0]);
            // Transformed moments: H S H^T (WUSH) or S (WUS), on both sides.
            Mat target(g * g, 0.0);
            for (std::size_t i = 0; i < g; ++i) target[i * g + i] = sv[i];
            if (kind == TransformKind::WUSH) {
                const Mat h = hadamard_matrix(g);
                target = mul(h, mul(target, h, g, false, true), g);
            }
            const Mat tx = mul(t, mul(dx, t, g, false, true), g);
            const Mat tww = mul(tw, mul(dw, tw, g, false, true), g);
            EXPECT_LT(max_abs_diff(tx, target), 1e-9 * sv[0]);
            EXPECT_LT(max_abs_diff(tww, target), 1e-9 * sv[0]);
            if (kind == TransformKind::WUSH) {
                double tr = 0.0;
                for (double v : sv) tr += v;
                for (std::size_t i = 0; i < g; ++i) EXPECT_NEAR(tx[i * g + i], tr / double(g), 1e-9 * sv[0]);
            } else {
                for (std::size_t i = 0; i < g; ++i)
                    for (std::size_t j = 0; j < g; ++j)
                        if (i != j) {
                            EXPECT_NEAR(tx[i * g + j], 0.0, 1e-9 * sv[0]);
                        }
            }
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Kinds, SolveBlock,
                         ::testing::Values(SolveCase{TransformKind::WUSH, 0.0}, SolveCase{TransformKind::WUSH, 0.01},
                                           SolveCase{TransformKind::WUS, 0.0}, SolveCase{TransformKind::WUS, 0.01}));

// Activations whose block 0 is generic, block 1 all zero, block 2 of rank 3 (< G).
std::vector<float> degenerate_activations(std::size_t n, std::size_t d, std::size_t g) {
    rng::Rng r(7);
    std::vector<float> x(n * d, 0.0f);
    for (std::size_t t = 0; t < n; ++t) {
        for (std::size_t j = 0; j < g; ++j) x[t * d + j] = float(r.gaussian());
        const double a = r.gaussian(), b = r.gaussian(), c = r.gaussian();
        for (std::size_t j = 0; j < g; ++j) x[t * d + 2 * g + j] = float(a + (j % 2 ? b : -b) + (j % 3 ? c : 0.0));
        for (std::size_t j = 3 * g; j < d; ++j) x[t * d + j] = float(r.gaussian());
    }
    return x;
}

std::vector<float> random_weight(std::size_t d_out, std::size_t d_in, std::uint64_t seed) {
    rng::Rng r(seed);
    std::vector<float> w(d_out * d_in);
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = float(r.gaussian() * (1.0 + double(i % d_in % 7)));
    return w;
}

// The transform is a continuous function of the moments: a rounding-level perturbation (what
// summing the moments in another order, e.g. across MPI ranks, produces) moves T_wush by about
// as much, never by a flipped singular-vector sign.
TEST(SolveBlock, StableUnderRoundingLevelPerturbation) {
    const std::size_t g = 32;
    rng::Rng r(77);
    std::size_t worst_block = 0;
    double worst = 0.0;
    for (std::uint64_t seed = 1; seed <= 100; ++seed) {
        const Mat m_w = random_spd(g, seed, 1.0), m_x = random_spd(g, 1000 + seed, 2.0);
        Mat m_x2 = m_x;
        for (std::size_t i = 0; i < g; ++i)
            for (std::size_t j = 0; j <= i; ++j) {
                const double f = 1.0 + 1e-15 * r.gaussian();
                m_x2[i * g + j] *= f;
                m_x2[j * g + i] = m_x2[i * g + j];
            }
        for (TransformKind kind : {TransformKind::WUS, TransformKind::WUSH}) {
            const BlockSolution a = solve_block(kind, m_w, m_x, g, 0.01), b = solve_block(kind, m_w, m_x2, g, 0.01);
            double scale = 0.0;
            for (double v : a.t_act) scale = std::max(scale, std::fabs(v));
            const double d = max_abs_diff(a.t_act, b.t_act) / scale;
            if (d > worst) worst = d, worst_block = seed;
        }
    }
    EXPECT_LT(worst, 1e-9) << "block seed " << worst_block;
}

TEST(BuildTransform, DegenerateBlocksFallBackAndAreReported) {
    const std::size_t g = 16, d = 64, n = 200, d_out = 48;
    const auto x = degenerate_activations(n, d, g);
    const auto w = random_weight(d_out, d, 3);
    Calibrator cal(d, g, MomentMode::BlockDiagonal);
    cal.add(WUSH_DTYPE_F32, x.data(), n);
    for (TransformKind kind : {TransformKind::WUSH, TransformKind::WUS}) {
        // Damped: the zero block falls back, the rank-3 block is rescued by damping but flagged.
        BlockTransform t = build_transform({kind, 0.01, 0}, cal, w, d_out);
        EXPECT_EQ(t.stats().fallback_blocks, (std::vector<std::size_t>{1}));
        EXPECT_EQ(t.stats().rank_deficient_blocks, (std::vector<std::size_t>{1, 2}));
        const Mat fallback = kind == TransformKind::WUSH ? hadamard_matrix(g) : identity(g);
        for (std::size_t i = 0; i < g * g; ++i) EXPECT_EQ(t.activation_matrices()[g * g + i], float(fallback[i]));
        for (std::size_t i = 0; i < g; ++i) EXPECT_EQ(t.stats().singular_values[g + i], 0.0);
        EXPECT_GT(t.stats().singular_values[2 * g + g - 1], 0.0);
        // Undamped: the rank-deficient block falls back too.
        BlockTransform u = build_transform({kind, 0.0, 0}, cal, w, d_out);
        EXPECT_EQ(u.stats().fallback_blocks, (std::vector<std::size_t>{1, 2}));
        for (float v : u.activation_matrices()) EXPECT_TRUE(std::isfinite(v));
    }
    // A zero weight block falls back as well.
    auto w0 = w;
    for (std::size_t o = 0; o < d_out; ++o)
        for (std::size_t j = 3 * g; j < 4 * g; ++j) w0[o * d + j] = 0.0f;
    EXPECT_EQ(build_transform({TransformKind::WUSH, 0.01, 0}, cal, w0, d_out).stats().fallback_blocks,
              (std::vector<std::size_t>{1, 3}));
}

TEST(BuildTransform, StoredFloat32TransformKeepsProductExact) {
    const std::size_t g = 32, d = 128, n = 300, d_out = 40;
    rng::Rng r(9);
    std::vector<float> x(n * d);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(r.gaussian() * (i % d == 5 ? 40.0 : 1.0 + double(i % 3)));
    const auto w = random_weight(d_out, d, 4);
    Calibrator cal(d, g, MomentMode::Full);  // Full mode: diagonal blocks are used
    cal.add(WUSH_DTYPE_F32, x.data(), n);
    for (TransformKind kind : {TransformKind::Identity, TransformKind::Hadamard, TransformKind::Random,
                               TransformKind::WUS, TransformKind::WUSH}) {
        const BlockTransform t = build_transform({kind, 0.01, 5}, cal, w, d_out);
        ASSERT_EQ(t.activation_matrices().size(), (d / g) * g * g);
        EXPECT_TRUE(t.stats().fallback_blocks.empty());
        // Float64 evaluation of sum_b (T_w w_b)^T (T_act x_b) with the stored float32 T_act.
        for (std::size_t trial = 0; trial < 5; ++trial) {
            const float* xv = x.data() + trial * d;
            const float* wv = w.data() + trial * d;
            double ref = 0.0, mag = 0.0, got = 0.0;
            for (std::size_t k = 0; k < d; ++k) {
                ref += double(xv[k]) * double(wv[k]);
                mag += std::fabs(double(xv[k]) * double(wv[k]));
            }
            for (std::size_t b = 0; b < d / g; ++b) {
                const float* ta = t.activation_matrices().data() + b * g * g;
                const double* tw = t.weight_matrices().data() + b * g * g;
                for (std::size_t i = 0; i < g; ++i) {
                    double ax = 0.0, bw = 0.0;
                    for (std::size_t j = 0; j < g; ++j) {
                        ax += double(ta[i * g + j]) * double(xv[b * g + j]);
                        bw += tw[i * g + j] * double(wv[b * g + j]);
                    }
                    got += ax * bw;
                }
            }
            EXPECT_LE(std::fabs(got - ref), 1e-5 * mag) << transform_kind_name(kind);
        }
        // The derived weight side is the exact inverse-transpose of the float32 matrices.
        for (std::size_t b = 0; b < d / g; ++b) {
            Mat ta(t.activation_matrices().begin() + b * g * g, t.activation_matrices().begin() + (b + 1) * g * g);
            Mat tw(t.weight_matrices().begin() + b * g * g, t.weight_matrices().begin() + (b + 1) * g * g);
            EXPECT_LT(max_abs_diff(mul(ta, tw, g, true, false), identity(g)), 1e-10);
        }
        // apply_*: float32 outputs, product preserved to float32 accuracy.
        std::vector<float> xt(x.size()), wt(w.size());
        t.apply_activations(x, n, xt);
        t.apply_weights(w, d_out, wt);
        for (std::size_t tok = 0; tok < 4; ++tok)
            for (std::size_t o = 0; o < 4; ++o) {
                double ref = 0.0, got = 0.0, mag = 0.0;
                for (std::size_t k = 0; k < d; ++k) {
                    ref += double(x[tok * d + k]) * w[o * d + k];
                    mag += std::fabs(double(x[tok * d + k]) * w[o * d + k]);
                    got += double(xt[tok * d + k]) * wt[o * d + k];
                }
                EXPECT_LE(std::fabs(got - ref), 1e-4 * mag) << transform_kind_name(kind);
            }
        // apply_activations against a naive loop.
        for (std::size_t b = 0; b < d / g; ++b)
            for (std::size_t i = 0; i < g; ++i) {
                double v = 0.0;
                for (std::size_t j = 0; j < g; ++j)
                    v += double(t.activation_matrices()[b * g * g + i * g + j]) * x[7 * d + b * g + j];
                EXPECT_NEAR(xt[7 * d + b * g + i], v, 1e-4 * (1.0 + std::fabs(v)));
            }
    }
}

TEST(BuildTransform, RoundedStorageRederivesWeightSide) {
    const std::size_t g = 16, d = 32, n = 100, d_out = 20;
    rng::Rng r(21);
    std::vector<float> x(n * d);
    for (float& v : x) v = float(r.gaussian());
    const auto w = random_weight(d_out, d, 6);
    Calibrator cal(d, g, MomentMode::BlockDiagonal);
    cal.add(WUSH_DTYPE_F32, x.data(), n);
    const BlockTransform t = build_transform({TransformKind::WUSH, 0.01, 0}, cal, w, d_out);
    for (wush_dtype storage : {WUSH_DTYPE_BF16, WUSH_DTYPE_F16}) {
        const BlockTransform b = t.rounded_to(storage);
        bool changed = false;
        for (std::size_t i = 0; i < b.activation_matrices().size(); ++i) {
            const float v = b.activation_matrices()[i];
            // Representable: bf16 keeps 8 significant bits, f16 (normal range here) 11.
            int e = 0;
            const double frac = std::frexp(double(v), &e);
            const int bits = storage == WUSH_DTYPE_BF16 ? 8 : 11;
            EXPECT_EQ(std::ldexp(frac, bits), std::round(std::ldexp(frac, bits)));
            const double quantum_floor = storage == WUSH_DTYPE_F16 ? 0x1p-25 : 0.0;  // f16 subnormal half-step
            EXPECT_LE(std::fabs(v - t.activation_matrices()[i]),
                      std::max(std::ldexp(double(std::fabs(t.activation_matrices()[i])), -bits), quantum_floor));
            changed |= v != t.activation_matrices()[i];
        }
        EXPECT_TRUE(changed);
        for (std::size_t blk = 0; blk < d / g; ++blk) {
            Mat ta(b.activation_matrices().begin() + blk * g * g, b.activation_matrices().begin() + (blk + 1) * g * g);
            Mat tw(b.weight_matrices().begin() + blk * g * g, b.weight_matrices().begin() + (blk + 1) * g * g);
            EXPECT_LT(max_abs_diff(mul(ta, tw, g, true, false), identity(g)), 1e-10);
        }
        EXPECT_EQ(b.stats().singular_values, t.stats().singular_values);
    }
}

// Storage rounding lives in the core builders (TransformOptions::storage): every builder, data-driven
// or data-free, yields exactly what rounded_to() of its float32 result gives, so RTN and GPTQ see the
// same stored matrices whatever entry point built them.
TEST(BuildTransform, BuildersRoundToTheStorageType) {
    const std::size_t g = 16, d = 64, n = 120, d_out = 24;
    rng::Rng r(33);
    std::vector<float> x(n * d);
    for (float& v : x) v = float(r.gaussian());
    const auto w = random_weight(d_out, d, 8);
    Calibrator cal(d, g, MomentMode::BlockDiagonal);
    cal.add(WUSH_DTYPE_F32, x.data(), n);
    for (TransformKind kind : {TransformKind::Random, TransformKind::WUS, TransformKind::WUSH}) {
        const BlockTransform f32 = build_transform({kind, 0.01, 2}, cal, w, d_out);
        for (wush_dtype storage : {WUSH_DTYPE_BF16, WUSH_DTYPE_F16}) {
            const BlockTransform built = build_transform({kind, 0.01, 2, storage}, cal, w, d_out);
            const BlockTransform want = f32.rounded_to(storage);
            ASSERT_EQ(built.activation_matrices().size(), want.activation_matrices().size());
            bool changed = false;
            for (std::size_t i = 0; i < want.activation_matrices().size(); ++i) {
                EXPECT_EQ(built.activation_matrices()[i], want.activation_matrices()[i]) << transform_kind_name(kind);
                changed |= built.activation_matrices()[i] != f32.activation_matrices()[i];
            }
            EXPECT_TRUE(changed) << transform_kind_name(kind);  // the rounding really happened
            for (std::size_t i = 0; i < want.weight_matrices().size(); ++i)
                EXPECT_EQ(built.weight_matrices()[i], want.weight_matrices()[i]);
        }
    }
    const BlockTransform fixed = build_data_free_transform({TransformKind::Random, 0.0, 4, WUSH_DTYPE_BF16}, d, g);
    const BlockTransform fixed_want =
        build_data_free_transform({TransformKind::Random, 0.0, 4}, d, g).rounded_to(WUSH_DTYPE_BF16);
    for (std::size_t i = 0; i < fixed.activation_matrices().size(); ++i)
        EXPECT_EQ(fixed.activation_matrices()[i], fixed_want.activation_matrices()[i]);
    EXPECT_THROW(build_data_free_transform({TransformKind::Hadamard, 0.0, 0, wush_dtype(77)}, d, g), Error);
}

// Size products are checked and G is bounded: absurd geometries fail with INVALID_ARGUMENT instead
// of wrapping an allocation size (d_in = 2^60 with G = 32 used to crash).
TEST(BuildTransform, AbsurdGeometryIsRejected) {
    const auto status = [](std::size_t d, std::size_t g, TransformKind k) {
        try {
            build_data_free_transform({k, 0.0, 0}, d, g);
        } catch (const Error& e) {
            return e.status();
        }
        return WUSH_OK;
    };
    EXPECT_EQ(status(std::size_t(1) << 60, 32, TransformKind::Identity), WUSH_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(status(std::size_t(1) << 59, 32, TransformKind::Random), WUSH_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(status(std::size_t(1) << 32, std::size_t(1) << 32, TransformKind::Hadamard), WUSH_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(status(1024, 512, TransformKind::Hadamard), WUSH_ERR_INVALID_ARGUMENT);  // G > kMaxGroupSize
    EXPECT_EQ(status(512, 256, TransformKind::Hadamard), WUSH_OK);                     // the largest G works
    EXPECT_THROW(Calibrator(1024, 512, MomentMode::BlockDiagonal), Error);
}

// The normalization convention, pinned by a theorem (docs/record/eval-record.md "Convention"): M_X = X^T X / n,
// M_W = W^T W / d_out, damping lambda tr(M)/G on each moment, so scaling X by a puts a^2 on M_X,
// a on X', a on S and a^{-1/2} on T_wush (a^{1/2} on T_wush^{-T}): the transformed activations
// T_wush (a x) and weights T_wush^{-T} w both scale by sqrt(a). Scaling W by a scales W' and S by
// a, T_wush by sqrt(a), T_wush^{-T} by a^{-1/2}: again both transformed operands scale by
// sqrt(a). With a = 4 and MXFP4 (power-of-two scales) the codes must be identical and every
// scale exponent one higher. Scaling by powers of two is exact in floating point, so this holds
// bit for bit, not just approximately.
TEST(BuildTransform, ScalingXOrWByFourShiftsEveryMxfp4ExponentByOne) {
    const std::size_t g = 32, d = 128, n = 400, d_out = 64;
    rng::Rng r(77);
    std::vector<float> x(n * d);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(r.gaussian() * (i % d == 9 ? 25.0 : 1.0 + double(i % 4)));
    const auto w = random_weight(d_out, d, 12);
    const formats::FormatSpec& mx = formats::spec(WUSH_FORMAT_MXFP4);
    struct Quantized {
        std::vector<std::uint8_t> xc, xs, wc, ws;
    };
    const auto run = [&](float ax, float aw) {
        std::vector<float> xs(x), ws(w);
        for (float& v : xs) v *= ax;
        for (float& v : ws) v *= aw;
        Calibrator cal(d, g, MomentMode::BlockDiagonal);
        cal.add(WUSH_DTYPE_F32, xs.data(), n);
        const BlockTransform t = build_transform({TransformKind::WUSH, 0.01, 0}, cal, ws, d_out);
        EXPECT_TRUE(t.stats().fallback_blocks.empty());
        std::vector<float> xt(xs.size()), wt(ws.size());
        t.apply_activations(xs, n, xt);
        t.apply_weights(ws, d_out, wt);
        Quantized q;
        const auto pack = [&](const std::vector<float>& v, std::size_t rows, std::vector<std::uint8_t>& c,
                              std::vector<std::uint8_t>& sc) {
            const formats::PackedSizes sz = formats::packed_sizes(mx, rows, d);
            c.resize(sz.codes);
            sc.resize(sz.scales);
            formats::quantize_rows(mx, v, rows, d, c, sc);
        };
        pack(xt, n, q.xc, q.xs);
        pack(wt, d_out, q.wc, q.ws);
        return q;
    };
    const Quantized base = run(1.0f, 1.0f);
    const auto expect_shift = [](const std::vector<std::uint8_t>& a, const std::vector<std::uint8_t>& b, int shift,
                                 const char* what) {
        ASSERT_EQ(a.size(), b.size());
        std::size_t bad = 0;
        for (std::size_t i = 0; i < a.size(); ++i) bad += int(b[i]) != int(a[i]) + shift;
        EXPECT_EQ(bad, 0u) << what;
    };
    const Quantized sx = run(4.0f, 1.0f);
    EXPECT_EQ(sx.xc, base.xc);
    expect_shift(base.xs, sx.xs, 1, "X x 4: activation scale exponents");
    EXPECT_EQ(sx.wc, base.wc);
    expect_shift(base.ws, sx.ws, 1, "X x 4: weight scale exponents");
    const Quantized sw = run(1.0f, 4.0f);
    EXPECT_EQ(sw.xc, base.xc);
    expect_shift(base.xs, sw.xs, 1, "W x 4: activation scale exponents");
    EXPECT_EQ(sw.wc, base.wc);
    expect_shift(base.ws, sw.ws, 1, "W x 4: weight scale exponents");
}

// weight_slices reads several blocks' column slices in one pass: element (r, j) of slice k is
// w[r][(first + k) G + j], for every k, and a count past the last block is refused.
TEST(BuildTransform, WeightSlicesAreTheBlocksColumns) {
    const std::size_t d_out = 7, d_in = 64, g = 16;
    std::vector<float> w(d_out * d_in);
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = float(i) * 0.5f - 3.0f;
    const auto slices = weight_slices(w, d_out, d_in, g, 1, 3);
    ASSERT_EQ(slices.size(), 3u);
    for (std::size_t k = 0; k < 3; ++k) {
        ASSERT_EQ(slices[k].size(), d_out * g);
        for (std::size_t r = 0; r < d_out; ++r)
            for (std::size_t j = 0; j < g; ++j)
                ASSERT_EQ(slices[k][r * g + j], double(w[r * d_in + (1 + k) * g + j])) << k << " " << r << " " << j;
    }
    EXPECT_EQ(weight_slice(w, d_out, d_in, g, 2), slices[1]);
    EXPECT_THROW(weight_slices(w, d_out, d_in, g, 2, 3), Error);
}

// apply_weights works in tiles of rows (about 1 MiB of float64 each: 8 rows at d_in = 8192), so a
// layer of 21 rows has three tiles, the last one partial. Every element against a float64 loop
// over the weight-side matrices: within one float32 rounding (the two sum in different orders).
TEST(BuildTransform, ApplyWeightsEqualsTheBlockProductAcrossRowTiles) {
    const std::size_t d_out = 21, d_in = 8192, g = 32;
    const BlockTransform t = build_data_free_transform({TransformKind::Random, 0.0, 9}, d_in, g);
    std::vector<float> w(d_out * d_in), out(d_out * d_in, std::nanf(""));
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = float(std::sin(double(i) * 0.37) * (1.0 + double(i % 97)));
    t.apply_weights(w, d_out, out);
    const auto tw = t.weight_matrices();
    for (std::size_t r = 0; r < d_out; ++r)
        for (std::size_t b = 0; b < d_in / g; ++b)
            for (std::size_t i = 0; i < g; ++i) {
                double v = 0.0, mag = 0.0;
                for (std::size_t j = 0; j < g; ++j) {
                    v += tw[b * g * g + i * g + j] * double(w[r * d_in + b * g + j]);
                    mag += std::fabs(tw[b * g * g + i * g + j] * double(w[r * d_in + b * g + j]));
                }
                const std::size_t k = r * d_in + b * g + i;
                ASSERT_LE(std::fabs(double(out[k]) - v), 0x1p-24 * std::fabs(v) + 1e-14 * mag)
                    << r << " " << b << " " << i;
            }
}

TEST(BuildTransform, RejectsBadInput) {
    const std::size_t g = 16, d = 64;
    Calibrator cal(d, g, MomentMode::BlockDiagonal);
    const auto w = random_weight(8, d, 1);
    EXPECT_THROW(build_transform({TransformKind::WUSH, 0.01, 0}, cal, w, 8), Error);  // no tokens
    std::vector<float> x(10 * d, 1.0f);
    cal.add(WUSH_DTYPE_F32, x.data(), 10);
    EXPECT_THROW(build_transform({TransformKind::WUSH, 0.01, 0}, cal, std::span(w).first(7 * d), 8), Error);
    EXPECT_THROW(build_transform({TransformKind::WUSH, -1.0, 0}, cal, w, 8), Error);
    auto bad = w;
    bad[3] = NAN;
    try {
        build_transform({TransformKind::WUSH, 0.01, 0}, cal, bad, 8);
        ADD_FAILURE();
    } catch (const Error& e) {
        EXPECT_EQ(e.status(), WUSH_ERR_NON_FINITE);
    }
    std::vector<float> singular(4 * g * g, 0.0f);
    try {
        BlockTransform(d, g, TransformKind::WUSH, singular);
        ADD_FAILURE();
    } catch (const Error& e) {
        EXPECT_EQ(e.status(), WUSH_ERR_NUMERICAL);
    }
    EXPECT_THROW(BlockTransform(d, g, TransformKind::WUSH, std::vector<float>(3 * g * g, 1.0f)), Error);
    EXPECT_THROW(build_data_free_transform({TransformKind::Hadamard, 0.0, 0}, 48, 32), Error);
}

}  // namespace
}  // namespace wush
