// The tensor-core quantize (device code: cuda/quantize/quantize_tc_kernel.cuh, which says how its bytes stay
// the float64 definition's) and the accumulator probe that guards its selection: the kernel's error
// bound rests on a model of how BF16 mma.sync accumulates in FP32 (cuda/quantize/mma_error_bound.h),
// which NVIDIA does not document, so the CUDA backend uses this kernel only when
// WUSH_CONTEXT_CUDA_TC_QUANTIZE = 1 and the probe, run once per context at the first prepare
// that asks for it, measured every tested MMA result inside the model's bound (else it keeps the
// CUDA-core kernels).
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "bf16_fragments.h"
#include "cuda_check.h"
#include "kernels.h"
#include "mma_error_bound.h"
#include "quantize_tc_kernel.cuh"

namespace wush::cuda {

namespace {

using namespace quantize_detail;

template <wush_format F>
void launch_tc(const QuantizeArgs& a, cudaStream_t stream) {
    const std::size_t groups = a.d_in / std::size_t(Fmt<F>::G);
    const dim3 grid(unsigned((a.n_tokens + kTileTokens - 1) / kTileTokens),
                    unsigned((groups + kTileGroups - 1) / kTileGroups));
    if (a.x_dtype == WUSH_DTYPE_F16) quantize_tc_kernel<F, true><<<grid, kThreads, 0, stream>>>(a);
    else quantize_tc_kernel<F, false><<<grid, kThreads, 0, stream>>>(a);
}

// One m16n8k16 per case: a warp loads A (16 x 16), B (16 x 8) BF16 and C (16 x 8) float row-major
// through the PTX fragment maps and writes D row-major.
__global__ void tc_probe_kernel(const std::uint16_t* a, const std::uint16_t* b, const float* c, float* d) {
    const int lane = threadIdx.x & 31;
    const std::size_t cs = blockIdx.x;
    const std::uint16_t* A = a + cs * 256;
    const std::uint16_t* B = b + cs * 128;
    std::uint32_t ra[4];
    for (int r = 0; r < 4; ++r)
        ra[r] = std::uint32_t(A[tc::a_row(lane, r) * 16 + tc::a_col(lane, r, 0)]) |
                (std::uint32_t(A[tc::a_row(lane, r) * 16 + tc::a_col(lane, r, 1)]) << 16);
    std::uint32_t rb[2];
    for (int r = 0; r < 2; ++r)
        rb[r] = std::uint32_t(B[tc::b_row(lane, r, 0) * 8 + tc::b_col(lane)]) |
                (std::uint32_t(B[tc::b_row(lane, r, 1) * 8 + tc::b_col(lane)]) << 16);
    float acc[4];
    for (int i = 0; i < 4; ++i) acc[i] = c[cs * 128 + tc::c_row(lane, i) * 8 + tc::c_col(lane, i)];
    mma_bf16(acc, ra, rb[0], rb[1], 0, 0);
    for (int i = 0; i < 4; ++i) d[cs * 128 + tc::c_row(lane, i) * 8 + tc::c_col(lane, i)] = acc[i];
}

std::uint16_t bf16_of(double v) {
    return tc::bf16_rne(float(v));
}

// Probe inputs, case by case: Gaussian; wide exponent spread; products just below powers of two
// (every alignment truncates a whole unit); a large C with small products (C's truncation); a
// tiny C with large products; heavy cancellation (the sum far below M); subnormal BF16 inputs;
// products below FP32's normal range (the last two: the model's absolute allowance).
void make_case(int kind, std::mt19937& rng, std::uint16_t* A, std::uint16_t* B, float* C) {
    std::normal_distribution<double> gauss;
    std::uniform_int_distribution<int> spread(-20, 20);
    for (int i = 0; i < 256; ++i) {
        double v = gauss(rng);
        if (kind == 1) v = std::ldexp(v, spread(rng));
        if (kind == 2) v = (i % 2 ? -1.0 : 1.0) * (2.0 - 0x1p-7);
        A[i] = bf16_of(v);
    }
    for (int i = 0; i < 128; ++i) {
        double v = gauss(rng);
        if (kind == 1) v = std::ldexp(v, spread(rng));
        if (kind == 2) v = 1.0 - 0x1p-8;
        B[i] = bf16_of(v);
        double c = gauss(rng);
        if (kind == 3) c = std::ldexp(c, 12);
        if (kind == 4) c = std::ldexp(c, -30);
        C[i] = float(c);
    }
    if (kind == 5)  // row r of A = -(row r + 8): pairs of outputs cancel to C plus rounding
        for (int r = 0; r < 8; ++r)
            for (int k = 0; k < 16; ++k) A[(r + 8) * 16 + k] = std::uint16_t(A[r * 16 + k] ^ 0x8000u);
    if (kind == 6) {  // subnormal BF16 inputs in A (every other one), tiny C: a flush shows
        for (int i = 0; i < 256; i += 2) A[i] = bf16_of(std::ldexp(gauss(rng), -130));
        for (int i = 0; i < 128; ++i) C[i] = float(std::ldexp(gauss(rng), -124));
    }
    if (kind == 7) {  // normal inputs whose products fall below FP32's normal range
        for (int i = 0; i < 256; ++i) A[i] = bf16_of(std::ldexp(gauss(rng), -70));
        for (int i = 0; i < 128; ++i) B[i] = bf16_of(std::ldexp(gauss(rng), -62));
        for (int i = 0; i < 128; ++i) C[i] = 0.0f;
    }
}

}  // namespace

bool quantize_tc_applies(const QuantizeArgs& a) {
    return a.tc_fragments != nullptr && a.tc_norms != nullptr && a.use != MatrixUse::None &&
           (a.x_dtype == WUSH_DTYPE_BF16 || a.x_dtype == WUSH_DTYPE_F16);
}

void launch_quantize_tc(const QuantizeArgs& a, cudaStream_t stream) {
    if (!with_quantize_format(a.format, [&](auto f) { launch_tc<decltype(f)::value>(a, stream); }))
        fail(WUSH_ERR_INVALID_ARGUMENT, "launch_quantize: unknown format");
    check_launch("tensor-core quantize kernel");
}

TcProbeResult run_tc_accumulator_probe(cudaStream_t stream) {
    constexpr int kKinds = 8, kPerKind = 64, kCases = kKinds * kPerKind;
    std::vector<std::uint16_t> A(std::size_t(kCases) * 256), B(std::size_t(kCases) * 128);
    std::vector<float> C(std::size_t(kCases) * 128), D(C.size());
    std::mt19937 rng(2026);
    for (int cs = 0; cs < kCases; ++cs)
        make_case(cs / kPerKind, rng, &A[std::size_t(cs) * 256], &B[std::size_t(cs) * 128], &C[std::size_t(cs) * 128]);
    const DeviceBuffer da = DeviceBuffer::upload(A.data(), A.size() * 2, stream);
    const DeviceBuffer db = DeviceBuffer::upload(B.data(), B.size() * 2, stream);
    const DeviceBuffer dc = DeviceBuffer::upload(C.data(), C.size() * 4, stream);
    DeviceBuffer dd(D.size() * 4);
    tc_probe_kernel<<<kCases, 32, 0, stream>>>(da.get<std::uint16_t>(), db.get<std::uint16_t>(), dc.get<float>(),
                                               dd.get<float>());
    check_launch("tensor-core accumulator probe");
    WUSH_CUDA_CHECK(cudaMemcpyAsync(D.data(), dd.get(), D.size() * 4, cudaMemcpyDeviceToHost, stream));
    WUSH_CUDA_CHECK(cudaStreamSynchronize(stream));
    TcProbeResult r;
    r.outputs = std::size_t(kCases) * 128;
    for (int cs = 0; cs < kCases; ++cs)
        for (int row = 0; row < 16; ++row)
            for (int col = 0; col < 8; ++col) {
                const std::size_t o = std::size_t(cs) * 128 + std::size_t(row * 8 + col);
                long double s = C[o], m = std::fabs(double(C[o]));
                for (int k = 0; k < 16; ++k) {
                    const double p = double(tc::bf16_value(A[std::size_t(cs) * 256 + std::size_t(row * 16 + k)])) *
                                     double(tc::bf16_value(B[std::size_t(cs) * 128 + std::size_t(k * 8 + col)]));
                    s += p;
                    m += std::fabs(p);
                }
                const double err = double(std::fabs((long double)D[o] - s));
                const double allowed = double(tc::mma_instruction_error(float(m))) + double(tc::kMmaAbsPerInstruction);
                const double ratio = allowed > 0 ? err / allowed : (err > 0 ? INFINITY : 0.0);
                if (ratio > r.worst_ratio) r.worst_ratio = ratio;
                if (err != 0.0) ++r.inexact;
            }
    r.passed = r.worst_ratio <= 1.0;
    return r;
}

}  // namespace wush::cuda
