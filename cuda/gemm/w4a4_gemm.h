// The W4A4 GEMM kernels of the CUDA backend and how the backend picks one (cuda/gemm_*.cu).
//
// Operands are in device memory, in the packed layouts of wush_quantize_rows: codes row-major,
// k/2 bytes per row (element 2j in the low nibble of byte j), group scales row-major, k/G scales
// per row of format_scale_bytes each (E8M0 / E4M3 bytes, or little-endian BF16 for INT4).
//   Y (m x n, row-major, F32 or BF16) = alpha * sum_groups sa * sw * <a_group, w_group>
// where alpha is the product of both operands' per-tensor factors (1/9 MXFP4, 1/100 NVFP4,
// 1 INT4 and MXFP4_OCP) and the element values are E2M1 values or INT4 midrise levels q + 0.5.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "gemm_table.h"
#include "output_bias.h"
#include "wush/wush.h"

namespace wush::cuda {

struct GemmArgs {
    wush_format format = WUSH_FORMAT_MXFP4;
    int group = 32;                          // G: 32 (MXFP4, MXFP4_OCP, INT4) or 16 (NVFP4)
    std::size_t m = 0, n = 0, k = 0;         // k = d_in (a multiple of G), n = d_out
    const std::uint8_t* a_codes = nullptr;   // m x k/2
    const std::uint8_t* a_scales = nullptr;  // m x k/G x scale bytes
    const std::uint8_t* w_codes = nullptr;   // n x k/2
    const std::uint8_t* w_scales = nullptr;  // n x k/G x scale bytes
    float alpha = 1.0f;
    void* y = nullptr;                    // m x n
    wush_dtype y_dtype = WUSH_DTYPE_F32;  // F32 or BF16
    OutputBias bias;                      // added to every row in float32 before the rounding to y_dtype
    void* workspace = nullptr;            // device scratch of workspace_bytes (split-K partials, ...)
    std::size_t workspace_bytes = 0;
};

// The operands the two decode kernels read alike (DecodeOperands, gemm/decode_group_dot.cuh, the
// base of their parameters), from a GemmArgs the launch has checked: one fill, so that both
// kernels see the same shape, scales and alpha / 4 (the doubled values on both sides). The prefill
// kernels read pre-scaled float32 scales instead and fill their own. A template: this header is
// the host's, the parameters' header the kernels'.
template <class DecodeOperands>
void fill_decode_operands(DecodeOperands& p, const GemmArgs& a) {
    p.format = a.format;
    p.m = int(a.m);
    p.n = int(a.n);
    p.k = (long long)a.k;
    p.a_codes = a.a_codes;
    p.a_scales = a.a_scales;
    p.alpha_q = a.alpha * 0.25f;
    p.y = a.y;
    p.y_bf16 = a.y_dtype == WUSH_DTYPE_BF16;
    p.bias = a.bias;
}

// Device scratch a kernel needs for (m, n, k) in `format`; 0 when none.
std::size_t gemm_workspace_bytes(GemmKernel kernel, wush_format format, std::size_t m, std::size_t n, std::size_t k);

// Whether `kernel`'s architecture, format and shape rules admit the product (operand pointers,
// where set, must be 16-byte aligned; no workspace check: the backend sizes the workspace from the
// kernel chosen). The streaming decode and BF16 prefill kernels check their operands and what was
// prepared in stream_decode_supported / bf16_prefill_supported.
bool gemm_shape_supported(GemmKernel kernel, const GemmArgs& args, int sm);

// Whether `kernel` can run this product on a device of compute capability `sm` (e.g. 90, 80, 100).
bool gemm_supported(GemmKernel kernel, const GemmArgs& args, int sm);

// The kernel of the first GEMM row of `table` (gemm_table.h, an active_table; null: the default
// choices) for the architecture and m whose kernel admits the shape (gemm_shape_supported), else
// Reference. BlockScaledLt rules apply where cuBLASLt offers an algorithm (`blockscaled_available`,
// probed by the backend). Operand pointers, where set, must suit the kernel (16-byte aligned code
// rows) or Reference is chosen.
GemmKernel pick_gemm(const GemmArgs& args, int sm, bool blockscaled_available = true,
                     const KernelTable* table = nullptr);

// What a caller that launches often (the backend's per-context Device) knows of the current
// device, so that a launch makes no device query: its compute capability (0: queried per launch)
// and whether configure_prefill_gemm() ran on it (false: every prefill launch sets the attribute).
struct GemmDevice {
    int sm = 0;
    bool prefill_configured = false;
};

// Raises the prefill kernels' dynamic shared-memory limit on the current device (a function
// attribute of each instantiation, per device); throws wush::Error(CUDA) if refused.
void configure_prefill_gemm();

// Enqueues the product on `stream`: no host synchronization, no allocation (graph-capturable).
// Throws wush::Error(CUDA) if a launch fails, UNSUPPORTED if !gemm_supported().
void launch_decode_gemm(const GemmArgs& args, cudaStream_t stream, const GemmDevice& device = {});
void launch_prefill_gemm(const GemmArgs& args, cudaStream_t stream, const GemmDevice& device = {});

// The decode kernel with k cut into splits of `chunks_per_split` chunks of plan::kDecodeChunk
// elements (clamped to 1..chunks) instead of plan::plan_decode's: the same kernel and reduce, so
// the bits of any partition of k. The streaming decode kernel's tests use it as their reference
// (stream::split_plan). The workspace must hold splits x m x n float32 when it splits.
void launch_decode_gemm_split(const GemmArgs& args, std::size_t chunks_per_split, cudaStream_t stream,
                              const GemmDevice& device = {});

}  // namespace wush::cuda
