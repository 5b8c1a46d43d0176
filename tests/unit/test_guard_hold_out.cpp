// The sequence marks of the calibrator's token sample and the guard's sequence hold-out: every
// sampled token of a sequence carries the same id and tokens of different sequences different
// ones, whatever the batch order and sharding; the hold-out takes whole sequences, balanced in
// tokens, deterministic from the seed; without marks (or with one sequence) there is none.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include "calibration/calibrator.h"
#include "common/error.h"
#include "pipeline/layer_pipeline.h"
#include "transforms/rng.h"

namespace wush {
namespace {

constexpr std::size_t kD = 32, kG = 32, kSeq = 16, kSequences = 24;

std::vector<float> tokens(std::size_t n, std::size_t d, std::uint64_t seed) {
    rng::Rng r(seed);
    std::vector<float> x(n * d);
    for (float& v : x) v = float(r.gaussian());
    return x;
}

// The sequence (index into the data) each sample row came from, found by its values.
std::vector<std::size_t> source_sequences(const std::vector<float>& sample, const std::vector<float>& x) {
    std::map<std::vector<float>, std::size_t> where;
    for (std::size_t t = 0; t < x.size() / kD; ++t) where[{x.begin() + t * kD, x.begin() + (t + 1) * kD}] = t / kSeq;
    std::vector<std::size_t> out;
    for (std::size_t t = 0; t < sample.size() / kD; ++t)
        out.push_back(where.at({sample.begin() + t * kD, sample.begin() + (t + 1) * kD}));
    return out;
}

Calibrator sampled(std::size_t capacity) {
    Calibrator c(kD, kG, MomentMode::BlockDiagonal);
    c.set_sample_capacity(capacity);
    return c;
}

TEST(GuardHoldOut, SampledTokensRememberTheirSequence) {
    const auto x = tokens(kSequences * kSeq, kD, 3);
    Calibrator c = sampled(128);
    c.add(WUSH_DTYPE_F32, x.data(), kSequences * kSeq, kSeq);
    const std::vector<std::uint32_t> ids = c.sample_sequences();
    const std::vector<std::size_t> truth = source_sequences(c.sample(), x);
    ASSERT_EQ(ids.size(), 128u);
    // Same sequence <=> same id (24 sequences in 2^20 ids: distinct here).
    for (std::size_t a = 0; a < ids.size(); ++a) {
        EXPECT_NE(ids[a], 0u);
        for (std::size_t b = 0; b < ids.size(); ++b) EXPECT_EQ(ids[a] == ids[b], truth[a] == truth[b]);
    }
    // Whole sequences in any order and shards give the same sample and ids.
    Calibrator a = sampled(128), b = sampled(128);
    for (std::size_t s = kSequences; s-- > 0;)
        (s % 3 ? a : b).add(WUSH_DTYPE_F32, x.data() + s * kSeq * kD, kSeq, kSeq);
    a.merge(b);
    EXPECT_EQ(a.sample(), c.sample());
    EXPECT_EQ(a.sample_sequences(), ids);
    // ... and through an exported state.
    const Calibrator back = Calibrator::import_state(c.export_state());
    EXPECT_EQ(back.sample_sequences(), ids);
    // A length that does not divide the batch is refused, the state untouched.
    EXPECT_THROW(c.add(WUSH_DTYPE_F32, x.data(), kSeq + 1, kSeq), Error);
    EXPECT_EQ(c.tokens(), kSequences * kSeq);
}

TEST(GuardHoldOut, SplitsWholeSequencesBalancedAndSeeded) {
    const auto x = tokens(kSequences * kSeq, kD, 4);
    Calibrator c = sampled(160);
    c.add(WUSH_DTYPE_F32, x.data(), kSequences * kSeq, kSeq);
    const std::vector<std::uint32_t> ids = c.sample_sequences();
    const std::vector<std::size_t> truth = source_sequences(c.sample(), x);
    const std::vector<bool> held = pipeline::guard_sequence_split(ids, 1);
    ASSERT_EQ(held.size(), ids.size());
    std::map<std::size_t, std::set<bool>> sides;
    std::map<std::size_t, std::size_t> count;
    std::size_t n_held = 0;
    for (std::size_t t = 0; t < ids.size(); ++t) {
        sides[truth[t]].insert(held[t]);
        ++count[truth[t]];
        n_held += held[t];
    }
    for (const auto& [s, side] : sides) EXPECT_EQ(side.size(), 1u) << "sequence " << s << " split";
    // Balanced: the halves differ by at most the largest sequence's sampled tokens.
    std::size_t largest = 0;
    for (const auto& [s, k] : count) largest = std::max(largest, k);
    const std::size_t n_search = ids.size() - n_held;
    EXPECT_LE(n_held > n_search ? n_held - n_search : n_search - n_held, largest);
    EXPECT_GT(n_held, 0u);
    EXPECT_GT(n_search, 0u);
    // Deterministic from the seed; another seed holds out other sequences.
    EXPECT_EQ(pipeline::guard_sequence_split(ids, 1), held);
    bool differs = false;
    for (std::uint64_t seed = 2; seed < 6; ++seed) differs |= pipeline::guard_sequence_split(ids, seed) != held;
    EXPECT_TRUE(differs);
}

TEST(GuardHoldOut, NoSplitWithoutMarksOrWithOneSequence) {
    const auto x = tokens(kSequences * kSeq, kD, 5);
    Calibrator plain = sampled(128);
    plain.add(WUSH_DTYPE_F32, x.data(), kSequences * kSeq);
    EXPECT_TRUE(pipeline::guard_sequence_split(plain.sample_sequences(), 1).empty());
    Calibrator one = sampled(128);
    one.add(WUSH_DTYPE_F32, x.data(), kSequences * kSeq, kSequences * kSeq);
    EXPECT_TRUE(pipeline::guard_sequence_split(one.sample_sequences(), 1).empty());
    // Mixed: some tokens without a sequence.
    Calibrator mixed = sampled(128);
    mixed.add(WUSH_DTYPE_F32, x.data(), 12 * kSeq, kSeq);
    mixed.add(WUSH_DTYPE_F32, x.data() + 12 * kSeq * kD, 12 * kSeq);
    const std::vector<std::uint32_t> ids = mixed.sample_sequences();
    if (std::count(ids.begin(), ids.end(), 0u) > 0) {
        EXPECT_TRUE(pipeline::guard_sequence_split(ids, 1).empty());
    }
}

}  // namespace
}  // namespace wush
