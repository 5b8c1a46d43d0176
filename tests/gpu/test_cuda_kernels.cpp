// The CUDA backend's kernels through the internal API (cuda::make_backend, backend::Backend,
// PreparedLayer) against the CPU runtime: quantized codes and scales bit-equal, GEMM outputs
// within float32 accumulation tolerance, calibration sums equal up to float64 summation order.
// Every test is SKIPPED where no CUDA device exists (ctest label `gpu`).
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "calibration/calibrator.h"
#include "common/error.h"
#include "cpu/activation_quantizer.h"
#include "cpu/gemm.h"
#include "cuda_backend.h"
#include "cuda_check.h"
#include "formats/block_format.h"
#include "formats/group_quantizer.h"
#include "transforms/block_transform.h"

namespace {

using namespace wush;

bool have_gpu() {
    int n = 0;
    const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
    cudaGetLastError();
    return ok;
}

#define REQUIRE_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device"

// Device 0's compute capability major (0 without a device).
int device_major() {
    int major = 0;
    if (have_gpu()) WUSH_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    return major;
}

// Skips the test without a GPU of sm_80 or later; `why` says what needs it.
#define REQUIRE_SM80(why) \
  REQUIRE_GPU();          \
  if (device_major() < 8) GTEST_SKIP() << why << " needs sm_80"

constexpr std::size_t kDin = 256;
// The CPU reference runs on the best ISA, one thread.
struct HostRun {
    Isa isa;
    std::size_t threads;
};
const HostRun kHost{best_isa(), 1};
const wush_format kFormats[] = {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4, WUSH_FORMAT_INT4, WUSH_FORMAT_MXFP4_OCP};
const TransformKind kKinds[] = {TransformKind::Identity, TransformKind::Hadamard, TransformKind::Random};

template <class T>
cuda::DeviceBuffer upload(const std::vector<T>& v) {
    return cuda::DeviceBuffer::upload(v.data(), v.size() * sizeof(T));
}

template <class T>
std::vector<T> download(const cuda::DeviceBuffer& b, std::size_t count) {
    std::vector<T> v(count);
    WUSH_CUDA_CHECK(cudaMemcpy(v.data(), b.get(), count * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
}

// Gaussian activations with a few outliers, and (every 7th token) values on E2M1 thresholds, so
// that the float64 fallback runs too.
std::vector<float> make_x(std::size_t n, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> gauss(0.0f, 1.0f);
    std::vector<float> x(n * kDin);
    for (float& v : x) v = gauss(rng);
    for (std::size_t t = 0; t < n; t += 7)
        for (std::size_t j = 0; j < kDin; ++j) x[t * kDin + j] = float(0.25 * double(1 + j % 20) / 3.0);
    if (n > 3) x[3 * kDin + 5] = 900.0f;
    return x;
}

std::vector<std::uint16_t> to_bf16(const std::vector<float>& x) {
    std::vector<std::uint16_t> h(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) h[i] = bits::bf16_encode(double(x[i]));
    return h;
}

struct Packed {
    std::vector<std::uint8_t> codes, scales;
};

Packed cpu_quantize(const BlockTransform& t, const formats::FormatSpec& f, wush_dtype dtype, const void* x,
                    std::size_t n) {
    const formats::PackedSizes s = formats::packed_sizes(f, n, kDin);
    Packed p{std::vector<std::uint8_t>(s.codes), std::vector<std::uint8_t>(s.scales)};
    const MatrixUse use = classify_matrices(t);
    std::vector<float> scratch(cpu::quantize_scratch_floats(t, use));
    cpu::quantize_activations(t, use, f, dtype, x, n, p.codes, p.scales, kHost.isa, scratch, kHost.threads);
    return p;
}

formats::PackedMatrix make_weight(const formats::FormatSpec& f, std::size_t d_out, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> gauss(0.0f, 1.0f);
    std::vector<float> w(d_out * kDin);
    for (float& v : w) v = gauss(rng);
    const formats::PackedSizes s = formats::packed_sizes(f, d_out, kDin);
    std::vector<std::uint8_t> c(s.codes), sc(s.scales);
    formats::quantize_rows(f, w, d_out, kDin, c, sc);
    return {f.id, d_out, kDin, formats::ByteView(std::move(c)), formats::ByteView(std::move(sc))};
}

std::vector<float> cpu_gemm(const formats::PackedMatrix& w, const Packed& a, std::size_t m) {
    std::vector<float> y(m * w.d_out);
    std::vector<std::byte> scratch(cpu::gemm_scratch_bytes(formats::spec(w.format), m, w.d_out, w.d_in, 1));
    EXPECT_TRUE(cpu::gemm(kHost.isa, kHost.threads, w, a.codes, a.scales, m, WUSH_DTYPE_F32, y.data(), scratch));
    return y;
}

// |y_gpu - y_cpu| within float32 accumulation error (k terms, relative to the output's size);
// an indexing or scaling bug is off by O(|y|).
void expect_close(const std::vector<float>& got, const std::vector<float>& want, std::size_t k,
                  const std::string& what) {
    double ymax = 0.0;
    for (float v : want) ymax = std::max(ymax, double(std::fabs(v)));
    const double tol = 4e-7 * double(k) * (1.0 + ymax);
    for (std::size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], tol) << what << " element " << i;
}

class CudaKernels : public ::testing::Test {
protected:
    void SetUp() override {
        REQUIRE_GPU();
        be_ = cuda::make_backend(0);
    }
    std::unique_ptr<backend::Backend> be_;
};

TEST_F(CudaKernels, QuantizeMatchesCpuBitForBit) {
    for (TransformKind kind : kKinds) {
        for (wush_format format : kFormats) {
            const formats::FormatSpec& f = formats::spec(format);
            const BlockTransform t = build_data_free_transform({kind, 0.01, 7}, kDin, f.group);
            const backend::TransformRef ref{t, classify_matrices(t)};
            // 1, 2, 5, 16: the small-m kernel with 4, 2 and 1 groups per block (issue 41); 37, 300: tiles
            for (std::size_t n :
                 {std::size_t(1), std::size_t(2), std::size_t(5), std::size_t(16), std::size_t(37), std::size_t(300)}) {
                const std::vector<float> x = make_x(n, unsigned(n));
                const std::vector<std::uint16_t> xb = to_bf16(x);
                for (wush_dtype dt : {WUSH_DTYPE_F32, WUSH_DTYPE_BF16}) {
                    const void* xh = dt == WUSH_DTYPE_F32 ? static_cast<const void*>(x.data()) : xb.data();
                    const Packed want = cpu_quantize(t, f, dt, xh, n);
                    const cuda::DeviceBuffer xd = dt == WUSH_DTYPE_F32 ? upload(x) : upload(xb);
                    cuda::DeviceBuffer cd(want.codes.size()), sd(want.scales.size());
                    be_->quantize_activations(ref, f, dt, xd.get(), n, {cd.get<std::uint8_t>(), cd.bytes()},
                                              {sd.get<std::uint8_t>(), sd.bytes()});
                    const std::string what = std::string(f.name) + " kind " + std::to_string(int(kind)) + " n " +
                                             std::to_string(n) + " dtype " + std::to_string(int(dt));
                    EXPECT_EQ(download<std::uint8_t>(cd, cd.bytes()), want.codes) << what;
                    EXPECT_EQ(download<std::uint8_t>(sd, sd.bytes()), want.scales) << what;
                }
            }
        }
    }
}

TEST_F(CudaKernels, NonFiniteIsReported) {
    const formats::FormatSpec& f = formats::spec(WUSH_FORMAT_MXFP4);
    const BlockTransform t = build_data_free_transform({TransformKind::Random, 0.01, 7}, kDin, f.group);
    const backend::TransformRef ref{t, classify_matrices(t)};
    std::vector<float> x = make_x(20, 3);
    x[5 * kDin + 17] = NAN;
    x[9 * kDin + 2] = INFINITY;
    const cuda::DeviceBuffer xd = upload(x);
    const formats::PackedSizes s = formats::packed_sizes(f, 20, kDin);
    cuda::DeviceBuffer cd(s.codes), sd(s.scales);
    try {
        be_->quantize_activations(ref, f, WUSH_DTYPE_F32, xd.get(), 20, {cd.get<std::uint8_t>(), cd.bytes()},
                                  {sd.get<std::uint8_t>(), sd.bytes()});
        ADD_FAILURE() << "no error";
    } catch (const Error& e) {
        EXPECT_EQ(e.status(), WUSH_ERR_NON_FINITE);
        EXPECT_NE(std::string(e.what()).find("row 5, column 17"), std::string::npos) << e.what();
    }
    // The enqueue-only path: reported by the next synchronize, then cleared.
    const formats::PackedMatrix w = make_weight(f, 64, 1);
    auto layer = be_->prepare(ref, w);
    layer->quantize(WUSH_DTYPE_F32, xd.get(), 20, {cd.get<std::uint8_t>(), cd.bytes()},
                    {sd.get<std::uint8_t>(), sd.bytes()});
    EXPECT_THROW(be_->synchronize(), Error);
    EXPECT_NO_THROW(be_->synchronize());
}

TEST_F(CudaKernels, HostPointersAreRejected) {
    const formats::FormatSpec& f = formats::spec(WUSH_FORMAT_NVFP4);
    const BlockTransform t = build_data_free_transform({TransformKind::Identity, 0.01, 7}, kDin, f.group);
    const backend::TransformRef ref{t, classify_matrices(t)};
    const std::vector<float> x = make_x(4, 1);
    const formats::PackedSizes s = formats::packed_sizes(f, 4, kDin);
    cuda::DeviceBuffer cd(s.codes), sd(s.scales);
    try {
        be_->quantize_activations(ref, f, WUSH_DTYPE_F32, x.data(), 4, {cd.get<std::uint8_t>(), cd.bytes()},
                                  {sd.get<std::uint8_t>(), sd.bytes()});
        ADD_FAILURE() << "no error";
    } catch (const Error& e) {
        EXPECT_EQ(e.status(), WUSH_ERR_INVALID_ARGUMENT);
        EXPECT_NE(std::string(e.what()).find("x is a host pointer"), std::string::npos) << e.what();
    }
}

TEST_F(CudaKernels, GemmAndForwardMatchCpu) {
    for (wush_format format : kFormats) {
        const formats::FormatSpec& f = formats::spec(format);
        const BlockTransform t = build_data_free_transform({TransformKind::Random, 0.01, 7}, kDin, f.group);
        const backend::TransformRef ref{t, classify_matrices(t)};
        const formats::PackedMatrix w = make_weight(f, 96, 11);
        for (std::size_t m : {std::size_t(1), std::size_t(5), std::size_t(200)}) {
            const std::vector<float> x = make_x(m, 40 + unsigned(m));
            const Packed a = cpu_quantize(t, f, WUSH_DTYPE_F32, x.data(), m);
            const std::vector<float> want = cpu_gemm(w, a, m);
            const std::string what = std::string(f.name) + " m " + std::to_string(m);
            // wush_gemm
            const cuda::DeviceBuffer ac = upload(a.codes), as = upload(a.scales);
            cuda::DeviceBuffer yd(m * w.d_out * sizeof(float));
            be_->gemm(w, {ac.get<std::uint8_t>(), ac.bytes()}, {as.get<std::uint8_t>(), as.bytes()}, m, WUSH_DTYPE_F32,
                      yd.get());
            expect_close(download<float>(yd, m * w.d_out), want, kDin, what + " gemm");
            // prepared layer: quantize + GEMM, enqueued, then synchronized
            auto layer = be_->prepare(ref, w);
            cuda::DeviceBuffer ws(layer->workspace_bytes(m));
            const cuda::DeviceBuffer xd = upload(x);
            layer->forward(WUSH_DTYPE_F32, xd.get(), m, {}, WUSH_DTYPE_F32, yd.get(),
                           {ws.get<std::byte>(), ws.bytes()});
            be_->synchronize();
            expect_close(download<float>(yd, m * w.d_out), want, kDin, what + " forward");
            // BF16 output: the F32 result rounded once
            cuda::DeviceBuffer yb(m * w.d_out * 2);
            layer->forward(WUSH_DTYPE_F32, xd.get(), m, {}, WUSH_DTYPE_BF16, yb.get(),
                           {ws.get<std::byte>(), ws.bytes()});
            be_->synchronize();
            const std::vector<std::uint16_t> got = download<std::uint16_t>(yb, m * w.d_out);
            for (std::size_t i = 0; i < got.size(); ++i)
                ASSERT_NEAR(bits::bf16_decode(got[i]), want[i], 1e-2 * (1.0 + std::fabs(want[i])))
                    << what << " bf16 " << i;
        }
    }
}

TEST_F(CudaKernels, CalibrationMatchesCpu) {
    for (MomentMode mode : {MomentMode::BlockDiagonal, MomentMode::Full}) {
        const std::vector<float> x = make_x(333, 5);
        Calibrator cpu(kDin, 32, mode), gpu(kDin, 32, mode);
        cpu.add(WUSH_DTYPE_F32, x.data(), 333);
        const cuda::DeviceBuffer xd = upload(x);
        be_->calibrate(gpu, WUSH_DTYPE_F32, xd.get(), 333, 0);
        ASSERT_EQ(gpu.tokens(), cpu.tokens());
        for (std::size_t b = 0; b < cpu.blocks(); ++b) {
            const std::vector<double> a = cpu.second_moment(b), g = gpu.second_moment(b);
            for (std::size_t i = 0; i < a.size(); ++i)
                ASSERT_NEAR(g[i], a[i], 1e-12 * (1.0 + std::fabs(a[i]))) << b << " " << i;
        }
    }
}

}  // namespace

// ---- issue 32: capture, bit-exact sizes, devices, alignment -------------------------------------

namespace capture_test {

using namespace wush;

std::vector<float> gaussian(std::size_t count, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> gauss(0.0f, 1.0f);
    std::vector<float> v(count);
    for (float& x : v) x = gauss(rng);
    return v;
}

formats::PackedMatrix weight(const formats::FormatSpec& f, std::size_t d_out, std::size_t d_in, unsigned seed) {
    const std::vector<float> w = gaussian(d_out * d_in, seed);
    const formats::PackedSizes s = formats::packed_sizes(f, d_out, d_in);
    std::vector<std::uint8_t> c(s.codes), sc(s.scales);
    formats::quantize_rows(f, w, d_out, d_in, c, sc);
    return {f.id, d_out, d_in, formats::ByteView(std::move(c)), formats::ByteView(std::move(sc))};
}

std::vector<std::uint8_t> bytes_of(const void* d, std::size_t n) {
    std::vector<std::uint8_t> h(n);
    WUSH_CUDA_CHECK(cudaMemcpy(h.data(), d, n, cudaMemcpyDeviceToHost));
    return h;
}

// Every launch of a prepared layer (quantize, then forward through decode, the reference path, the
// prefill kernel when asked for, cuBLASLt on sm_100/120) captured in a CUDA graph in GLOBAL mode
// (the mode PyTorch uses: an allocation, a legacy-stream operation or a synchronous copy inside
// would invalidate it), replayed, and compared byte for byte with the eager launch.
void capture_matches_eager(bool prefill) {
    auto be = cuda::make_backend(0);
    if (prefill) be->set_parameter(WUSH_CONTEXT_CUDA_PREFILL_MIN_M, 33);
    cudaStream_t stream = nullptr;
    WUSH_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    be->set_stream(stream);
    const std::size_t d_in = 512, d_out = 384;
    for (wush_format format : kFormats) {
        const formats::FormatSpec& f = formats::spec(format);
        const BlockTransform t = build_data_free_transform({TransformKind::Random, 0.01, 7}, d_in, f.group);
        const backend::TransformRef ref{t, classify_matrices(t)};
        auto layer = be->prepare(ref, weight(f, d_out, d_in, 3));
        for (std::size_t m : {std::size_t(1), std::size_t(17), std::size_t(200)}) {
            const std::string what = std::string(f.name) + " m " + std::to_string(m) + (prefill ? " prefill" : "");
            const cuda::DeviceBuffer xd = upload(gaussian(m * d_in, unsigned(m)));
            const formats::PackedSizes s = formats::packed_sizes(f, m, d_in);
            cuda::DeviceBuffer ws(layer->workspace_bytes(m)), y(m * d_out * 4), cd(s.codes), sd(s.scales);
            const auto run = [&] {
                layer->quantize(WUSH_DTYPE_F32, xd.get(), m, {cd.get<std::uint8_t>(), cd.bytes()},
                                {sd.get<std::uint8_t>(), sd.bytes()});
                layer->forward(WUSH_DTYPE_F32, xd.get(), m, {}, WUSH_DTYPE_F32, y.get(),
                               {ws.get<std::byte>(), ws.bytes()});
            };
            run();
            be->synchronize();
            const std::vector<std::uint8_t> y_eager = bytes_of(y.get(), y.bytes()),
                                            c_eager = bytes_of(cd.get(), cd.bytes());
            WUSH_CUDA_CHECK(cudaMemsetAsync(y.get(), 0, y.bytes(), stream));
            WUSH_CUDA_CHECK(cudaMemsetAsync(cd.get(), 0, cd.bytes(), stream));
            WUSH_CUDA_CHECK(cudaStreamSynchronize(stream));
            cudaGraph_t graph = nullptr;
            ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess) << what;
            run();
            ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess) << what << ": capture invalidated";
            cudaGraphExec_t exec = nullptr;
            ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess) << what;
            for (int replay = 0; replay < 2; ++replay) ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess) << what;
            be->synchronize();
            EXPECT_EQ(bytes_of(y.get(), y.bytes()), y_eager) << what << ": replay != eager (y)";
            EXPECT_EQ(bytes_of(cd.get(), cd.bytes()), c_eager) << what << ": replay != eager (codes)";
            cudaGraphExecDestroy(exec);
            cudaGraphDestroy(graph);
        }
    }
    be->set_stream(nullptr);
    cudaStreamDestroy(stream);
}

TEST(CudaIssue32, GlobalCaptureReplayEqualsEager) {
    REQUIRE_GPU();
    capture_matches_eager(false);
}

TEST(CudaIssue32, GlobalCaptureReplayEqualsEagerPrefill) {
    REQUIRE_GPU();
    capture_matches_eager(true);
}

// The fused quantize at LLM widths, both kernels (m = 1 small-m, 17 and 1024 tile), bit-equal to
// the CPU runtime.
TEST(CudaIssue32, QuantizeBitExactAtModelWidths) {
    REQUIRE_GPU();
    auto be = cuda::make_backend(0);
    for (std::size_t d_in : {std::size_t(4096), std::size_t(14336)}) {
        for (wush_format format : kFormats) {
            const formats::FormatSpec& f = formats::spec(format);
            for (TransformKind kind : {TransformKind::Random, TransformKind::Hadamard}) {
                const BlockTransform t = build_data_free_transform({kind, 0.01, 7}, d_in, f.group);
                const backend::TransformRef ref{t, classify_matrices(t)};
                for (std::size_t m : {std::size_t(1), std::size_t(17), std::size_t(1024)}) {
                    std::vector<float> x = gaussian(m * d_in, unsigned(m + d_in));
                    for (std::size_t j = 0; j < d_in; ++j) x[j] = float(0.25 * double(1 + j % 20) / 3.0);  // fallback
                    const formats::PackedSizes s = formats::packed_sizes(f, m, d_in);
                    Packed want{std::vector<std::uint8_t>(s.codes), std::vector<std::uint8_t>(s.scales)};
                    const MatrixUse use = classify_matrices(t);
                    std::vector<float> scratch(cpu::quantize_scratch_floats(t, use));
                    cpu::quantize_activations(t, use, f, WUSH_DTYPE_F32, x.data(), m, want.codes, want.scales,
                                              kHost.isa, scratch, kHost.threads);
                    const cuda::DeviceBuffer xd = upload(x);
                    cuda::DeviceBuffer cd(s.codes), sd(s.scales);
                    be->quantize_activations(ref, f, WUSH_DTYPE_F32, xd.get(), m, {cd.get<std::uint8_t>(), cd.bytes()},
                                             {sd.get<std::uint8_t>(), sd.bytes()});
                    const std::string what =
                        std::string(f.name) + " d_in " + std::to_string(d_in) + " m " + std::to_string(m);
                    EXPECT_EQ(bytes_of(cd.get(), cd.bytes()), want.codes) << what;
                    EXPECT_EQ(bytes_of(sd.get(), sd.bytes()), want.scales) << what;
                }
            }
        }
    }
}

// A workspace sized for n tokens serves every smaller batch (wush_linear_workspace_size: "for up
// to n_tokens"): the kernel changes with m, and the first GPU run found a 300-token workspace too
// small for 64 tokens (INT4: the prefill kernel at 300, the reference path at 64).
TEST(CudaIssue32, WorkspaceForUpToNServesEverySmallerBatch) {
    REQUIRE_GPU();
    auto be = cuda::make_backend(0);
    const std::size_t d_in = 256, d_out = 192, most = 300;
    for (wush_format format : kFormats) {
        const formats::FormatSpec& f = formats::spec(format);
        const BlockTransform t = build_data_free_transform({TransformKind::Random, 0.01, 7}, d_in, f.group);
        auto layer = be->prepare({t, classify_matrices(t)}, weight(f, d_out, d_in, 5));
        std::size_t previous = 0;
        for (std::size_t m = 1; m <= 600; ++m) {
            EXPECT_GE(layer->workspace_bytes(m), previous) << f.name << " m " << m;
            EXPECT_GE(layer->workspace_bytes(m), layer->minimum_workspace_bytes(m)) << f.name << " m " << m;
            previous = layer->workspace_bytes(m);
        }
        cuda::DeviceBuffer ws(layer->workspace_bytes(most)), y(most * d_out * 4);
        for (std::size_t m :
             {std::size_t(1), std::size_t(17), std::size_t(64), std::size_t(127), std::size_t(128), most}) {
            const cuda::DeviceBuffer xd = upload(gaussian(m * d_in, unsigned(m)));
            EXPECT_NO_THROW(layer->forward(WUSH_DTYPE_F32, xd.get(), m, {}, WUSH_DTYPE_BF16, y.get(),
                                           {ws.get<std::byte>(), ws.bytes()}))
                << f.name << " m " << m;
        }
        be->synchronize();
    }
}

// The caller's current device is restored by every entry point; a misaligned typed tensor is refused.
TEST(CudaIssue32, CurrentDeviceRestoredAndMisalignedRefused) {
    REQUIRE_GPU();
    int count = 0;
    WUSH_CUDA_CHECK(cudaGetDeviceCount(&count));
    auto be = cuda::make_backend(0);
    WUSH_CUDA_CHECK(cudaSetDevice(count - 1));
    const formats::FormatSpec& f = formats::spec(WUSH_FORMAT_MXFP4);
    const BlockTransform t = build_data_free_transform({TransformKind::Random, 0.01, 7}, kDin, f.group);
    const backend::TransformRef ref{t, classify_matrices(t)};
    WUSH_CUDA_CHECK(cudaSetDevice(0));
    const cuda::DeviceBuffer xd = upload(make_x(4, 1));
    const formats::PackedSizes s = formats::packed_sizes(f, 4, kDin);
    cuda::DeviceBuffer cd(s.codes), sd(s.scales);
    WUSH_CUDA_CHECK(cudaSetDevice(count - 1));
    be->quantize_activations(ref, f, WUSH_DTYPE_F32, xd.get(), 4, {cd.get<std::uint8_t>(), cd.bytes()},
                             {sd.get<std::uint8_t>(), sd.bytes()});
    auto layer = be->prepare(ref, make_weight(f, 64, 1));
    be->synchronize();
    int now = -1;
    WUSH_CUDA_CHECK(cudaGetDevice(&now));
    EXPECT_EQ(now, count - 1);
    try {
        be->quantize_activations(ref, f, WUSH_DTYPE_F32, static_cast<const char*>(xd.get()) + 2, 3,
                                 {cd.get<std::uint8_t>(), cd.bytes()}, {sd.get<std::uint8_t>(), sd.bytes()});
        ADD_FAILURE() << "a misaligned F32 tensor was accepted";
    } catch (const Error& e) {
        EXPECT_EQ(e.status(), WUSH_ERR_INVALID_ARGUMENT);
        EXPECT_NE(std::string(e.what()).find("4-byte aligned"), std::string::npos) << e.what();
    }
    WUSH_CUDA_CHECK(cudaGetDevice(&now));
    EXPECT_EQ(now, count - 1);
    WUSH_CUDA_CHECK(cudaSetDevice(0));
}

// Another GPU's buffer is refused with a clear status (not a sticky fault at kernel time).
TEST(CudaIssue32, AnotherDevicesPointerIsRefused) {
    REQUIRE_GPU();
    int count = 0;
    WUSH_CUDA_CHECK(cudaGetDeviceCount(&count));
    if (count < 2) GTEST_SKIP() << "one CUDA device: two-device behaviour not testable";
    auto be = cuda::make_backend(0);
    const formats::FormatSpec& f = formats::spec(WUSH_FORMAT_MXFP4);
    const BlockTransform t = build_data_free_transform({TransformKind::Identity, 0.01, 7}, kDin, f.group);
    const backend::TransformRef ref{t, classify_matrices(t)};
    WUSH_CUDA_CHECK(cudaSetDevice(1));
    const cuda::DeviceBuffer x1 = upload(make_x(4, 1));
    WUSH_CUDA_CHECK(cudaSetDevice(0));
    const formats::PackedSizes s = formats::packed_sizes(f, 4, kDin);
    cuda::DeviceBuffer cd(s.codes), sd(s.scales);
    try {
        be->quantize_activations(ref, f, WUSH_DTYPE_F32, x1.get(), 4, {cd.get<std::uint8_t>(), cd.bytes()},
                                 {sd.get<std::uint8_t>(), sd.bytes()});
        ADD_FAILURE() << "device 1's buffer was accepted by a device-0 context";
    } catch (const Error& e) {
        EXPECT_EQ(e.status(), WUSH_ERR_INVALID_ARGUMENT);
        EXPECT_NE(std::string(e.what()).find("memory of CUDA device 1"), std::string::npos) << e.what();
    }
}

}  // namespace capture_test

// ---- issue 41: integration defects of the host code ---------------------------------------------

namespace issue41_test {

using namespace wush;

// Keeps a stream busy from the host (300 ms) without touching the device: what follows it on that
// stream starts only afterwards, deterministically.
void CUDART_CB hold_stream(void*) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
}

struct Streams {
    cudaStream_t a = nullptr, b = nullptr;
    Streams() {
        WUSH_CUDA_CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
        WUSH_CUDA_CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    }
    ~Streams() {
        cudaStreamDestroy(a);
        cudaStreamDestroy(b);
    }
};

// Item 1: switching streams between calls orders the new stream after the old one. Stream A holds
// a forward (m = 64: the reference path, cuBLAS and its shared workspace) behind a 300 ms host
// hold; the context switches to B and runs another forward there: B's must not finish before A's,
// both must equal the CPU runtime, and a NaN seen by A's launch must be reported by the
// synchronize on B (the shared non-finite flag read after A's kernel wrote it).
TEST(CudaIssue41, StreamSwitchWaitsForTheOldStream) {
    REQUIRE_GPU();
    auto be = cuda::make_backend(0);
    const Streams s;
    const formats::FormatSpec& f = formats::spec(WUSH_FORMAT_MXFP4);
    const std::size_t m = 64, d_out = 96;
    const BlockTransform t = build_data_free_transform({TransformKind::Random, 0.01, 7}, kDin, f.group);
    const backend::TransformRef ref{t, classify_matrices(t)};
    const formats::PackedMatrix w = make_weight(f, d_out, 11);
    auto layer = be->prepare(ref, w);
    const std::vector<float> x0 = make_x(m, 1), x1 = make_x(m, 2);
    const cuda::DeviceBuffer xd0 = upload(x0), xd1 = upload(x1);
    cuda::DeviceBuffer ws0(layer->workspace_bytes(m)), ws1(layer->workspace_bytes(m));
    cuda::DeviceBuffer y0(m * d_out * sizeof(float)), y1(m * d_out * sizeof(float));
    be->set_stream(s.a);
    WUSH_CUDA_CHECK(cudaLaunchHostFunc(s.a, hold_stream, nullptr));
    layer->forward(WUSH_DTYPE_F32, xd0.get(), m, {}, WUSH_DTYPE_F32, y0.get(), {ws0.get<std::byte>(), ws0.bytes()});
    be->set_stream(s.b);
    layer->forward(WUSH_DTYPE_F32, xd1.get(), m, {}, WUSH_DTYPE_F32, y1.get(), {ws1.get<std::byte>(), ws1.bytes()});
    WUSH_CUDA_CHECK(cudaStreamSynchronize(s.b));
    EXPECT_EQ(cudaStreamQuery(s.a), cudaSuccess) << "stream B's forward finished before stream A's";
    be->synchronize();
    expect_close(download<float>(y0, m * d_out), cpu_gemm(w, cpu_quantize(t, f, WUSH_DTYPE_F32, x0.data(), m), m), kDin,
                 "stream A");
    expect_close(download<float>(y1, m * d_out), cpu_gemm(w, cpu_quantize(t, f, WUSH_DTYPE_F32, x1.data(), m), m), kDin,
                 "stream B");

    std::vector<float> bad = x0;
    bad[5 * kDin + 7] = NAN;
    const cuda::DeviceBuffer xbad = upload(bad);
    be->set_stream(s.a);
    WUSH_CUDA_CHECK(cudaLaunchHostFunc(s.a, hold_stream, nullptr));
    layer->forward(WUSH_DTYPE_F32, xbad.get(), m, {}, WUSH_DTYPE_F32, y0.get(), {ws0.get<std::byte>(), ws0.bytes()});
    be->set_stream(s.b);
    try {
        be->synchronize();
        ADD_FAILURE() << "the NaN of stream A's forward was not reported by the synchronize on stream B";
    } catch (const Error& e) {
        EXPECT_EQ(e.status(), WUSH_ERR_NON_FINITE);
        EXPECT_NE(std::string(e.what()).find("row 5, column 7"), std::string::npos) << e.what();
    }
    be->set_stream(nullptr);
    WUSH_CUDA_CHECK(cudaStreamSynchronize(s.a));
}

// Item 1, captures: switching to a stream that is capturing adds no wait on an eager event (that
// would break the capture); the captured forward replays like the eager one.
TEST(CudaIssue41, StreamSwitchIntoACaptureKeepsItValid) {
    REQUIRE_GPU();
    auto be = cuda::make_backend(0);
    const Streams s;
    const formats::FormatSpec& f = formats::spec(WUSH_FORMAT_NVFP4);
    const std::size_t m = 40, d_out = 64;
    const BlockTransform t = build_data_free_transform({TransformKind::Hadamard, 0.01, 7}, kDin, f.group);
    auto layer = be->prepare({t, classify_matrices(t)}, make_weight(f, d_out, 4));
    const cuda::DeviceBuffer xd = upload(make_x(m, 3));
    cuda::DeviceBuffer ws(layer->workspace_bytes(m)), y(m * d_out * sizeof(float));
    be->set_stream(s.a);
    layer->forward(WUSH_DTYPE_F32, xd.get(), m, {}, WUSH_DTYPE_F32, y.get(), {ws.get<std::byte>(), ws.bytes()});
    be->synchronize();
    const std::vector<float> eager = download<float>(y, m * d_out);
    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(s.b, cudaStreamCaptureModeGlobal), cudaSuccess);
    be->set_stream(s.b);
    layer->forward(WUSH_DTYPE_F32, xd.get(), m, {}, WUSH_DTYPE_F32, y.get(), {ws.get<std::byte>(), ws.bytes()});
    be->set_stream(s.a);  // leaving the capture: no event recorded into it either
    ASSERT_EQ(cudaStreamEndCapture(s.b, &graph), cudaSuccess) << "capture invalidated by set_stream";
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    WUSH_CUDA_CHECK(cudaMemsetAsync(y.get(), 0, y.bytes(), s.b));
    ASSERT_EQ(cudaGraphLaunch(exec, s.b), cudaSuccess);
    WUSH_CUDA_CHECK(cudaStreamSynchronize(s.b));
    EXPECT_EQ(download<float>(y, m * d_out), eager);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    be->set_stream(nullptr);
}

// Item 3: the prefill kernels' shared-memory attribute is set once per context (at creation), not
// per launch; a second context on the same device, and a launch after a stream switch, still run
// it, equal to the CPU runtime.
TEST(CudaIssue41, PrefillConfiguredOncePerContextRuns) {
    REQUIRE_GPU();
    auto first = cuda::make_backend(0);
    auto second = cuda::make_backend(0);
    first->set_parameter(WUSH_CONTEXT_CUDA_PREFILL_MIN_M, 33);
    second->set_parameter(WUSH_CONTEXT_CUDA_PREFILL_MIN_M, 33);
    const Streams s;
    const std::size_t m = 200, d_out = 128;
    for (wush_format format : {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4}) {
        const formats::FormatSpec& f = formats::spec(format);
        const BlockTransform t = build_data_free_transform({TransformKind::Random, 0.01, 7}, kDin, f.group);
        const formats::PackedMatrix w = make_weight(f, d_out, 9);
        const std::vector<float> x = make_x(m, 6);
        const std::vector<float> want = cpu_gemm(w, cpu_quantize(t, f, WUSH_DTYPE_F32, x.data(), m), m);
        const cuda::DeviceBuffer xd = upload(x);
        for (backend::Backend* be : {first.get(), second.get()}) {
            be->set_stream(s.a);
            auto layer = be->prepare({t, classify_matrices(t)}, w);
            cuda::DeviceBuffer ws(layer->workspace_bytes(m)), y(m * d_out * sizeof(float));
            layer->forward(WUSH_DTYPE_F32, xd.get(), m, {}, WUSH_DTYPE_F32, y.get(), {ws.get<std::byte>(), ws.bytes()});
            be->set_stream(s.b);
            be->synchronize();
            expect_close(download<float>(y, m * d_out), want, kDin, std::string(f.name) + " prefill");
            be->set_stream(nullptr);
        }
    }
}

// Item 6: cuBLASLt's block-scaled FP4 path runs only where a context opts in
// (WUSH_CONTEXT_CUDA_BLOCKSCALED = 1); on sm_100 / sm_120 it must then equal the CPU runtime (m > 32).
TEST(CudaIssue41, BlockScaledOptInMatchesCpuOnBlackwell) {
    REQUIRE_GPU();
    int major = 0;
    WUSH_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    if (major != 10 && major != 12) GTEST_SKIP() << "not a Blackwell part (sm_100 / sm_120)";
    auto be = cuda::make_backend(0);
    be->set_parameter(WUSH_CONTEXT_CUDA_BLOCKSCALED, 1);
    const std::size_t m = 200, d_out = 128;
    for (wush_format format : {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4}) {
        const formats::FormatSpec& f = formats::spec(format);
        const BlockTransform t = build_data_free_transform({TransformKind::Random, 0.01, 7}, kDin, f.group);
        const formats::PackedMatrix w = make_weight(f, d_out, 9);
        const std::vector<float> x = make_x(m, 6);
        const std::vector<float> want = cpu_gemm(w, cpu_quantize(t, f, WUSH_DTYPE_F32, x.data(), m), m);
        auto layer = be->prepare({t, classify_matrices(t)}, w);
        const cuda::DeviceBuffer xd = upload(x);
        cuda::DeviceBuffer ws(layer->workspace_bytes(m)), y(m * d_out * sizeof(float));
        layer->forward(WUSH_DTYPE_F32, xd.get(), m, {}, WUSH_DTYPE_F32, y.get(), {ws.get<std::byte>(), ws.bytes()});
        be->synchronize();
        expect_close(download<float>(y, m * d_out), want, kDin, std::string(f.name) + " block-scaled");
    }
}

// The forward bytes of one layer on a default context and on a context with `param` = 1 (same
// transform, weight and input x of dtype `x_dtype`), for each format and token count; `what` names
// the opt-in in the failure message.
void expect_opt_in_same_bytes(wush_context_parameter param, wush_dtype x_dtype,
                              std::initializer_list<wush_format> formats, std::initializer_list<std::size_t> ms,
                              std::size_t d_out, unsigned seed, const char* what) {
    auto plain = cuda::make_backend(0);
    auto opted = cuda::make_backend(0);
    opted->set_parameter(param, 1);
    for (wush_format format : formats) {
        const formats::FormatSpec& f = formats::spec(format);
        const BlockTransform t = build_data_free_transform({TransformKind::Random, 0.01, 7}, kDin, f.group);
        const formats::PackedMatrix w = make_weight(f, d_out, seed);
        for (std::size_t m : ms) {
            const std::vector<float> x = make_x(m, seed + 1);
            const cuda::DeviceBuffer xd = x_dtype == WUSH_DTYPE_BF16 ? upload(to_bf16(x)) : upload(x);
            std::vector<float> got[2];
            int i = 0;
            for (backend::Backend* be : {plain.get(), opted.get()}) {
                auto layer = be->prepare({t, classify_matrices(t)}, w);
                cuda::DeviceBuffer ws(layer->workspace_bytes(m)), y(m * d_out * sizeof(float));
                layer->forward(x_dtype, xd.get(), m, {}, WUSH_DTYPE_F32, y.get(), {ws.get<std::byte>(), ws.bytes()});
                be->synchronize();
                got[i++] = download<float>(y, m * d_out);
            }
            EXPECT_EQ(std::memcmp(got[0].data(), got[1].data(), m * d_out * sizeof(float)), 0)
                << f.name << " m " << m << ": " << what << "'s bytes differ from the default context's";
        }
    }
}

// Ask 2: a context with WUSH_CONTEXT_CUDA_STREAM_DECODE = 1 runs m <= 32 with the streaming decode
// kernel (sm_80+), whose bytes equal the default decode kernel's (another context, same layer):
// with d_in = 256 (one chunk) both cut k alike. (Other partitions: wush_gpu_stream_decode_tests.)
TEST(CudaIssue41, StreamDecodeOptInSameBytesAsDecode) {
    REQUIRE_SM80("the streaming decode kernel");
    expect_opt_in_same_bytes(WUSH_CONTEXT_CUDA_STREAM_DECODE, WUSH_DTYPE_F32,
                             {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4, WUSH_FORMAT_INT4}, {1, 5, 17, 32}, 200, 11,
                             "the streaming decode kernel");
}

// A context with WUSH_CONTEXT_CUDA_TC_QUANTIZE = 1 quantizes BF16 activations from 17 tokens with
// the tensor-core kernel (sm_80+, a matrix transform, the probe passed on this card); its forward
// bytes equal a default context's on the same layer, because both kernels' codes are the float64
// definition's. (Where the probe fails the opt-in context keeps the CUDA-core kernel; the bytes
// are then equal trivially, and QuantizeTc.AccumulatorProbe reports the failure.)
TEST(CudaIssue58, TcQuantizeOptInSameBytesAsDefault) {
    REQUIRE_SM80("BF16 mma.sync");
    expect_opt_in_same_bytes(WUSH_CONTEXT_CUDA_TC_QUANTIZE, WUSH_DTYPE_BF16,
                             {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4, WUSH_FORMAT_INT4, WUSH_FORMAT_MXFP4_OCP},
                             {16, 17, 40, 200}, 72, 13, "the tensor-core quantize");
}

// Ask 3(c): with WUSH_CONTEXT_CUDA_BF16_PREFILL = 1 the products above 32 tokens of the E2M1 formats take
// the BF16 prefill kernel (cuda/gemm/gemm_bf16_prefill.h) where the reference path ran: equal to the
// CPU runtime, eager and replayed from a graph alike; any other value than 0 / 1 is refused.
TEST(CudaIssue41, Bf16PrefillOptInMatchesCpu) {
    REQUIRE_SM80("BF16 mma.sync");
    auto be = cuda::make_backend(0);
    EXPECT_THROW(be->set_parameter(WUSH_CONTEXT_CUDA_BF16_PREFILL, 2), wush::Error);
    be->set_parameter(WUSH_CONTEXT_CUDA_BF16_PREFILL, 1);
    const Streams s;
    const std::size_t m = 200, d_out = 136;
    for (wush_format format : {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4, WUSH_FORMAT_MXFP4_OCP}) {
        const formats::FormatSpec& f = formats::spec(format);
        const BlockTransform t = build_data_free_transform({TransformKind::Random, 0.01, 7}, kDin, f.group);
        const formats::PackedMatrix w = make_weight(f, d_out, 9);
        const std::vector<float> x = make_x(m, 6);
        const std::vector<float> want = cpu_gemm(w, cpu_quantize(t, f, WUSH_DTYPE_F32, x.data(), m), m);
        auto layer = be->prepare({t, classify_matrices(t)}, w);
        const cuda::DeviceBuffer xd = upload(x);
        cuda::DeviceBuffer ws(layer->workspace_bytes(m)), y(m * d_out * sizeof(float));
        be->set_stream(s.a);
        layer->forward(WUSH_DTYPE_F32, xd.get(), m, {}, WUSH_DTYPE_F32, y.get(), {ws.get<std::byte>(), ws.bytes()});
        be->synchronize();
        const std::vector<float> eager = download<float>(y, m * d_out);
        expect_close(eager, want, kDin, std::string(f.name) + " BF16 prefill");
        cudaGraph_t graph = nullptr;
        ASSERT_EQ(cudaStreamBeginCapture(s.a, cudaStreamCaptureModeGlobal), cudaSuccess);
        layer->forward(WUSH_DTYPE_F32, xd.get(), m, {}, WUSH_DTYPE_F32, y.get(), {ws.get<std::byte>(), ws.bytes()});
        ASSERT_EQ(cudaStreamEndCapture(s.a, &graph), cudaSuccess);
        cudaGraphExec_t exec = nullptr;
        ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
        WUSH_CUDA_CHECK(cudaMemsetAsync(y.get(), 0, y.bytes(), s.a));
        ASSERT_EQ(cudaGraphLaunch(exec, s.a), cudaSuccess);
        WUSH_CUDA_CHECK(cudaStreamSynchronize(s.a));
        EXPECT_EQ(download<float>(y, m * d_out), eager) << f.name << ": graph replay differs from eager";
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
        be->set_stream(nullptr);
    }
}

}  // namespace issue41_test
