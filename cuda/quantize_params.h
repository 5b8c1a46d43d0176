// The fused quantize kernel's arguments (cuda/quantize_kernel.cuh), as plain C++ so that the CPU
// emulation test (tests/unit/test_quantize_emulation.cpp) builds them without CUDA headers.
#pragma once

#include <cstddef>
#include <cstdint>

#include "transforms/matrix_use.h"
#include "wush/wush.h"

namespace wush::cuda {

// The non-finite report of the quantize kernels: the smallest (row << 32 | column) of a NaN/Inf
// seen in x, or kNoNonFinite. Lives in device memory; reset to all ones (0xFF bytes).
constexpr unsigned long long kNoNonFinite = ~0ull;

struct QuantizeArgs {
    wush_format format = WUSH_FORMAT_MXFP4;
    int group = 32;                       // G (16 or 32)
    wush_dtype x_dtype = WUSH_DTYPE_F32;  // F32, F16 or BF16 (x aligned to its element size)
    const void* x = nullptr;              // n_tokens x d_in, row-major
    std::size_t n_tokens = 0, d_in = 0;
    MatrixUse use = MatrixUse::None;
    const float* matrices = nullptr;           // PerBlock: C x G x G; Shared: G x G; Identity: unused
    const float* row_norms = nullptr;          // one max_row_norm_bound per matrix (same layout rule)
    std::uint8_t* codes = nullptr;             // n_tokens x d_in / 2 (any alignment)
    std::uint8_t* scales = nullptr;            // n_tokens x C x scale bytes (any alignment)
    unsigned long long* non_finite = nullptr;  // see kNoNonFinite (atomicMin)
};

}  // namespace wush::cuda
