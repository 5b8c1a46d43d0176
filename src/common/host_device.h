// Marks functions shared verbatim by the CPU core and the CUDA kernels (docs/ARCHITECTURE.md: cuda/ shares
// the numeric core with src/ instead of re-deriving it).
#pragma once

#if defined(__CUDACC__)
#  define WUSH_HD __host__ __device__ __forceinline__
#else
#  define WUSH_HD inline
#endif

// Full unrolling of a loop over a group's values in device code, so that per-group arrays stay in
// registers (a dynamically indexed array goes to local memory); nothing on the host.
#if defined(__CUDA_ARCH__)
#  define WUSH_UNROLL _Pragma("unroll")
#else
#  define WUSH_UNROLL
#endif
