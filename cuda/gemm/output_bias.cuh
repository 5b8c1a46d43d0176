// The W4A4 GEMMs' final store: the bias step (output_bias.h) and the write of y as float32 or
// BF16, shared by the decode and prefill kernels, the split-K reduction and the reference path's
// finishing kernel, and compiled on the CPU by the emulation test like the kernels that use it.
#pragma once

#include <cstddef>
#include <cstdint>

#if !defined(WUSH_CUDA_HOST_EMULATION)
#  include <cuda_bf16.h>
#endif

#include "common/float_bits.h"
#include "output_bias.h"

namespace wush::cuda {

// v + bias[col] in float32, before the caller rounds to y's dtype; v itself without a bias (not
// v + 0.0, which would turn -0.0 into +0.0). A NaN/Inf bias element is reported (it still
// reaches y: the launch's outputs are unspecified once a non-finite input is reported).
__device__ __forceinline__ float add_bias(const OutputBias& b, std::size_t col, float v) {
    if (b.data == nullptr) return v;
    float x;
    if (b.dtype == WUSH_DTYPE_F32) {
        x = static_cast<const float*>(b.data)[col];
    } else {
        const std::uint16_t h = static_cast<const std::uint16_t*>(b.data)[col];
        x = b.dtype == WUSH_DTYPE_BF16 ? bits::bf16_decode(h) : bits::f16_decode(h);
    }
    if ((bits::bits_from_float(x) & 0x7F800000u) == 0x7F800000u)
        atomicMin(b.non_finite, (kBiasReportRow << 32) | static_cast<unsigned long long>(col));
    return v + x;
}

// y[idx] = v, as float32 or rounded to nearest even in BF16.
__device__ __forceinline__ void store_out(void* y, int bf16, std::size_t idx, float v) {
    if (bf16) static_cast<__nv_bfloat16*>(y)[idx] = __float2bfloat16_rn(v);
    else static_cast<float*>(y)[idx] = v;
}

}  // namespace wush::cuda
