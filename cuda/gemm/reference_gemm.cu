// The reference W4A4 GEMM: both operands dequantized exactly (cuda/gemm/dequantize.h) into device
// workspace, then one cuBLAS GEMM with the per-tensor factors as alpha. MXFP4 / NVFP4 /
// MXFP4_OCP go through bf16 (exact) with float32 accumulation; INT4 levels times bf16 scales are
// not exact in bf16, so INT4 goes through float32 with CUBLAS_COMPUTE_32F_PEDANTIC (no TF32
// downgrade, also not through NVIDIA_TF32_OVERRIDE). Without a bias, a BF16 y is written by cuBLAS
// itself for the bf16 formats (its float32 accumulator rounded to nearest even in its epilogue:
// no float32 scratch, no second kernel; tests/gpu/test_w4a4_gemm.cpp compares the bits with
// float32 output rounded RNE). INT4 with a BF16 y, and any product with a bias, is computed into
// float32 scratch and a finishing kernel adds the bias and rounds to bf16 (RNE,
// bits::bf16_encode) as it writes y: cuBLAS's own store cannot add a bias, and cuBLAS offers no
// float32-input, bf16-output GEMM.
#include "kernels.h"

#include <cstring>

#include "common/float_bits.h"
#include "cuda_check.h"
#include "dequantize.h"
#include "device_rules.h"
#include "output_bias.cuh"

namespace wush::cuda {

namespace {

constexpr int kThreads = 256;

std::size_t round_up(std::size_t v, std::size_t a) {
    return (v + a - 1) / a * a;
}

// A thread per 16 elements of a row (8 packed bytes, inside one group: G is 16 or 32), a grid row
// per matrix row (blockIdx.y, striding by gridDim.y past 65535 rows): no 64-bit division per
// element. `vec`: codes are 8-byte aligned (row pitch k / 2 is a multiple of 8, so every chunk is
// too) and read as one 8-byte load; out (workspace) is 16-byte aligned and written in 16-byte stores.
template <class Out>
__global__ void dequantize_kernel(wush_format format, int group, const std::uint8_t* codes, const std::uint8_t* scales,
                                  std::size_t rows, std::size_t k, Out* out, int vec) {
    constexpr int kPerVec = 16 / int(sizeof(Out));
    const std::size_t chunk = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (chunk >= k / 16) return;
    const int sb = format == WUSH_FORMAT_INT4 ? 2 : 1;
    for (std::size_t row = blockIdx.y; row < rows; row += gridDim.y) {
        const std::uint8_t* c = codes + row * (k / 2) + chunk * 8;
        std::uint8_t b[8];
        if (vec) {
            const uint2 w = *reinterpret_cast<const uint2*>(c);
#pragma unroll
            for (int i = 0; i < 4; ++i) b[i] = std::uint8_t(w.x >> (8 * i)), b[4 + i] = std::uint8_t(w.y >> (8 * i));
        } else {
#pragma unroll
            for (int i = 0; i < 8; ++i) b[i] = c[i];
        }
        const float s = formats::decode_scale(
            format, scales + (row * (k / std::size_t(group)) + chunk * 16 / std::size_t(group)) * sb);
        Out v[16];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const float v0 = dequantize_element(format, std::uint8_t(b[i] & 0xF), s);
            const float v1 = dequantize_element(format, std::uint8_t(b[i] >> 4), s);
            if constexpr (sizeof(Out) == 2) {
                v[2 * i] = bf16_bits_of_exact(v0);
                v[2 * i + 1] = bf16_bits_of_exact(v1);
            } else {
                v[2 * i] = v0;
                v[2 * i + 1] = v1;
            }
        }
        uint4* dst = reinterpret_cast<uint4*>(out + row * k + chunk * 16);
#pragma unroll
        for (int q = 0; q < 16 / kPerVec; ++q) {
            uint4 w;
            std::memcpy(&w, v + q * kPerVec, 16);
            dst[q] = w;
        }
    }
}

// y (count = m x n elements, F32 or BF16) = the float32 product + the bias of column i % n.
__global__ void finish_kernel(const float* in, void* out, int bf16, std::size_t count, std::size_t n, OutputBias bias) {
    const std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= count) return;
    const float v = add_bias(bias, i % n, in[i]);
    if (bf16) static_cast<std::uint16_t*>(out)[i] = bits::bf16_encode(double(v));
    else static_cast<float*>(out)[i] = v;
}

std::size_t blocks_for(std::size_t count) {
    return (count + kThreads - 1) / kThreads;
}

}  // namespace

std::size_t dequantized_element_bytes(wush_format format) {
    return format == WUSH_FORMAT_INT4 ? 4 : 2;
}

void launch_dequantize(wush_format format, int group, const std::uint8_t* codes, const std::uint8_t* scales,
                       std::size_t rows, std::size_t k, void* out, cudaStream_t stream) {
    if (rows == 0 || k == 0) return;
    require(k % 16 == 0 && reinterpret_cast<std::uintptr_t>(out) % 16 == 0,
            "dequantize: k % 16 or workspace alignment");
    const dim3 grid(unsigned((k / 16 + kThreads - 1) / kThreads), unsigned(rows < 65535 ? rows : 65535));
    const int vec = reinterpret_cast<std::uintptr_t>(codes) % 8 == 0 ? 1 : 0;
    if (format == WUSH_FORMAT_INT4)
        dequantize_kernel<float>
            <<<grid, kThreads, 0, stream>>>(format, group, codes, scales, rows, k, static_cast<float*>(out), vec);
    else
        dequantize_kernel<std::uint16_t><<<grid, kThreads, 0, stream>>>(format, group, codes, scales, rows, k,
                                                                        static_cast<std::uint16_t*>(out), vec);
    check_launch("dequantize_kernel");
}

namespace {

// Whether the product goes through float32 scratch and the finishing kernel: a bias (cuBLAS's
// store cannot add it), or a BF16 y of INT4 (no float32-input, bf16-output GEMM in cuBLAS).
bool rounds_separately(wush_format format, wush_dtype y_dtype, bool bias) {
    return bias || (y_dtype == WUSH_DTYPE_BF16 && format == WUSH_FORMAT_INT4);
}

}  // namespace

std::size_t reference_gemm_workspace_bytes(wush_format format, std::size_t m, std::size_t n, std::size_t k,
                                           bool w_dequantized_given, wush_dtype y_dtype, bool bias) {
    const std::size_t e = dequantized_element_bytes(format);
    std::size_t bytes = round_up(m * k * e, 256);
    if (!w_dequantized_given) bytes += round_up(n * k * e, 256);
    if (rounds_separately(format, y_dtype, bias)) bytes += round_up(m * n * sizeof(float), 256);
    return bytes;
}

void launch_reference_gemm(const GemmArgs& g, const void* w_dequantized, cublasHandle_t handle, cudaStream_t stream) {
    if (g.m == 0 || g.n == 0) return;
    // cuBLAS's sizes are int (n is also Y's leading dimension, k both operands'); checked before
    // anything is enqueued.
    const char* who = "reference GEMM";
    const int m = checked_int(g.m, "m (tokens)", who), n = checked_int(g.n, "n (d_out)", who),
              k = checked_int(g.k, "k (d_in)", who);
    const bool staged = rounds_separately(g.format, g.y_dtype, g.bias.data != nullptr);
    const unsigned finish_blocks =
        unsigned(checked_int(staged ? blocks_for(g.m * g.n) : 0, "m x n / 256 (finishing blocks)", who));
    const std::size_t e = dequantized_element_bytes(g.format);
    require(g.workspace_bytes >= reference_gemm_workspace_bytes(g.format, g.m, g.n, g.k, w_dequantized != nullptr,
                                                                g.y_dtype, g.bias.data != nullptr),
            "reference GEMM: workspace too small");
    auto* ws = static_cast<unsigned char*>(g.workspace);
    void* a = ws;
    ws += round_up(g.m * g.k * e, 256);
    const void* w = w_dequantized;
    if (w == nullptr) {
        launch_dequantize(g.format, g.group, g.w_codes, g.w_scales, g.n, g.k, ws, stream);
        w = ws;
        ws += round_up(g.n * g.k * e, 256);
    }
    launch_dequantize(g.format, g.group, g.a_codes, g.a_scales, g.m, g.k, a, stream);
    void* out = staged ? static_cast<void*>(ws) : g.y;
    const cudaDataType_t out_type = g.y_dtype == WUSH_DTYPE_BF16 && !staged ? CUDA_R_16BF : CUDA_R_32F;
    // Row-major Y (m x n) = A W^T is column-major Y^T (n x m) = W^T' A': op(W) = T, op(A) = N.
    const cudaDataType_t in = g.format == WUSH_FORMAT_INT4 ? CUDA_R_32F : CUDA_R_16BF;
    const cublasComputeType_t compute = g.format == WUSH_FORMAT_INT4 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
    const float alpha = g.alpha, beta = 0.0f;
    WUSH_CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w, in, k, a, in, k, &beta, out,
                                   out_type, n, compute, CUBLAS_GEMM_DEFAULT));
    if (staged) {
        finish_kernel<<<finish_blocks, kThreads, 0, stream>>>(
            static_cast<const float*>(out), g.y, g.y_dtype == WUSH_DTYPE_BF16 ? 1 : 0, g.m * g.n, g.n, g.bias);
        check_launch("finish_kernel");
    }
}

}  // namespace wush::cuda
