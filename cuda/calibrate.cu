// Second-moment sums of activations on the device, in float64 (the CPU calibrator's precision):
// x is converted to double on the device, tile by tile, then one DSYRK (full mode) or one
// strided-batched DGEMM over the diagonal blocks (block-diagonal mode) accumulates into `sums`.
#include "kernels.h"

#include "common/float_bits.h"
#include "cuda_check.h"

namespace wush::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void to_double_kernel(wush_dtype dtype, const void* x, std::size_t row0, std::size_t count, std::size_t d_in,
                                 double* out, unsigned long long* non_finite) {
    const std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= count) return;
    const std::size_t src = row0 * d_in + i;
    float v;
    if (dtype == WUSH_DTYPE_F16) v = bits::f16_decode(static_cast<const std::uint16_t*>(x)[src]);
    else if (dtype == WUSH_DTYPE_BF16) v = bits::bf16_decode(static_cast<const std::uint16_t*>(x)[src]);
    else v = static_cast<const float*>(x)[src];
    if (!isfinite(v)) atomicMin(non_finite, (static_cast<unsigned long long>(row0 + i / d_in) << 32) | (i % d_in));
    out[i] = v;
}

}  // namespace

void launch_moment_sums(bool full, std::size_t d_in, std::size_t group, wush_dtype x_dtype, const void* x,
                        std::size_t n_tokens, double* sums, double* scratch, std::size_t tile_tokens,
                        unsigned long long* non_finite, cublasHandle_t handle, cudaStream_t stream) {
    const double one = 1.0;
    for (std::size_t t0 = 0; t0 < n_tokens; t0 += tile_tokens) {
        const std::size_t rows = n_tokens - t0 < tile_tokens ? n_tokens - t0 : tile_tokens;
        const std::size_t count = rows * d_in;
        to_double_kernel<<<unsigned((count + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
            x_dtype, x, t0, count, d_in, scratch, non_finite);
        check_launch("to_double_kernel");
        // The row-major tile (rows x d_in) is the column-major X' (d_in x rows): S += X' X'^T.
        if (full) {
            WUSH_CUBLAS_CHECK(cublasDsyrk(handle, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, int(d_in), int(rows), &one,
                                          scratch, int(d_in), &one, sums, int(d_in)));
        } else {
            const long long g = static_cast<long long>(group);
            WUSH_CUBLAS_CHECK(cublasDgemmStridedBatched(handle, CUBLAS_OP_N, CUBLAS_OP_T, int(group), int(group),
                                                        int(rows), &one, scratch, int(d_in), g, scratch, int(d_in), g,
                                                        &one, sums, int(group), g * g, int(d_in / group)));
        }
    }
}

}  // namespace wush::cuda
