// pick_gemm / gemm_supported / gemm_workspace_bytes of w4a4_gemm.h. The Decode / Prefill kernels
// are offered only when their files are built (WUSH_HAVE_W4A4_KERNELS, cuda/CMakeLists.txt);
// their own support rules are assumed to be "sm >= 80" until those files define finer ones.
// NOTE for the merge: if gemm_decode.cu / gemm_prefill.cu also define these three functions,
// keep one definition (this file's Reference / BlockScaledLt branches must survive).
#include "kernels.h"

namespace wush::cuda {

namespace {

constexpr std::size_t kDecodeMaxM = 16;  // below this many rows a GEMV-like kernel wins

bool w4a4_kernels_built() {
#if defined(WUSH_HAVE_W4A4_KERNELS)
    return true;
#else
    return false;
#endif
}

}  // namespace

std::size_t gemm_workspace_bytes(GemmKernel kernel, wush_format format, std::size_t m, std::size_t n, std::size_t k) {
    switch (kernel) {
        case GemmKernel::Reference: return reference_gemm_workspace_bytes(format, m, n, k, false, WUSH_DTYPE_BF16);
        case GemmKernel::BlockScaledLt: return blockscaled_gemm_workspace_bytes(format, m, n, k);
        default: return 0;
    }
}

bool gemm_supported(GemmKernel kernel, const GemmArgs& args, int sm) {
    switch (kernel) {
        case GemmKernel::Reference: return true;
        case GemmKernel::BlockScaledLt: return blockscaled_gemm_supported(args, sm);
        default: return w4a4_kernels_built() && sm >= 80;
    }
}

GemmKernel pick_gemm(const GemmArgs& args, int sm) {
    if (gemm_supported(GemmKernel::BlockScaledLt, args, sm)) return GemmKernel::BlockScaledLt;
    const GemmKernel fast = args.m <= kDecodeMaxM ? GemmKernel::Decode : GemmKernel::Prefill;
    return gemm_supported(fast, args, sm) ? fast : GemmKernel::Reference;
}

}  // namespace wush::cuda
