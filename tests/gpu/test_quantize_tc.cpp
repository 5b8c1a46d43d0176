// The tensor-core quantize (cuda/quantize/quantize_tc.cu) on a device: the accumulator probe (the model its
// error bound assumes, cuda/quantize/mma_error_bound.h, against real mma.sync results), and the
// kernel's bytes against the float64 definition of the formats on random inputs, inputs on E2M1
// thresholds and inputs built to lie a twentieth of the bound below a boundary. SKIPPED without a
// device of compute capability 8.0 or newer (ctest label `gpu`).
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "common/float_bits.h"
#include "cuda_check.h"
#include "formats/block_format.h"
#include "formats/certified_group.h"
#include "formats/group_quantizer.h"
#include "kernels.h"
#include "quantize/bf16_fragments.h"
#include "quantize/mma_error_bound.h"
#include "transforms/block_transform.h"
#include "transforms/runtime_layer.h"

namespace {

using namespace wush;

int compute_capability() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        cudaGetLastError();
        return 0;
    }
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return 0;
    return p.major * 10 + p.minor;
}

#define REQUIRE_SM80() \
  if (compute_capability() < 80) GTEST_SKIP() << "no CUDA device of sm_80 or newer"

TEST(QuantizeTc, AccumulatorProbe) {
    REQUIRE_SM80();
    const cuda::TcProbeResult r = cuda::run_tc_accumulator_probe(nullptr);
    std::printf("tc accumulator probe: sm_%d, %zu outputs, %zu inexact, largest error / model bound %.4f: %s\n",
                compute_capability(), r.outputs, r.inexact, r.worst_ratio, r.passed ? "PASS" : "FAIL");
    EXPECT_TRUE(r.passed) << "BF16 mma accumulation left the assumed model: keep the CUDA-core quantize";
}

int group_of(wush_format f) {
    return f == WUSH_FORMAT_NVFP4 ? 16 : 32;
}

struct Problem {
    wush_format format = WUSH_FORMAT_MXFP4;
    wush_dtype dtype = WUSH_DTYPE_BF16;
    std::size_t n = 0, d_in = 0;
    bool per_block = true;
    std::vector<float> t;  // row-major matrices
    std::vector<std::uint16_t> x;
    float x_at(std::size_t i) const {
        return dtype == WUSH_DTYPE_BF16 ? bits::bf16_decode(x[i]) : bits::f16_decode(x[i]);
    }
};

std::uint16_t f16_of(float v) {
    const std::uint16_t sign = std::signbit(v) ? 0x8000 : 0;
    const double r = bits::round_to_format(std::fabs(double(v)), 10, -14);
    if (r < 0x1p-14) return std::uint16_t(sign | std::uint16_t(r * 0x1p24));
    const int e = bits::floor_log2(r);
    return std::uint16_t(sign | ((e + 15) << 10) | int((r / std::ldexp(1.0, e) - 1.0) * 1024.0));
}

std::uint16_t encode_x(float v, wush_dtype dt) {
    return dt == WUSH_DTYPE_BF16 ? bits::bf16_encode(double(v)) : f16_of(v);
}

struct Bytes {
    std::vector<std::uint8_t> codes, scales;
};

Bytes definition(const Problem& p) {
    const int g = group_of(p.format), sb = p.format == WUSH_FORMAT_INT4 ? 2 : 1;
    const formats::PackedSizes s = formats::packed_sizes(formats::spec(p.format), p.n, p.d_in);
    Bytes b{std::vector<std::uint8_t>(s.codes), std::vector<std::uint8_t>(s.scales)};
    for (std::size_t r = 0; r < p.n; ++r)
        for (std::size_t grp = 0; grp < p.d_in / std::size_t(g); ++grp) {
            float x[32];
            for (int j = 0; j < g; ++j) x[j] = p.x_at(r * p.d_in + grp * std::size_t(g) + std::size_t(j));
            double y[32];
            formats::transform_group_f64(p.t.data() + (p.per_block ? grp : 0) * std::size_t(g * g), x, g, y);
            formats::quantize_group<double>(p.format, y, g, b.codes.data() + (r * p.d_in + grp * std::size_t(g)) / 2,
                                            b.scales.data() + (r * (p.d_in / std::size_t(g)) + grp) * std::size_t(sb));
        }
    return b;
}

template <class T>
cuda::DeviceBuffer upload(const std::vector<T>& v) {
    return cuda::DeviceBuffer::upload(v.data(), v.size() * sizeof(T));
}

Bytes run_device(const Problem& p) {
    const int g = group_of(p.format);
    const std::size_t count = p.per_block ? p.d_in / std::size_t(g) : 1;
    std::vector<std::uint32_t> frags(count * tc::fragment_words(g));
    std::vector<tc::PartNorms> norms(count);
    for (std::size_t m = 0; m < count; ++m)
        norms[m] = tc::pack_fragments(p.t.data() + m * std::size_t(g * g), g, frags.data() + m * tc::fragment_words(g));
    const formats::PackedSizes s = formats::packed_sizes(formats::spec(p.format), p.n, p.d_in);
    const cuda::DeviceBuffer dx = upload(p.x), dm = upload(cuda::kernel_matrices(p.t.data(), count, g));
    const cuda::DeviceBuffer df = upload(frags), dn = upload(norms);
    cuda::DeviceBuffer dc(s.codes), ds(s.scales), flag(sizeof(unsigned long long));
    WUSH_CUDA_CHECK(cudaMemset(flag.get(), 0xFF, sizeof(unsigned long long)));
    cuda::QuantizeArgs a;
    a.format = p.format;
    a.group = g;
    a.x_dtype = p.dtype;
    a.x = dx.get();
    a.n_tokens = p.n;
    a.d_in = p.d_in;
    a.use = p.per_block ? MatrixUse::PerBlock : MatrixUse::Shared;
    a.matrices = dm.get<float>();
    a.codes = dc.get<std::uint8_t>();
    a.scales = ds.get<std::uint8_t>();
    a.non_finite = flag.get<unsigned long long>();
    a.tc_fragments = df.get<std::uint32_t>();
    a.tc_norms = dn.get<tc::PartNorms>();
    EXPECT_TRUE(cuda::quantize_tc_applies(a));
    cuda::launch_quantize(a, cuda::Kernel::QuantizeTensorCore, nullptr);
    WUSH_CUDA_CHECK(cudaDeviceSynchronize());
    Bytes b{std::vector<std::uint8_t>(s.codes), std::vector<std::uint8_t>(s.scales)};
    WUSH_CUDA_CHECK(cudaMemcpy(b.codes.data(), dc.get(), s.codes, cudaMemcpyDeviceToHost));
    WUSH_CUDA_CHECK(cudaMemcpy(b.scales.data(), ds.get(), s.scales, cudaMemcpyDeviceToHost));
    return b;
}

Problem random_problem(wush_format f, wush_dtype dt, TransformKind kind, std::size_t n, std::size_t d_in,
                       unsigned seed) {
    Problem p;
    p.format = f;
    p.dtype = dt;
    p.n = n;
    p.d_in = d_in;
    const BlockTransform t = build_data_free_transform({kind, 0.01, 7}, d_in, std::size_t(group_of(f)));
    p.per_block = classify_matrices(t) == MatrixUse::PerBlock;
    const std::size_t count = (p.per_block ? t.blocks() : 1) * std::size_t(group_of(f) * group_of(f));
    p.t.assign(t.activation_matrices().begin(), t.activation_matrices().begin() + std::ptrdiff_t(count));
    std::mt19937 rng(seed);
    std::normal_distribution<float> gauss(0.0f, 1.0f);
    p.x.resize(n * d_in);
    for (std::size_t r = 0; r < n; ++r)
        for (std::size_t j = 0; j < d_in; ++j) {
            float v = gauss(rng);
            if (r % 5 == 0) v = float(0.25 * double(1 + j % 20) / 3.0);  // on E2M1 thresholds
            p.x[r * d_in + j] = encode_x(v, dt);
        }
    return p;
}

TEST(QuantizeTc, MatchesDefinitionBitForBit) {
    REQUIRE_SM80();
    for (wush_format f : {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4, WUSH_FORMAT_INT4, WUSH_FORMAT_MXFP4_OCP})
        for (TransformKind kind : {TransformKind::Hadamard, TransformKind::Random})
            for (wush_dtype dt : {WUSH_DTYPE_BF16, WUSH_DTYPE_F16})
                for (std::size_t n : {std::size_t(1), std::size_t(7), std::size_t(40), std::size_t(300)}) {
                    const Problem p = random_problem(f, dt, kind, n, 4096, unsigned(n));
                    const Bytes want = definition(p), got = run_device(p);
                    const std::string what = std::string(formats::spec(f).name) + " kind " + std::to_string(int(kind)) +
                                             " dtype " + std::to_string(int(dt)) + " n " + std::to_string(n);
                    ASSERT_EQ(got.codes, want.codes) << what;
                    ASSERT_EQ(got.scales, want.scales) << what;
                }
}

// Elements a twentieth of the bound below an MXFP4 boundary (x_j = 14/3 T_ij with unit rows, one
// T_ij nudged): the real accumulator's error decides their side; the bytes must still be the
// definition's (per-element float64 recompute).
TEST(QuantizeTc, NearBoundaryInputsMatchDefinition) {
    REQUIRE_SM80();
    const int g = 32;
    Problem p;
    p.n = 256;
    p.d_in = 4 * std::size_t(g);
    std::mt19937 rng(5);
    std::normal_distribution<float> gauss;
    p.t.resize(4 * std::size_t(g * g));
    for (float& v : p.t) v = gauss(rng);
    for (std::size_t row = 0; row < 4 * std::size_t(g); ++row) {
        double ss = 0.0;
        for (int j = 0; j < g; ++j) ss += double(p.t[row * g + j]) * p.t[row * g + j];
        for (int j = 0; j < g; ++j) p.t[row * g + j] = float(p.t[row * g + j] / std::sqrt(ss));
    }
    p.x.resize(p.n * p.d_in);
    for (std::size_t r = 0; r < p.n; ++r)
        for (std::size_t grp = 0; grp < 4; ++grp)
            for (int j = 0; j < g; ++j)
                p.x[r * p.d_in + grp * g + j] =
                    encode_x(p.t[grp * g * g + (r % g) * g + std::size_t(j)] * (14.0f / 3.0f), p.dtype);
    for (std::size_t r = 0; r < std::size_t(g); ++r)  // one token per row: nudge row r for token r
        for (std::size_t grp = 0; grp < 4; ++grp) {
            float* t = p.t.data() + grp * g * g;
            const int i = int(r);
            std::vector<std::uint32_t> w(tc::fragment_words(g));
            const tc::PartNorms norms = tc::pack_fragments(t, g, w.data());
            float x[32], ss = 0.0f;
            for (int j = 0; j < g; ++j) {
                x[j] = p.x_at(r * p.d_in + grp * g + j);
                ss = std::fma(x[j], x[j], ss);
            }
            double y[32];
            formats::transform_group_f64(t, x, g, y);
            const double bound = tc::split_product_error_bound(norms, std::sqrt(ss), false, g);
            const double unit = std::ldexp(1.0, bits::floor_log2(std::fabs(y[i]))) / 3.0;
            const double target = 3.5 * unit - 0.05 * bound;
            int jm = 0;
            for (int j = 1; j < g; ++j) jm = std::fabs(x[j]) > std::fabs(x[jm]) ? j : jm;
            t[i * g + jm] = float(double(t[i * g + jm]) + (target - y[i]) / double(x[jm]));
        }
    const Bytes want = definition(p), got = run_device(p);
    ASSERT_EQ(got.codes, want.codes);
    ASSERT_EQ(got.scales, want.scales);
}

}  // namespace
