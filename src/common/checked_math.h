// Size arithmetic that reports overflow instead of wrapping (shape products, buffer sizes).
#pragma once

#include <cstddef>
#include <string>

#include "common/error.h"

namespace wush {

inline std::size_t checked_mul(std::size_t a, std::size_t b, const char* what) {
    std::size_t r = 0;
    if (__builtin_mul_overflow(a, b, &r)) fail(WUSH_ERR_INVALID_ARGUMENT, std::string(what) + " overflows size_t");
    return r;
}

inline std::size_t checked_add(std::size_t a, std::size_t b, const char* what) {
    std::size_t r = 0;
    if (__builtin_add_overflow(a, b, &r)) fail(WUSH_ERR_INVALID_ARGUMENT, std::string(what) + " overflows size_t");
    return r;
}

}  // namespace wush
