// Dense element types at the API (f32, f16, bf16): sizes, conversion to float, finiteness checks.
#pragma once

#include <cstddef>
#include <optional>
#include <span>

#include "wush/wush.h"

namespace wush {

// Bytes per element; throws wush::Error(INVALID_ARGUMENT) for an unknown dtype.
std::size_t dtype_size(wush_dtype dtype);
const char* dtype_name(wush_dtype dtype);

// The outputs of the runtime's products (GEMM, linear forward) are F32 or BF16: throws
// INVALID_ARGUMENT naming the dtype otherwise. The one statement of that rule, for the C API's
// argument checks and every backend.
void require_output_dtype(wush_dtype y_dtype);

// Converts `out.size()` elements starting at element `offset` of `src` to float (exact).
void to_float(wush_dtype dtype, const void* src, std::size_t offset, std::span<float> out);

// Index of the first NaN/Inf among `count` elements of `src`, if any.
std::optional<std::size_t> find_non_finite(wush_dtype dtype, const void* src, std::size_t count);

// Throws wush::Error(NON_FINITE) naming row and column of the first NaN/Inf in a rows x cols
// matrix, with `what` naming the argument.
void require_finite(wush_dtype dtype, const void* src, std::size_t rows, std::size_t cols, const char* what);

}  // namespace wush
