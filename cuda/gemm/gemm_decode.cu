// The decode W4A4 GEMM (small m): streams the weight's packed codes once with 16-byte loads and
// multiplies them with up to 16 activation rows per pass, exactly per group in int32 (dp4a on the
// doubled int8 values of cuda/gemm/tile_decode.h), promoted to float32 once per group.
//
// Geometry (cuda/gemm/gemm_plan.h): a block of 8 warps owns 16 weight rows (2 per warp) and one split of
// k; it walks its split in chunks of 1024 elements. Per chunk, each lane issues one 16-byte load of
// codes per weight row (32 elements = one G = 32 group or two NVFP4 groups) before the block
// decodes the chunk's activations (m x 1024 int8 plus float scales) into shared
// memory; then each lane decodes its weight words (6 integer ops per 4 elements), and per
// activation row does 2 conflict-free LDS.128 and 8 dp4a started from the promotion magic, then one
// FADD + FMUL + FFMA. A warp reduction by shuffles ends the block. Where one wave of blocks is not
// enough (n / 16 * passes < 528), k is split: partials go to the workspace and a second kernel sums
// them in split order (deterministic, no atomics).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "common/error.h"
#include "cuda_check.h"
#include "gemm_decode_kernel.cuh"
#include "gemm_plan.h"
#include "w4a4_gemm.h"

namespace wush::cuda {

namespace {

using namespace wush::cuda::decode_detail;

template <int G>
void launch_mr(int mr, dim3 grid, const DecodeParams& p, cudaStream_t stream) {
    switch (mr) {
        case 1: decode_gemm_kernel<1, G><<<grid, kThreads, 0, stream>>>(p); break;
        case 2: decode_gemm_kernel<2, G><<<grid, kThreads, 0, stream>>>(p); break;
        case 4: decode_gemm_kernel<4, G><<<grid, kThreads, 0, stream>>>(p); break;
        case 8: decode_gemm_kernel<8, G><<<grid, kThreads, 0, stream>>>(p); break;
        default: decode_gemm_kernel<16, G><<<grid, kThreads, 0, stream>>>(p); break;
    }
}

}  // namespace

namespace {

// The launch with partition `pl` (plan::plan_decode's, or another of the same shape).
void launch_with_plan(const GemmArgs& a, const plan::DecodePlan& pl, cudaStream_t stream, const GemmDevice& device,
                      const char* who) {
    const int sm = device.sm != 0 ? device.sm : current_sm(who);
    if (!gemm_shape_supported(GemmKernel::Decode, a, sm) || !a.a_codes || !a.w_codes || !a.a_scales || !a.w_scales ||
        !a.y)
        fail(WUSH_ERR_UNSUPPORTED, std::string(who) + ": unsupported format, shape or alignment");
    if (pl.splits > 1 && (a.workspace == nullptr || a.workspace_bytes < pl.splits * a.m * a.n * sizeof(float) ||
                          reinterpret_cast<std::uintptr_t>(a.workspace) % 16 != 0))
        fail(WUSH_ERR_UNSUPPORTED, std::string(who) + ": workspace too small or not 16-byte aligned");
    if (pl.blocks_n > 0x7FFFFFFFu || pl.splits > 65535 || pl.row_passes > 65535 || a.m > 0x7FFFFFFFu ||
        a.n > 0x7FFFFFFFu)
        fail(WUSH_ERR_UNSUPPORTED, std::string(who) + ": shape too large for the grid");
    DecodeParams p;
    fill_decode_operands(p, a);
    p.w_codes = a.w_codes;
    p.w_scales = a.w_scales;
    p.partial = pl.splits > 1 ? static_cast<float*>(a.workspace) : nullptr;
    p.split_len = (long long)(pl.chunks_per_split * plan::kDecodeChunk);
    const dim3 grid(unsigned(pl.blocks_n), unsigned(pl.splits), unsigned(pl.row_passes));
    if (a.group == 16) launch_mr<16>(pl.mr, grid, p, stream);
    else launch_mr<32>(pl.mr, grid, p, stream);
    check_launch("decode_gemm_kernel");
    if (pl.splits > 1) {
        const std::size_t mn = a.m * a.n;
        const unsigned blocks = unsigned(std::min<std::size_t>(plan::ceil_div(mn, 256), 4096));
        splitk_reduce_kernel<<<blocks, 256, 0, stream>>>(p.partial, int(pl.splits), mn, a.n, a.y, p.y_bf16, a.bias);
        check_launch("splitk_reduce_kernel");
    }
}

}  // namespace

void launch_decode_gemm(const GemmArgs& a, cudaStream_t stream, const GemmDevice& device) {
    launch_with_plan(a, plan::plan_decode(a.m, a.n, a.k), stream, device, "launch_decode_gemm");
}

void launch_decode_gemm_split(const GemmArgs& a, std::size_t chunks_per_split, cudaStream_t stream,
                              const GemmDevice& device) {
    launch_with_plan(a, plan::with_chunks_per_split(plan::plan_decode(a.m, a.n, a.k), chunks_per_split), stream, device,
                     "launch_decode_gemm_split");
}

}  // namespace wush::cuda
