// The CUDA backend's own kernels (quantize, reference GEMM, block-scaled cuBLASLt GEMM,
// calibration), as cuda_backend.cpp and tests/gpu/ call them. Device pointers throughout; every
// launch_* enqueues on `stream` without synchronizing or allocating (graph-capturable).
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "gemm/w4a4_gemm.h"
#include "quantize/quantize_params.h"
#include "wush/wush.h"

namespace wush::cuda {

// ---- fused transform + quantization (quantize_kernel.cu) -------------------------------------

// QuantizeArgs, kNoNonFinite: quantize_params.h (shared with the CPU emulation test).
// Runs the quantize kernel `kernel` names (a row of the kernel table: quantize_pick); throws
// UNSUPPORTED where that kernel cannot take the launch (the tensor-core kernel without
// quantize_tc_applies, the small-m kernel above its token limit).
void launch_quantize(const QuantizeArgs& args, Kernel kernel, cudaStream_t stream);
// ... the default choices' kernel (the CUDA-core kernels by m).
void launch_quantize(const QuantizeArgs& args, cudaStream_t stream);

// ---- the tensor-core quantize (quantize_tc.cu; sm_80+, BF16 / F16 x, a matrix transform) ------
// Usable where quantize_tc_applies(args): the caller gave the split matrices (tc_fragments,
// tc_norms), which the backend does only after a passed accumulator probe.
bool quantize_tc_applies(const QuantizeArgs& args);
void launch_quantize_tc(const QuantizeArgs& args, cudaStream_t stream);
// One m16n8k16 BF16 MMA per probe case against the exact sum: the largest error as a fraction of
// the accumulator model's bound (tc::mma_instruction_error); passed when no output exceeds it.
struct TcProbeResult {
    bool passed = false;
    double worst_ratio = 0.0;
    std::size_t outputs = 0, inexact = 0;
};
TcProbeResult run_tc_accumulator_probe(cudaStream_t stream);

// ---- reference GEMM (reference_gemm.cu) ------------------------------------------------------

// Bytes per dequantized element: 2 (bf16, MXFP4 / NVFP4 / MXFP4_OCP) or 4 (float32, INT4).
std::size_t dequantized_element_bytes(wush_format format);

// Dequantizes rows x k packed values (code x group scale, no per-tensor factor) into `out`
// (rows x k of bf16 or float32, see dequantized_element_bytes). Exact (cuda/gemm/dequantize.h).
void launch_dequantize(wush_format format, int group, const std::uint8_t* codes, const std::uint8_t* scales,
                       std::size_t rows, std::size_t k, void* out, cudaStream_t stream);

// Workspace of launch_reference_gemm: A dequantized, W dequantized unless given, and a float32
// product when the finishing kernel writes y: with a bias, or for INT4 with a BF16 y (the bf16
// formats without a bias have cuBLAS write BF16 itself).
std::size_t reference_gemm_workspace_bytes(wush_format format, std::size_t m, std::size_t n, std::size_t k,
                                           bool w_dequantized_given, wush_dtype y_dtype, bool bias = false);

// Y = alpha * deq(A) deq(W)^T with cuBLAS (bf16 x bf16 -> float32 accumulate, or float32
// pedantic for INT4). `w_dequantized` (n x k, from launch_dequantize) may be null: then W is
// dequantized into the workspace. `handle` must already be bound to `stream`.
void launch_reference_gemm(const GemmArgs& args, const void* w_dequantized, cublasHandle_t handle, cudaStream_t stream);

// ---- block-scaled FP4 GEMM through cuBLASLt (blockscaled_gemm.cu; untested on hardware) ----------

// Workspace of BlockScaledCache::launch: cuBLASLt's own (kBlockScaledLtWorkspaceBytes, the most
// any algorithm chosen may use), and both operands' scales in its tiled layout.
constexpr std::size_t kBlockScaledLtWorkspaceBytes = std::size_t(32) << 20;
std::size_t blockscaled_gemm_workspace_bytes(wush_format format, std::size_t m, std::size_t n, std::size_t k);
// Architecture and shape rules (no cuBLASLt call).
bool blockscaled_gemm_supported(const GemmArgs& args, int sm);
// rows x k/G group scales rewritten into cuBLASLt's 128x4-tiled layout (`out` holds
// blockscaled_scale_bytes); used once per prepared layer for the weight.
std::size_t blockscaled_scale_bytes(std::size_t rows, std::size_t k, int group);
void launch_swizzle_scales(const std::uint8_t* scales, std::size_t rows, std::size_t k, int group, std::uint8_t* out,
                           cudaStream_t stream);

// The cuBLASLt descriptors and chosen algorithm of one weight's block-scaled products, per token
// count m and output dtype (the m bucket is m itself: descriptors carry m), built at the first
// product of that m and kept (at most kMaxEntries; the oldest are dropped beyond), so that a
// launch runs no heuristic and a graph replays the same algorithm. Host state only; not
// thread-safe (calls on one context are serialized).
class BlockScaledCache {
public:
    static constexpr std::size_t kMaxEntries = 64;
    BlockScaledCache();
    ~BlockScaledCache();
    BlockScaledCache(const BlockScaledCache&) = delete;
    BlockScaledCache& operator=(const BlockScaledCache&) = delete;

    // Enqueues the product on `stream` (w_scales_swizzled: the weight's scales from
    // launch_swizzle_scales; null: rewritten into the workspace). Returns false when cuBLASLt
    // offers no algorithm for this m or refuses the launch (remembered per m: later calls return
    // false at once): the caller then runs the reference path, whose workspace it must have sized.
    bool launch(const GemmArgs& args, const std::uint8_t* w_scales_swizzled, cublasLtHandle_t handle,
                cudaStream_t stream);

private:
    struct Entry;
    struct Impl;
    Impl* impl_;
};

// ---- calibration (calibrate.cu) ----------------------------------------------------------------

// Adds the float64 second-moment sums of n_tokens x d_in activations x to `sums` (device):
// block diagonal: C G x G blocks; full: d_in x d_in (column-major lower = row-major upper).
// `scratch` holds tile_tokens x d_in doubles. Synchronous only through the caller.
void launch_moment_sums(bool full, std::size_t d_in, std::size_t group, wush_dtype x_dtype, const void* x,
                        std::size_t n_tokens, double* sums, double* scratch, std::size_t tile_tokens,
                        unsigned long long* non_finite, cublasHandle_t handle, cudaStream_t stream);

}  // namespace wush::cuda
