// Kernels that tests/cuda/check_ptxas.sh --self-test must reject: one that keeps an array in local
// memory (indexed at run time), and one named as if designed for tensor cores that has no MMA.
#include <cstdint>

__global__ void selftest_local_memory_kernel(const int* in, int* out, int i) {
    int a[256];  // 1 KB per thread, written and read at run-time indices: a stack frame
    for (int j = 0; j < 256; ++j) a[j] = in[j + threadIdx.x];
    a[i & 255] += i;
    out[threadIdx.x] = a[(i * 7 + threadIdx.x) & 255];
}

__global__ void selftest_designed_mma_kernel(const std::int8_t* a, const std::int8_t* b, int* out) {
    int s = 0;
    for (int j = 0; j < 32; ++j) s += a[j] * b[j];
    out[threadIdx.x] = s;
}
