// cuBLASLt block-scaled FP4 GEMM for sm_100 / sm_120 (MXFP4: CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0,
// NVFP4: VEC16_UE4M3, scales swizzled into cuBLASLt's 128x4 tiles, TN with K contiguous).
//
// NOT IMPLEMENTED YET: the scale swizzle and the matmul descriptor setup are still to be written
// and nothing here has run on hardware. Until then it reports itself unsupported, so pick_gemm
// never chooses it and a forced launch throws UNSUPPORTED.
#include "kernels.h"

#include "common/error.h"

namespace wush::cuda {

std::size_t blockscaled_gemm_workspace_bytes(wush_format, std::size_t, std::size_t, std::size_t) { return 0; }

bool blockscaled_gemm_supported(const GemmArgs&, int) { return false; }

void launch_blockscaled_gemm(const GemmArgs&, cublasLtHandle_t, cudaStream_t) {
    fail(WUSH_ERR_UNSUPPORTED, "the cuBLASLt block-scaled FP4 GEMM is not implemented yet");
}

}  // namespace wush::cuda
