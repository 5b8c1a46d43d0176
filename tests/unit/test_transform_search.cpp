// The per-block search over WUSH's free parameters (transforms/transform_search.h): its score
// against an independent float64 oracle, the invariants of every candidate (exact product, the
// chosen score never above the plain solution's), the theorem that makes the scale search matter
// (MXFP4 codes are invariant under power-of-two scaling, so c = 2^(k/8) only ever matters through
// the fractional part), the random-rotation fall-back (a block only R quantizes well stores the
// Random transform's own block), and end to end on a built-in layer: lower held-out loss than
// plain WUSH.
#include <gtest/gtest.h>

#include <lapacke.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "calibration/calibrator.h"
#include "common/cpu_isa.h"
#include "eval/layer_loss.h"
#include "eval/synthetic_layer.h"
#include "formats/block_format.h"
#include "formats/feedback_group.h"
#include "formats/round_trip.h"
#include "prequant/gptq.h"
#include "transforms/basis.h"
#include "transforms/block_transform.h"
#include "transforms/rng.h"
#include "transforms/round_trip_errors.h"
#include "transforms/transform_search.h"

namespace wush {
namespace {

std::vector<double> slice_of(const std::vector<float>& w, std::size_t d_out, std::size_t d_in, std::size_t g,
                             std::size_t b) {
    return weight_slice(w, d_out, d_in, g, b);
}

// Oracle: the block error with the library's row quantizer (quantize_rows / dequantize_rows, a
// different entry point from the search's per-group loop) and plain float64 loops.
double oracle_score(const formats::FormatSpec& f, const float* t, std::size_t g, const BlockSample& s) {
    const std::vector<double> tw = inverse_transpose(t, g);
    std::vector<float> xt(s.n * g), wt(s.rows * g);
    for (std::size_t r = 0; r < s.n; ++r)
        for (std::size_t i = 0; i < g; ++i) {
            double v = 0.0;
            for (std::size_t j = 0; j < g; ++j) v += double(t[i * g + j]) * s.x[r * g + j];
            xt[r * g + i] = float(v);
        }
    for (std::size_t r = 0; r < s.rows; ++r)
        for (std::size_t i = 0; i < g; ++i) {
            double v = 0.0;
            for (std::size_t j = 0; j < g; ++j) v += double(float(tw[i * g + j])) * s.w[r * g + j];
            wt[r * g + i] = float(v);
        }
    const auto qdq = [&](std::vector<float>& v, std::size_t n) {
        const formats::PackedSizes sz = formats::packed_sizes(f, n, g);
        std::vector<std::uint8_t> c(sz.codes), sc(sz.scales);
        formats::quantize_rows(f, v, n, g, c, sc);
        formats::dequantize_rows(f, c, sc, n, g, v);
    };
    qdq(xt, s.n);
    qdq(wt, s.rows);
    double sum = 0.0;
    for (std::size_t a = 0; a < s.n; ++a)
        for (std::size_t o = 0; o < s.rows; ++o) {
            double yq = 0.0, y = 0.0;
            for (std::size_t j = 0; j < g; ++j) {
                yq += double(xt[a * g + j]) * wt[o * g + j];
                y += double(s.x[a * g + j]) * s.w[o * g + j];
            }
            sum += (yq - y) * (yq - y);
        }
    return sum;
}

struct Fixture {
    eval::SyntheticLayer layer;
    Calibrator cal;
    explicit Fixture(const char* name, std::size_t g, std::size_t n = 1024, std::size_t held = 512)
        : layer(eval::generate_layer(eval::synthetic_preset(name, n, held, 1))),
          cal(layer.spec.d_in, g, MomentMode::BlockDiagonal) {
        cal.add(WUSH_DTYPE_F32, layer.calibration.data(), n);
    }
};

TEST(TransformSearch, ScoreMatchesAnIndependentOracle) {
    Fixture fx("small_256x512", 32);
    const std::size_t d = fx.layer.spec.d_in, d_out = fx.layer.spec.d_out, g = 32;
    SearchOptions so;
    so.sample_tokens = 64;
    so.weight_rows = 48;
    for (wush_format fmt : {WUSH_FORMAT_MXFP4, WUSH_FORMAT_INT4}) {
        const formats::FormatSpec& f = formats::spec(fmt);
        for (std::size_t b : {std::size_t(0), std::size_t(5)}) {
            const auto slice = slice_of(fx.layer.weight, d_out, d, g, b);
            const auto m_x = fx.cal.second_moment(b);
            const BlockSample s = surrogate_sample(m_x, slice, d_out, g, so, surrogate_noise(so.sample_tokens, g, 7));
            ASSERT_EQ(s.n, 64u);
            ASSERT_EQ(s.rows, 48u);
            const BlockSolution sol =
                solve_block(TransformKind::WUSH, slice_second_moment(slice, d_out, g), m_x, g, 0.01);
            const std::vector<float> t(sol.t_act.begin(), sol.t_act.end());
            const double got = block_score(f, t.data(), g, s), want = oracle_score(f, t.data(), g, s);
            EXPECT_NEAR(got, want, 1e-4 * want) << f.name << " block " << b;
            const std::vector<double> h = hadamard_matrix(g);
            const std::vector<float> hf(h.begin(), h.end());
            EXPECT_NEAR(block_score(f, hf.data(), g, s), oracle_score(f, hf.data(), g, s), 1e-4 * want);
        }
    }
}

// Heavy-tailed random rows (a few loud channels), the kind of data whose group maxima move
// the scales.
std::vector<float> random_rows(std::size_t n, std::size_t g, std::uint64_t seed) {
    rng::Rng r(seed);
    std::vector<float> v(n * g);
    for (std::size_t i = 0; i < n; ++i)
        for (std::size_t j = 0; j < g; ++j) v[i * g + j] = float(r.gaussian() * (j % 7 == 0 ? 8.0 : 1.0));
    return v;
}

// The unpacked round trip the search uses gives the bytes of the packed path (quantize_rows,
// then dequantize_rows), for every format.
TEST(TransformSearch, RoundTripGroupIsQuantizeThenDequantize) {
    for (wush_format fmt : {WUSH_FORMAT_MXFP4, WUSH_FORMAT_MXFP4_OCP, WUSH_FORMAT_NVFP4, WUSH_FORMAT_INT4}) {
        const formats::FormatSpec& f = formats::spec(fmt);
        const std::size_t n = 300, g = f.group;
        std::vector<float> v = random_rows(n, g, 11);
        for (std::size_t r = 0; r < n; ++r)  // rows over many scales, down to subnormal ones
            for (std::size_t j = 0; j < g; ++j)
                v[r * g + j] *= std::ldexp(1.0f + float(r % 7) / 7.0f, int(r % 61) - 40);
        for (std::size_t i = 0; i < g; ++i) v[5 * g + i] = 0.0f;  // an all-zero group
        // Exact ties: amax 6 gives NVFP4 the scale 10 (x * 10 / 10 = x) and OCP MXFP4 the
        // multiplier 1, so these values sit on the E2M1 thresholds (even code wins); MXFP4's
        // multiplier 3/4 puts 1 on the threshold 0.75.
        const float ties[] = {6.0f,   0.25f,  0.75f,  1.25f,  1.75f, 2.5f,  3.5f, 5.0f,
                              -0.25f, -0.75f, -1.25f, -1.75f, -2.5f, -3.5f, 1.0f, -0.0f};
        for (std::size_t i = 0; i < g; ++i) v[6 * g + i] = ties[i % 16];
        const formats::PackedSizes sz = formats::packed_sizes(f, n, g);
        std::vector<std::uint8_t> c(sz.codes), sc(sz.scales);
        std::vector<float> want(n * g), got(v);
        formats::quantize_rows(f, v, n, g, c, sc);
        formats::dequantize_rows(f, c, sc, n, g, want);
        for (std::size_t r = 0; r < n; ++r) formats::round_trip_group(f, got.data() + r * g, int(g));
        for (std::size_t i = 0; i < n * g; ++i)
            ASSERT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(want[i]))
                << f.name << " " << i;
    }
}

// The round trip's NVFP4 scale code (table cell, then one boundary) is quantize_group_nvfp4's
// e4m3_encode(amax * 10 / 6) for every amax: a sweep over the float bit patterns from 0 to
// beyond saturation (every 61st float: each E4M3 code spans many thousands of floats, so every
// code and both neighbours of every boundary region are hit), plus each boundary's neighbours.
TEST(TransformSearch, Nvfp4ScaleCodeIsTheE4m3Encoding) {
    const auto want = [](float a) { return codec::e4m3_encode(double(a) * 10.0 / 6.0); };
    const std::uint32_t end = std::bit_cast<std::uint32_t>(1e4f);
    int codes_seen = 0, last = -1;
    for (std::uint32_t b = 0; b < end; b += 61) {
        const float a = std::bit_cast<float>(b);
        const std::uint8_t got = formats::round_trip_detail::nvfp4_scale_code(double(a));
        ASSERT_EQ(got, want(a)) << "amax " << a;
        if (got != last) {
            ++codes_seen;
            last = got;
        }
        // Where the code changes, the floats just around the change.
        if (b >= 61 && want(std::bit_cast<float>(b - 61)) != got) {
            for (std::uint32_t c = b - 61; c <= b; ++c) {
                ASSERT_EQ(formats::round_trip_detail::nvfp4_scale_code(double(std::bit_cast<float>(c))),
                          want(std::bit_cast<float>(c)));
            }
        }
    }
    EXPECT_EQ(codes_seen, 127);  // 0..126: every code, saturation included
    // The table's premise: no cell of amax (exponent, top 4 mantissa bits) spans two boundaries.
    EXPECT_TRUE(formats::round_trip_detail::nvfp4_scale_table().one_boundary_per_cell);
    EXPECT_EQ(formats::round_trip_detail::nvfp4_scale_code(3.0e38), 126);
}

// Groups that exercise the round trip's every branch: every NVFP4 scale code's boundary and
// every E8M0 exponent (amax just at and below each), elements on the scale's thresholds and one
// float either side, subnormal and zero groups, both signs and -0.
std::vector<float> boundary_rows(const formats::FormatSpec& f, std::size_t g) {
    using namespace formats::round_trip_detail;
    std::vector<float> amaxes = {0.0f, std::numeric_limits<float>::denorm_min(), 1e-40f, 3e38f};
    if (f.id == WUSH_FORMAT_NVFP4)
        for (int c = 0; c < 126; ++c) amaxes.push_back(nvfp4_scale_table().bound[c]);
    else
        for (int e = -126; e <= 127; ++e) amaxes.push_back(std::ldexp(1.0f, e));
    std::vector<float> rows;
    for (float top : amaxes)
        for (float amax : {top, std::nextafter(top, 0.0f)}) {
            const float* t = f.id == WUSH_FORMAT_NVFP4 ? nvfp4_entry(nvfp4_scale_code(amax), f.tensor_divisor).t
                             : f.id == WUSH_FORMAT_INT4
                                 ? nullptr
                                 : mx_entry(formats::mx_scale_exponent(amax, f.id == WUSH_FORMAT_MXFP4_OCP),
                                            f.id == WUSH_FORMAT_MXFP4_OCP, f.tensor_divisor)
                                       .t;
            std::vector<float> group(g, 0.0f);
            group[0] = amax;
            for (std::size_t j = 1; j < g; ++j) {
                float v = t ? t[j % 7] : amax * float(j) / float(g);
                if (j % 3 == 1) v = std::nextafter(v, 0.0f);
                if (j % 3 == 2) v = std::nextafter(v, 1e38f);
                v = std::min(v, amax);
                group[j] = (j % 2 ? -v : v);
            }
            if (amax == 0.0f) group[1] = -0.0f;
            rows.insert(rows.end(), group.begin(), group.end());
        }
    return rows;
}

// The search's round-trip errors (transforms/round_trip_errors.h) are round_trip_group's, bit for bit,
// on every ISA this CPU runs: E = q(V) - V for each row of [E V], and false at a non-finite V.
// The oracle is the scalar round trip, itself checked against quantize then dequantize above.
TEST(TransformSearch, RoundTripErrorsAreTheSameOnEveryIsa) {
    int isas_run = 0;
    for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512Vnni}) {
        if (!isa_supported(isa)) continue;
        ++isas_run;
        for (wush_format fmt : {WUSH_FORMAT_MXFP4, WUSH_FORMAT_MXFP4_OCP, WUSH_FORMAT_NVFP4, WUSH_FORMAT_INT4}) {
            const formats::FormatSpec& f = formats::spec(fmt);
            const std::size_t g = f.group;
            std::vector<float> v = boundary_rows(f, g);
            std::vector<float> random = random_rows(600, g, 17);
            for (std::size_t r = 0; r < 600; ++r)  // over many scales, as in the test above
                for (std::size_t j = 0; j < g; ++j) random[r * g + j] *= std::ldexp(1.0f, int(r % 97) - 60);
            v.insert(v.end(), random.begin(), random.end());
            const std::size_t n = v.size() / g;
            std::vector<float> cat(2 * n * g, 123.0f), want(n * g);
            for (std::size_t r = 0; r < n; ++r) {
                std::copy_n(v.begin() + r * g, g, cat.begin() + (2 * r + 1) * g);
                std::copy_n(v.begin() + r * g, g, want.begin() + r * g);
                formats::round_trip_group(f, want.data() + r * g, int(g));
                for (std::size_t j = 0; j < g; ++j) want[r * g + j] -= v[r * g + j];
            }
            ASSERT_TRUE(round_trip_errors(f, cat.data(), n, g, isa));
            for (std::size_t r = 0; r < n; ++r)
                for (std::size_t j = 0; j < g; ++j) {
                    ASSERT_EQ(std::bit_cast<std::uint32_t>(cat[(2 * r) * g + j]),
                              std::bit_cast<std::uint32_t>(want[r * g + j]))
                        << isa_name(isa) << " " << f.name << " row " << r << " element " << j << " of " << v[r * g + j];
                    ASSERT_EQ(cat[(2 * r + 1) * g + j], v[r * g + j]);  // V is left as it was
                }
            for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
                std::vector<float> c2(cat);
                c2[(2 * (n - 1) + 1) * g + g / 2] = -bad;  // the last row's V
                EXPECT_FALSE(round_trip_errors(f, c2.data(), n, g, isa)) << f.name;
            }
        }
    }
    if (isas_run < 2) GTEST_SKIP() << "only the portable path could run: this CPU has no AVX2";
}

// The Gram-trace score is the float64 product error: with a transform whose float32 application
// is exact (a signed permutation times 2, weight side the same over 4), the quantized operands
// are the oracle's bit for bit and only rounding separates the two sums: the float32 Grams of
// the errors (about 1e-7 relative measured; a wrong term or sign is off by far more).
TEST(TransformSearch, GramScoreEqualsTheDirectProductError) {
    for (wush_format fmt : {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4, WUSH_FORMAT_INT4}) {
        const formats::FormatSpec& f = formats::spec(fmt);
        const std::size_t g = f.group, n = 200, rows = 90;
        const std::vector<float> x = random_rows(n, g, 3), wf = random_rows(rows, g, 4);
        const std::vector<double> w(wf.begin(), wf.end());
        SearchOptions so;
        so.weight_rows = rows;
        const BlockSample s = token_sample(x, n, w, rows, g, so);
        std::vector<float> t(g * g, 0.0f);
        for (std::size_t i = 0; i < g; ++i) t[i * g + (i * 5 + 3) % g] = (i % 3 == 0) ? -2.0f : 2.0f;
        const double got = block_score(f, t.data(), g, s), want = oracle_score(f, t.data(), g, s);
        EXPECT_GT(want, 0.0);
        EXPECT_NEAR(got, want, 1e-6 * want) << f.name;
    }
}

// GPTQ scoring: without error feedback (a transformed factor that is diagonal) GPTQ's in-block
// pass is RTN and the score is the RTN one; with a real factor, the chosen candidate never scores above the
// canonical one (it is among the candidates), and feedback lowers the weight error's share.
TEST(TransformSearch, GptqScoringReducesToRtnWithoutFeedbackAndNeverLosesToCanonical) {
    Fixture fx("small_512x256", 32);
    const std::size_t d = fx.layer.spec.d_in, d_out = fx.layer.spec.d_out, g = 32;
    const formats::FormatSpec& f = formats::spec(WUSH_FORMAT_MXFP4);
    SearchOptions so;
    so.sample_tokens = 128;
    so.weight_rows = 64;
    const std::size_t b = 2;
    const auto slice = slice_of(fx.layer.weight, d_out, d, g, b);
    const auto m_x = fx.cal.second_moment(b);
    BlockSample s = surrogate_sample(m_x, slice, d_out, g, so, surrogate_noise(so.sample_tokens, g, 5));
    const BlockSolution sol = solve_block(TransformKind::WUSH, slice_second_moment(slice, d_out, g), m_x, g, 0.01);
    const std::vector<float> t(sol.t_act.begin(), sol.t_act.end());
    {
        // T = 2 x a signed permutation and U_bb = I: the transformed factor is exactly I / 2 (no
        // feedback) and both weight paths see the same values; they differ only in float vs
        // double decoding of the codes.
        std::vector<float> p(g * g, 0.0f);
        for (std::size_t i = 0; i < g; ++i) p[i * g + (i * 7 + 1) % g] = (i % 2) ? -2.0f : 2.0f;
        const double rtn_p = block_score(f, p.data(), g, s);
        s.u_bb = identity_matrix(g);
        EXPECT_NEAR(block_score(f, p.data(), g, s), rtn_p, 1e-6 * rtn_p);
        s.u_bb.clear();
    }
    const double rtn = block_score(f, t.data(), g, s);
    // U_bb: the upper Cholesky factor of the inverse of the block's damped moment.
    std::vector<double> h(m_x);
    double tr = 0.0;
    for (std::size_t i = 0; i < g; ++i) tr += h[i * g + i];
    for (std::size_t i = 0; i < g; ++i) h[i * g + i] += 0.01 * tr / double(g);
    std::vector<double> inv = h;
    ASSERT_EQ(LAPACKE_dpotrf(LAPACK_ROW_MAJOR, 'L', int(g), inv.data(), int(g)), 0);
    ASSERT_EQ(LAPACKE_dpotri(LAPACK_ROW_MAJOR, 'L', int(g), inv.data(), int(g)), 0);
    for (std::size_t i = 0; i < g; ++i)
        for (std::size_t j = i + 1; j < g; ++j) inv[i * g + j] = inv[j * g + i];
    ASSERT_EQ(LAPACKE_dpotrf(LAPACK_ROW_MAJOR, 'U', int(g), inv.data(), int(g)), 0);
    for (std::size_t i = 0; i < g; ++i) std::fill_n(inv.begin() + i * g, i, 0.0);
    s.u_bb = inv;
    const double gptq = block_score(f, t.data(), g, s);
    EXPECT_LT(gptq, rtn);  // error feedback with the true Hessian lowers the product error
    const SearchResult r = search_block(TransformKind::WUSH, sol, f, s, WUSH_DTYPE_F32, so, 5, b);
    EXPECT_LE(r.choice.score, r.choice.plain_score);
    // (the search derives each candidate's weight side analytically, block_score by inversion:
    // equal up to rounding, which may move a code)
    EXPECT_NEAR(r.choice.plain_score, gptq, 1e-3 * gptq);
    EXPECT_NEAR(block_score(f, r.t_act.data(), g, s), r.choice.score, 1e-3 * r.choice.score);
}

// The surrogate has the moments the transform was built from: its sample second moment converges
// to M_X (a loose check at 4096 tokens: a wrong factor, e.g. L^T instead of L, is far off).
TEST(TransformSearch, SurrogateHasTheBlockMoment) {
    Fixture fx("small_512x256", 16);
    const std::size_t g = 16, d_out = fx.layer.spec.d_out, d = fx.layer.spec.d_in;
    SearchOptions so;
    so.sample_tokens = 4096;
    const auto m_x = fx.cal.second_moment(3);
    const BlockSample s = surrogate_sample(m_x, slice_of(fx.layer.weight, d_out, d, g, 3), d_out, g, so,
                                           surrogate_noise(so.sample_tokens, g, 1));
    double err = 0.0, norm = 0.0;
    for (std::size_t i = 0; i < g; ++i)
        for (std::size_t j = 0; j < g; ++j) {
            double m = 0.0;
            for (std::size_t t = 0; t < s.n; ++t) m += double(s.x[t * g + i]) * s.x[t * g + j];
            m /= double(s.n);
            err += (m - m_x[i * g + j]) * (m - m_x[i * g + j]);
            norm += m_x[i * g + j] * m_x[i * g + j];
        }
    EXPECT_LT(std::sqrt(err / norm), 0.1);
}

TEST(TransformSearch, ChoiceNeverScoresAbovePlainAndKeepsTheProductExact) {
    Fixture fx("small_512x256", 32);
    const std::size_t d = fx.layer.spec.d_in, d_out = fx.layer.spec.d_out, g = 32;
    TransformOptions o(TransformKind::WUSH, 0.01, 3);
    o.search.enabled = true;
    o.search.format = WUSH_FORMAT_MXFP4;
    o.search.sample_tokens = 128;
    const BlockTransform t = build_searched_transform(o, fx.cal, fx.layer.weight, d_out);
    ASSERT_EQ(t.stats().search.size(), d / g);
    std::size_t changed = 0;
    for (std::size_t b = 0; b < d / g; ++b) {
        const BlockChoice& c = t.stats().search[b];
        EXPECT_LE(c.score, c.plain_score);
        changed += c.score < c.plain_score;
        // The stored matrix is what the score was computed for.
        const auto slice = slice_of(fx.layer.weight, d_out, d, g, b);
        const BlockSample s = surrogate_sample(fx.cal.second_moment(b), slice, d_out, g, o.search,
                                               surrogate_noise(o.search.sample_tokens, g, o.seed));
        // (to float32-product rounding: BLAS may block the products differently inside the
        // parallel build than here)
        EXPECT_NEAR(block_score(formats::spec(WUSH_FORMAT_MXFP4), t.activation_matrices().data() + b * g * g, g, s),
                    c.score, 1e-6 * c.score);
    }
    EXPECT_GT(changed, 0u);  // on this layer the canonical point is not the best everywhere
    // Every candidate is invertible and the weight side is its inverse-transpose: x^T w survives.
    std::vector<float> xt(fx.layer.calibration.size()), wt(fx.layer.weight.size());
    t.apply_activations(fx.layer.calibration, 4, xt);
    t.apply_weights(fx.layer.weight, d_out, wt);
    for (std::size_t o2 = 0; o2 < 3; ++o2) {
        double ref = 0.0, got = 0.0, mag = 0.0;
        for (std::size_t k = 0; k < d; ++k) {
            ref += double(fx.layer.calibration[k]) * fx.layer.weight[o2 * d + k];
            got += double(xt[k]) * wt[o2 * d + k];
            mag += std::fabs(double(fx.layer.calibration[k]) * fx.layer.weight[o2 * d + k]);
        }
        EXPECT_LE(std::fabs(got - ref), 1e-4 * mag);
    }
    // Reproducible: the same seed gives the same matrices.
    const BlockTransform again = build_searched_transform(o, fx.cal, fx.layer.weight, d_out);
    EXPECT_TRUE(std::equal(t.activation_matrices().begin(), t.activation_matrices().end(),
                           again.activation_matrices().begin()));
}

// The plain (unsearched) transform a searched build hands out on the way (what the per-layer
// guard uses as its plain WUS/WUSH candidate) is, bit for bit, the build without the search, and
// asking for it changes nothing in the searched transform: with a token sample and with the
// surrogate, MXFP4 and NVFP4, float32 and bf16 storage, WUS and WUSH.
TEST(TransformSearch, PlainByProductIsThePlainBuildBitForBit) {
    for (const wush_format f : {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4}) {
        const std::size_t g = formats::spec(f).group;
        Fixture fx("small_512x256", g);
        const std::size_t d_out = fx.layer.spec.d_out;
        Calibrator with_sample(fx.layer.spec.d_in, g, MomentMode::BlockDiagonal);
        with_sample.set_sample_capacity(256);
        with_sample.add(WUSH_DTYPE_F32, fx.layer.calibration.data(), 1024);
        for (const TransformKind kind : {TransformKind::WUSH, TransformKind::WUS})
            for (const wush_dtype storage : {WUSH_DTYPE_F32, WUSH_DTYPE_BF16})
                for (const Calibrator* cal : {&fx.cal, &with_sample}) {
                    TransformOptions o(kind, 0.01, 5);
                    o.storage = storage;
                    TransformOptions searched = o;
                    searched.search.enabled = true;
                    searched.search.format = f;
                    searched.search.sample_tokens = 64;
                    const LayerSolution solution = solve_layer(searched, *cal, fx.layer.weight, d_out);
                    const std::optional<BlockTransform> plain = solution.transform;
                    const BlockTransform s = search_transform(searched, *cal, fx.layer.weight, d_out, solution);
                    const BlockTransform s_alone = build_searched_transform(searched, *cal, fx.layer.weight, d_out);
                    const BlockTransform p_alone = build_transform(o, *cal, fx.layer.weight, d_out);
                    ASSERT_TRUE(plain.has_value());
                    const auto same_bits = [](auto a, auto b) {
                        return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
                    };
                    EXPECT_TRUE(same_bits(plain->activation_matrices(), p_alone.activation_matrices()));
                    EXPECT_TRUE(same_bits(plain->weight_matrices(), p_alone.weight_matrices()));
                    EXPECT_TRUE(same_bits(std::span<const double>(plain->stats().singular_values),
                                          std::span<const double>(p_alone.stats().singular_values)));
                    EXPECT_EQ(plain->stats().fallback_blocks, p_alone.stats().fallback_blocks);
                    EXPECT_TRUE(plain->stats().search.empty());
                    EXPECT_EQ(plain->kind(), kind);
                    EXPECT_TRUE(same_bits(s.activation_matrices(), s_alone.activation_matrices()));
                    // The search changed something, so the two are not trivially the same.
                    EXPECT_FALSE(same_bits(s.activation_matrices(), p_alone.activation_matrices()));
                }
    }
}

// The search leaves the plain solution only for a candidate that scores lower on both halves of
// its token sample, each half scored here as a sample of its own; a small sample (64 real
// tokens: noisy scores) so that both outcomes occur.
TEST(TransformSearch, LeavesPlainOnlyWhenBothHalvesOfTheSampleAgree) {
    Fixture fx("small_512x256", 32);
    const std::size_t d = fx.layer.spec.d_in, d_out = fx.layer.spec.d_out, g = 32, n = 64;
    const formats::FormatSpec& f = formats::spec(WUSH_FORMAT_MXFP4);
    SearchOptions so;
    so.sample_tokens = n;
    std::size_t switched = 0, kept = 0;
    for (std::size_t b = 0; b < d / g; ++b) {
        std::vector<float> xb(n * g);
        for (std::size_t i = 0; i < n; ++i)
            std::copy_n(fx.layer.calibration.data() + (i * 16) * d + b * g, g, xb.begin() + i * g);
        const auto slice = slice_of(fx.layer.weight, d_out, d, g, b);
        const BlockSample s = token_sample(xb, n, slice, d_out, g, so);
        const BlockSolution sol =
            solve_block(TransformKind::WUSH, slice_second_moment(slice, d_out, g), fx.cal.second_moment(b), g, 0.01);
        const SearchResult r = search_block(TransformKind::WUSH, sol, f, s, WUSH_DTYPE_F32, so, 5, b);
        const std::vector<float> plain(sol.t_act.begin(), sol.t_act.end());
        if (r.t_act == plain) {
            ++kept;
            continue;
        }
        ++switched;
        for (std::size_t h = 0; h < 2; ++h) {
            const std::vector<float> part(xb.begin() + h * (n / 2) * g, xb.begin() + (h + 1) * (n / 2) * g);
            const BlockSample sh = token_sample(part, n / 2, slice, d_out, g, so);
            EXPECT_LT(block_score(f, r.t_act.data(), g, sh), block_score(f, plain.data(), g, sh) * (1.0 + 1e-6))
                << "block " << b << " half " << h;
        }
    }
    EXPECT_GT(switched, 0u);
    EXPECT_GT(kept, 0u);
}

// Block b of the library's Random transform for `seed`, through its public builder (not the
// search's code path): what a block falling back to R must store.
std::vector<float> random_transform_block(std::size_t g, std::uint64_t seed, std::size_t b) {
    const BlockTransform r = build_data_free_transform({TransformKind::Random, 0.01, seed}, (b + 1) * g, g);
    return {r.activation_matrices().begin() + b * g * g, r.activation_matrices().begin() + (b + 1) * g * g};
}

// R is a candidate: on blocks of a built-in layer the chosen score is never above the R block's
// independent score (to the 1e-3 that separates the search's analytic weight side from
// block_score's inversion, as above), RTN scoring in every format. (Here WUSH mostly beats R, so
// this is a consistency check; the next test is the one R must win.)
TEST(TransformSearch, ChoiceNeverScoresAboveTheRandomRotationBlock) {
    for (wush_format fmt : {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4, WUSH_FORMAT_INT4}) {
        const formats::FormatSpec& f = formats::spec(fmt);
        const std::size_t g = f.group;
        Fixture fx("small_512x256", g);
        const std::size_t d = fx.layer.spec.d_in, d_out = fx.layer.spec.d_out;
        SearchOptions so;
        so.sample_tokens = 128;
        so.weight_rows = 64;
        for (std::size_t b = 0; b < d / g; b += 3) {
            const auto slice = slice_of(fx.layer.weight, d_out, d, g, b);
            const auto m_x = fx.cal.second_moment(b);
            const BlockSample s = surrogate_sample(m_x, slice, d_out, g, so, surrogate_noise(so.sample_tokens, g, 9));
            const BlockSolution sol =
                solve_block(TransformKind::WUSH, slice_second_moment(slice, d_out, g), m_x, g, 0.01);
            const SearchResult r = search_block(TransformKind::WUSH, sol, f, s, WUSH_DTYPE_F32, so, 9, b);
            const std::vector<float> rb = random_transform_block(g, 9, b);
            const double r_score = block_score(f, rb.data(), g, s);
            EXPECT_LE(r.choice.score, r_score * (1 + 1e-3)) << f.name << " block " << b;
        }
    }
}

// A block that only R quantizes well: tokens and weight rows built in the Random transform's
// own basis, x = R_b^T z and w = R_b^T v with z, v on MXFP4's grid (entries +-k/6, k in
// {0, 1, 2, 3, 4, 6}, one of them +-1: the group maps amax = 1 to 3 and k/2 is an E2M1 value;
// if rounding leaves amax just below 1 the map is k and still on the grid), so R_b quantizes
// both sides exactly and I, H, WUSH (and a rotation of another seed or block) do not. The
// search must then pick R, store exactly the Random transform's block b (scale search off:
// c = 1), and with the scale search and BF16 storage c R_b, which keeps x^T w.
// A block whose tokens (n) and weight rows are B^T z for z on MXFP4's grid (entries +-k/6, k in
// {0, 1, 2, 3, 4, 6}, one of them +-1: the group maps amax = 1 to 3 and k/2 is an E2M1 value; if
// rounding leaves amax just below 1 the map is k and still on the grid), B a G x G orthogonal
// basis: in B both sides quantize exactly. With its token sample (every weight row scored) and
// WUSH's solution from its moments.
struct GridBlock {
    std::vector<float> x;   // n x G
    std::vector<double> w;  // rows x G
    BlockSample sample;
    BlockSolution solution;
};

GridBlock grid_block(const std::vector<float>& basis, std::size_t g, std::size_t n, std::size_t rows,
                     std::uint64_t seed) {
    rng::Rng r(seed);
    const double kGrid[] = {0, 1, 2, 3, 4, 6};
    const auto in_basis = [&](std::size_t count) {  // count rows B^T z
        std::vector<double> out(count * g, 0.0);
        std::vector<double> z(g);
        for (std::size_t t = 0; t < count; ++t) {
            for (double& v : z) v = (r.uniform() < 0.5 ? -1.0 : 1.0) * kGrid[std::size_t(r.uniform() * 6.0) % 6] / 6.0;
            z[std::size_t(r.uniform() * double(g)) % g] = r.uniform() < 0.5 ? -1.0 : 1.0;
            for (std::size_t i = 0; i < g; ++i)
                for (std::size_t j = 0; j < g; ++j) out[t * g + j] += double(basis[i * g + j]) * z[i];
        }
        return out;
    };
    const std::vector<double> xd = in_basis(n);
    GridBlock blk{{xd.begin(), xd.end()}, in_basis(rows), {}, {}};
    SearchOptions so;
    so.weight_rows = rows;
    blk.sample = token_sample(blk.x, n, blk.w, rows, g, so);
    std::vector<double> m_x(g * g, 0.0);
    for (std::size_t t = 0; t < n; ++t)
        for (std::size_t i = 0; i < g; ++i)
            for (std::size_t j = 0; j < g; ++j) m_x[i * g + j] += xd[t * g + i] * xd[t * g + j] / double(n);
    blk.solution = solve_block(TransformKind::WUSH, slice_second_moment(blk.w, rows, g), m_x, g, 0.01);
    return blk;
}

TEST(TransformSearch, PicksTheRandomRotationBlockWhereOnlyItIsGood) {
    const std::size_t g = 32, n = 256, rows = 64, b = 3;
    const std::uint64_t seed = 21;
    const formats::FormatSpec& f = formats::spec(WUSH_FORMAT_MXFP4);
    const std::vector<float> rb = random_transform_block(g, seed, b);
    const GridBlock blk = grid_block(rb, g, n, rows, 77);
    const std::vector<float>& x = blk.x;
    const std::vector<double>& w = blk.w;
    const BlockSample& s = blk.sample;
    const BlockSolution& sol = blk.solution;
    SearchOptions so;
    so.weight_rows = rows;
    ASSERT_FALSE(sol.fell_back);

    const std::vector<double> h = hadamard_matrix(g), eye = identity_matrix(g);
    const std::vector<float> hf(h.begin(), h.end()), ef(eye.begin(), eye.end());
    const std::vector<float> wf(sol.t_act.begin(), sol.t_act.end()), other = random_transform_block(g, seed, b + 1);
    const double r_score = block_score(f, rb.data(), g, s);
    const double others = std::min({block_score(f, hf.data(), g, s), block_score(f, ef.data(), g, s),
                                    block_score(f, wf.data(), g, s), block_score(f, other.data(), g, s)});
    ASSERT_LT(r_score, 0.01 * others);  // the construction works: R_b is by far the best base

    so.scale_steps = 1;
    const SearchResult at1 = search_block(TransformKind::WUSH, sol, f, s, WUSH_DTYPE_F32, so, seed, b);
    EXPECT_EQ(at1.choice.base, SearchBase::Random);
    ASSERT_EQ(at1.t_act.size(), g * g);
    for (std::size_t i = 0; i < g * g; ++i)
        ASSERT_EQ(std::bit_cast<std::uint32_t>(at1.t_act[i]), std::bit_cast<std::uint32_t>(rb[i])) << i;

    // Screening must not lose it: 8 rotations besides, every candidate screened on a quarter of
    // the sample and only the best one scored in full.
    SearchOptions screened = so;
    screened.rotations = 8;
    screened.screen_keep = 1;
    const SearchResult sr = search_block(TransformKind::WUSH, sol, f, s, WUSH_DTYPE_F32, screened, seed, b);
    EXPECT_EQ(sr.choice.base, SearchBase::Random);
    EXPECT_EQ(sr.t_act, at1.t_act);

    so.scale_steps = 8;
    const SearchResult sc = search_block(TransformKind::WUSH, sol, f, s, WUSH_DTYPE_BF16, so, seed, b);
    EXPECT_EQ(sc.choice.base, SearchBase::Random);
    EXPECT_LE(sc.choice.score, sc.choice.plain_score);
    const double c = std::exp2(double(sc.choice.scale_step) / 8.0);
    // c R_b rounded to BF16 (8 significant bits) and still c times an orthogonal matrix, so its
    // inverse-transpose is T / c^2 and x^T w survives.
    double orth_err = 0.0;
    for (std::size_t i = 0; i < g; ++i) {
        for (std::size_t j = 0; j < g; ++j) {
            const double want = c * double(rb[i * g + j]);
            EXPECT_NEAR(sc.t_act[i * g + j], want, std::fabs(want) * 0x1p-8 + 1e-30) << i << "," << j;
            double dot = 0.0;
            for (std::size_t k = 0; k < g; ++k) dot += double(sc.t_act[i * g + k]) * sc.t_act[j * g + k];
            orth_err = std::max(orth_err, std::fabs(dot / (c * c) - (i == j ? 1.0 : 0.0)));
        }
    }
    EXPECT_LT(orth_err, 0.02);  // BF16 rounding of a unit-norm row: about sqrt(G) 2^-9
    const std::vector<double> it = inverse_transpose(sc.t_act.data(), g);
    ASSERT_FALSE(it.empty());
    double ref = 0.0, got = 0.0, mag = 0.0;
    for (std::size_t i = 0; i < g; ++i) {
        double xt = 0.0, wtv = 0.0;
        for (std::size_t j = 0; j < g; ++j) {
            xt += double(sc.t_act[i * g + j]) * x[j];
            wtv += it[i * g + j] * w[j];
        }
        got += xt * wtv;
        ref += double(x[i]) * w[i];
        mag += std::fabs(double(x[i]) * w[i]);
    }
    EXPECT_NEAR(got, ref, 1e-9 * mag);
}

// The replay (replay_block) of the choice search_block made is the matrix search_block stored,
// bit for bit: the search's own output is the oracle. Every candidate kind is made to win
// somewhere: the plain solution, seeded sign patterns (MXFP4, 16 of them) and rotations
// (NVFP4) on a built-in layer's blocks with a small, noisy token sample, for WUSH and WUS, F32
// and BF16 storage, with the scale search on; and I, H and R on blocks built on the grid of
// their own basis (grid_block), where only that basis quantizes exactly.
TEST(TransformSearch, ReplayOfTheSearchedChoiceIsTheStoredMatrixBitForBit) {
    std::set<std::pair<SearchBase, bool>> seen;  // (base, sign pattern or rotation > 0)
    bool scaled = false;
    const auto check = [&](TransformKind kind, const BlockSolution& sol, const formats::FormatSpec& f,
                           const BlockSample& s, wush_dtype storage, const SearchOptions& so, std::uint64_t seed,
                           std::size_t b) {
        const SearchResult r = search_block(kind, sol, f, s, storage, so, seed, b);
        const std::vector<float> replayed =
            replay_block(kind, sol, r.choice, f.group, storage, so.scale_steps, seed, b);
        ASSERT_EQ(replayed.size(), r.t_act.size());
        for (std::size_t i = 0; i < replayed.size(); ++i)
            ASSERT_EQ(std::bit_cast<std::uint32_t>(replayed[i]), std::bit_cast<std::uint32_t>(r.t_act[i]))
                << f.name << " block " << b << " base " << int(r.choice.base) << " pattern "
                << int(r.choice.sign_pattern) << " step " << int(r.choice.scale_step) << " entry " << i;
        seen.insert({r.choice.base, r.choice.sign_pattern > 0});
        scaled |= r.choice.scale_step > 0;
    };
    for (wush_format fmt : {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4}) {
        const formats::FormatSpec& f = formats::spec(fmt);
        const std::size_t g = f.group, n = 64;
        Fixture fx("small_512x256", g);
        const std::size_t d = fx.layer.spec.d_in, d_out = fx.layer.spec.d_out;
        SearchOptions so;
        so.sample_tokens = n;
        so.weight_rows = 64;
        if (fmt == WUSH_FORMAT_MXFP4) so.sign_patterns = 16;
        for (TransformKind kind : {TransformKind::WUSH, TransformKind::WUS})
            for (wush_dtype storage : {WUSH_DTYPE_F32, WUSH_DTYPE_BF16})
                for (std::size_t b = 0; b < d / g; b += 2) {
                    std::vector<float> xb(n * g);
                    for (std::size_t i = 0; i < n; ++i)
                        std::copy_n(fx.layer.calibration.data() + (i * 16) * d + b * g, g, xb.begin() + i * g);
                    const auto slice = slice_of(fx.layer.weight, d_out, d, g, b);
                    const BlockSolution sol =
                        solve_block(kind, slice_second_moment(slice, d_out, g), fx.cal.second_moment(b), g, 0.01);
                    check(kind, sol, f, token_sample(xb, n, slice, d_out, g, so), storage, so, 5, b);
                }
    }
    const std::size_t g = 32, b = 3;
    const std::uint64_t seed = 21;
    const std::vector<double> h = hadamard_matrix(g), eye = identity_matrix(g);
    for (const std::vector<float>& basis : {std::vector<float>(eye.begin(), eye.end()),
                                            std::vector<float>(h.begin(), h.end()), random_transform_block(g, seed, b)})
        for (wush_dtype storage : {WUSH_DTYPE_F32, WUSH_DTYPE_BF16}) {
            const GridBlock blk = grid_block(basis, g, 256, 64, 77);
            SearchOptions so;
            so.weight_rows = 64;
            check(TransformKind::WUSH, blk.solution, formats::spec(WUSH_FORMAT_MXFP4), blk.sample, storage, so, seed,
                  b);
        }
    for (auto want : {std::pair{SearchBase::Solution, false}, std::pair{SearchBase::Solution, true},
                      std::pair{SearchBase::Rotated, true}, std::pair{SearchBase::Hadamard, false},
                      std::pair{SearchBase::Identity, false}, std::pair{SearchBase::Random, false}})
        EXPECT_TRUE(seen.count(want)) << "no block chose base " << int(want.first) << " pattern > 0: " << want.second;
    EXPECT_TRUE(scaled);  // some block chose a scale c != 1
}

// The replay follows the choice: every sign pattern, rotation and scale step gives a matrix of
// its own (a replay that ignored any of them would repeat another's), and each is an exact
// remix of the plain solution: T^T T = c^2 A^T A up to the float32 storage rounding, since H, D
// and Q are orthogonal.
TEST(TransformSearch, ReplayedChoicesDifferFromThePlainSolution) {
    const std::size_t g = 32, b = 1, steps = 8;
    Fixture fx("small_512x256", g);
    const std::size_t d = fx.layer.spec.d_in, d_out = fx.layer.spec.d_out;
    const auto slice = slice_of(fx.layer.weight, d_out, d, g, b);
    const BlockSolution sol =
        solve_block(TransformKind::WUSH, slice_second_moment(slice, d_out, g), fx.cal.second_moment(b), g, 0.01);
    const auto replay = [&](SearchBase base, std::size_t pattern, std::size_t step) {
        return replay_block(TransformKind::WUSH, sol, {base, std::uint8_t(pattern), std::uint8_t(step)}, g,
                            WUSH_DTYPE_F32, steps, 9, b);
    };
    const auto gram = [&](const std::vector<float>& t) {  // T^T T in float64
        std::vector<double> m(g * g, 0.0);
        for (std::size_t k = 0; k < g; ++k)
            for (std::size_t i = 0; i < g; ++i)
                for (std::size_t j = 0; j < g; ++j) m[i * g + j] += double(t[k * g + i]) * t[k * g + j];
        return m;
    };
    const std::vector<float> plain = replay(SearchBase::Solution, 0, 0);
    EXPECT_EQ(plain, std::vector<float>(sol.t_act.begin(), sol.t_act.end()));
    const std::vector<double> plain_gram = gram(plain);
    std::set<std::vector<float>> distinct{plain};
    for (SearchBase base : {SearchBase::Solution, SearchBase::Rotated})
        for (std::size_t k = 0; k <= 4; ++k)
            for (std::size_t step : {std::size_t(0), std::size_t(3)}) {
                if (base == SearchBase::Rotated && k == 0) continue;
                const std::vector<float> t = replay(base, k, step);
                distinct.insert(t);
                const double c2 = std::exp2(2.0 * double(step) / double(steps));
                const std::vector<double> tg = gram(t);
                double err = 0.0, norm = 0.0;
                for (std::size_t i = 0; i < g * g; ++i) {
                    err = std::max(err, std::fabs(tg[i] - c2 * plain_gram[i]));
                    norm = std::max(norm, std::fabs(c2 * plain_gram[i]));
                }
                EXPECT_LT(err, 1e-5 * norm) << int(base) << " " << k << " " << step;
            }
    EXPECT_EQ(distinct.size(), 1u + 5u * 2u + 4u * 2u - 1u);  // plain, at step 0, counted once
}

// NVFP4's rotations are wired in and are what they claim: on a built-in layer some blocks pick a
// rotated solution Q A, none does with rotations off, and each rotated block is an orthogonal
// remix of the plain solution scaled by the chosen c: T^T T = c^2 A^T A (= c^2 T_plain^T T_plain,
// as H is orthogonal), up to the float32 storage rounding.
TEST(TransformSearch, Nvfp4BlocksPickRotatedSolutionsThatKeepTheGram) {
    const formats::FormatSpec& f = formats::spec(WUSH_FORMAT_NVFP4);
    const std::size_t g = f.group;
    Fixture fx("small_512x256", g, 2048, 0);
    const std::size_t d_out = fx.layer.spec.d_out;
    TransformOptions plain(TransformKind::WUSH, 0.01, 1);
    TransformOptions s = plain;
    s.search.enabled = true;
    s.search.format = WUSH_FORMAT_NVFP4;
    s.search.sample_tokens = 1024;
    const BlockTransform tp = build_transform(plain, fx.cal, fx.layer.weight, d_out);
    const BlockTransform ts =
        build_searched_transform(s, fx.cal, fx.layer.weight, d_out, nullptr, fx.layer.calibration, 2048);
    std::size_t rotated = 0;
    for (std::size_t b = 0; b < ts.stats().search.size(); ++b) {
        const BlockChoice& c = ts.stats().search[b];
        if (c.base != SearchBase::Rotated) continue;
        ++rotated;
        const double c2 = std::exp2(2.0 * double(c.scale_step) / double(s.search.scale_steps));
        const float* t = ts.activation_matrices().data() + b * g * g;
        const float* p = tp.activation_matrices().data() + b * g * g;
        double err = 0.0, mag = 0.0;
        for (std::size_t i = 0; i < g; ++i)
            for (std::size_t j = 0; j < g; ++j) {
                double tt = 0.0, pp = 0.0;
                for (std::size_t k = 0; k < g; ++k) {
                    tt += double(t[k * g + i]) * t[k * g + j];
                    pp += double(p[k * g + i]) * p[k * g + j];
                }
                err = std::max(err, std::fabs(tt - c2 * pp));
                mag = std::max(mag, std::fabs(c2 * pp));
            }
        EXPECT_LT(err, 1e-5 * mag) << "block " << b;
    }
    EXPECT_GT(rotated, 0u);
    s.search.rotations = 0;
    const BlockTransform t0 =
        build_searched_transform(s, fx.cal, fx.layer.weight, d_out, nullptr, fx.layer.calibration, 2048);
    for (const BlockChoice& c : t0.stats().search) EXPECT_NE(c.base, SearchBase::Rotated);
}

// MXFP4 and INT4 search 16 sign patterns once kWideSignSetTokens real tokens are scored, 2
// below: on 4096 real tokens some block picks a pattern beyond the second, and the build is the
// one asked for with 16 explicitly; on 2048 none does, nor on a 4096-token Gaussian surrogate.
// (Whether the wider set pays is measured on held-out tokens in docs/record/eval-record.md, "Larger samples";
// here, that the rule is what runs.)
TEST(TransformSearch, WidensTheSignSetOnALargeSample) {
    for (wush_format fmt : {WUSH_FORMAT_MXFP4, WUSH_FORMAT_INT4}) {
        const formats::FormatSpec& f = formats::spec(fmt);
        const std::size_t n = kWideSignSetTokens;
        Fixture fx("small_512x256", f.group, n, 0);
        const std::size_t d_out = fx.layer.spec.d_out;
        TransformOptions s(TransformKind::WUSH, 0.01, 1);
        s.search.enabled = true;
        s.search.format = fmt;
        const auto widest_pattern = [&](std::size_t tokens, std::size_t signs, bool surrogate = false) {
            TransformOptions o = s;
            o.search.sample_tokens = tokens;
            o.search.sign_patterns = signs;
            const BlockTransform t = build_searched_transform(o, fx.cal, fx.layer.weight, d_out, nullptr,
                                                              fx.layer.calibration, surrogate ? 0 : n);
            std::size_t widest = 0;
            for (const BlockChoice& c : t.stats().search)
                if (c.base == SearchBase::Solution) widest = std::max<std::size_t>(widest, c.sign_pattern);
            const std::span<const float> m = t.activation_matrices();
            return std::pair{widest, std::vector<float>(m.begin(), m.end())};
        };
        const auto [wide, t_wide] = widest_pattern(n, SearchOptions::kByFormat);
        EXPECT_GT(wide, 2u) << f.name;
        EXPECT_TRUE(t_wide == widest_pattern(n, 16).second) << f.name;
        EXPECT_LE(widest_pattern(n / 2, SearchOptions::kByFormat).first, 2u) << f.name;
        EXPECT_LE(widest_pattern(n, SearchOptions::kByFormat, /*surrogate=*/true).first, 2u) << f.name;
    }
}

// End to end on held-out tokens (not the ones the search saw): the searched transform beats
// plain WUSH for MXFP4 and NVFP4 with RTN on this layer.
TEST(TransformSearch, LowersHeldOutLossOnABuiltInLayer) {
    for (wush_format fmt : {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4}) {
        const formats::FormatSpec& f = formats::spec(fmt);
        Fixture fx("small_512x256", f.group, 2048, 2048);
        const std::size_t d_out = fx.layer.spec.d_out, n_held = fx.layer.spec.n_heldout;
        TransformOptions plain(TransformKind::WUSH, 0.01, 1);
        TransformOptions searched = plain;
        searched.search.enabled = true;
        searched.search.format = fmt;
        const BlockTransform tp = build_transform(plain, fx.cal, fx.layer.weight, d_out);
        const BlockTransform ts = build_searched_transform(searched, fx.cal, fx.layer.weight, d_out);
        const double lp = eval::layer_loss(tp, f, fx.layer.weight, d_out, fx.layer.heldout, n_held);
        const double ls = eval::layer_loss(ts, f, fx.layer.weight, d_out, fx.layer.heldout, n_held);
        EXPECT_LT(ls, 0.97 * lp) << f.name;  // measured: -6.5% (MXFP4), -25.2% (NVFP4, with its rotations)
    }
}

TEST(TransformSearch, RejectsAMismatchedFormat) {
    Fixture fx("small_256x512", 32);
    TransformOptions o(TransformKind::WUSH, 0.01, 0);
    o.search.enabled = true;
    o.search.format = WUSH_FORMAT_NVFP4;  // G = 16, the calibrator's G = 32
    EXPECT_THROW(build_searched_transform(o, fx.cal, fx.layer.weight, fx.layer.spec.d_out), Error);
    // build_transform is Algorithm 1 alone: a searched build is refused, not silently unsearched.
    o.search.format = WUSH_FORMAT_MXFP4;
    EXPECT_THROW(build_transform(o, fx.cal, fx.layer.weight, fx.layer.spec.d_out), Error);
}

}  // namespace
}  // namespace wush
