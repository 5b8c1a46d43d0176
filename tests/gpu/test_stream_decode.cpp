// The streaming decode kernel (cuda/gemm/stream_decode.cu) on a GPU: its output bytes equal the
// existing decode kernel's (cuda/gemm/gemm_decode.cu, itself checked against float64 by
// test_w4a4_gemm.cpp) run with the streaming kernel's partition of k (launch_decode_gemm_split,
// stream::split_plan) for every m = 1..32 and several shapes (4096 x 4096, 14336 x 4096,
// 4096 x 14336, ragged), for F32 and BF16 outputs, for the device's own grid and a small one (the
// bits may not depend on the SM count), eagerly and replayed from a CUDA graph, with the workspace
// (partials and split-K counters) poisoned before every launch; and two launches of one layer in
// flight at once on two streams, each with its own workspace. Without a GPU of sm_80 or later
// every test reports SKIPPED.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <random>
#include <vector>

#include "gemm/stream_decode.h"
#include "gemm/stream_decode_plan.h"
#include "gemm/w4a4_gemm.h"

namespace {

using wush::cuda::GemmArgs;
using wush::cuda::GemmKernel;
namespace st = wush::cuda::stream;

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

#define REQUIRE_SM80()                           \
  const int sm = device_sm();                    \
  if (sm == 0) GTEST_SKIP() << "no CUDA device"; \
  if (sm < 80) GTEST_SKIP() << "the streaming kernel needs sm_80"

const wush_format kFormats[] = {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4, WUSH_FORMAT_INT4, WUSH_FORMAT_MXFP4_OCP};

std::vector<std::uint8_t> random_codes(std::size_t bytes, std::mt19937& rng) {
    std::vector<std::uint8_t> v(bytes);
    for (auto& c : v) c = std::uint8_t(rng());
    return v;
}

std::vector<std::uint8_t> random_scales(wush_format f, std::size_t rows, std::size_t k, std::mt19937& rng) {
    const int sb = st::scale_bytes_of(f);
    std::vector<std::uint8_t> v(rows * (k / st::group_of(f)) * sb);
    for (std::size_t i = 0; i < v.size(); i += sb) {
        if (f == WUSH_FORMAT_NVFP4) {
            v[i] = std::uint8_t(0x20 + rng() % 0x40);
        } else if (f == WUSH_FORMAT_INT4) {
            const std::uint16_t b = std::uint16_t(0x3E00 + rng() % 0x0200);
            v[i] = std::uint8_t(b & 0xFF);
            v[i + 1] = std::uint8_t(b >> 8);
        } else {
            v[i] = std::uint8_t(120 + rng() % 14);
        }
    }
    return v;
}

struct Buffer {
    void* p = nullptr;
    std::size_t bytes = 0;
    explicit Buffer(std::size_t n) : bytes(n) {
        if (cudaMalloc(&p, n ? n : 16) != cudaSuccess) p = nullptr;
    }
    Buffer(const std::vector<std::uint8_t>& h) : Buffer(h.size()) {
        if (p) cudaMemcpy(p, h.data(), h.size(), cudaMemcpyHostToDevice);
    }
    ~Buffer() { cudaFree(p); }
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    std::uint8_t* u8() const { return static_cast<std::uint8_t*>(p); }
    std::vector<std::uint8_t> download() const {
        std::vector<std::uint8_t> h(bytes);
        cudaMemcpy(h.data(), p, bytes, cudaMemcpyDeviceToHost);
        return h;
    }
};

// The product's arguments: activations a (codes, scales) times weight w, output y, workspace.
GemmArgs product_args(wush_format f, std::size_t m, std::size_t n, std::size_t k, const Buffer& a, const Buffer& sa,
                      const Buffer& w, const Buffer& sw, Buffer& y, wush_dtype y_dtype, Buffer& work) {
    GemmArgs g;
    g.format = f;
    g.group = st::group_of(f);
    g.m = m;
    g.n = n;
    g.k = k;
    g.a_codes = a.u8();
    g.a_scales = sa.u8();
    g.w_codes = w.u8();
    g.w_scales = sw.u8();
    g.alpha = f == WUSH_FORMAT_MXFP4 ? 1.0f / 9 : f == WUSH_FORMAT_NVFP4 ? 0.01f : 1.0f;
    g.y = y.p;
    g.y_dtype = y_dtype;
    g.workspace = work.p;
    g.workspace_bytes = work.bytes;
    return g;
}

// One product: the decode kernel's bytes, then the streaming kernel's on the device's grid, on a
// 3-SM grid, and replayed from a graph (when `graph`).
void check_same_bytes(wush_format f, std::size_t m, std::size_t n, std::size_t k, wush_dtype y_dtype,
                      const wush::cuda::StreamDecodeDevice& dev, std::mt19937& rng, bool graph) {
    SCOPED_TRACE(::testing::Message() << "format " << int(f) << " m " << m << " n " << n << " k " << k << " y "
                                      << int(y_dtype));
    const std::vector<std::uint8_t> wc = random_codes(n * k / 2, rng), ws = random_scales(f, n, k, rng);
    const Buffer a(random_codes(m * k / 2, rng)), sa(random_scales(f, m, k, rng)), w(wc), sw(ws);
    const Buffer staged(st::stage_weights(f, n, k, wc.data(), ws.data()));
    Buffer work(std::max<std::size_t>(st::workspace_bytes(m, n, k), 16));
    const std::size_t ybytes = m * n * (y_dtype == WUSH_DTYPE_BF16 ? 2 : 4);
    Buffer y(ybytes);
    ASSERT_TRUE(a.p && sa.p && w.p && sw.p && staged.p && work.p && y.p);

    const GemmArgs g = product_args(f, m, n, k, a, sa, w, sw, y, y_dtype, work);
    const wush::cuda::StreamDecodeWeights sw_{staged.u8()};
    ASSERT_TRUE(wush::cuda::stream_decode_supported(g, sw_, dev));

    const auto poison = [&] {
        CUDA_OK(cudaMemset(y.p, 0xFF, ybytes));
        CUDA_OK(cudaMemset(work.p, 0xFF, work.bytes));
    };
    poison();
    wush::cuda::launch_decode_gemm_split(g, st::schedule_of(m, n, k).chunks_per_split, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<std::uint8_t> want = y.download();

    wush::cuda::StreamDecodeDevice small_grid = dev;
    small_grid.sm_count = 3;
    for (const wush::cuda::StreamDecodeDevice* d :
         {&dev, static_cast<const wush::cuda::StreamDecodeDevice*>(&small_grid)}) {
        poison();
        wush::cuda::launch_stream_decode_gemm(g, sw_, nullptr, *d);
        CUDA_OK(cudaDeviceSynchronize());
        EXPECT_TRUE(y.download() == want) << "bytes differ from the decode kernel's (SMs " << d->sm_count << ")";
    }
    // As a forward enqueues it: the counters zeroed first, then the activations written (here a
    // copy; in a forward the quantize), then the kernel without a zeroing of its own (a
    // programmatic dependent launch on sm_90+, split-K included).
    {
        poison();
        const Buffer fresh(a.bytes);
        ASSERT_TRUE(fresh.p);
        GemmArgs g2 = g;
        g2.a_codes = fresh.u8();
        wush::cuda::zero_stream_decode_counters(g2, nullptr);
        CUDA_OK(cudaMemcpyAsync(fresh.p, a.p, a.bytes, cudaMemcpyDeviceToDevice, nullptr));
        wush::cuda::launch_stream_decode_gemm(g2, sw_, nullptr, dev, true);
        CUDA_OK(cudaDeviceSynchronize());
        EXPECT_TRUE(y.download() == want) << "counters zeroed before the activations were written";
    }
    if (!graph) return;
    cudaStream_t s = nullptr;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t gr = nullptr;
    cudaGraphExec_t exec = nullptr;
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    wush::cuda::launch_stream_decode_gemm(g, sw_, s, dev);
    CUDA_OK(cudaStreamEndCapture(s, &gr));
    CUDA_OK(cudaGraphInstantiate(&exec, gr, 0));
    for (int replay = 0; replay < 2; ++replay) {
        poison();
        CUDA_OK(cudaGraphLaunch(exec, s));
        CUDA_OK(cudaStreamSynchronize(s));
        EXPECT_TRUE(y.download() == want) << "graph replay " << replay << " differs from eager";
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(gr);
    cudaStreamDestroy(s);
}

TEST(StreamDecodeGpu, BytesEqualDecodeKernelEveryM) {
    REQUIRE_SM80();
    const wush::cuda::StreamDecodeDevice dev = wush::cuda::configure_stream_decode();
    std::mt19937 rng(141);
    for (wush_format f : kFormats)
        for (std::size_t m = 1; m <= 32; ++m)
            check_same_bytes(f, m, 4096, 4096, m % 2 ? WUSH_DTYPE_F32 : WUSH_DTYPE_BF16, dev, rng, m == 1 || m == 16);
}

TEST(StreamDecodeGpu, BytesEqualDecodeKernelShapes) {
    REQUIRE_SM80();
    const wush::cuda::StreamDecodeDevice dev = wush::cuda::configure_stream_decode();
    std::mt19937 rng(142);
    for (wush_format f : kFormats)
        for (std::size_t m : {1, 4, 16, 32}) {
            check_same_bytes(f, m, 14336, 4096, WUSH_DTYPE_BF16, dev, rng, m == 1);
            check_same_bytes(f, m, 4096, 14336, WUSH_DTYPE_F32, dev, rng, m == 4);
            check_same_bytes(f, m, 40, 2080, WUSH_DTYPE_F32, dev, rng, false);  // ragged tile and chunk
        }
}

// Two forwards of one layer in flight at once (two streams, each with its own workspace and
// output, launched alternately without waiting): each equals the decode kernel's bytes. With the
// split-K counters in the layer, the two launches counted each other's arrivals.
TEST(StreamDecodeGpu, TwoLaunchesInFlightOnTwoStreams) {
    REQUIRE_SM80();
    const wush::cuda::StreamDecodeDevice dev = wush::cuda::configure_stream_decode();
    std::mt19937 rng(143);
    const wush_format f = WUSH_FORMAT_MXFP4;
    const std::size_t m = 1, n = 1024, k = 14336;
    ASSERT_GT(st::schedule_of(m, n, k).splits, 1u) << "the shape must split K";
    const std::vector<std::uint8_t> wc = random_codes(n * k / 2, rng), ws = random_scales(f, n, k, rng);
    const Buffer a(random_codes(m * k / 2, rng)), sa(random_scales(f, m, k, rng)), w(wc), sw(ws);
    const Buffer staged(st::stage_weights(f, n, k, wc.data(), ws.data()));
    Buffer work[2] = {Buffer(st::workspace_bytes(m, n, k)), Buffer(st::workspace_bytes(m, n, k))};
    Buffer y[2] = {Buffer(m * n * 4), Buffer(m * n * 4)};
    const GemmArgs per[2] = {product_args(f, m, n, k, a, sa, w, sw, y[0], WUSH_DTYPE_F32, work[0]),
                             product_args(f, m, n, k, a, sa, w, sw, y[1], WUSH_DTYPE_F32, work[1])};
    wush::cuda::launch_decode_gemm_split(per[0], st::schedule_of(m, n, k).chunks_per_split, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<std::uint8_t> want = y[0].download();
    const wush::cuda::StreamDecodeWeights sw_{staged.u8()};
    cudaStream_t s[2] = {nullptr, nullptr};
    for (cudaStream_t& st_ : s) CUDA_OK(cudaStreamCreateWithFlags(&st_, cudaStreamNonBlocking));
    for (int round = 0; round < 50; ++round)
        for (int i = 0; i < 2; ++i) wush::cuda::launch_stream_decode_gemm(per[i], sw_, s[i], dev);
    for (cudaStream_t st_ : s) CUDA_OK(cudaStreamSynchronize(st_));
    for (int i = 0; i < 2; ++i) EXPECT_TRUE(y[i].download() == want) << "stream " << i;
    for (cudaStream_t st_ : s) cudaStreamDestroy(st_);
}

}  // namespace
