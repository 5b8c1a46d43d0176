// The CUDA W4A4 GEMM kernels (cuda/gemm/gemm_decode.cu, cuda/gemm/gemm_prefill.cu) on random packed
// operands of every format, against a float64 CPU product of the dequantized values written here
// (element values and scales decoded independently of the library's codecs where practical).
// The bias of the final store in every kernel. Without a usable GPU every device test reports
// SKIPPED; the selection test runs anywhere.
//
// Benchmark (not run by default): WUSH_GEMM_BENCH=1 ./wush_gpu_gemm_tests --gtest_filter='*Bench*'
// times the design points against cuBLAS BF16 (cublasGemmEx, float32 accumulation) with events,
// median of 50 after warm-up, and prints a table.
#include <gtest/gtest.h>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "formats/group_quantizer.h"
#include "gemm/gemm_bf16_prefill.h"
#include "gemm/w4a4_gemm.h"
#include "kernels.h"

namespace {

using wush::cuda::GemmArgs;
using wush::cuda::GemmKernel;

#define CUDA_OK(expr)                                                      \
  do {                                                                     \
    const cudaError_t e_ = (expr);                                         \
    ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(e_); \
  } while (0)

int device_sm() {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        cudaGetLastError();
        return 0;
    }
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
    return major * 10 + minor;
}

#define REQUIRE_GPU(sm)       \
  const int sm = device_sm(); \
  if (sm == 0) GTEST_SKIP() << "no CUDA device";

const wush_format kFormats[] = {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4, WUSH_FORMAT_INT4, WUSH_FORMAT_MXFP4_OCP};
int group_of(wush_format f) {
    return f == WUSH_FORMAT_NVFP4 ? 16 : 32;
}
int scale_bytes(wush_format f) {
    return f == WUSH_FORMAT_INT4 ? 2 : 1;
}
double tensor_factor(wush_format f) {
    return f == WUSH_FORMAT_MXFP4 ? 1.0 / 3.0 : f == WUSH_FORMAT_NVFP4 ? 0.1 : 1.0;
}

double element_value(wush_format f, unsigned nibble) {
    static const double kE2M1[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
    if (f == WUSH_FORMAT_INT4) return (nibble >= 8 ? int(nibble) - 16 : int(nibble)) + 0.5;
    return (nibble & 8) ? -kE2M1[nibble & 7] : kE2M1[nibble & 7];
}

double scale_value(wush_format f, const std::uint8_t* p) {
    switch (f) {
        case WUSH_FORMAT_NVFP4: {
            const int e = (p[0] >> 3) & 0xF, mnt = p[0] & 7;
            const double v = e == 0 ? std::ldexp(double(mnt), -9) : std::ldexp(8.0 + mnt, e - 10);
            return (p[0] & 0x80) ? -v : v;
        }
        case WUSH_FORMAT_INT4: {
            const std::uint32_t u = (std::uint32_t(p[1]) << 24) | (std::uint32_t(p[0]) << 16);
            float v;
            std::memcpy(&v, &u, 4);
            return v;
        }
        default: return std::ldexp(1.0, int(p[0]) - 127);
    }
}

// A random packed operand: codes uniformly random, scales random in a modest range.
struct Operand {
    std::vector<std::uint8_t> codes, scales;
    std::vector<double> values;  // dequantized, rows x k (with the per-tensor factor)
};

// force_e8m0 >= 0 sets every MXFP4 scale byte to it (extreme scales).
Operand random_operand(wush_format f, std::size_t rows, std::size_t k, std::mt19937& rng, int force_e8m0 = -1) {
    const int G = group_of(f), sb = scale_bytes(f);
    const std::size_t groups = k / G;
    Operand o;
    o.codes.resize(rows * k / 2);
    o.scales.resize(rows * groups * sb);
    for (auto& c : o.codes) c = std::uint8_t(rng());
    for (std::size_t i = 0; i < rows * groups; ++i) {
        std::uint8_t* s = &o.scales[i * sb];
        switch (f) {
            case WUSH_FORMAT_NVFP4: s[0] = std::uint8_t(0x20 + rng() % 0x40); break;  // 2^-3 .. 2^4 range
            case WUSH_FORMAT_INT4: {
                const std::uint16_t b = std::uint16_t(0x3E00 + rng() % 0x0200);  // 0.125 .. 1
                s[0] = std::uint8_t(b & 0xFF);
                s[1] = std::uint8_t(b >> 8);
                break;
            }
            default: s[0] = std::uint8_t(120 + rng() % 14); break;  // 2^-7 .. 2^6
        }
        if (force_e8m0 >= 0 && sb == 1 && f != WUSH_FORMAT_NVFP4) s[0] = std::uint8_t(force_e8m0);
    }
    o.values.resize(rows * k);
    for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t i = 0; i < k; ++i) {
            const unsigned nib = wush::formats::get_nibble(&o.codes[r * k / 2], int(i));
            o.values[r * k + i] =
                element_value(f, nib) * scale_value(f, &o.scales[(r * groups + i / G) * sb]) * tensor_factor(f);
        }
    return o;
}

template <typename T>
struct DeviceBuffer {
    T* p = nullptr;
    std::size_t n = 0;
    explicit DeviceBuffer(std::size_t count) : n(count) {
        if (count && cudaMalloc(reinterpret_cast<void**>(&p), count * sizeof(T)) != cudaSuccess) p = nullptr;
    }
    ~DeviceBuffer() { cudaFree(p); }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

template <typename T>
void upload(DeviceBuffer<T>& d, const std::vector<T>& h) {
    ASSERT_EQ(cudaMemcpy(d.p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
}

float bf16_to_float(std::uint16_t b) {
    const std::uint32_t u = std::uint32_t(b) << 16;
    float v;
    std::memcpy(&v, &u, 4);
    return v;
}

// One cuBLAS handle for the reference path's tests (on the legacy stream, as they launch).
cublasHandle_t blas_handle() {
    static cublasHandle_t h = [] {
        cublasHandle_t created = nullptr;
        return cublasCreate(&created) == CUBLAS_STATUS_SUCCESS ? created : nullptr;
    }();
    return h;
}

// Runs `kernel` on (m, n, k) in `f` and compares every output with the float64 product.
// `codes_offset`: both operands' codes start that many bytes past an allocation (the reference
// path accepts any alignment; the custom kernels want 16 bytes).
// `bf16_prefill`: the opt-in BF16 prefill kernel (cuda/gemm/gemm_bf16_prefill.h) instead of `kernel`.
void check_product(GemmKernel kernel, wush_format f, std::size_t m, std::size_t n, std::size_t k, wush_dtype y_dtype,
                   std::mt19937& rng, int sm, int force_a = -1, int force_w = -1, std::size_t codes_offset = 0,
                   bool bf16_prefill = false) {
    SCOPED_TRACE(::testing::Message() << "kernel " << int(kernel) << " format " << int(f) << " m " << m << " n " << n
                                      << " k " << k << " y " << int(y_dtype) << " codes offset " << codes_offset);
    const Operand a = random_operand(f, m, k, rng, force_a), w = random_operand(f, n, k, rng, force_w);
    DeviceBuffer<std::uint8_t> da(a.codes.size() + codes_offset), dsa(a.scales.size()),
        dw(w.codes.size() + codes_offset), dsw(w.scales.size());
    ASSERT_TRUE(da.p && dw.p);
    ASSERT_EQ(cudaMemcpy(da.p + codes_offset, a.codes.data(), a.codes.size(), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dw.p + codes_offset, w.codes.data(), w.codes.size(), cudaMemcpyHostToDevice), cudaSuccess);
    upload(dsa, a.scales);
    upload(dsw, w.scales);
    const std::size_t ybytes = m * n * (y_dtype == WUSH_DTYPE_BF16 ? 2 : 4);
    DeviceBuffer<std::uint8_t> dy(ybytes);
    const std::size_t ws = bf16_prefill ? wush::cuda::bf16_prefill_workspace_bytes(f, m, n, k)
                           : kernel == GemmKernel::Reference
                               ? wush::cuda::reference_gemm_workspace_bytes(f, m, n, k, false, y_dtype)
                               : wush::cuda::gemm_workspace_bytes(kernel, f, m, n, k);
    DeviceBuffer<std::uint8_t> dws(std::max<std::size_t>(ws, 16));
    ASSERT_TRUE(da.p && dsa.p && dw.p && dsw.p && dy.p && dws.p);

    GemmArgs args;
    args.format = f;
    args.group = group_of(f);
    args.m = m;
    args.n = n;
    args.k = k;
    args.a_codes = da.p + codes_offset;
    args.a_scales = dsa.p;
    args.w_codes = dw.p + codes_offset;
    args.w_scales = dsw.p;
    args.alpha = float(tensor_factor(f) * tensor_factor(f));
    args.y = dy.p;
    args.y_dtype = y_dtype;
    args.workspace = dws.p;
    args.workspace_bytes = dws.n;
    if (bf16_prefill) ASSERT_TRUE(wush::cuda::bf16_prefill_supported(args, sm));
    else ASSERT_TRUE(wush::cuda::gemm_supported(kernel, args, sm));

    std::vector<std::uint8_t> first;
    for (int run = 0; run < 2; ++run) {
        CUDA_OK(cudaMemset(dy.p, 0xFF, ybytes));  // NaN poison: every output must be written
        CUDA_OK(cudaMemset(dws.p, 0xFF, dws.n));  // the workspace holds nothing between calls
        if (bf16_prefill) wush::cuda::launch_bf16_prefill_gemm(args, sm, nullptr);
        else if (kernel == GemmKernel::Decode) wush::cuda::launch_decode_gemm(args, nullptr);
        else if (kernel == GemmKernel::Prefill) wush::cuda::launch_prefill_gemm(args, nullptr);
        else wush::cuda::launch_reference_gemm(args, nullptr, blas_handle(), nullptr);
        CUDA_OK(cudaGetLastError());
        CUDA_OK(cudaDeviceSynchronize());
        std::vector<std::uint8_t> out(ybytes);
        CUDA_OK(cudaMemcpy(out.data(), dy.p, ybytes, cudaMemcpyDeviceToHost));
        if (run == 0) {
            first = out;
        } else {
            ASSERT_TRUE(out == first) << "two runs differ (the kernels must be deterministic)";
        }
    }

    // The float64 reference and the bound: float32 accumulation of float32-rounded group terms.
    int bad = 0;
    for (std::size_t i = 0; i < m; ++i)
        for (std::size_t j = 0; j < n; ++j) {
            double ref = 0.0, abs_sum = 0.0;
            const double* x = &a.values[i * k];
            const double* y = &w.values[j * k];
            for (std::size_t e = 0; e < k; ++e) {
                ref += x[e] * y[e];
                abs_sum += std::fabs(x[e] * y[e]);
            }
            float got;
            double tol = 1e-5 * abs_sum + 1e-30;
            if (y_dtype == WUSH_DTYPE_BF16) {
                std::uint16_t b;
                std::memcpy(&b, &first[(i * n + j) * 2], 2);
                got = bf16_to_float(b);
                tol += 0x1p-8 * std::fabs(ref);
            } else {
                std::memcpy(&got, &first[(i * n + j) * 4], 4);
            }
            if (!(std::fabs(double(got) - ref) <= tol) && bad++ < 5)
                ADD_FAILURE() << "y[" << i << "][" << j << "] = " << got << ", float64 " << ref << ", tolerance "
                              << tol;
        }
    EXPECT_EQ(bad, 0);
}

TEST(W4A4GemmGpu, DecodeAllFormatsAndShapes) {
    REQUIRE_GPU(sm);
    std::mt19937 rng(1);
    for (wush_format f : kFormats)
        for (std::size_t m : {1, 3, 16, 17, 128, 130, 257})
            for (std::size_t n : {8, 13, 256})
                for (std::size_t k : {32, 96, 4096}) {
                    if (m > 32 && k == 4096 && n == 256 && f != WUSH_FORMAT_MXFP4) continue;  // CPU reference time
                    check_product(GemmKernel::Decode, f, m, n, k, WUSH_DTYPE_F32, rng, sm);
                }
}

TEST(W4A4GemmGpu, PrefillAllFormatsAndShapes) {
    REQUIRE_GPU(sm);
    if (sm < 80) GTEST_SKIP() << "prefill needs sm_80";
    std::mt19937 rng(2);
    for (wush_format f : kFormats)
        for (std::size_t m : {1, 3, 16, 17, 128, 130, 257})
            for (std::size_t n : {8, 13, 256})
                for (std::size_t k : {32, 96, 4096})
                    check_product(GemmKernel::Prefill, f, m, n, k, WUSH_DTYPE_F32, rng, sm);
}

// The reference path (exact dequantization + cuBLAS): what m > 32 runs on sm_80/90 by default.
TEST(W4A4GemmGpu, ReferenceAllFormatsAndShapes) {
    REQUIRE_GPU(sm);
    ASSERT_NE(blas_handle(), nullptr);
    std::mt19937 rng(4);
    for (wush_format f : kFormats)
        for (std::size_t m : {1, 17, 130})
            for (std::size_t n : {8, 13, 256})
                for (std::size_t k : {32, 96, 4096})
                    for (wush_dtype y : {WUSH_DTYPE_F32, WUSH_DTYPE_BF16})
                        check_product(GemmKernel::Reference, f, m, n, k, y, rng, sm);
    // Codes at odd and 4-byte offsets: the dequantization's byte loads instead of 8-byte ones.
    for (wush_format f : kFormats)
        for (std::size_t offset : {1, 4})
            check_product(GemmKernel::Reference, f, 17, 13, 96, WUSH_DTYPE_F32, rng, sm, -1, -1, offset);
}

TEST(W4A4GemmGpu, Bf16OutputAndSplitK) {
    REQUIRE_GPU(sm);
    std::mt19937 rng(3);
    for (wush_format f : kFormats) {
        check_product(GemmKernel::Decode, f, 1, 256, 4096, WUSH_DTYPE_BF16, rng, sm);  // 4 splits
        check_product(GemmKernel::Decode, f, 5, 40, 14336, WUSH_DTYPE_F32, rng, sm);   // 14 splits, ragged
        if (sm >= 80) check_product(GemmKernel::Prefill, f, 200, 136, 480, WUSH_DTYPE_BF16, rng, sm);
    }
}

// The bias of the final store (cuda/gemm/output_bias.cuh) in every kernel's store: the decode kernel
// (one split, and split-K's reduction), the prefill epilogue, the reference path's finishing
// kernel. y with a bias equals the bias-free F32 y plus the bias, added and (BF16 y) rounded to
// nearest even here, bit for bit, for F32, F16 and BF16 biases; a NaN/Inf bias element is
// reported through the flag with the bias row and the smallest bad column.
void run_kernel(GemmKernel kernel, const GemmArgs& args) {
    if (kernel == GemmKernel::Decode) wush::cuda::launch_decode_gemm(args, nullptr);
    else if (kernel == GemmKernel::Prefill) wush::cuda::launch_prefill_gemm(args, nullptr);
    else wush::cuda::launch_reference_gemm(args, nullptr, blas_handle(), nullptr);
}

void check_bias(GemmKernel kernel, wush_format f, std::size_t m, std::size_t n, std::size_t k, std::mt19937& rng,
                int sm) {
    SCOPED_TRACE(::testing::Message() << "kernel " << int(kernel) << " format " << int(f) << " m " << m << " n " << n
                                      << " k " << k);
    const Operand a = random_operand(f, m, k, rng), w = random_operand(f, n, k, rng);
    DeviceBuffer<std::uint8_t> da(a.codes.size()), dsa(a.scales.size()), dw(w.codes.size()), dsw(w.scales.size());
    DeviceBuffer<float> dy(m * n), db(n);
    DeviceBuffer<std::uint16_t> db16(n), dh16(n);
    DeviceBuffer<unsigned long long> dflag(1);
    const std::size_t ws = kernel == GemmKernel::Reference
                               ? wush::cuda::reference_gemm_workspace_bytes(f, m, n, k, false, WUSH_DTYPE_BF16)
                               : wush::cuda::gemm_workspace_bytes(kernel, f, m, n, k);
    DeviceBuffer<std::uint8_t> dws(std::max<std::size_t>(ws, 16));
    ASSERT_TRUE(da.p && dsa.p && dw.p && dsw.p && dy.p && db.p && db16.p && dh16.p && dflag.p && dws.p);
    upload(da, a.codes);
    upload(dsa, a.scales);
    upload(dw, w.codes);
    upload(dsw, w.scales);
    // q / 64 with |q| < 2^8: exact in F32, F16 and BF16 (the F16 bits built from the value's exponent)
    std::vector<float> b(n);
    std::vector<std::uint16_t> b16(n), h16(n);
    for (std::size_t j = 0; j < n; ++j) {
        const int q = int(rng() % 511) - 255;
        b[j] = j == 2 ? -0.0f : float(q) / 64.0f;
        std::uint32_t u;
        std::memcpy(&u, &b[j], 4);
        b16[j] = std::uint16_t(u >> 16);
        int e = 0;
        const double fr = std::frexp(std::fabs(double(b[j])), &e);
        h16[j] = std::uint16_t((std::signbit(b[j]) ? 0x8000u : 0u) |
                               (b[j] == 0.0f ? 0u : (unsigned(e - 1 + 15) << 10 | unsigned((2 * fr - 1) * 1024))));
    }
    upload(db, b);
    upload(db16, b16);
    upload(dh16, h16);
    const unsigned long long clear = ~0ull;
    CUDA_OK(cudaMemcpy(dflag.p, &clear, 8, cudaMemcpyHostToDevice));

    GemmArgs args;
    args.format = f;
    args.group = group_of(f);
    args.m = m;
    args.n = n;
    args.k = k;
    args.a_codes = da.p;
    args.a_scales = dsa.p;
    args.w_codes = dw.p;
    args.w_scales = dsw.p;
    args.alpha = float(tensor_factor(f) * tensor_factor(f));
    args.y = dy.p;
    args.workspace = dws.p;
    args.workspace_bytes = dws.n;
    ASSERT_TRUE(wush::cuda::gemm_supported(kernel, args, sm));
    auto run = [&](wush_dtype y_dtype, const wush::cuda::OutputBias& bias, void* out) {
        args.y_dtype = y_dtype;
        args.bias = bias;
        run_kernel(kernel, args);
        CUDA_OK(cudaGetLastError());
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaMemcpy(out, dy.p, m * n * (y_dtype == WUSH_DTYPE_BF16 ? 2 : 4), cudaMemcpyDeviceToHost));
    };
    std::vector<float> y0(m * n), y(m * n);
    std::vector<std::uint16_t> yh(m * n);
    run(WUSH_DTYPE_F32, {}, y0.data());
    const void* biases[] = {db.p, dh16.p, db16.p};
    const wush_dtype dtypes[] = {WUSH_DTYPE_F32, WUSH_DTYPE_F16, WUSH_DTYPE_BF16};
    for (int d = 0; d < 3; ++d) {
        const wush::cuda::OutputBias bias{biases[d], dtypes[d], dflag.p};
        run(WUSH_DTYPE_F32, bias, y.data());
        run(WUSH_DTYPE_BF16, bias, yh.data());
        int bad = 0;
        for (std::size_t i = 0; i < m * n; ++i) {
            const float want = y0[i] + b[i % n];
            std::uint32_t u;
            std::memcpy(&u, &want, 4);
            const std::uint16_t want16 = std::uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
            if ((std::memcmp(&y[i], &want, 4) != 0 || yh[i] != want16) && bad++ < 5)
                ADD_FAILURE() << "bias dtype " << int(dtypes[d]) << ": y[" << i << "] = " << y[i] << " (bf16 " << yh[i]
                              << "), want " << want;
        }
        EXPECT_EQ(bad, 0);
    }
    unsigned long long flag = 0;
    CUDA_OK(cudaMemcpy(&flag, dflag.p, 8, cudaMemcpyDeviceToHost));
    EXPECT_EQ(flag, clear);
    b[n - 1] = INFINITY;
    b[n / 2] = NAN;
    upload(db, b);
    run(WUSH_DTYPE_F32, {db.p, WUSH_DTYPE_F32, dflag.p}, y.data());
    CUDA_OK(cudaMemcpy(&flag, dflag.p, 8, cudaMemcpyDeviceToHost));
    EXPECT_EQ(flag, (wush::cuda::kBiasReportRow << 32) | (n / 2));
}

TEST(W4A4GemmGpu, BiasInEveryKernelsStore) {
    REQUIRE_GPU(sm);
    ASSERT_NE(blas_handle(), nullptr);
    std::mt19937 rng(5);
    check_bias(GemmKernel::Decode, WUSH_FORMAT_MXFP4, 3, 40, 96, rng, sm);     // the kernel's own store
    check_bias(GemmKernel::Decode, WUSH_FORMAT_NVFP4, 1, 256, 4096, rng, sm);  // split-K: the reduction
    if (sm >= 80) check_bias(GemmKernel::Prefill, WUSH_FORMAT_INT4, 200, 136, 480, rng, sm);
    check_bias(GemmKernel::Reference, WUSH_FORMAT_MXFP4, 17, 13, 96, rng, sm);  // the finishing kernel
    check_bias(GemmKernel::Reference, WUSH_FORMAT_INT4, 130, 256, 512, rng, sm);
}

// Activation scales of 2^103 (past the exact range of the prefill kernel's 2-op promotion: its
// flag must switch to FADD + FMUL + FFMA) and 2^-126 (smallest normal) with compensating weights.
TEST(W4A4GemmGpu, ExtremeMxScales) {
    REQUIRE_GPU(sm);
    std::mt19937 rng(4);
    for (wush_format f : {WUSH_FORMAT_MXFP4, WUSH_FORMAT_MXFP4_OCP}) {
        check_product(GemmKernel::Decode, f, 3, 24, 96, WUSH_DTYPE_F32, rng, sm, 127 + 103, 127 - 100);
        check_product(GemmKernel::Decode, f, 3, 24, 96, WUSH_DTYPE_F32, rng, sm, 127 - 126, 127 + 110);
        if (sm >= 80) {
            check_product(GemmKernel::Prefill, f, 130, 24, 96, WUSH_DTYPE_F32, rng, sm, 127 + 103, 127 - 100);
            check_product(GemmKernel::Prefill, f, 130, 24, 96, WUSH_DTYPE_F32, rng, sm, 127 - 126, 127 + 110);
        }
    }
}

// The BF16 prefill kernel (opt-in, WUSH_CONTEXT_CUDA_BF16_PREFILL) on the reference path's shapes and
// more, against the same float64 product and tolerance the reference path meets above; extreme MX
// scales: activations of 2^-126 (BF16 subnormal products: the tensor core must not flush them)
// and of 2^103 with compensating weights.
TEST(W4A4GemmGpu, Bf16PrefillAgainstFloat64) {
    REQUIRE_GPU(sm);
    if (sm < 80) GTEST_SKIP() << "BF16 mma.sync needs sm_80";
    std::mt19937 rng(6);
    for (wush_format f : {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4, WUSH_FORMAT_MXFP4_OCP}) {
        for (std::size_t m : {33, 130, 257})
            for (std::size_t n : {8, 13, 256})
                for (std::size_t k : {32, 96, 4096})
                    check_product(GemmKernel::Reference, f, m, n, k, WUSH_DTYPE_F32, rng, sm, -1, -1, 0, true);
        check_product(GemmKernel::Reference, f, 200, 136, 480, WUSH_DTYPE_BF16, rng, sm, -1, -1, 0, true);
    }
    for (wush_format f : {WUSH_FORMAT_MXFP4, WUSH_FORMAT_MXFP4_OCP}) {
        check_product(GemmKernel::Reference, f, 130, 24, 96, WUSH_DTYPE_F32, rng, sm, 127 + 103, 127 - 100, 0, true);
        check_product(GemmKernel::Reference, f, 130, 24, 96, WUSH_DTYPE_F32, rng, sm, 127 - 126, 127 + 110, 0, true);
    }
}

// The reference path's BF16 y is written by cuBLAS itself (issue 41, 3(b)); until then it was
// cuBLAS's float32 y rounded to nearest even by a separate kernel. Same operands, both outputs:
// the bits must equal the float32 output rounded RNE here (an independent rounding). cuBLAS may
// choose another algorithm (tiling, split-K) for a bf16 output, whose float32 accumulator then
// differs before the rounding: any difference is reported with its count and largest distance
// in bf16 ulps, so that the record says which shapes differ.
std::uint16_t rne_bf16(float v) {
    std::uint32_t u;
    std::memcpy(&u, &v, 4);
    if ((u & 0x7F800000u) == 0x7F800000u) return std::uint16_t((u >> 16) | ((u & 0xFFFFu) ? 0x40u : 0u));
    return std::uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

void check_bf16_equals_rounded_f32(wush_format f, std::size_t m, std::size_t n, std::size_t k, std::mt19937& rng) {
    SCOPED_TRACE(::testing::Message() << "format " << int(f) << " m " << m << " n " << n << " k " << k);
    const Operand a = random_operand(f, m, k, rng), w = random_operand(f, n, k, rng);
    DeviceBuffer<std::uint8_t> da(a.codes.size()), dsa(a.scales.size()), dw(w.codes.size()), dsw(w.scales.size()),
        y32(m * n * 4), y16(m * n * 2),
        ws(wush::cuda::reference_gemm_workspace_bytes(f, m, n, k, false, WUSH_DTYPE_F32));
    ASSERT_TRUE(da.p && dsa.p && dw.p && dsw.p && y32.p && y16.p && ws.p);
    upload(da, a.codes);
    upload(dsa, a.scales);
    upload(dw, w.codes);
    upload(dsw, w.scales);
    GemmArgs args;
    args.format = f;
    args.group = group_of(f);
    args.m = m;
    args.n = n;
    args.k = k;
    args.a_codes = da.p;
    args.a_scales = dsa.p;
    args.w_codes = dw.p;
    args.w_scales = dsw.p;
    args.alpha = float(tensor_factor(f) * tensor_factor(f));
    args.workspace = ws.p;
    args.workspace_bytes = ws.n;
    args.y = y32.p;
    args.y_dtype = WUSH_DTYPE_F32;
    wush::cuda::launch_reference_gemm(args, nullptr, blas_handle(), nullptr);
    args.y = y16.p;
    args.y_dtype = WUSH_DTYPE_BF16;
    wush::cuda::launch_reference_gemm(args, nullptr, blas_handle(), nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> f32(m * n);
    std::vector<std::uint16_t> b16(m * n);
    CUDA_OK(cudaMemcpy(f32.data(), y32.p, m * n * 4, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(b16.data(), y16.p, m * n * 2, cudaMemcpyDeviceToHost));
    std::size_t differ = 0;
    int worst = 0;
    for (std::size_t i = 0; i < m * n; ++i) {
        const int d = std::abs(int(std::int16_t(rne_bf16(f32[i]))) - int(std::int16_t(b16[i])));
        if (d != 0) ++differ, worst = std::max(worst, d);
    }
    std::printf("[ bf16 out ] format %d m %zu n %zu k %zu: %zu of %zu differ from RNE(float32 out), largest %d ulp\n",
                int(f), m, n, k, differ, m * n, worst);
    EXPECT_EQ(differ, 0u) << "cuBLAS's bf16 output is not its float32 output rounded RNE (largest " << worst << " ulp)";
}

TEST(W4A4GemmGpu, ReferenceBf16OutputEqualsRoundedF32) {
    REQUIRE_GPU(sm);
    ASSERT_NE(blas_handle(), nullptr);
    (void)sm;
    std::mt19937 rng(5);
    for (wush_format f : {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4, WUSH_FORMAT_MXFP4_OCP}) {
        check_bf16_equals_rounded_f32(f, 33, 13, 96, rng);
        check_bf16_equals_rounded_f32(f, 130, 256, 4096, rng);
        check_bf16_equals_rounded_f32(f, 64, 64, 14336, rng);  // small m x n, long k: where split-K is likely
        check_bf16_equals_rounded_f32(f, 1024, 1024, 1024, rng);
    }
}

// Selection runs without a device.
TEST(W4A4GemmSelect, PicksByRowsAndArchitecture) {
    GemmArgs a;
    a.format = WUSH_FORMAT_MXFP4;
    a.group = 32;
    a.n = 4096;
    a.k = 4096;
    a.m = 1;
    EXPECT_EQ(wush::cuda::pick_gemm(a, 90), GemmKernel::Decode);
    a.m = 16;
    EXPECT_EQ(wush::cuda::pick_gemm(a, 80), GemmKernel::Decode);
    a.m = 4096;
    // m > 32 on sm_80/90: the reference path unless the prefill kernel is asked for.
    const wush::cuda::KernelTable prefill = wush::cuda::active_table({.prefill_min_m = 33});
    EXPECT_EQ(wush::cuda::pick_gemm(a, 90), GemmKernel::Reference);
    EXPECT_EQ(wush::cuda::pick_gemm(a, 90, true, &prefill), GemmKernel::Prefill);
    EXPECT_EQ(wush::cuda::pick_gemm(a, 80, true, &prefill), GemmKernel::Prefill);
    // Blackwell's cuBLASLt FP4 path only where the context opted in (WUSH_CONTEXT_CUDA_BLOCKSCALED).
    const wush::cuda::KernelTable lt = wush::cuda::active_table({.blockscaled = true});
    EXPECT_EQ(wush::cuda::pick_gemm(a, 100), GemmKernel::Reference);
    EXPECT_EQ(wush::cuda::pick_gemm(a, 120), GemmKernel::Reference);
    EXPECT_EQ(wush::cuda::pick_gemm(a, 100, true, &lt), GemmKernel::BlockScaledLt);
    EXPECT_EQ(wush::cuda::pick_gemm(a, 120, true, &lt), GemmKernel::BlockScaledLt);
    EXPECT_EQ(wush::cuda::pick_gemm(a, 100, false, &lt), GemmKernel::Reference);
    EXPECT_EQ(wush::cuda::pick_gemm(a, 75), GemmKernel::Reference);
    a.format = WUSH_FORMAT_INT4;  // no cuBLASLt FP4 path: the next rule, INT4's prefill from m = 128
    EXPECT_EQ(wush::cuda::pick_gemm(a, 100), GemmKernel::Prefill);
    EXPECT_EQ(wush::cuda::pick_gemm(a, 90), GemmKernel::Prefill);
    EXPECT_EQ(wush::cuda::pick_gemm(a, 75), GemmKernel::Reference);
    a.m = 127;
    EXPECT_EQ(wush::cuda::pick_gemm(a, 90), GemmKernel::Reference);
    EXPECT_EQ(wush::cuda::pick_gemm(a, 100, true, &prefill), GemmKernel::Prefill);
    a.m = 4096;
    a.k = 4112;  // not a multiple of 32
    EXPECT_EQ(wush::cuda::pick_gemm(a, 90, true, &prefill), GemmKernel::Reference);
    a.k = 4096;
    a.group = 16;  // wrong G for INT4
    EXPECT_EQ(wush::cuda::pick_gemm(a, 90), GemmKernel::Reference);
    a.format = WUSH_FORMAT_NVFP4;
    a.m = 1;
    EXPECT_EQ(wush::cuda::pick_gemm(a, 90), GemmKernel::Decode);
    // gemm_supported also wants the operands and the workspace.
    EXPECT_FALSE(wush::cuda::gemm_supported(GemmKernel::Decode, a, 90));
    EXPECT_EQ(wush::cuda::gemm_workspace_bytes(GemmKernel::Decode, a.format, 1, 4096, 4096), 2u * 4096 * 4);
    EXPECT_EQ(wush::cuda::gemm_workspace_bytes(GemmKernel::Decode, a.format, 1, 14336, 4096), 0u);
    EXPECT_EQ(wush::cuda::gemm_workspace_bytes(GemmKernel::Reference, a.format, 1, 14336, 4096), 0u);
}

// The BF16 prefill kernel's host rules (no device needed): the E2M1 formats on sm_80+ only, k a
// multiple of 32, operands and enough aligned workspace; and its workspace never exceeds what the
// reference path it replaces was given (W dequantized per forward), so that the backend's hook
// needs no larger layer workspace.
TEST(W4A4GemmSelect, Bf16PrefillRulesAndWorkspace) {
    std::vector<std::uint8_t> buf(1 << 16);
    GemmArgs a;
    a.format = WUSH_FORMAT_MXFP4;
    a.group = 32;
    a.m = 64;
    a.n = 40;
    a.k = 96;
    a.a_codes = a.w_codes = a.a_scales = a.w_scales =
        buf.data() + (16 - reinterpret_cast<std::uintptr_t>(buf.data()) % 16) % 16;
    a.y = buf.data();
    a.workspace = const_cast<std::uint8_t*>(a.a_codes);
    a.workspace_bytes = wush::cuda::bf16_prefill_workspace_bytes(a.format, a.m, a.n, a.k);
    EXPECT_TRUE(wush::cuda::bf16_prefill_supported(a, 80));
    EXPECT_TRUE(wush::cuda::bf16_prefill_supported(a, 90));
    EXPECT_FALSE(wush::cuda::bf16_prefill_supported(a, 75));
    a.workspace_bytes -= 1;
    EXPECT_FALSE(wush::cuda::bf16_prefill_supported(a, 90));
    a.workspace_bytes += 1;
    a.k = 80;  // not a multiple of 32
    EXPECT_FALSE(wush::cuda::bf16_prefill_supported(a, 90));
    a.k = 96;
    a.w_codes = a.w_codes + 8;  // code rows not 16-byte aligned
    EXPECT_FALSE(wush::cuda::bf16_prefill_supported(a, 90));
    a.w_codes = a.a_codes;
    a.format = WUSH_FORMAT_INT4;  // not exact in BF16
    EXPECT_FALSE(wush::cuda::bf16_prefill_supported(a, 90));
    a.format = WUSH_FORMAT_NVFP4;  // G must be 16
    EXPECT_FALSE(wush::cuda::bf16_prefill_supported(a, 90));
    a.group = 16;
    a.workspace_bytes = wush::cuda::bf16_prefill_workspace_bytes(a.format, a.m, a.n, a.k);
    EXPECT_TRUE(wush::cuda::bf16_prefill_supported(a, 90));
    for (wush_format f : {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4, WUSH_FORMAT_MXFP4_OCP})
        for (std::size_t m : {33, 200, 4096})
            for (std::size_t n : {1, 3, 8, 13, 4096})
                for (std::size_t k : {32, 96, 4096, 14336})
                    EXPECT_LE(wush::cuda::bf16_prefill_workspace_bytes(f, m, n, k),
                              wush::cuda::reference_gemm_workspace_bytes(f, m, n, k, false, WUSH_DTYPE_F32))
                        << "format " << int(f) << " m " << m << " n " << n << " k " << k;
}

// The reference path's workspace (issue 41, 3(b)): a BF16 y of the bf16 formats needs no float32
// scratch (cuBLAS writes BF16); INT4 still rounds a float32 product in a second kernel.
TEST(W4A4GemmSelect, ReferenceBf16OutputNeedsNoFloatScratch) {
    const std::size_t m = 300, n = 200, k = 64;
    for (wush_format f : {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4, WUSH_FORMAT_MXFP4_OCP})
        EXPECT_EQ(wush::cuda::reference_gemm_workspace_bytes(f, m, n, k, true, WUSH_DTYPE_BF16),
                  wush::cuda::reference_gemm_workspace_bytes(f, m, n, k, true, WUSH_DTYPE_F32));
    const std::size_t int4_f32 =
        wush::cuda::reference_gemm_workspace_bytes(WUSH_FORMAT_INT4, m, n, k, true, WUSH_DTYPE_F32);
    EXPECT_GE(wush::cuda::reference_gemm_workspace_bytes(WUSH_FORMAT_INT4, m, n, k, true, WUSH_DTYPE_BF16),
              int4_f32 + m * n * sizeof(float));
}

// ---------------------------------------------------------------------------------------------
// Benchmark against cuBLAS BF16
// ---------------------------------------------------------------------------------------------

float median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

template <typename F>
float time_us(F&& f, cudaStream_t s) {
    for (int i = 0; i < 10; ++i) f();
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    std::vector<float> ts;
    for (int i = 0; i < 50; ++i) {
        cudaEventRecord(e0, s);
        f();
        cudaEventRecord(e1, s);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        ts.push_back(ms * 1000.0f);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return median(ts);
}

TEST(W4A4GemmGpu, Bench) {
    REQUIRE_GPU(sm);
    if (!std::getenv("WUSH_GEMM_BENCH")) GTEST_SKIP() << "set WUSH_GEMM_BENCH=1";
    struct Shape {
        std::size_t m, n, k;
    };
    const Shape shapes[] = {{1, 4096, 4096},   {1, 14336, 4096},  {1, 4096, 14336},  {16, 4096, 4096},
                            {16, 14336, 4096}, {16, 4096, 14336}, {128, 4096, 4096}, {4096, 4096, 4096}};
    cublasHandle_t h;
    ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    std::mt19937 rng(5);
    std::printf("%-8s %-18s %10s %10s %10s %8s\n", "format", "m x n x k", "kernel us", "cublas us", "kernel",
                "speedup");
    for (wush_format f : {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4, WUSH_FORMAT_INT4}) {
        for (const Shape& s : shapes) {
            const int G = group_of(f), sb = scale_bytes(f);
            // Several weight copies rotate so that the weights do not sit in L2 between runs.
            const std::size_t copies =
                std::max<std::size_t>(1, std::min<std::size_t>(8, (200u << 20) / (s.n * s.k / 2)));
            DeviceBuffer<std::uint8_t> da(s.m * s.k / 2), dsa(s.m * s.k / G * sb), dw(copies * s.n * s.k / 2),
                dsw(copies * s.n * s.k / G * sb), dy(s.m * s.n * 4);
            std::vector<std::uint8_t> h_codes(std::max(dw.n, da.n)), h_sc(std::max(dsw.n, dsa.n));
            for (auto& c : h_codes) c = std::uint8_t(rng());
            for (auto& c : h_sc) c = std::uint8_t(f == WUSH_FORMAT_INT4 ? 0x3F : 0x38 + rng() % 8);
            CUDA_OK(cudaMemcpy(da.p, h_codes.data(), da.n, cudaMemcpyHostToDevice));
            CUDA_OK(cudaMemcpy(dw.p, h_codes.data(), dw.n, cudaMemcpyHostToDevice));
            CUDA_OK(cudaMemcpy(dsa.p, h_sc.data(), dsa.n, cudaMemcpyHostToDevice));
            CUDA_OK(cudaMemcpy(dsw.p, h_sc.data(), dsw.n, cudaMemcpyHostToDevice));
            GemmArgs args;
            args.format = f;
            args.group = G;
            args.m = s.m;
            args.n = s.n;
            args.k = s.k;
            args.a_codes = da.p;
            args.a_scales = dsa.p;
            args.alpha = 1.0f;
            args.y = dy.p;
            args.y_dtype = WUSH_DTYPE_BF16;
            const GemmKernel kernel =
                wush::cuda::pick_gemm(args, sm) == GemmKernel::Decode ? GemmKernel::Decode : GemmKernel::Prefill;
            const std::size_t ws = wush::cuda::gemm_workspace_bytes(kernel, f, s.m, s.n, s.k);
            DeviceBuffer<std::uint8_t> dws(std::max<std::size_t>(ws, 16));
            args.workspace = dws.p;
            args.workspace_bytes = dws.n;
            std::size_t it = 0;
            const float us = time_us(
                [&] {
                    const std::size_t c = it++ % copies;
                    GemmArgs a2 = args;
                    a2.w_codes = dw.p + c * (s.n * s.k / 2);
                    a2.w_scales = dsw.p + c * (s.n * s.k / G * sb);
                    if (kernel == GemmKernel::Decode) wush::cuda::launch_decode_gemm(a2, nullptr);
                    else wush::cuda::launch_prefill_gemm(a2, nullptr);
                },
                nullptr);
            CUDA_OK(cudaDeviceSynchronize());
            // cuBLAS BF16: Y^T (n x m, column-major) = W (k x n col-major = n x k row-major)^T X.
            const std::size_t wcopies =
                std::max<std::size_t>(1, std::min<std::size_t>(4, (400u << 20) / (s.n * s.k * 2)));
            DeviceBuffer<__nv_bfloat16> bx(s.m * s.k), bw(wcopies * s.n * s.k), by(s.m * s.n);
            CUDA_OK(cudaMemset(bx.p, 0x3C, bx.n * 2));
            CUDA_OK(cudaMemset(bw.p, 0x3C, bw.n * 2));
            const float one = 1.0f, zero = 0.0f;
            std::size_t it2 = 0;
            const float us_blas = time_us(
                [&] {
                    const std::size_t c = it2++ % wcopies;
                    cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(s.n), int(s.m), int(s.k), &one, bw.p + c * s.n * s.k,
                                 CUDA_R_16BF, int(s.k), bx.p, CUDA_R_16BF, int(s.k), &zero, by.p, CUDA_R_16BF, int(s.n),
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
                },
                nullptr);
            CUDA_OK(cudaDeviceSynchronize());
            char shape[64];
            std::snprintf(shape, sizeof shape, "%zux%zux%zu", s.m, s.n, s.k);
            std::printf("%-8s %-18s %10.1f %10.1f %10s %7.2fx\n",
                        f == WUSH_FORMAT_MXFP4   ? "mxfp4"
                        : f == WUSH_FORMAT_NVFP4 ? "nvfp4"
                                                 : "int4",
                        shape, us, us_blas, kernel == GemmKernel::Decode ? "decode" : "prefill", us_blas / us);
        }
    }
    cublasDestroy(h);
}

}  // namespace
