// Marks functions shared verbatim by the CPU core and the CUDA kernels (docs/ARCHITECTURE.md: cuda/ shares
// the numeric core with src/ instead of re-deriving it).
#pragma once

#if defined(__CUDACC__)
#define WUSH_HD __host__ __device__ __forceinline__
#else
#define WUSH_HD inline
#endif
