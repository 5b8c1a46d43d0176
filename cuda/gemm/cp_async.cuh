// cp.async, its commit and its wait, shared by the kernels that stage tiles through shared memory
// (the prefill kernels' main loop, cuda/gemm/prefill_tile.cuh; the streaming decode kernel's ring,
// cuda/gemm/stream_decode_kernel.cuh). On sm_80+ the PTX instructions; in the CPU emulation
// (tests/unit/cuda_host_emulation.h) its copy and group bookkeeping, so the kernels' sources run
// unchanged in the emulation tests.
#pragma once

namespace wush::cuda {

// 16 bytes global -> shared, zero-filled when !valid (the tile's edge).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned s = unsigned(__cvta_generic_to_shared(smem));
    const int bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes));
#elif defined(WUSH_CUDA_HOST_EMULATION)
    wush_emu::copy16(smem, gmem, valid);
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#elif defined(WUSH_CUDA_HOST_EMULATION)
    wush_emu::commit();
#endif
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#elif defined(WUSH_CUDA_HOST_EMULATION)
    wush_emu::wait_groups(N);
#endif
}

}  // namespace wush::cuda
