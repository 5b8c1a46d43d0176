// The BF16 prefill GEMM (cuda/gemm/gemm_bf16_prefill.cu; device code in gemm_bf16_prefill_kernel.cuh):
// for m > 32 on sm_80+, the E2M1 formats only (MXFP4, MXFP4_OCP, NVFP4), the weight's 4-bit codes
// converted to BF16 in registers and multiplied by BF16 tensor cores with float32 accumulation,
// the activations dequantized exactly to BF16 first. It replaces the reference path's per-forward
// dequantization of W and its cuBLAS call. Opt-in (WUSH_CONTEXT_CUDA_BF16_PREFILL = 1, read
// at prepare) until a GPU measures it; the reference path otherwise.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "w4a4_gemm.h"

namespace wush::cuda {

// Device scratch: the activations as BF16 (m x k) and W's scales as BF16 pairs.
std::size_t bf16_prefill_workspace_bytes(wush_format format, std::size_t m, std::size_t n, std::size_t k);

// Whether the kernel can run this product on compute capability `sm` with the workspace given.
bool bf16_prefill_supported(const GemmArgs& args, int sm);

// Enqueues the product on `stream` (no allocation, no synchronization: graph-capturable); throws
// wush::Error(UNSUPPORTED) if !bf16_prefill_supported, wush::Error(CUDA) if a launch fails.
void launch_bf16_prefill_gemm(const GemmArgs& args, int sm, cudaStream_t stream);

}  // namespace wush::cuda
