// Dense matrices handed over at the API (f32, f16 or bf16): checked for NaN/Inf and seen as float32
// by the core, converting only when the caller's dtype is not already f32.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "common/checked_math.h"
#include "common/dtype.h"
#include "guard.h"

namespace wush::capi {

class FloatMatrix {
public:
    FloatMatrix(wush_dtype dtype, const void* data, std::size_t rows, std::size_t cols, const char* name) {
        require_pointer(data, name);
        const std::size_t n = checked_mul(rows, cols, name);
        dtype_size(dtype);  // validates the dtype
        require_finite(dtype, data, rows, cols, name);
        if (dtype == WUSH_DTYPE_F32) {
            view_ = {static_cast<const float*>(data), n};
        } else {
            owned_.resize(n);
            to_float(dtype, data, 0, owned_);
            view_ = owned_;
        }
    }
    std::span<const float> span() const noexcept { return view_; }

private:
    std::vector<float> owned_;
    std::span<const float> view_;
};

}  // namespace wush::capi
