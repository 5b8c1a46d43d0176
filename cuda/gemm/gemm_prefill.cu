// The prefill W4A4 GEMM (large m): INT8 tensor-core MMAs on the doubled codes, one exact MMA per
// group (mma.sync m16n8k32 s8 for G = 32, m16n8k16 s8 for NVFP4's G = 16), each group's int32
// result promoted to float32 with the two group scales (alpha / 4 folded into the weight scales)
// and accumulated in float32.
//
// Geometry (cuda/gemm/gemm_plan.h): block tile 128 activation rows x 128 weight rows, 128 elements (64
// packed bytes per row) per stage, 3 stages of cp.async (16-byte copies, zero-filled past m, n, k),
// 8 warps as 2 (m) x 4 (n) warp tiles of 64 x 32 = 4 x 4 MMAs per group. The packed codes stay
// packed in shared memory (half the bytes of int8); each warp decodes its fragments with two
// prmt per 4 elements (cuda/gemm/tile_decode.h). The element order inside a group is permuted
// identically for both operands (tile::group_element_of_slot), so that a thread's fragment is one
// 32-bit shared load per row and group. Rows are padded to 80 bytes: conflict-free loads.
// A first small kernel decodes both operands' group scales to float32 in the workspace, rows
// padded to a whole stage, so that each stage's scales are 16-byte copies too.
// Each MMA's accumulator starts at tile::kPromoteMagicBits (1.5 * 2^23 as float bits), so that
// one FFMA with the activation scale, fma(acc_bits, sa, -1.5 * 2^23 * sa), yields dot * sa exactly
// (tile::scaled_dot: the scales have at most 8 significant bits), and a second FFMA with the weight
// scale accumulates: 2 FP32 ops per element and group, no I2F (a quarter of the FP32 rate). If an
// activation scale is at or past 2^100 (1.5 * 2^23 * sa would overflow) the scales kernel raises
// a flag and the tile kernel promotes with FADD + FMUL + FFMA instead (uniform branch per group).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>

#include "common/error.h"
#include "cuda_check.h"
#include "gemm_plan.h"
#include "gemm_prefill_kernel.cuh"
#include "w4a4_gemm.h"

namespace wush::cuda {

namespace {

using namespace wush::cuda::prefill_detail;

// Raising the dynamic shared-memory limit is a per-function, per-device attribute: set once per
// context (configure_prefill_gemm) or, for a caller that did not, before each launch.
template <int G>
void set_smem_limit() {
    const cudaError_t e =
        cudaFuncSetAttribute(prefill_gemm_kernel<G>, cudaFuncAttributeMaxDynamicSharedMemorySize, Layout<G>::kSmem);
    if (e != cudaSuccess)
        fail(WUSH_ERR_CUDA, std::string("cudaFuncSetAttribute(prefill_gemm_kernel): ") + cudaGetErrorString(e));
}

template <int G>
void launch_tiles(const PrefillParams& p, dim3 grid, bool configured, cudaStream_t stream) {
    if (!configured) set_smem_limit<G>();
    prefill_gemm_kernel<G><<<grid, kThreads, Layout<G>::kSmem, stream>>>(p);
}

}  // namespace

void configure_prefill_gemm() {
    set_smem_limit<16>();
    set_smem_limit<32>();
}

void launch_prefill_gemm(const GemmArgs& a, cudaStream_t stream, const GemmDevice& device) {
    const int sm = device.sm != 0 ? device.sm : current_sm("launch_prefill_gemm");
    if (!gemm_supported(GemmKernel::Prefill, a, sm))
        fail(WUSH_ERR_UNSUPPORTED, "launch_prefill_gemm: unsupported format, shape, alignment or workspace");
    const std::size_t grid_m = plan::ceil_div(a.m, BM), grid_n = plan::ceil_div(a.n, BN);
    if (grid_m > 65535 || grid_n > 0x7FFFFFFFu || a.m > 0x3FFFFFFFu || a.n > 0x3FFFFFFFu)
        fail(WUSH_ERR_UNSUPPORTED, "launch_prefill_gemm: shape too large for the grid");
    const long long stride = (long long)plan::prefill_scale_stride(a.k, a.group);
    float* scales = static_cast<float*>(a.workspace);
    int* flag = reinterpret_cast<int*>(static_cast<std::uint8_t*>(a.workspace) +
                                       plan::prefill_flag_offset(a.m, a.n, a.k, a.group));
    const float alpha_q = a.alpha * 0.25f;
    {
        const cudaError_t e = cudaMemsetAsync(flag, 0, sizeof(int), stream);
        if (e != cudaSuccess)
            fail(WUSH_ERR_CUDA, std::string("launch_prefill_gemm: cudaMemsetAsync: ") + cudaGetErrorString(e));
        const std::size_t total = (a.m + a.n) * std::size_t(stride);
        const unsigned blocks = unsigned(std::min<std::size_t>(plan::ceil_div(total, 256), 8192));
        prefill_scales_kernel<<<blocks, 256, 0, stream>>>(a.format, int(a.m), int(a.n), (long long)(a.k / a.group),
                                                          stride, a.a_scales, a.w_scales, alpha_q, scales, flag);
        check_launch("prefill_scales_kernel");
    }
    PrefillParams p;
    p.m = int(a.m);
    p.n = int(a.n);
    p.k = (long long)a.k;
    p.format = a.format;
    p.a_codes = a.a_codes;
    p.w_codes = a.w_codes;
    p.a_scales = scales;
    p.w_scales = scales + a.m * std::size_t(stride);
    p.stride = stride;
    p.flag = flag;
    p.y = a.y;
    p.y_bf16 = a.y_dtype == WUSH_DTYPE_BF16;
    p.bias = a.bias;
    const dim3 grid{unsigned(grid_n), unsigned(grid_m), 1u};
    if (a.group == 16) launch_tiles<16>(p, grid, device.prefill_configured, stream);
    else launch_tiles<32>(p, grid, device.prefill_configured, stream);
    check_launch("prefill_gemm_kernel");
}

}  // namespace wush::cuda
