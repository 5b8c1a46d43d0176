// E2M1's grid encoder (formats::certify_detail::e2m1_encode_grid, the tensor-core quantize's)
// against the threshold chain it replaces (e2m1_encode_checked) and against the float64 codec
// (codec::e2m1_encode): the same code and near flag on every float of |v| in [2^-4, 8) (both
// signs, every bit pattern: the thresholds' range) for a certified group's typical tolerance, on
// every 7th float of [2^-10, 2^5) for tolerances up to a quarter code unit, and on zeros,
// subnormals, large values and infinities.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>

#include "common/float_bits.h"
#include "formats/certified_group.h"
#include "formats/element_codecs.h"

namespace {

using namespace wush;
using formats::certify_detail::e2m1_encode_checked;
using formats::certify_detail::e2m1_encode_grid;

const float kTols[] = {0.0f, 0x1p-20f, 1e-4f, 0.01f, 0.1f, 0.2f, 0.25f};

// Counts disagreements over the bit patterns [lo, hi) (and their negatives) for one tolerance.
std::uint64_t mismatches(std::uint32_t lo, std::uint32_t hi, float tol, std::uint32_t step = 1) {
    std::uint64_t bad = 0;
    for (std::uint32_t b = lo; b < hi; b += step)
        for (std::uint32_t sign : {0u, 0x80000000u}) {
            const float v = bits::float_from_bits(b | sign);
            bool near_old = false, near_new = false;
            const std::uint8_t old_code = e2m1_encode_checked(v, tol, near_old);
            const std::uint8_t new_code = e2m1_encode_grid(v, tol, near_new);
            bad += old_code != new_code || near_old != near_new || new_code != codec::e2m1_encode(double(v));
        }
    return bad;
}

TEST(E2m1Grid, SameCodesAndFlagsAsTheThresholdChain) {
    EXPECT_EQ(mismatches(bits::bits_from_float(0x1p-4f), bits::bits_from_float(8.0f), 1e-5f), 0u);
    const std::uint32_t lo = bits::bits_from_float(0x1p-10f), hi = bits::bits_from_float(0x1p5f);
    for (float tol : kTols) EXPECT_EQ(mismatches(lo, hi, tol, 7), 0u) << tol;
}

TEST(E2m1Grid, OutsideTheWindow) {
    for (float tol : kTols) {
        EXPECT_EQ(mismatches(0, 0x00800000u, tol, 65537), 0u) << "subnormals, tol " << tol;
        EXPECT_EQ(mismatches(0x00800000u, bits::bits_from_float(0x1p-10f), tol, 1009), 0u) << "small, tol " << tol;
        EXPECT_EQ(mismatches(bits::bits_from_float(0x1p5f), 0x7F800001u, tol, 997), 0u) << "large, tol " << tol;
        EXPECT_EQ(mismatches(0, 1, tol), 0u) << "zero";
    }
}

// Larger tolerances: never less cautious than the threshold chain.
TEST(E2m1Grid, LargeTolerancesAreFlagged) {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> any(-8.0f, 8.0f);
    for (int i = 0; i < 100000; ++i) {
        const float v = any(rng), tol = 0.25f + 2.0f * std::fabs(any(rng));
        bool near_old = false, near_new = false;
        e2m1_encode_checked(v, tol, near_old);
        EXPECT_EQ(e2m1_encode_grid(v, tol, near_new), codec::e2m1_encode(double(v)));
        EXPECT_TRUE(near_new || !near_old) << v << " " << tol;
    }
}

}  // namespace
