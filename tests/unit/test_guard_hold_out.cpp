// The sequence marks of the calibrator's token sample and the guard's sequence hold-out: every
// sampled token of a sequence carries the same id and tokens of different sequences different
// ones, whatever the batch order and sharding; the hold-out takes whole sequences, balanced in
// tokens, deterministic from the seed; without marks (or with one sequence) there is none.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <map>
#include <set>
#include <vector>

#include "calibration/calibrator.h"
#include "common/error.h"
#include "eval/synthetic_layer.h"
#include "pipeline/layer_pipeline.h"
#include "prequant/gptq.h"
#include "prequant/rtn.h"
#include "transforms/rng.h"
#include "transforms/transform_search.h"

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

// The document hold-out's cross-fit searches the other documents' tokens; when the searched
// layer is kept it is built on every token with those per-block choices replayed, not searched
// again. Oracle: the cross-fit redone here from the split (guard_sequence_split) and the search
// on the fit documents' sampled tokens; the kept layer carries its choices and equals, bit for
// bit, the build with them replayed (RTN and GPTQ). For RTN each kept block is also checked
// against plain WUSH on every token without the replay's code: a sign pattern or rotation of the
// solution scaled by the chosen c has the Gram c^2 A^T A of the plain block, a data-free block c^2 I.
struct DocumentLayer {
    eval::SyntheticLayer layer = eval::generate_layer(eval::synthetic_preset("small_512x256", 1024, 0, 1));
    std::size_t d_in = layer.spec.d_in, d_out = layer.spec.d_out;
};

Calibrator with_documents(const DocumentLayer& l, std::size_t g, MomentMode mode) {
    constexpr std::size_t kDocuments = 8;
    Calibrator c(l.d_in, g, mode);
    c.set_sample_capacity(512);
    const std::size_t per = 1024 / kDocuments;
    for (std::size_t d = 0; d < kDocuments; ++d) {
        const Calibrator::DocumentScope scope(c, 1000 + d);
        c.add(WUSH_DTYPE_F32, l.layer.calibration.data() + d * per * l.d_in, per);
    }
    return c;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](float x, float y) {
               return std::bit_cast<std::uint32_t>(x) == std::bit_cast<std::uint32_t>(y);
           });
}

bool same_weights(const formats::PackedMatrix& a, const formats::PackedMatrix& b) {
    return std::ranges::equal(a.codes.span(), b.codes.span()) && std::ranges::equal(a.scales.span(), b.scales.span());
}

// The sample's tokens outside the held-out documents (the cross-fit's fit half, in sample order).
std::vector<float> fit_tokens(const Calibrator& c, std::uint64_t seed) {
    const std::vector<bool> held = pipeline::guard_sequence_split(c.sample_sequences(), seed);
    const std::vector<float> all = c.sample();
    std::vector<float> rest;
    for (std::size_t t = 0; t < held.size(); ++t)
        if (!held[t]) rest.insert(rest.end(), all.begin() + t * c.d_in(), all.begin() + (t + 1) * c.d_in());
    return rest;
}

void expect_same_choices(const std::vector<BlockChoice>& got, const std::vector<BlockChoice>& want) {
    ASSERT_EQ(got.size(), want.size());
    std::size_t searched = 0;
    for (std::size_t b = 0; b < got.size(); ++b) {
        EXPECT_EQ(got[b].base, want[b].base) << b;
        EXPECT_EQ(got[b].sign_pattern, want[b].sign_pattern) << b;
        EXPECT_EQ(got[b].scale_step, want[b].scale_step) << b;
        searched += want[b].base != SearchBase::Solution || want[b].sign_pattern != 0 || want[b].scale_step != 0;
    }
    EXPECT_GT(searched, 0u);  // some block left the plain solution: the replay is not vacuous
}

// T^T T of one G x G block.
std::vector<double> gram(const float* t, std::size_t g) {
    std::vector<double> m(g * g, 0.0);
    for (std::size_t k = 0; k < g; ++k)
        for (std::size_t i = 0; i < g; ++i)
            for (std::size_t j = 0; j < g; ++j) m[i * g + j] += double(t[k * g + i]) * t[k * g + j];
    return m;
}

TEST(GuardHoldOut, DocumentGuardReplaysTheCrossFitChoicesOnEveryToken) {
    const DocumentLayer l;
    const formats::FormatSpec& f = formats::spec(WUSH_FORMAT_MXFP4);
    const std::size_t g = f.group, c = l.d_in / g;
    TransformOptions o(TransformKind::WUSH, 0.01, 3);
    o.search.enabled = true;
    o.search.format = f.id;
    {
        const Calibrator cal = with_documents(l, g, MomentMode::BlockDiagonal);
        const pipeline::QuantizedLayer kept =
            pipeline::guarded_layer(o, f, pipeline::Method::Rtn, cal, l.layer.weight, l.d_out, nullptr);
        ASSERT_EQ(kept.guard.source, pipeline::GuardSource::HoldOutDocuments);
        ASSERT_EQ(kept.guard.kept, 0u);  // the searched layer (else this layer tests nothing)
        const std::vector<float> rest = fit_tokens(cal, o.seed);
        Calibrator fit(l.d_in, g, MomentMode::BlockDiagonal);
        fit.add(WUSH_DTYPE_F32, rest.data(), rest.size() / l.d_in);
        const BlockTransform searched =
            build_searched_transform(o, fit, l.layer.weight, l.d_out, nullptr, rest, rest.size() / l.d_in);
        expect_same_choices(kept.transform.stats().search, searched.stats().search);
        TransformOptions replayed = o;
        replayed.search.replay = searched.stats().search;
        const BlockTransform want = build_searched_transform(replayed, cal, l.layer.weight, l.d_out);
        EXPECT_TRUE(same_bits(kept.transform.activation_matrices(), want.activation_matrices()));
        EXPECT_TRUE(same_weights(kept.weights, prequantize_rtn(want, f, l.layer.weight, l.d_out)));
        // Independently of the replay: each block is the full-token plain block remixed, times c.
        TransformOptions plain_options = o;
        plain_options.search = {};
        const BlockTransform plain = build_transform(plain_options, cal, l.layer.weight, l.d_out);
        for (std::size_t b = 0; b < c; ++b) {
            const BlockChoice& ch = searched.stats().search[b];
            const double c2 = std::exp2(2.0 * ch.scale_step / double(o.search.scale_steps));
            const bool data_free = ch.base != SearchBase::Solution && ch.base != SearchBase::Rotated;
            const std::vector<double> got = gram(kept.transform.activation_matrices().data() + b * g * g, g);
            const std::vector<double> base = gram(plain.activation_matrices().data() + b * g * g, g);
            double err = 0.0, norm = 0.0;
            for (std::size_t i = 0; i < g * g; ++i) {
                const double want_ij = c2 * (data_free ? double(i % (g + 1) == 0) : base[i]);
                err = std::max(err, std::fabs(got[i] - want_ij));
                norm = std::max(norm, std::fabs(want_ij));
            }
            EXPECT_LT(err, 1e-5 * norm) << "block " << b;
        }
    }
    {
        const Calibrator cal = with_documents(l, g, MomentMode::Full);
        const pipeline::QuantizedLayer kept =
            pipeline::guarded_layer(o, f, pipeline::Method::Gptq, cal, l.layer.weight, l.d_out, nullptr);
        ASSERT_EQ(kept.guard.source, pipeline::GuardSource::HoldOutDocuments);
        ASSERT_EQ(kept.guard.kept, 0u);
        const std::vector<float> rest = fit_tokens(cal, o.seed);
        Calibrator fit(l.d_in, g, MomentMode::Full);
        fit.add(WUSH_DTYPE_F32, rest.data(), rest.size() / l.d_in);
        const gptq::Result searched = gptq::quantize(o, f, fit, l.layer.weight, l.d_out, nullptr, rest);
        expect_same_choices(kept.transform.stats().search, searched.transform.stats().search);
        TransformOptions replayed = o;
        replayed.search.replay = searched.transform.stats().search;
        const gptq::Result want = gptq::quantize(replayed, f, cal, l.layer.weight, l.d_out);
        EXPECT_TRUE(same_bits(kept.transform.activation_matrices(), want.transform.activation_matrices()));
        EXPECT_TRUE(same_weights(kept.weights, want.weights));
    }
}

}  // namespace
}  // namespace wush
