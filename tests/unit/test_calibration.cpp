// Calibrator: moments against a naive float64 triple loop, merging, export/import and the
// all-reduce pattern, rejection of bad batches, narrow dtypes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "calibration/calibrator.h"
#include "common/error.h"
#include "common/float_bits.h"
#include "transforms/rng.h"

namespace wush {
namespace {

constexpr std::size_t kDin = 64, kG = 16, kTokens = 700;  // 700: not a multiple of the 256-token tile

std::vector<float> random_activations(std::size_t n, std::size_t d, std::uint64_t seed) {
    rng::Rng r(seed);
    std::vector<float> x(n * d);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(r.gaussian() * (1.0 + double(i % d) / 8.0));
    return x;
}

// Oracle: sum_t x_ti x_tj / n over tokens, straight loops in float64.
double naive_moment(const std::vector<float>& x, std::size_t n, std::size_t d, std::size_t i, std::size_t j) {
    double s = 0.0;
    for (std::size_t t = 0; t < n; ++t) s += double(x[t * d + i]) * double(x[t * d + j]);
    return s / double(n);
}

// sqrt(M_ii M_jj) bounds |M_ij|: the scale against which an entry's rounding error is judged.
double natural_scale(const std::vector<float>& x, std::size_t i, std::size_t j) {
    return std::sqrt(naive_moment(x, kTokens, kDin, i, i) * naive_moment(x, kTokens, kDin, j, j));
}

// Header fields and token count exactly; each sum S_ij to `tol` relative to sqrt(S_ii S_jj), its
// natural scale (an off-diagonal sum can cancel to near zero, so plain relative error is unfair).
void expect_state_near(const std::vector<double>& a, const std::vector<double>& b, double tol) {
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t i = 0; i < 6; ++i) EXPECT_EQ(a[i], b[i]) << "header index " << i;
    const std::size_t side = a[2] == 2.0 ? std::size_t(a[3]) : std::size_t(a[4]);
    for (std::size_t k = 6; k < a.size(); ++k) {
        const std::size_t off = k - 6, base = off - off % (side * side), i = off % (side * side) / side, j = off % side;
        const double scale = std::sqrt(b[6 + base + i * side + i] * b[6 + base + j * side + j]);
        EXPECT_LE(std::fabs(a[k] - b[k]), tol * scale) << "state index " << k;
    }
}

class CalibratorModes : public ::testing::TestWithParam<MomentMode> {};

TEST_P(CalibratorModes, MomentsEqualNaiveSum) {
    const auto x = random_activations(kTokens, kDin, 11);
    Calibrator c(kDin, kG, GetParam());
    c.add(WUSH_DTYPE_F32, x.data(), 300);
    c.add(WUSH_DTYPE_F32, x.data() + 300 * kDin, kTokens - 300);
    EXPECT_EQ(c.tokens(), kTokens);
    for (std::size_t b = 0; b < kDin / kG; ++b) {
        const auto m = c.second_moment(b);
        for (std::size_t i = 0; i < kG; ++i)
            for (std::size_t j = 0; j < kG; ++j)
                EXPECT_LE(std::fabs(m[i * kG + j] - naive_moment(x, kTokens, kDin, b * kG + i, b * kG + j)),
                          1e-12 * natural_scale(x, b * kG + i, b * kG + j));
    }
    if (GetParam() == MomentMode::Full) {
        const auto m = c.full_second_moment();
        for (std::size_t i = 0; i < kDin; ++i)
            for (std::size_t j = 0; j < kDin; ++j)
                EXPECT_LE(std::fabs(m[i * kDin + j] - naive_moment(x, kTokens, kDin, i, j)),
                          1e-12 * natural_scale(x, i, j))
                    << i << "," << j;
    } else {
        EXPECT_THROW(c.full_second_moment(), Error);
    }
}

TEST_P(CalibratorModes, MergeOfShardsEqualsSinglePass) {
    const auto x = random_activations(kTokens, kDin, 12);
    Calibrator all(kDin, kG, GetParam()), a(kDin, kG, GetParam()), b(kDin, kG, GetParam());
    all.add(WUSH_DTYPE_F32, x.data(), kTokens);
    a.add(WUSH_DTYPE_F32, x.data(), 123);
    b.add(WUSH_DTYPE_F32, x.data() + 123 * kDin, kTokens - 123);
    a.merge(b);
    EXPECT_EQ(a.tokens(), kTokens);
    expect_state_near(a.export_state(), all.export_state(), 1e-12);
}

TEST_P(CalibratorModes, ExportImportRoundTrip) {
    const auto x = random_activations(kTokens, kDin, 13);
    Calibrator c(kDin, kG, GetParam());
    c.add(WUSH_DTYPE_F32, x.data(), kTokens);
    const auto state = c.export_state();
    ASSERT_EQ(state.size(), Calibrator::state_size(kDin, kG, GetParam()));
    EXPECT_EQ(state[0], 1.0);
    EXPECT_EQ(state[5], double(kTokens));
    const Calibrator back = Calibrator::import_state(state);
    EXPECT_EQ(back.d_in(), kDin);
    EXPECT_EQ(back.group(), kG);
    EXPECT_EQ(back.mode(), GetParam());
    EXPECT_EQ(back.tokens(), kTokens);
    EXPECT_EQ(back.export_state(), state);  // bit-exact
    EXPECT_EQ(back.second_moment(2), c.second_moment(2));
}

TEST_P(CalibratorModes, SummedShardStatesImportAsSinglePass) {
    // The all-reduce pattern: three ranks export, an elementwise SUM combines, one rank imports.
    const auto x = random_activations(kTokens, kDin, 14);
    Calibrator all(kDin, kG, GetParam());
    all.add(WUSH_DTYPE_F32, x.data(), kTokens);
    const std::size_t cuts[] = {0, 100, 450, kTokens};
    std::vector<double> reduced;
    for (int r = 0; r < 3; ++r) {
        Calibrator shard(kDin, kG, GetParam());
        shard.add(WUSH_DTYPE_F32, x.data() + cuts[r] * kDin, cuts[r + 1] - cuts[r]);
        const auto s = shard.export_state();
        if (reduced.empty()) reduced.assign(s.size(), 0.0);
        for (std::size_t i = 0; i < s.size(); ++i) reduced[i] += s[i];
    }
    EXPECT_EQ(reduced[0], 3.0);
    const Calibrator merged = Calibrator::import_state(reduced);
    EXPECT_EQ(merged.tokens(), kTokens);
    auto got = merged.export_state();
    EXPECT_EQ(got[0], 1.0);  // re-export is a single-replica state again
    expect_state_near(got, all.export_state(), 1e-12);
}

INSTANTIATE_TEST_SUITE_P(Modes, CalibratorModes, ::testing::Values(MomentMode::BlockDiagonal, MomentMode::Full));

// Accuracy over a million tokens streamed in batches: activations with a large common offset
// (what a float32 accumulator loses digits on) against a compensated long-double reference.
TEST(Calibrator, AccurateOverAMillionTokens) {
    constexpr std::size_t d = 8, batch = 4096, batches = 256;  // 1,048,576 tokens
    Calibrator cal(d, d, MomentMode::BlockDiagonal);
    std::vector<long double> sum(d * d, 0.0L), comp(d * d, 0.0L);
    rng::Rng r(4242);
    std::vector<float> x(batch * d);
    for (std::size_t b = 0; b < batches; ++b) {
        for (std::size_t k = 0; k < x.size(); ++k) x[k] = float(100.0 + double(k % d) + r.gaussian());
        cal.add(WUSH_DTYPE_F32, x.data(), batch);
        for (std::size_t t = 0; t < batch; ++t)
            for (std::size_t i = 0; i < d; ++i)
                for (std::size_t j = 0; j < d; ++j) {  // Kahan summation in long double
                    const long double y = (long double)x[t * d + i] * x[t * d + j] - comp[i * d + j];
                    const long double s = sum[i * d + j] + y;
                    comp[i * d + j] = (s - sum[i * d + j]) - y;
                    sum[i * d + j] = s;
                }
    }
    ASSERT_EQ(cal.tokens(), batch * batches);
    const std::vector<double> m = cal.second_moment(0);
    double worst = 0.0;
    for (std::size_t k = 0; k < d * d; ++k) {
        const long double ref = sum[k] / (long double)(batch * batches);
        worst = std::max(worst, double(std::fabs((long double)m[k] - ref) / std::fabs(ref)));
    }
    std::printf("  worst relative error of M_X after %zu tokens: %.2e\n", batch * batches, worst);
    EXPECT_LT(worst, 1e-12);
}

TEST(Calibrator, NonFiniteBatchRejectedStateUnchanged) {
    const auto x = random_activations(kTokens, kDin, 15);
    Calibrator c(kDin, kG, MomentMode::BlockDiagonal);
    c.add(WUSH_DTYPE_F32, x.data(), 200);
    const auto before = c.export_state();
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
        auto y = x;
        y[600 * kDin + 5] = bad;  // late in the batch: earlier tiles would already be accumulated
        try {
            c.add(WUSH_DTYPE_F32, y.data(), kTokens);
            ADD_FAILURE() << "non-finite batch accepted";
        } catch (const Error& e) {
            EXPECT_EQ(e.status(), WUSH_ERR_NON_FINITE);
        }
        EXPECT_EQ(c.export_state(), before);
    }
}

TEST(Calibrator, BadArgumentsRejected) {
    const auto x = random_activations(4, kDin, 16);
    Calibrator c(kDin, kG, MomentMode::BlockDiagonal);
    auto status_of = [](auto&& f) {
        try {
            f();
        } catch (const Error& e) {
            return e.status();
        }
        return WUSH_OK;
    };
    EXPECT_EQ(status_of([&] { c.add(WUSH_DTYPE_F32, x.data(), 0); }), WUSH_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(status_of([&] { c.add(WUSH_DTYPE_F32, nullptr, 4); }), WUSH_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(status_of([&] { c.second_moment(0); }), WUSH_ERR_INVALID_ARGUMENT);  // no tokens yet
    EXPECT_EQ(status_of([&] { Calibrator(kDin, 24, MomentMode::Full); }), WUSH_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(status_of([&] { Calibrator(48, 32, MomentMode::Full); }), WUSH_ERR_INVALID_ARGUMENT);
    Calibrator other(kDin, 32, MomentMode::BlockDiagonal);
    EXPECT_EQ(status_of([&] { c.merge(other); }), WUSH_ERR_INVALID_ARGUMENT);
    Calibrator full(kDin, kG, MomentMode::Full);
    EXPECT_EQ(status_of([&] { c.merge(full); }), WUSH_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(c.tokens(), 0u);
}

TEST(Calibrator, CorruptStatesRejected) {
    const auto x = random_activations(32, kDin, 17);
    Calibrator c(kDin, kG, MomentMode::BlockDiagonal);
    c.add(WUSH_DTYPE_F32, x.data(), 32);
    const auto good = c.export_state();
    auto expect_bad = [](std::vector<double> s) { EXPECT_THROW(Calibrator::import_state(s), Error); };
    expect_bad({});
    expect_bad(std::vector<double>(good.begin(), good.end() - 1));  // truncated
    auto s = good;
    s[1] = 2.0;  // unknown version
    expect_bad(s);
    s = good;
    s[0] = 2.0;  // two replicas, but header fields not doubled (ranks disagreed)
    expect_bad(s);
    s = good;
    s[3] = 65.0;  // d_in not matching the size
    expect_bad(s);
    s = good;
    s[5] = 1.5;  // fractional token count
    expect_bad(s);
    s = good;
    s[10] = std::numeric_limits<double>::quiet_NaN();
    expect_bad(s);
    s = good;
    s[2] = 3.0;  // unknown mode
    expect_bad(s);
}

TEST(Calibrator, HalfAndBfloatEqualTheirFloatConversion) {
    const auto x = random_activations(300, kDin, 18);
    std::vector<std::uint16_t> h(x.size()), bf(x.size());
    std::vector<float> hf(x.size()), bff(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
        bf[i] = bits::bf16_encode(x[i]);
        bff[i] = bits::bf16_decode(bf[i]);
        // f16 by truncating the float to 10 mantissa bits (values here are well inside f16 range):
        // an independent encoder, checked against the library's decoder below.
        std::uint32_t u;
        std::memcpy(&u, &x[i], 4);
        const std::uint32_t sign = (u >> 16) & 0x8000;
        const int e = int((u >> 23) & 0xFF) - 127 + 15;
        ASSERT_LT(e, 31);
        std::uint32_t tu = u & 0xFFFFE000u;
        if (e <= 0) {  // below the f16 normal range: use a signed zero on both sides
            h[i] = std::uint16_t(sign);
            tu = sign << 16;
        } else {
            h[i] = std::uint16_t(sign | (std::uint32_t(e) << 10) | ((u >> 13) & 0x3FF));
        }
        std::memcpy(&hf[i], &tu, 4);
        ASSERT_EQ(bits::f16_decode(h[i]), hf[i]);
    }
    for (auto [dtype, narrow, wide] : {std::tuple{WUSH_DTYPE_F16, &h, &hf}, std::tuple{WUSH_DTYPE_BF16, &bf, &bff}}) {
        Calibrator a(kDin, kG, MomentMode::BlockDiagonal), b(kDin, kG, MomentMode::BlockDiagonal);
        a.add(dtype, narrow->data(), 300);
        b.add(WUSH_DTYPE_F32, wide->data(), 300);
        EXPECT_EQ(a.export_state(), b.export_state());
    }
}

}  // namespace
}  // namespace wush
