// The optional bias of the W4A4 GEMMs' final store (wush_linear_run_bias), as the kernels read it:
// plain C++, so that the CPU emulation test (tests/unit/test_gemm_emulation.cpp) builds it without
// CUDA headers. The device function that applies it is in output_bias.cuh.
#pragma once

#include "wush/wush.h"

namespace wush::cuda {

// A NaN/Inf bias element is reported through the backend's non-finite flag (quantize_params.h:
// the smallest row << 32 | column wins) with this row: above every token row, so that a NaN in
// x of the same launch is the one reported. cuda_backend.cpp names it "bias" in the message.
constexpr unsigned long long kBiasReportRow = 0xFFFFFFFEull;

struct OutputBias {
    const void* data = nullptr;                // n values aligned to their size; nullptr: no bias
    wush_dtype dtype = WUSH_DTYPE_F32;         // F32, F16 or BF16
    unsigned long long* non_finite = nullptr;  // the backend's flag (atomicMin)
};

}  // namespace wush::cuda
