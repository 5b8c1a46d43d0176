#include "common/dtype.h"

#include <cmath>
#include <cstdint>
#include <string>

#include "common/checked_math.h"
#include "common/error.h"
#include "common/float_bits.h"

namespace wush {

std::size_t dtype_size(wush_dtype dtype) {
    switch (dtype) {
        case WUSH_DTYPE_F32: return 4;
        case WUSH_DTYPE_F16:
        case WUSH_DTYPE_BF16: return 2;
        default: break;  // out-of-range values are handled after the switch
    }
    fail(WUSH_ERR_INVALID_ARGUMENT, "unknown wush_dtype " + std::to_string(int(dtype)));
}

const char* dtype_name(wush_dtype dtype) {
    switch (dtype) {
        case WUSH_DTYPE_F32: return "f32";
        case WUSH_DTYPE_F16: return "f16";
        case WUSH_DTYPE_BF16: return "bf16";
        default: break;  // out-of-range values are handled after the switch
    }
    return "unknown";
}

void require_output_dtype(wush_dtype y_dtype) {
    dtype_size(y_dtype);  // validates
    if (y_dtype != WUSH_DTYPE_F32 && y_dtype != WUSH_DTYPE_BF16)
        fail(WUSH_ERR_INVALID_ARGUMENT, std::string("y_dtype must be F32 or BF16, got ") + dtype_name(y_dtype));
}

void to_float(wush_dtype dtype, const void* src, std::size_t offset, std::span<float> out) {
    switch (dtype) {
        case WUSH_DTYPE_F32: {
            const float* p = static_cast<const float*>(src) + offset;
            for (std::size_t i = 0; i < out.size(); ++i) out[i] = p[i];
            return;
        }
        case WUSH_DTYPE_F16: {
            const std::uint16_t* p = static_cast<const std::uint16_t*>(src) + offset;
            for (std::size_t i = 0; i < out.size(); ++i) out[i] = bits::f16_decode(p[i]);
            return;
        }
        case WUSH_DTYPE_BF16: {
            const std::uint16_t* p = static_cast<const std::uint16_t*>(src) + offset;
            for (std::size_t i = 0; i < out.size(); ++i) out[i] = bits::bf16_decode(p[i]);
            return;
        }
        default: break;  // out-of-range values are handled after the switch
    }
    fail(WUSH_ERR_INVALID_ARGUMENT, "unknown wush_dtype " + std::to_string(int(dtype)));
}

namespace {

// Exponent field all ones = Inf or NaN, for each width. Blocks of a fixed size are first tested
// without an early exit, so the compiler vectorizes the scan (the runtime checks every product
// it returns): adding the exponent's lowest bit to the masked exponent carries into the bit
// above it (the sign bit) exactly when the exponent is all ones, and the OR of those sums is one
// branch-free reduction. Only a block that holds a non-finite value is searched element by
// element.
template <typename Bits, Bits kExpMask>
std::optional<std::size_t> first_all_ones_exponent(const void* src, std::size_t count) {
    constexpr Bits kLowest = Bits(kExpMask & (~kExpMask + 1));
    constexpr Bits kCarry = Bits(kExpMask + kLowest);
    static_assert(kCarry == Bits(Bits(1) << (8 * sizeof(Bits) - 1)), "the exponent sits just below the sign bit");
    constexpr std::size_t kBlock = 256;
    const Bits* p = static_cast<const Bits*>(src);
    for (std::size_t b = 0; b < count; b += kBlock) {
        const std::size_t n = count - b < kBlock ? count - b : kBlock;
        Bits any = 0;
        if (n == kBlock)
            for (std::size_t i = 0; i < kBlock; ++i) any |= Bits((p[b + i] & kExpMask) + kLowest);
        else
            for (std::size_t i = 0; i < n; ++i) any |= Bits((p[b + i] & kExpMask) + kLowest);
        if ((any & kCarry) == 0) continue;
        for (std::size_t i = b; i < b + n; ++i)
            if ((p[i] & kExpMask) == kExpMask) return i;
    }
    return std::nullopt;
}

}  // namespace

std::optional<std::size_t> find_non_finite(wush_dtype dtype, const void* src, std::size_t count) {
    switch (dtype) {
        case WUSH_DTYPE_F32: return first_all_ones_exponent<std::uint32_t, 0x7F800000u>(src, count);
        case WUSH_DTYPE_F16: return first_all_ones_exponent<std::uint16_t, 0x7C00u>(src, count);
        case WUSH_DTYPE_BF16: return first_all_ones_exponent<std::uint16_t, 0x7F80u>(src, count);
        default: break;  // out-of-range values are handled after the switch
    }
    fail(WUSH_ERR_INVALID_ARGUMENT, "unknown wush_dtype " + std::to_string(int(dtype)));
}

void require_finite(wush_dtype dtype, const void* src, std::size_t rows, std::size_t cols, const char* what) {
    const auto bad = find_non_finite(dtype, src, checked_mul(rows, cols, "matrix size"));
    if (!bad) return;
    fail(WUSH_ERR_NON_FINITE, std::string(what) + " holds a NaN or infinite value at row " +
                                  std::to_string(*bad / cols) + ", column " + std::to_string(*bad % cols));
}

}  // namespace wush
