// The tensor-core quantize's prepare-time operands (cuda/quantize/bf16_fragments.h): the exact
// three-part BF16 split, the fragment re-layout (round trip), and the fragment map against the PTX
// ISA's table, written here again in the ISA's own terms (element index i of the fragment, not
// register and half), plus an MMA tile computed from the layouts against the direct product.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "quantize/bf16_fragments.h"

namespace {

using namespace wush;

std::vector<float> random_matrix(int g, unsigned seed, float scale = 1.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> gauss(0.0f, scale);
    std::vector<float> t(std::size_t(g * g));
    for (float& v : t) v = gauss(rng);
    return t;
}

TEST(Bf16Fragments, SplitIsExactForNormalValues) {
    std::mt19937 rng(3);
    std::uniform_int_distribution<std::uint32_t> any;
    int checked = 0;
    while (checked < 1000000) {
        const float t = bits::float_from_bits(any(rng));
        if (!std::isfinite(t) || std::fabs(t) < 0x1p-100f || std::fabs(t) > 0x1p120f) continue;
        const tc::Split3 s = tc::split3(t);
        ASSERT_EQ(s.residual, 0.0) << t;
        const double sum = double(tc::bf16_value(s.part[tc::kPartHi])) + double(tc::bf16_value(s.part[tc::kPartMid])) +
                           double(tc::bf16_value(s.part[tc::kPartLo]));
        ASSERT_EQ(sum, double(t));
        // Each part is the RNE of what the larger ones leave, so it is at most half a BF16 step.
        ASSERT_LE(std::fabs(double(tc::bf16_value(s.part[tc::kPartMid]))), std::ldexp(std::fabs(double(t)), -8));
        ++checked;
    }
}

TEST(Bf16Fragments, UnderflowGoesToTheResidual) {
    for (float t : {0x1.234568p-115f, 0x1p-130f, -0x1.fffffep-112f, 0x1p-149f}) {
        const tc::Split3 s = tc::split3(t);
        const double sum = double(tc::bf16_value(s.part[tc::kPartHi])) + double(tc::bf16_value(s.part[tc::kPartMid])) +
                           double(tc::bf16_value(s.part[tc::kPartLo]));
        EXPECT_EQ(sum + s.residual, double(t)) << t;
        for (int p = 0; p < tc::kParts; ++p) {
            const float v = std::fabs(tc::bf16_value(s.part[p]));
            EXPECT_TRUE(v == 0.0f || v >= 0x1p-126f) << "subnormal BF16 part of " << t;
        }
    }
    std::vector<float> t = random_matrix(16, 5);
    t[3 * 16 + 7] = 0x1.234568p-115f;
    std::vector<std::uint32_t> w(tc::fragment_words(16));
    const tc::PartNorms n = tc::pack_fragments(t.data(), 16, w.data());
    EXPECT_GT(n.residual, 0.0f);
}

TEST(Bf16Fragments, RoundTrip) {
    for (int g : {16, 32}) {
        const std::vector<float> t = random_matrix(g, unsigned(g));
        std::vector<std::uint32_t> w(tc::fragment_words(g), 0xDEADBEEFu);
        const tc::PartNorms n = tc::pack_fragments(t.data(), g, w.data());
        EXPECT_EQ(n.residual, 0.0f);
        std::vector<float> parts[tc::kParts];
        for (int p = 0; p < tc::kParts; ++p) {
            parts[p].assign(std::size_t(g * g), NAN);
            tc::unpack_part(w.data(), g, p, parts[p].data());
        }
        double norm[tc::kParts] = {};
        for (int i = 0; i < g; ++i) {
            double ss[tc::kParts] = {};
            for (int j = 0; j < g; ++j) {
                const std::size_t at = std::size_t(i * g + j);
                ASSERT_EQ(
                    double(parts[tc::kPartHi][at]) + double(parts[tc::kPartMid][at]) + double(parts[tc::kPartLo][at]),
                    double(t[at]))
                    << "g " << g << " (" << i << ", " << j << ")";
                for (int p = 0; p < tc::kParts; ++p) ss[p] += double(parts[p][at]) * parts[p][at];
            }
            for (int p = 0; p < tc::kParts; ++p) norm[p] = std::fmax(norm[p], std::sqrt(ss[p]));
        }
        for (int p = 0; p < tc::kParts; ++p) {
            EXPECT_GE(double(n.part[p]), norm[p]);
            EXPECT_LE(double(n.part[p]), norm[p] * (1 + 1e-5));
        }
    }
}

// The PTX ISA's table for the .bf16 m16n8k16 B fragment, by element index i = 0..3 of the four
// BF16 a thread holds (b0, b1 in the first .b32 register, b2, b3 in the second):
//   row = threadID_in_group * 2 + (i & 0x1)        for i < 2
//       = threadID_in_group * 2 + (i & 0x1) + 8    for i >= 2
//   col = groupID
// and of A (a0..a7, two per register):
//   row = groupID      for a0, a1, a4, a5;   groupID + 8 for a2, a3, a6, a7
//   col = threadID_in_group * 2 + (i & 0x1)  for i < 4;   ... + 8 for i >= 4
// and of C (c0..c3): row = groupID for c0, c1, groupID + 8 for c2, c3; col = tig * 2 + (i & 0x1).
TEST(Bf16Fragments, FragmentMapIsThePtxTable) {
    for (int lane = 0; lane < 32; ++lane) {
        const int group_id = lane >> 2, tig = lane % 4;
        for (int i = 0; i < 4; ++i) {
            const int row = tig * 2 + (i & 0x1) + (i >= 2 ? 8 : 0);
            EXPECT_EQ(tc::b_row(lane, i / 2, i % 2), row);
            EXPECT_EQ(tc::b_col(lane), group_id);
            EXPECT_EQ(tc::c_row(lane, i), group_id + (i >= 2 ? 8 : 0));
            EXPECT_EQ(tc::c_col(lane, i), tig * 2 + (i & 0x1));
        }
        for (int i = 0; i < 8; ++i) {
            const bool low_row = i == 0 || i == 1 || i == 4 || i == 5;
            EXPECT_EQ(tc::a_row(lane, i / 2), low_row ? group_id : group_id + 8);
            EXPECT_EQ(tc::a_col(lane, i / 2, i % 2), tig * 2 + (i & 0x1) + (i >= 4 ? 8 : 0));
        }
    }
    // Every (part, k-step, lane, n-tile, register) has its own word, and together they fill the array.
    for (int g : {16, 32}) {
        std::vector<int> seen(tc::fragment_words(g), 0);
        for (int p = 0; p < tc::kParts; ++p)
            for (int ks = 0; ks < tc::k_steps(g); ++ks)
                for (int lane = 0; lane < 32; ++lane)
                    for (int nt = 0; nt < tc::n_tiles(g); ++nt)
                        for (int reg = 0; reg < 2; ++reg) ++seen.at(tc::fragment_index(g, p, ks, lane, nt, reg));
        for (int c : seen) ASSERT_EQ(c, 1);
    }
}

// One warp's MMAs from the layouts (A from X by the A map, B straight from the packed words, D by
// the C map), summed in double, against Y = X T^T summed directly: a transposed or shifted B
// layout gives another product.
TEST(Bf16Fragments, MmaFromFragmentsIsTheProduct) {
    for (int g : {16, 32}) {
        const std::vector<float> t = random_matrix(g, 11u + unsigned(g));
        std::vector<std::uint32_t> w(tc::fragment_words(g));
        tc::pack_fragments(t.data(), g, w.data());
        std::mt19937 rng(7);
        std::normal_distribution<float> gauss;
        float x[16][32];
        for (auto& row : x)
            for (float& v : row) v = tc::bf16_value(tc::bf16_rne(gauss(rng)));
        double y[16][32] = {};
        for (int p = 0; p < tc::kParts; ++p)
            for (int ks = 0; ks < tc::k_steps(g); ++ks)
                for (int nt = 0; nt < tc::n_tiles(g); ++nt) {
                    double a[16][16], b[16][8];
                    for (int lane = 0; lane < 32; ++lane) {
                        for (int reg = 0; reg < 4; ++reg)
                            for (int h = 0; h < 2; ++h)
                                a[tc::a_row(lane, reg)][tc::a_col(lane, reg, h)] =
                                    x[tc::a_row(lane, reg)][ks * 16 + tc::a_col(lane, reg, h)];
                        for (int reg = 0; reg < 2; ++reg) {
                            const std::uint32_t word = w[tc::fragment_index(g, p, ks, lane, nt, reg)];
                            for (int h = 0; h < 2; ++h)
                                b[tc::b_row(lane, reg, h)][tc::b_col(lane)] =
                                    tc::bf16_value(std::uint16_t(word >> (16 * h)));
                        }
                    }
                    for (int lane = 0; lane < 32; ++lane)
                        for (int i = 0; i < 4; ++i) {
                            const int r = tc::c_row(lane, i), c = tc::c_col(lane, i);
                            for (int k = 0; k < 16; ++k) y[r][nt * 8 + c] += a[r][k] * b[k][c];
                        }
                }
        for (int r = 0; r < 16; ++r)
            for (int i = 0; i < g; ++i) {
                double want = 0.0;
                for (int j = 0; j < g; ++j) want += double(t[std::size_t(i * g + j)]) * x[r][j];
                ASSERT_NEAR(y[r][i], want, 1e-12 * (1 + std::fabs(want))) << "g " << g << " r " << r << " i " << i;
            }
    }
}

}  // namespace
