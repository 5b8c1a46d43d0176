// find_non_finite (common/dtype.h), which the runtime runs over every product it returns and the
// calibrator over every batch: the first NaN or infinity, by index, against a plain loop written
// here that decodes each value (std::isfinite of the float it stands for), for every dtype, at
// every position around the scan's block edges and in the tail.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#include "common/dtype.h"
#include "common/float_bits.h"

namespace {

float decode(wush_dtype dtype, const std::vector<std::uint32_t>& bits, std::size_t i) {
    if (dtype == WUSH_DTYPE_F32) {
        float f;
        std::memcpy(&f, &bits[i], sizeof f);
        return f;
    }
    const auto b = std::uint16_t(bits[i]);
    return dtype == WUSH_DTYPE_F16 ? wush::bits::f16_decode(b) : wush::bits::bf16_decode(b);
}

std::optional<std::size_t> oracle(wush_dtype dtype, const std::vector<std::uint32_t>& bits) {
    for (std::size_t i = 0; i < bits.size(); ++i)
        if (!std::isfinite(decode(dtype, bits, i))) return i;
    return std::nullopt;
}

std::optional<std::size_t> scan(wush_dtype dtype, const std::vector<std::uint32_t>& bits) {
    if (dtype == WUSH_DTYPE_F32) return wush::find_non_finite(dtype, bits.data(), bits.size());
    std::vector<std::uint16_t> narrow(bits.begin(), bits.end());
    return wush::find_non_finite(dtype, narrow.data(), narrow.size());
}

struct Width {
    wush_dtype dtype;
    std::uint32_t largest_finite, infinity, quiet_nan, signalling_nan;
};

// Per dtype: the largest finite magnitude (exponent one below all ones), +infinity and two NaNs.
constexpr Width kWidths[] = {
    {WUSH_DTYPE_F32, 0x7F7FFFFFu, 0x7F800000u, 0x7FC00000u, 0x7F800001u},
    {WUSH_DTYPE_F16, 0x7BFFu, 0x7C00u, 0x7E00u, 0x7C01u},
    {WUSH_DTYPE_BF16, 0x7F7Fu, 0x7F80u, 0x7FC0u, 0x7F81u},
};

TEST(FiniteScan, FirstNonFiniteAtEveryPositionOfEveryLength) {
    for (const Width& w : kWidths) {
        const std::uint32_t negative = w.dtype == WUSH_DTYPE_F32 ? 0x80000000u : 0x8000u;
        for (std::size_t n :
             {std::size_t(0), std::size_t(1), std::size_t(255), std::size_t(256), std::size_t(257), std::size_t(700)}) {
            // Finite values up to the largest, of both signs: none may be taken for a bad one.
            std::vector<std::uint32_t> bits(n);
            for (std::size_t i = 0; i < n; ++i)
                bits[i] = (i % 3 == 0 ? w.largest_finite - i % 7 : i) | (i % 2 ? negative : 0u);
            ASSERT_EQ(scan(w.dtype, bits), oracle(w.dtype, bits)) << "all finite, n = " << n;
            ASSERT_FALSE(oracle(w.dtype, bits).has_value());
            for (std::size_t at = 0; at < n; ++at) {
                const std::uint32_t bad[] = {w.infinity, w.infinity | negative, w.quiet_nan, w.signalling_nan};
                std::vector<std::uint32_t> b = bits;
                b[at] = bad[at % 4];
                if (at + 300 < n) b[at + 300] = w.quiet_nan;  // a later one must not win
                ASSERT_EQ(scan(w.dtype, b), oracle(w.dtype, b))
                    << "dtype " << int(w.dtype) << ", n = " << n << ", at " << at;
                ASSERT_EQ(oracle(w.dtype, b), std::optional<std::size_t>(at));
            }
        }
    }
}

}  // namespace
