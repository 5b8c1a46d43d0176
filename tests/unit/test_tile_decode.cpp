// The per-element arithmetic of the CUDA W4A4 GEMM kernels (cuda/gemm/tile_decode.h), run on the
// CPU against independent float64 math; an emulation of one MMA tile of each shape from the PTX
// fragment layouts, fed exactly as the prefill kernel feeds it; and the decode kernel's split-K
// partition (cuda/gemm/gemm_plan.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "formats/group_quantizer.h"
#include "gemm/gemm_plan.h"
#include "gemm/gemm_table.h"
#include "gemm/tile_decode.h"

namespace {

using namespace wush;

const wush_format kFormats[] = {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4, WUSH_FORMAT_INT4, WUSH_FORMAT_MXFP4_OCP};

// Element values written out here (not taken from the codecs): E2M1 and INT4 midrise levels.
double element_value(wush_format f, unsigned nibble) {
    static const double kE2M1[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
    if (f == WUSH_FORMAT_INT4) {
        const int q = nibble >= 8 ? int(nibble) - 16 : int(nibble);
        return q + 0.5;
    }
    const double m = kE2M1[nibble & 7];
    return (nibble & 8) ? -m : m;
}

double tensor_factor(wush_format f) {
    switch (f) {
        case WUSH_FORMAT_MXFP4: return 1.0 / 3.0;
        case WUSH_FORMAT_NVFP4: return 1.0 / 10.0;
        default: return 1.0;
    }
}

int group_of(wush_format f) {
    return f == WUSH_FORMAT_NVFP4 ? 16 : 32;
}

bool same_float(float a, float b) {
    if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
    std::uint32_t ua, ub;
    std::memcpy(&ua, &a, 4);
    std::memcpy(&ub, &b, 4);
    return ua == ub;
}

TEST(TileDecode, DoubledElementIsTwiceTheValue) {
    for (wush_format f : kFormats)
        for (unsigned c = 0; c < 16; ++c) {
            EXPECT_EQ(double(tile::doubled_element(f, c)), 2.0 * element_value(f, c)) << f << " " << c;
            EXPECT_EQ(double(tile::doubled_element(f, c)), 2.0 * double(formats::decode_element(f, std::uint8_t(c))));
        }
}

TEST(TileDecode, PrmtEmulationFollowsPtx) {
    // Bytes of {b:a} = 00 11 .. 77 pattern with sign bits on bytes 5 and 7.
    const std::uint32_t a = 0x33221100u, b = 0xF7668544u;
    EXPECT_EQ(tile::prmt(a, b, 0x3210u), a);
    EXPECT_EQ(tile::prmt(a, b, 0x7654u), b);
    EXPECT_EQ(tile::prmt(a, b, 0x0123u), 0x00112233u);
    // Bit 3 of a selector nibble replicates the selected byte's sign bit.
    // nibbles 4, 8|4, 5, 8|5: 0x44, sign(0x44) = 00, 0x85, sign(0x85) = FF
    EXPECT_EQ(tile::prmt(a, b, 0xD5C4u), 0xFF850044u);
}

TEST(TileDecode, Decode4AllCodes) {
    for (wush_format f : kFormats) {
        const tile::DoubledLut lut = tile::doubled_lut(f);
        for (std::uint32_t c = 0; c < 65536; ++c) {
            const std::uint32_t v = tile::decode4(lut, c | 0xABCD0000u);  // upper half must be ignored
            for (int i = 0; i < 4; ++i)
                ASSERT_EQ(tile::lane_s8(v, i), tile::doubled_element(f, (c >> (4 * i)) & 0xF))
                    << f << " " << c << " " << i;
        }
    }
}

TEST(TileDecode, ScaleValuesEqualDecodeScale) {
    for (wush_format f : kFormats) {
        const int sb = tile::scale_bytes(f);
        const unsigned count = sb == 2 ? 65536u : 256u;
        for (unsigned c = 0; c < count; ++c) {
            const std::uint8_t bytes[2] = {std::uint8_t(c & 0xFF), std::uint8_t(c >> 8)};
            ASSERT_TRUE(same_float(tile::scale_value(f, bytes), formats::decode_scale(f, bytes)) ||
                        (std::isnan(tile::scale_value(f, bytes)) && std::isnan(formats::decode_scale(f, bytes))))
                << f << " " << c << " " << tile::scale_value(f, bytes) << " " << formats::decode_scale(f, bytes);
        }
    }
    // Independent values: E8M0 254 = 2^127, 0 = 2^-127; E4M3 0x01 = 2^-9, 0x7E = 448.
    const std::uint8_t c0 = 0, c254 = 254, s1 = 1, s7e = 0x7E, sfe = 0xFE;
    EXPECT_EQ(double(tile::scale_value(WUSH_FORMAT_MXFP4, &c0)), std::ldexp(1.0, -127));
    EXPECT_EQ(double(tile::scale_value(WUSH_FORMAT_MXFP4, &c254)), std::ldexp(1.0, 127));
    EXPECT_EQ(double(tile::scale_value(WUSH_FORMAT_NVFP4, &s1)), std::ldexp(1.0, -9));
    EXPECT_EQ(double(tile::scale_value(WUSH_FORMAT_NVFP4, &s7e)), 448.0);
    EXPECT_EQ(double(tile::scale_value(WUSH_FORMAT_NVFP4, &sfe)), -448.0);
}

TEST(TileDecode, PromotionMagicIsExact) {
    for (int dot = -(1 << 16); dot <= (1 << 16); ++dot)
        ASSERT_EQ(tile::promoted_dot(tile::kPromoteMagicBits + dot), float(dot)) << dot;
    // The largest group dot products of each format are far inside the exact range (2^22).
    EXPECT_LT(32 * 15 * 15, 1 << 22);
}

// The prefill kernel's 2-op promotion: fma(bits(magic + dot), s, -magic * s) == dot * s exactly, for
// every scale code of every format below the range bound, and every dot a group can produce.
TEST(TileDecode, ScaledDotIsExact) {
    std::mt19937 rng(3);
    for (wush_format f : kFormats) {
        const unsigned count = tile::scale_bytes(f) == 2 ? 65536u : 256u;
        int checked = 0;
        for (unsigned code = 0; code < count; ++code) {
            const std::uint8_t bytes[2] = {std::uint8_t(code & 0xFF), std::uint8_t(code >> 8)};
            const float s = tile::scale_value(f, bytes);
            if (!(std::fabs(s) < tile::kScaledDotMaxScale)) continue;  // the kernel's flag takes the slow path
            const float c = tile::kPromoteMagic * s;
            ASSERT_EQ(double(c), 12582912.0 * double(s)) << "magic * s not exact, code " << code;
            const int lim = 32 * 15 * 15;
            for (int rep = 0; rep < 64; ++rep) {
                const int dot = rep < 5 ? (rep - 2) * lim / 2 : int(rng() % (2 * lim + 1)) - lim;
                const float t = tile::scaled_dot(tile::kPromoteMagicBits + dot, s, c);
                ASSERT_EQ(double(t), double(dot) * double(s)) << "format " << f << " code " << code << " dot " << dot;
            }
            ++checked;
        }
        EXPECT_GT(checked, 200);
    }
}

// A group's promoted value: the int32 dot of doubled codes (decode4 + dp4a, as the decode kernel)
// times the scales and alpha / 4 equals the float64 dot of the dequantized values.
TEST(TileDecode, GroupPromotionEqualsFloat64Dot) {
    std::mt19937 rng(7);
    for (wush_format f : kFormats) {
        const int G = group_of(f), sb = tile::scale_bytes(f);
        const tile::DoubledLut lut = tile::doubled_lut(f);
        for (int trial = 0; trial < 2000; ++trial) {
            std::uint8_t ca[16], cw[16], sa[2], sw[2];
            for (auto& b : ca) b = std::uint8_t(rng());
            for (auto& b : cw) b = std::uint8_t(rng());
            for (int i = 0; i < sb; ++i) sa[i] = std::uint8_t(rng()), sw[i] = std::uint8_t(rng());
            if (f == WUSH_FORMAT_NVFP4) sa[0] &= 0x7E, sw[0] &= 0x7E;                           // no NaN codes
            if (f == WUSH_FORMAT_INT4) sa[1] = 0x3C + (rng() % 8), sw[1] = 0x3C + (rng() % 8);  // finite bf16
            if (f == WUSH_FORMAT_MXFP4 || f == WUSH_FORMAT_MXFP4_OCP)
                sa[0] = 100 + rng() % 50, sw[0] = 100 + rng() % 50;
            int dot = tile::kPromoteMagicBits;
            for (int w = 0; w < G / 8; ++w) {
                std::uint32_t a32, w32;
                std::memcpy(&a32, ca + 4 * w, 4);
                std::memcpy(&w32, cw + 4 * w, 4);
                dot = tile::dp4a(tile::decode4(lut, a32), tile::decode4(lut, w32), dot);
                dot = tile::dp4a(tile::decode4(lut, a32 >> 16), tile::decode4(lut, w32 >> 16), dot);
            }
            const double fa = tensor_factor(f), fw = tensor_factor(f);
            double ref = 0.0, ref_units = 0.0, abs_sum = 0.0;
            const double sav = formats::decode_scale(f, sa), swv = formats::decode_scale(f, sw);
            for (int i = 0; i < G; ++i) {
                const double ea = element_value(f, formats::get_nibble(ca, i));
                const double ew = element_value(f, formats::get_nibble(cw, i));
                ref_units += ea * ew;  // exact: quarter-integers
                ref += (ea * sav * fa) * (ew * swv * fw);
                abs_sum += std::fabs((ea * sav * fa) * (ew * swv * fw));
            }
            const float d = tile::promoted_dot(dot);
            ASSERT_EQ(double(d), 4.0 * ref_units);
            const double alpha = fa * fw;
            const double got = double(d) * double(sav) * double(swv) * alpha / 4.0;
            ASSERT_NEAR(got, ref, 1e-14 * abs_sum);  // float64 rounding of the reference's terms
            // The float32 promotion the kernels do (alpha / 4 folded into scale_a) is within 2 ulp.
            const float sa_alpha = float(sav) * float(alpha) * 0.25f;
            const float p = tile::promote(0.0f, int(d), sa_alpha, float(swv));
            ASSERT_NEAR(double(p), ref, 4 * 0x1p-24 * std::fabs(ref) + 1e-14 * abs_sum);
        }
    }
}

// One MMA tile on the CPU: fragments built with the kernel's functions from packed rows, the
// product computed by the PTX layout maps, against a plain matmul in natural element order.
void emulate_mma_tile(wush_format f) {
    const int G = group_of(f);
    const int row_bytes = G / 2;
    std::mt19937 rng(11 + int(f));
    const tile::DoubledLut lut = tile::doubled_lut(f);
    for (int trial = 0; trial < 50; ++trial) {
        std::vector<std::uint8_t> a(16 * row_bytes), w(8 * row_bytes);
        for (auto& b : a) b = std::uint8_t(rng());
        for (auto& b : w) b = std::uint8_t(rng());
        // Plain matmul of doubled values.
        int ref[16][8];
        for (int r = 0; r < 16; ++r)
            for (int c = 0; c < 8; ++c) {
                int s = 0;
                for (int i = 0; i < G; ++i)
                    s += tile::doubled_element(f, formats::get_nibble(&a[r * row_bytes], i)) *
                         tile::doubled_element(f, formats::get_nibble(&w[c * row_bytes], i));
                ref[r][c] = s;
            }
        // Fragments per lane, as the kernel loads them.
        std::uint32_t fa[32][4] = {}, fb[32][2] = {};
        for (int lane = 0; lane < 32; ++lane) {
            const int gid = lane >> 2, t = lane & 3;
            if (G == 32) {
                tile::a_frag_k32(lut, &a[gid * row_bytes], &a[(gid + 8) * row_bytes], t, fa[lane]);
                tile::b_frag_k32(lut, &w[gid * row_bytes], t, fb[lane]);
            } else {
                std::uint32_t a2[2];
                tile::a_frag_k16(lut, &a[gid * row_bytes], &a[(gid + 8) * row_bytes], t, a2);
                fa[lane][0] = a2[0];
                fa[lane][1] = a2[1];
                fb[lane][0] = tile::b_frag_k16(lut, &w[gid * row_bytes], t);
            }
        }
        // Reassemble A (16 x K) and B (K x 8) from the fragments by the PTX maps; every slot once.
        const int K = G;
        std::vector<int> A(16 * K, 1000), B(K * 8, 1000);
        for (int lane = 0; lane < 32; ++lane) {
            for (int reg = 0; reg < K / 8; ++reg)
                for (int j = 0; j < 4; ++j) {
                    int& slot = A[mma::a_row(lane, reg) * K + tile::mma_a_col(lane, reg, j)];
                    ASSERT_EQ(slot, 1000);
                    slot = tile::lane_s8(fa[lane][reg], j);
                }
            for (int reg = 0; reg < K / 16; ++reg)
                for (int j = 0; j < 4; ++j) {
                    int& slot = B[tile::mma_b_row(lane, reg, j) * 8 + mma::b_col(lane)];
                    ASSERT_EQ(slot, 1000);
                    slot = tile::lane_s8(fb[lane][reg], j);
                }
        }
        // Slot k holds element group_element_of_slot(k) of both operands.
        for (int r = 0; r < 16; ++r)
            for (int k = 0; k < K; ++k)
                ASSERT_EQ(A[r * K + k],
                          tile::doubled_element(
                              f, formats::get_nibble(&a[r * row_bytes], tile::group_element_of_slot(G, k))));
        // D = A B, read out by the C fragment map, from the magic start.
        for (int lane = 0; lane < 32; ++lane)
            for (int e = 0; e < 4; ++e) {
                const int r = mma::c_row(lane, e), c = mma::c_col(lane, e);
                int d = tile::kPromoteMagicBits;
                for (int k = 0; k < K; ++k) d += A[r * K + k] * B[k * 8 + c];
                ASSERT_EQ(tile::promoted_dot(d), float(ref[r][c])) << "lane " << lane << " e " << e;
            }
    }
}

TEST(TileDecode, MmaTileEmulation) {
    for (wush_format f : kFormats) emulate_mma_tile(f);
}

TEST(TileDecode, GroupElementOfSlotIsAPermutation) {
    for (int G : {16, 32}) {
        std::vector<int> seen(G, 0);
        for (int k = 0; k < G; ++k) ++seen[tile::group_element_of_slot(G, k)];
        for (int i = 0; i < G; ++i) EXPECT_EQ(seen[i], 1);
    }
}

TEST(GemmPlan, DecodeSplitsPartitionK) {
    using namespace wush::cuda::plan;
    for (std::size_t m : {1, 3, 16, 17, 32}) {
        for (std::size_t n : {8, 13, 256, 4096, 14336}) {
            for (std::size_t k : {32, 96, 1024, 4096, 4128, 14336}) {
                const DecodePlan p = plan_decode(m, n, k);
                EXPECT_GE(p.mr, int(std::min<std::size_t>(m, 16)));
                EXPECT_LE(p.mr, 16);
                EXPECT_EQ(p.row_passes, (m + 15) / 16);
                EXPECT_EQ(p.blocks_n, (n + 15) / 16);
                ASSERT_GE(p.splits, 1u);
                std::size_t expect = 0;
                for (std::size_t s = 0; s < p.splits; ++s) {
                    std::size_t k0, k1;
                    decode_split_range(p, k, s, &k0, &k1);
                    EXPECT_EQ(k0, expect);
                    EXPECT_GT(k1, k0) << "empty split " << s << " of " << p.splits;
                    EXPECT_EQ(k0 % kDecodeChunk, 0u);
                    expect = k1;
                }
                EXPECT_EQ(expect, k);
                if (p.splits > 1) {
                    EXPECT_LT(p.blocks_n * p.row_passes, kDecodeTargetBlocks);
                    EXPECT_EQ(decode_workspace_bytes(m, n, k), p.splits * m * n * 4);
                } else {
                    EXPECT_EQ(decode_workspace_bytes(m, n, k), 0u);
                }
            }
        }
    }
    // The design points: 4096 x 4096 at m = 1 splits in 2; 14336 rows need no split.
    EXPECT_EQ(plan_decode(1, 4096, 4096).splits, 2u);
    EXPECT_EQ(plan_decode(1, 14336, 4096).splits, 1u);
    EXPECT_EQ(plan_decode(16, 4096, 14336).splits, 3u);
}

TEST(GemmPlan, PrefillScaleStrideCoversStages) {
    using namespace wush::cuda::plan;
    for (int G : {16, 32})
        for (std::size_t k : {32, 96, 128, 4096, 4128}) {
            const std::size_t s = prefill_scale_stride(k, G);
            EXPECT_GE(s, k / G);
            EXPECT_EQ(s % (kPrefillBK / G), 0u);
            EXPECT_EQ((s * 4) % 16, 0u);
            EXPECT_EQ(prefill_flag_offset(5, 7, k, G), 12 * s * 4);
            EXPECT_EQ(prefill_workspace_bytes(5, 7, k, G), 12 * s * 4 + 16);
        }
}

}  // namespace

// ---- the kernel table's GEMM rows (cuda/gemm/gemm_table.h) ------------------------------------------

namespace table_test {

using wush::cuda::GemmKernel;

const auto kAll = [](GemmKernel) { return true; };
const auto kNoLt = [](GemmKernel k) { return k != GemmKernel::BlockScaledLt; };

// The documented policy, written out: decode up to 32 tokens; above, cuBLASLt FP4 on sm_100/120
// where it has an algorithm and the context opted in (WUSH_CONTEXT_CUDA_BLOCKSCALED); INT4 from 128
// tokens on sm >= 80: the prefill kernel (measured faster than INT4's float32 reference path);
// else the reference path.
void expect_documented_policy(const wush::cuda::KernelTable& t, bool blockscaled_opt_in) {
    for (wush_format f : {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4, WUSH_FORMAT_INT4, WUSH_FORMAT_MXFP4_OCP}) {
        for (int sm : {61, 70, 75, 80, 86, 89, 90, 100, 103, 120, 121}) {
            for (std::size_t m = 1; m <= 600; ++m) {
                const bool lt = blockscaled_opt_in && (sm / 10 == 10 || sm / 10 == 12);
                const bool int4_prefill = f == WUSH_FORMAT_INT4 && sm >= 80 && m >= 128;
                const GemmKernel after_lt = int4_prefill ? GemmKernel::Prefill : GemmKernel::Reference;
                const GemmKernel want_lt = m <= 32 ? GemmKernel::Decode : lt ? GemmKernel::BlockScaledLt : after_lt;
                const GemmKernel want_nolt = m <= 32 ? GemmKernel::Decode : after_lt;
                EXPECT_EQ(wush::cuda::table_pick(t, sm, m, f, kAll), want_lt) << f << " " << sm << " " << m;
                EXPECT_EQ(wush::cuda::table_pick(t, sm, m, f, kNoLt), want_nolt) << f << " " << sm << " " << m;
            }
        }
    }
}

TEST(GemmTable, DefaultPicksPrefillOnlyForInt4) {
    const wush::cuda::KernelTable t = wush::cuda::active_table({});
    expect_documented_policy(t, false);
    expect_documented_policy(wush::cuda::active_table({.blockscaled = true}), true);
    // Below sm_61 (no dp4a) and where the decode kernel refuses the shape: the reference path.
    EXPECT_EQ(wush::cuda::table_pick(t, 60, 1, WUSH_FORMAT_MXFP4, kAll), GemmKernel::Reference);
    EXPECT_EQ(wush::cuda::table_pick(t, 90, 1, WUSH_FORMAT_MXFP4, [](GemmKernel k) { return k != GemmKernel::Decode; }),
              GemmKernel::Reference);
    EXPECT_EQ(wush::cuda::table_pick(t, 90, std::size_t(1) << 40, WUSH_FORMAT_MXFP4, kAll), GemmKernel::Reference);
    // INT4 where the prefill kernel refuses the product: the reference path.
    EXPECT_EQ(
        wush::cuda::table_pick(t, 90, 4096, WUSH_FORMAT_INT4, [](GemmKernel k) { return k != GemmKernel::Prefill; }),
        GemmKernel::Reference);
}

// wush_linear_workspace_size promises a workspace "for up to n tokens". With the kernels' own
// scratch formulas (the reference path's: its m x k and n x k BF16 copies and an m x n float
// output, as in reference_gemm.cu), max_bytes_up_to must equal the brute-force maximum over every
// m <= n; the size at n alone must fall short somewhere (the decode kernel's split partials and
// INT4's switch to the prefill kernel), or this test checks nothing.
TEST(GemmTable, WorkspaceForUpToNCoversEverySmallerBatch) {
    namespace c = wush::cuda;
    std::size_t naive_short = 0;
    for (std::size_t prefill_min_m : {0, 33, 200}) {
        const c::KernelTable t = c::active_table({.prefill_min_m = prefill_min_m});
        for (wush_format f : {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4, WUSH_FORMAT_INT4}) {
            const int group = f == WUSH_FORMAT_NVFP4 ? 16 : 32;
            for (auto [n, k] : {std::pair<std::size_t, std::size_t>{192, 256}, {4096, 4096}, {14336, 4096}}) {
                const auto bytes_at = [&](std::size_t m) -> std::size_t {
                    switch (c::table_pick(t, 90, m, f, kNoLt)) {
                        case GemmKernel::Decode: return c::plan::decode_workspace_bytes(m, n, k);
                        case GemmKernel::Prefill: return c::plan::prefill_workspace_bytes(m, n, k, group);
                        default: return (m * k + n * k) * 2 + m * n * 4;
                    }
                };
                std::size_t brute = 0;
                for (std::size_t up_to = 1; up_to <= 700; ++up_to) {
                    brute = std::max(brute, bytes_at(up_to));
                    ASSERT_EQ(c::max_bytes_up_to(t, up_to, bytes_at), brute)
                        << prefill_min_m << " " << f << " " << n << " " << up_to;
                    naive_short += bytes_at(up_to) < brute;
                }
                EXPECT_EQ(c::max_bytes_up_to(t, 0, bytes_at), 0u);
            }
        }
    }
    EXPECT_GT(naive_short, 0u);
}

TEST(GemmTable, PrefillSwitch) {
    wush::cuda::KernelTable t = wush::cuda::active_table({.prefill_min_m = 100});
    for (std::size_t m = 1; m <= 300; ++m) {
        const GemmKernel want = m <= 32 ? GemmKernel::Decode : m < 100 ? GemmKernel::Reference : GemmKernel::Prefill;
        EXPECT_EQ(wush::cuda::table_pick(t, 90, m, WUSH_FORMAT_MXFP4, kAll), want) << m;
        EXPECT_EQ(wush::cuda::table_pick(t, 80, m, WUSH_FORMAT_MXFP4, kAll), want) << m;
        // Opted in, cuBLASLt keeps its range on Blackwell; without it, the prefill kernel (sm >= 80).
        EXPECT_EQ(wush::cuda::table_pick(wush::cuda::active_table({.prefill_min_m = 100, .blockscaled = true}), 100, m,
                                         WUSH_FORMAT_MXFP4, kAll),
                  m <= 32 ? GemmKernel::Decode : GemmKernel::BlockScaledLt)
            << m;
        EXPECT_EQ(wush::cuda::table_pick(t, 100, m, WUSH_FORMAT_MXFP4, kAll), want) << m;
        EXPECT_EQ(wush::cuda::table_pick(t, 120, m, WUSH_FORMAT_MXFP4, kNoLt), want) << m;
        // A kernel that refuses the product hands over to the next rule.
        EXPECT_EQ(
            wush::cuda::table_pick(t, 90, m, WUSH_FORMAT_MXFP4, [](GemmKernel k) { return k != GemmKernel::Prefill; }),
            m <= 32 ? GemmKernel::Decode : GemmKernel::Reference)
            << m;
    }
    EXPECT_EQ(wush::cuda::table_pick(t, 75, 500, WUSH_FORMAT_MXFP4, kAll),
              GemmKernel::Reference);  // no mma.sync s8 before sm_80
    // A value at or below the decode rows starts right above them: decode keeps m <= 32.
    t = wush::cuda::active_table({.prefill_min_m = 1});
    EXPECT_EQ(wush::cuda::table_pick(t, 90, 32, WUSH_FORMAT_MXFP4, kAll), GemmKernel::Decode);
    EXPECT_EQ(wush::cuda::table_pick(t, 90, 33, WUSH_FORMAT_MXFP4, kAll), GemmKernel::Prefill);
    t = wush::cuda::active_table({.prefill_min_m = 0});  // off
    EXPECT_EQ(wush::cuda::table_pick(t, 90, 33, WUSH_FORMAT_MXFP4, kAll), GemmKernel::Reference);
    EXPECT_EQ(wush::cuda::table_pick(t, 90, 4096, WUSH_FORMAT_MXFP4, kAll), GemmKernel::Reference);
}

}  // namespace table_test
