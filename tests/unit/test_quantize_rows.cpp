// quantize_rows on every ISA path gives the bytes of the float64 definition, group by group
// (formats::quantize_group, itself checked against NVIDIA's converters in test_nvidia_oracle):
// Gaussian rows over a wide range of magnitudes, and rows whose elements sit on and next to every
// E2M1 rounding threshold of their group's scale, zeros of both signs, subnormals and values near
// the top of each format's range.
#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "common/cpu_isa.h"
#include "formats/block_format.h"
#include "formats/group_quantizer.h"

namespace {

using wush::Isa;
using wush::formats::FormatSpec;

constexpr double kThresholds[] = {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0};

// A group's scale as the definition chooses it from its largest magnitude.
wush::formats::E2m1GroupScale scale_of(const FormatSpec& f, double amax) {
    return f.id == WUSH_FORMAT_NVFP4 ? wush::formats::nvfp4_group_scale(amax)
                                     : wush::formats::mx_group_scale(amax, f.id == WUSH_FORMAT_MXFP4_OCP);
}

// One group led by `amax`, then each threshold's value under that group's scale and the floats
// next to it (alternating signs), those within amax only (so that amax keeps the scale; a scale
// clamped at the bottom of its range puts the thresholds beyond it); G = 16 takes the first 15.
std::vector<float> threshold_group(const FormatSpec& f, float amax) {
    const auto s = scale_of(f, double(amax));
    std::vector<float> g{amax};
    int sign = -1;
    for (double t : kThresholds) {
        const float at = float(t * s.div / s.mul);
        for (float v : {at, std::nextafter(at, 0.0f), std::nextafter(at, FLT_MAX),
                        std::nextafter(std::nextafter(at, 0.0f), 0.0f)}) {
            if (v > amax) continue;
            g.push_back(float(sign) * v);
            sign = -sign;
        }
    }
    g.resize(f.group, 0.0f);
    return g;
}

std::vector<float> test_rows(const FormatSpec& f, std::size_t d_in, std::size_t* n_rows) {
    std::vector<float> x;
    // Groups on the thresholds, under scales from subnormal to near the format's top.
    const float top = f.id == WUSH_FORMAT_MXFP4 ? 1e38f : FLT_MAX / 2;
    for (float amax : {1.75f, 1.9f, 3.3f, 7.9f, 0.007f, 1.75e-30f, 2.0e-38f, 6e-41f, 3e4f, 1.7e30f, top})
        for (float v : threshold_group(f, amax)) x.push_back(v);
    // Zeros of both signs, a lone subnormal, one group of the smallest subnormals.
    for (std::size_t i = 0; i < f.group; ++i) x.push_back(i % 2 ? -0.0f : 0.0f);
    for (std::size_t i = 0; i < f.group; ++i) x.push_back(i == 3 ? 1e-45f : 0.0f);
    for (std::size_t i = 0; i < f.group; ++i) x.push_back(i % 3 ? -1e-45f : 3e-45f);
    // Gaussian groups of magnitudes 2^-130 .. 2^100.
    std::mt19937 rng(17);
    std::normal_distribution<float> normal;
    for (int e = -130; e <= 100; e += 10)
        for (std::size_t i = 0; i < 4 * f.group; ++i) x.push_back(std::ldexp(normal(rng), e));
    while (x.size() % d_in) x.push_back(normal(rng));
    *n_rows = x.size() / d_in;
    return x;
}

class QuantizeRowsIsa : public ::testing::TestWithParam<wush_format> {};

TEST_P(QuantizeRowsIsa, EveryPathGivesTheDefinitionsBytes) {
    const FormatSpec& f = wush::formats::spec(GetParam());
    const std::size_t d_in = 3 * f.group;
    std::size_t n_rows = 0;
    const std::vector<float> x = test_rows(f, d_in, &n_rows);
    const auto sizes = wush::formats::packed_sizes(f, n_rows, d_in);
    std::vector<std::uint8_t> want_codes(sizes.codes), want_scales(sizes.scales);
    for (std::size_t k = 0; k < n_rows * d_in / f.group; ++k)
        wush::formats::quantize_group(f.id, x.data() + k * f.group, int(f.group), want_codes.data() + k * f.group / 2,
                                      want_scales.data() + k * f.scale_bytes);
    int paths = 0;
    for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512Vnni}) {
        if (!wush::isa_supported(isa)) continue;
        ++paths;
        std::vector<std::uint8_t> codes(sizes.codes, 0xAA), scales(sizes.scales, 0xAA);
        wush::formats::quantize_rows(f, x, n_rows, d_in, codes, scales, isa);
        for (std::size_t i = 0; i < codes.size(); ++i)
            ASSERT_EQ(codes[i], want_codes[i]) << wush::isa_name(isa) << " code byte " << i << " (row " << 2 * i / d_in
                                               << ", value " << x[2 * i] << ", " << x[2 * i + 1] << ")";
        EXPECT_EQ(scales, want_scales) << wush::isa_name(isa);
        // The dtype entry point (bf16 here, widened exactly) takes the best path.
        std::vector<std::uint16_t> bf16(x.size());
        std::vector<float> widened(x.size());
        for (std::size_t i = 0; i < x.size(); ++i) {
            bf16[i] = std::uint16_t(std::bit_cast<std::uint32_t>(x[i]) >> 16);  // truncation: any bf16 will do
            widened[i] = std::bit_cast<float>(std::uint32_t(bf16[i]) << 16);
        }
        std::vector<std::uint8_t> c16(sizes.codes), s16(sizes.scales), c32(sizes.codes), s32(sizes.scales);
        wush::formats::quantize_rows(f, WUSH_DTYPE_BF16, bf16.data(), n_rows, d_in, c16, s16);
        wush::formats::quantize_rows(f, widened, n_rows, d_in, c32, s32, Isa::Scalar);
        EXPECT_EQ(c16, c32) << "bf16";
        EXPECT_EQ(s16, s32) << "bf16";
    }
    if (paths == 1) GTEST_SKIP() << "only the scalar path runs on this CPU";
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantizeRowsIsa,
                         ::testing::Values(WUSH_FORMAT_MXFP4, WUSH_FORMAT_MXFP4_OCP, WUSH_FORMAT_NVFP4,
                                           WUSH_FORMAT_INT4));

}  // namespace
