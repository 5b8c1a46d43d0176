// The fused transform + quantization on CUDA cores (device code: cuda/quantize/quantize_kernel.cuh, which
// says how the bytes equal the CPU's and how the kernels are laid out). Two kernels: the tile
// kernel (32 tokens x 4 groups per block) and the small-m kernel (a warp per token and group, so
// that one token spreads over the GPU; a block's group matrices are loaded once for all its
// tokens). The G x G product on tensor cores: cuda/quantize/quantize_tc.cu. Which one runs is the caller's
// row of the kernel table (gemm_table.h, quantize_pick); launch_quantize runs the kernel named.
#include "kernels.h"

#include "cuda_check.h"
#include "quantize_kernel.cuh"

namespace wush::cuda {

namespace {

using namespace quantize_detail;

bool aligned(const void* p, std::size_t a) {
    return reinterpret_cast<std::uintptr_t>(p) % a == 0;
}

static_assert(kSmallMaxTokens == kQuantizeSmallMaxTokens, "the table's small-m row and the kernel's limit");

template <wush_format F>
void launch(const QuantizeArgs& a, bool small_m, cudaStream_t stream) {
    const std::size_t groups = a.d_in / std::size_t(Fmt<F>::G);
    const int vec_codes = aligned(a.codes, std::size_t(Fmt<F>::kCodeBytes)) ? 1 : 0;
    if (small_m) {
        const int per_block = small_groups_per_block(a.n_tokens);
        const unsigned grid = unsigned((groups + std::size_t(per_block) - 1) / std::size_t(per_block));
        quantize_small_kernel<F><<<grid, kThreads, 0, stream>>>(a, per_block, vec_codes);
    } else {
        const dim3 grid(unsigned((a.n_tokens + kTileTokens - 1) / kTileTokens),
                        unsigned((groups + kTileGroups - 1) / kTileGroups));
        quantize_tile_kernel<F><<<grid, kThreads, 0, stream>>>(a, aligned(a.x, 16) ? 1 : 0, vec_codes);
    }
}

}  // namespace

void launch_quantize(const QuantizeArgs& a, Kernel kernel, cudaStream_t stream) {
    if (a.n_tokens == 0 || a.d_in == 0) return;
    if (a.n_tokens > 0x7FFFFFFFu * std::size_t(kTileTokens) || a.d_in / std::size_t(a.group) > 65535u * kTileGroups)
        fail(WUSH_ERR_UNSUPPORTED, "launch_quantize: shape too large for the grid");
    bool small_m = false;
    switch (kernel) {
        case Kernel::QuantizeTensorCore:
            if (!quantize_tc_applies(a))
                fail(WUSH_ERR_UNSUPPORTED,
                     "launch_quantize: the tensor-core kernel needs BF16 / F16 x, a matrix "
                     "transform and its fragments");
            return launch_quantize_tc(a, stream);
        case Kernel::QuantizeSmallM:
            // The small-m kernel's blocks hold at most kSmallMaxTokens tokens each.
            if (a.n_tokens > kSmallMaxTokens)
                fail(WUSH_ERR_UNSUPPORTED, "launch_quantize: too many tokens for small-m");
            small_m = true;
            break;
        case Kernel::QuantizeTile: break;
        default: fail(WUSH_ERR_INVALID_ARGUMENT, "launch_quantize: not a quantize kernel");
    }
    if (!with_quantize_format(a.format, [&](auto f) { launch<decltype(f)::value>(a, small_m, stream); }))
        fail(WUSH_ERR_INVALID_ARGUMENT, "launch_quantize: unknown format");
    check_launch("quantize kernel");
}

void launch_quantize(const QuantizeArgs& a, cudaStream_t stream) {
    static const KernelTable kDefault = active_table(KernelOptions{});
    launch_quantize(a, quantize_pick(kDefault, 0, a.n_tokens, int(a.format), [](Kernel) { return true; }), stream);
}

}  // namespace wush::cuda
