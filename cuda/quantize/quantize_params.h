// The fused quantize kernel's arguments (cuda/quantize/quantize_kernel.cuh), as plain C++ so that the CPU
// emulation test (tests/unit/test_quantize_emulation.cpp) builds them without CUDA headers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "bf16_fragments.h"
#include "transforms/matrix_use.h"
#include "wush/wush.h"

namespace wush::cuda {

// The non-finite report of the quantize kernels: the smallest (row << 32 | column) of a NaN/Inf
// seen in x, or kNoNonFinite. Lives in device memory; reset to all ones (0xFF bytes).
constexpr unsigned long long kNoNonFinite = ~0ull;

// The matrices as the quantize kernels read them: each G x G matrix T transposed (T[i][j] at
// j * G + i), so that the kernels copy them to shared memory as they are, and a warp's lanes read
// a column of T (the outputs of one input) from consecutive addresses.
inline std::vector<float> kernel_matrices(const float* m, std::size_t count, int g) {
    std::vector<float> t(count * std::size_t(g) * std::size_t(g));
    for (std::size_t b = 0; b < count; ++b)
        for (int i = 0; i < g; ++i)
            for (int j = 0; j < g; ++j) t[(b * g + j) * g + i] = m[(b * g + i) * g + j];
    return t;
}

struct QuantizeArgs {
    wush_format format = WUSH_FORMAT_MXFP4;
    int group = 32;                       // G (16 or 32)
    wush_dtype x_dtype = WUSH_DTYPE_F32;  // F32, F16 or BF16 (x aligned to its element size)
    const void* x = nullptr;              // n_tokens x d_in, row-major
    std::size_t n_tokens = 0, d_in = 0;
    MatrixUse use = MatrixUse::None;
    const float* matrices = nullptr;           // PerBlock: C x G x G; Shared: G x G; Identity: unused;
                                               // each T transposed (kernel_matrices), 16-byte aligned
    const float* row_norms = nullptr;          // one max_row_norm_bound per matrix (same layout rule)
    std::uint8_t* codes = nullptr;             // n_tokens x d_in / 2 (any alignment)
    std::uint8_t* scales = nullptr;            // n_tokens x C x scale bytes (any alignment)
    unsigned long long* non_finite = nullptr;  // see kNoNonFinite (atomicMin)
    // The tensor-core kernel's operands (cuda/quantize/quantize_tc_kernel.cuh), same layout rule as
    // `matrices`: tc::fragment_words(G) words per matrix (tc::pack_fragments) and its part norms.
    const std::uint32_t* tc_fragments = nullptr;
    const tc::PartNorms* tc_norms = nullptr;
    float tc_bound_scale = 1.0f;  // 1 always; tests set 0.5 to show that a halved bound fails
};

// The one switch from a run-time format to the quantize kernels' template argument (both launch
// files): calls f(std::integral_constant<wush_format, F>{}) for `format`; false, and f not called,
// for a format the kernels do not serve.
template <class Launch>
bool with_quantize_format(wush_format format, Launch&& f) {
    switch (format) {
        case WUSH_FORMAT_MXFP4: f(std::integral_constant<wush_format, WUSH_FORMAT_MXFP4>{}); return true;
        case WUSH_FORMAT_MXFP4_OCP: f(std::integral_constant<wush_format, WUSH_FORMAT_MXFP4_OCP>{}); return true;
        case WUSH_FORMAT_NVFP4: f(std::integral_constant<wush_format, WUSH_FORMAT_NVFP4>{}); return true;
        case WUSH_FORMAT_INT4: f(std::integral_constant<wush_format, WUSH_FORMAT_INT4>{}); return true;
        default: return false;
    }
}

}  // namespace wush::cuda
