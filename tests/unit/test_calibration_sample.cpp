// The calibrator's bounded token sample (bottom-k by a hash of each token): it is a subset of the
// tokens seen, its size is bounded, it does not depend on batch order or sharding (merge equals
// one pass), it survives the version-2 state round trip, a summed version-2 state is refused,
// and version-1 states (no sample) still import.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "calibration/calibrator.h"
#include "common/error.h"
#include "transforms/rng.h"

namespace wush {
namespace {

std::vector<float> tokens(std::size_t n, std::size_t d, std::uint64_t seed) {
    rng::Rng r(seed);
    std::vector<float> x(n * d);
    for (float& v : x) v = float(r.gaussian());
    return x;
}

std::set<std::vector<float>> rows_of(const std::vector<float>& x, std::size_t d) {
    std::set<std::vector<float>> s;
    for (std::size_t i = 0; i < x.size() / d; ++i) s.emplace(x.begin() + i * d, x.begin() + (i + 1) * d);
    return s;
}

constexpr std::size_t kD = 64, kG = 32;

TEST(CalibratorSample, BoundedSubsetOfTheTokens) {
    const auto x = tokens(500, kD, 1);
    Calibrator c(kD, kG, MomentMode::BlockDiagonal);
    c.set_sample_capacity(40);
    c.add(WUSH_DTYPE_F32, x.data(), 200);
    c.add(WUSH_DTYPE_F32, x.data() + 200 * kD, 300);
    ASSERT_EQ(c.sample_count(), 40u);
    const auto all = rows_of(x, kD);
    const auto got = rows_of(c.sample(), kD);
    EXPECT_EQ(got.size(), 40u);
    for (const auto& r : got) EXPECT_TRUE(all.count(r));
    // Fewer tokens than the capacity: all of them.
    Calibrator few(kD, kG, MomentMode::BlockDiagonal);
    few.set_sample_capacity(40);
    few.add(WUSH_DTYPE_F32, x.data(), 10);
    EXPECT_EQ(rows_of(few.sample(), kD), rows_of(std::vector<float>(x.begin(), x.begin() + 10 * kD), kD));
    // No capacity, no sample; capacity only before tokens.
    Calibrator none(kD, kG, MomentMode::BlockDiagonal);
    none.add(WUSH_DTYPE_F32, x.data(), 10);
    EXPECT_EQ(none.sample_count(), 0u);
    EXPECT_THROW(none.set_sample_capacity(4), Error);
    Calibrator big(kD, kG, MomentMode::BlockDiagonal);
    EXPECT_THROW(big.set_sample_capacity(kMaxSampleTokens + 1), Error);
}

TEST(CalibratorSample, OrderAndShardingDoNotMatter) {
    const std::size_t n = 600;
    const auto x = tokens(n, kD, 2);
    Calibrator one(kD, kG, MomentMode::BlockDiagonal);
    one.set_sample_capacity(32);
    one.add(WUSH_DTYPE_F32, x.data(), n);
    // Reversed token order, in three shards merged.
    std::vector<float> rev(x.size());
    for (std::size_t i = 0; i < n; ++i) std::copy_n(x.begin() + (n - 1 - i) * kD, kD, rev.begin() + i * kD);
    Calibrator a(kD, kG, MomentMode::BlockDiagonal), b(kD, kG, MomentMode::BlockDiagonal),
        c(kD, kG, MomentMode::BlockDiagonal);
    for (Calibrator* p : {&a, &b, &c}) p->set_sample_capacity(32);
    a.add(WUSH_DTYPE_F32, rev.data(), 100);
    b.add(WUSH_DTYPE_F32, rev.data() + 100 * kD, 250);
    c.add(WUSH_DTYPE_F32, rev.data() + 350 * kD, 250);
    a.merge(b);
    a.merge(c);
    EXPECT_EQ(a.sample(), one.sample());  // same rows, same (priority) order
}

TEST(CalibratorSample, StateRoundTripAndVersions) {
    const auto x = tokens(300, kD, 3);
    Calibrator c(kD, kG, MomentMode::BlockDiagonal);
    c.set_sample_capacity(16);
    c.add(WUSH_DTYPE_F32, x.data(), 300);
    const std::vector<double> st = c.export_state();
    EXPECT_EQ(st.size(), Calibrator::state_size(kD, kG, MomentMode::BlockDiagonal, 16));
    EXPECT_EQ(st[1], kCalibratorSampleStateVersion);
    const Calibrator back = Calibrator::import_state(st);
    EXPECT_EQ(back.sample(), c.sample());
    EXPECT_EQ(back.sample_capacity(), 16u);
    EXPECT_EQ(back.second_moment(1), c.second_moment(1));
    // A summed (r = 2) version-2 state is refused: samples do not add.
    std::vector<double> summed(st.size());
    for (std::size_t i = 0; i < st.size(); ++i) summed[i] = 2.0 * st[i];
    EXPECT_THROW(Calibrator::import_state(summed), Error);
    // A corrupt sample count is refused.
    std::vector<double> bad = st;
    bad[Calibrator::state_size(kD, kG, MomentMode::BlockDiagonal) + 1] = 17.0;
    EXPECT_THROW(Calibrator::import_state(bad), Error);
    // Without a sample the export is exactly version 1, which imports with an empty sample of the
    // requested capacity.
    Calibrator v1(kD, kG, MomentMode::BlockDiagonal);
    v1.add(WUSH_DTYPE_F32, x.data(), 300);
    const std::vector<double> s1 = v1.export_state();
    EXPECT_EQ(s1[1], kCalibratorStateVersion);
    EXPECT_EQ(s1.size(), Calibrator::state_size(kD, kG, MomentMode::BlockDiagonal));
    const Calibrator from_v1 = Calibrator::import_state(s1, 16);
    EXPECT_EQ(from_v1.sample_capacity(), 16u);
    EXPECT_EQ(from_v1.sample_count(), 0u);
    EXPECT_EQ(from_v1.tokens(), 300u);
}

// Version 3 carries both samples; a version-2 state imports with an empty validation sample.
TEST(CalibratorSample, ValidationSampleStateAndVersion2Import) {
    const auto x = tokens(300, kD, 4);
    const auto v = tokens(40, kD, 5);
    Calibrator c(kD, kG, MomentMode::BlockDiagonal);
    c.set_sample_capacity(16);
    c.set_validation_capacity(8);
    c.add(WUSH_DTYPE_F32, x.data(), 300);
    c.add_validation(WUSH_DTYPE_F32, v.data(), 40);
    EXPECT_EQ(c.tokens(), 300u);
    const std::vector<double> st = c.export_state();
    EXPECT_EQ(st[1], kCalibratorValidationStateVersion);
    EXPECT_EQ(st.size(), Calibrator::state_size(kD, kG, MomentMode::BlockDiagonal, 16, 8));
    const Calibrator back = Calibrator::import_state(st);
    EXPECT_EQ(back.sample(), c.sample());
    EXPECT_EQ(back.validation(), c.validation());
    EXPECT_EQ(back.validation_capacity(), 8u);
    // The validation rows are validation tokens (a subset of v), none of the calibration tokens.
    const auto got = rows_of(c.validation(), kD);
    const auto all = rows_of(v, kD);
    ASSERT_EQ(got.size(), 8u);
    for (const auto& r : got) EXPECT_NE(std::find(all.begin(), all.end(), r), all.end());

    Calibrator v2(kD, kG, MomentMode::BlockDiagonal);
    v2.set_sample_capacity(16);
    v2.add(WUSH_DTYPE_F32, x.data(), 300);
    const std::vector<double> s2 = v2.export_state();
    EXPECT_EQ(s2[1], kCalibratorSampleStateVersion);
    const Calibrator from_v2 = Calibrator::import_state(s2, 0, 8);
    EXPECT_EQ(from_v2.sample(), v2.sample());
    EXPECT_EQ(from_v2.validation_capacity(), 8u);
    EXPECT_EQ(from_v2.validation_count(), 0u);
}

// Corrupt headers of a version-3 state (the sample blocks' capacities and counts included) are
// refused with an Error, never read past the buffer or trigger a huge allocation (ASan build).
TEST(CalibratorSample, CorruptVersion3StatesAreRefused) {
    const auto x = tokens(50, kD, 6);
    Calibrator c(kD, kG, MomentMode::BlockDiagonal);
    c.set_sample_capacity(4);
    c.set_validation_capacity(3);
    c.add(WUSH_DTYPE_F32, x.data(), 50);
    c.add_validation(WUSH_DTYPE_F32, x.data(), 50);
    const std::vector<double> st = c.export_state();
    const std::size_t v1 = Calibrator::state_size(kD, kG, MomentMode::BlockDiagonal);
    const std::size_t val = v1 + 2 + 4 + 4 * kD;  // where the validation block starts
    const double bad_values[] = {-1.0, 0.5, 1e300, 65537.0, 1e9, std::nan(""), 0.0, 5.0};
    int refused = 0;
    for (std::size_t field : {std::size_t(1), v1, v1 + 1, v1 + 2, val, val + 1, val + 2, val + 3 + 3 * kD}) {
        for (double v : bad_values) {
            std::vector<double> bad = st;
            if (bad[field] == v) continue;
            bad[field] = v;
            try {
                (void)Calibrator::import_state(bad);
            } catch (const Error&) {
                ++refused;
                continue;
            }
            // Some changes leave a consistent state (a smaller whole count, another whole
            // priority, another float value); the layout fields never do.
            const bool layout_field = field == 1 || field == v1 || field == val;
            EXPECT_FALSE(layout_field) << "field " << field << " = " << v << " was accepted";
        }
    }
    EXPECT_GE(refused, 40);
    // Truncated states are refused at every length.
    for (std::size_t n = 0; n < st.size(); n += 97)
        EXPECT_THROW(Calibrator::import_state(std::span<const double>(st.data(), n)), Error) << n;
}

}  // namespace
}  // namespace wush
