// `wush bench --device cuda`: the CUDA backend against its baselines, measured in the same run
// with CUDA events (median of batches after a warm-up), on the built-in Llama-like layers:
//   quantize  wush_linear_quantize, WUSH (per-block matrices)  vs (a) the same kernel with one
//             shared Hadamard matrix, (b) a device-to-device copy of the activations' bytes
//   forward   wush_linear_run (quantize + W4A4 GEMM)          vs cuBLAS BF16 GEMM (X W^T, float32
//                                                               accumulation) on the same shape
//   gemm      wush_linear_run_quantized (the GEMM alone, on    vs the same cuBLAS BF16 GEMM
//             activations quantized once), with every forward
// Every row names the kernels that ran (wush_linear_last_kernels after its calls).
// Activations are BF16. speedup = baseline_s / ours_s. `--timing both` (the default) measures every
// call twice: eager (each call launched from the host) and replayed from a captured CUDA graph (no
// host launch cost, as a framework that replays graphs sees it); `eager` or `graph` measure one.
// `--l2 cold` (the default) rotates each side through copies of its weights that overflow the L2
// twice over, as in a model where the other layers' weights pass through L2 between two calls of
// one layer; `--l2 warm` reuses one copy, which a 4-bit weight smaller than L2 never leaves. The
// library is used through its public C API only; the CUDA runtime and cuBLAS are linked here for
// the baselines.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cli.h"
#include "commands.h"
#include "cuda_variants.h"
#include "layers.h"

namespace {

constexpr double kNotMeasured = std::numeric_limits<double>::quiet_NaN();

// Seconds per call, eager and graph-replayed (the median of the samples, and their fastest and
// slowest): kNotMeasured where that timing was not asked for, negative where the graph could not
// be captured.
struct Times {
    double eager = kNotMeasured, graph = kNotMeasured;
    double eager_min = kNotMeasured, eager_max = kNotMeasured, graph_min = kNotMeasured, graph_max = kNotMeasured;
};

// The median, fastest and slowest of one measurement's samples, in seconds per call.
struct Spread {
    double median, min, max;
};

// What the run measures.
struct Settings {
    bool eager = true, graph = true;
    bool cold = true;          // rotate through copies of the weights (--l2 cold)
    std::size_t l2_bytes = 0;  // the device's L2 size (cudaDevAttrL2CacheSize)
};

struct Result {
    std::string kind, layer, format, baseline;
    std::size_t m;
    Times ours, base;
    std::size_t copies_ours = 1, copies_base = 1;  // the copies each side's calls rotate through
    double ours_bytes = 0.0, base_bytes = 0.0;     // quantize only: bytes moved per call (GB/s)
    std::string variant = "default";               // the --variants item the layers were prepared with
    std::size_t repeat = 0;                        // which round of --repeats (from 0)
    std::string kernels{};                         // what ran: wush_linear_last_kernels after the calls
};

// Device memory owned for the length of one measurement, or of one layer's copies.
class DeviceBuffer {
public:
    explicit DeviceBuffer(std::size_t bytes) {
        if (cudaMalloc(&p_, bytes ? bytes : 1) != cudaSuccess) p_ = nullptr;
    }
    DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
    ~DeviceBuffer() { cudaFree(p_); }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(DeviceBuffer&&) = delete;
    void* get() const { return p_; }
    explicit operator bool() const { return p_ != nullptr; }

private:
    void* p_ = nullptr;
};

struct LinearDeleter {
    void operator()(wush_linear* l) const { wush_linear_destroy(l); }
};
using Linear = std::unique_ptr<wush_linear, LinearDeleter>;

// Median (fastest, slowest) seconds per call over 7 samples, each one launch() of `calls` calls
// between two CUDA events on `stream`.
template <typename Launch>
Spread median_per_call(cudaStream_t stream, std::size_t calls, Launch&& launch) {
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    std::vector<double> t;
    for (int sample = 0; sample < 7; ++sample) {
        cudaEventRecord(a, stream);
        launch();
        cudaEventRecord(b, stream);
        cudaEventSynchronize(b);
        float ms = 0.0f;
        cudaEventElapsedTime(&ms, a, b);
        t.push_back(double(ms) * 1e-3 / double(calls));
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    std::sort(t.begin(), t.end());
    return {t[t.size() / 2], t.front(), t.back()};
}

// The calls of one batch: at least 20 and a multiple of the copies, so that every batch, eager or
// replayed, walks whole rounds (call i uses copy i % copies) and the next batch starts where the
// last one left off: each copy comes back only after all the others, the least recently used.
std::size_t batch_size(std::size_t copies) {
    constexpr std::size_t kMinBatch = 20;
    return (kMinBatch + copies - 1) / copies * copies;
}

template <typename Fn>
void run_batch(std::size_t copies, Fn& fn) {
    const std::size_t batch = batch_size(copies);
    for (std::size_t i = 0; i < batch; ++i) fn(i % copies);
}

// Eager: every call launched from the host. The warm-up round also uses every copy once (first
// launches, lazy set-up) before the samples, and before any capture.
template <typename Fn>
Spread eager_seconds(cudaStream_t stream, std::size_t copies, Fn& fn) {
    run_batch(copies, fn);
    cudaStreamSynchronize(stream);
    return median_per_call(stream, batch_size(copies), [&] { run_batch(copies, fn); });
}

// Graph: one batch captured once (global mode) and replayed for each sample, so the host's launch
// cost drops out. The captured batch cycles through the copies as the eager one does. Negative
// when the capture fails.
template <typename Fn>
Spread graph_seconds(cudaStream_t stream, std::size_t copies, Fn& fn) {
    run_batch(copies, fn);  // eager warm-up: nothing lazy may happen inside the capture
    cudaStreamSynchronize(stream);
    cudaGraph_t g = nullptr;
    cudaGraphExec_t exec = nullptr;
    constexpr Spread kFailed{-1.0, -1.0, -1.0};
    if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) != cudaSuccess) return kFailed;
    run_batch(copies, fn);
    const bool captured = cudaStreamEndCapture(stream, &g) == cudaSuccess && g != nullptr;
    const bool ready = captured && cudaGraphInstantiate(&exec, g, 0) == cudaSuccess;
    if (g != nullptr) cudaGraphDestroy(g);
    if (!ready) {
        cudaGetLastError();  // clear the capture's error for the next measurement
        return kFailed;
    }
    cudaGraphLaunch(exec, stream);  // warm-up of the graph itself (its upload)
    cudaStreamSynchronize(stream);
    const Spread t = median_per_call(stream, batch_size(copies), [&] { cudaGraphLaunch(exec, stream); });
    cudaGraphExecDestroy(exec);
    return t;
}

// fn(copy) enqueues one call on `stream` using weight copy `copy` (< copies).
template <typename Fn>
Times measure(cudaStream_t stream, const Settings& s, std::size_t copies, Fn&& fn) {
    Times t;
    if (s.eager) {
        const Spread e = eager_seconds(stream, copies, fn);
        t.eager = e.median, t.eager_min = e.min, t.eager_max = e.max;
    }
    if (s.graph) {
        const Spread g = graph_seconds(stream, copies, fn);
        t.graph = g.median, t.graph_min = g.min, t.graph_max = g.max;
    }
    return t;
}

std::vector<std::uint16_t> random_bf16(std::size_t count, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal;
    std::vector<std::uint16_t> v(count);
    for (auto& e : v) {
        const float f = normal(rng);
        std::uint32_t bits;
        std::memcpy(&bits, &f, 4);
        e = std::uint16_t(bits >> 16);
    }
    return v;
}

bool ok(wush_status st, const char* what) {
    if (st == WUSH_OK) return true;
    std::fprintf(stderr, "wush bench: %s: %s: %s\n", what, wush_status_string(st),
                 cli::printable_message(wush_last_error()).c_str());
    return false;
}

// The transforms and quantized weights of one layer and format, which every prepared copy is
// made from.
struct Sources {
    Handle<wush_transform, wush_transform_destroy> tw, th;
    Handle<wush_qweight, wush_qweight_destroy> qw, qh;
};

// One layer and format: the prepared WUSH and Hadamard layers on the CUDA context, in as many
// copies as the run rotates through (wush_linear_create uploads its own copy each time), and
// cuBLAS's BF16 weight in its own number of device copies.
struct Case {
    std::string layer;
    std::size_t d_out = 0, d_in = 0;
    wush_format format = WUSH_FORMAT_MXFP4;
    std::vector<Linear> wush, hadamard;
    std::vector<DeviceBuffer> w_bf16;
};

bool make_sources(wush_context* cpu, const std::string& name, wush_format format, Sources* s, Case* c) {
    Layer l;
    if (load_builtin(name, 1, 256, 0, &l) != 0) return false;
    c->layer = name;
    c->d_out = l.d_out;
    c->d_in = l.d_in;
    c->format = format;
    std::size_t g = 0;
    wush_format_group_size(format, &g);
    Handle<wush_calibrator, wush_calibrator_destroy> cal;
    return ok(wush_calibrator_create(l.d_in, g, WUSH_MOMENTS_BLOCK_DIAGONAL, &cal.p), "calibrator") &&
           ok(wush_calibrator_add(cpu, cal.p, l.x_dtype, l.x.data(), l.n_calibration), "calibrate") &&
           ok(wush_transform_build(cpu, cal.p, l.w_dtype, l.weight.data(), l.d_out, l.d_in, WUSH_TRANSFORM_WUSH,
                                   nullptr, &s->tw.p),
              "wush transform") &&
           ok(wush_transform_create_fixed(WUSH_TRANSFORM_HADAMARD, l.d_in, g, nullptr, &s->th.p), "hadamard") &&
           ok(wush_qweight_create(cpu, s->tw.p, format, WUSH_METHOD_RTN, l.w_dtype, l.weight.data(), l.d_out, l.d_in,
                                  nullptr, &s->qw.p),
              "qweight") &&
           ok(wush_qweight_create(cpu, s->th.p, format, WUSH_METHOD_RTN, l.w_dtype, l.weight.data(), l.d_out, l.d_in,
                                  nullptr, &s->qh.p),
              "qweight");
}

// One more copy of the prepared WUSH and Hadamard layers.
bool add_copy(wush_context* ctx, const Sources& s, Case* c) {
    wush_linear *w = nullptr, *h = nullptr;
    const bool made = ok(wush_linear_create(ctx, s.tw.p, s.qw.p, &w), "prepare") &&
                      ok(wush_linear_create(ctx, s.th.p, s.qh.p, &h), "prepare");
    c->wush.emplace_back(w);  // owned (and destroyed) even when the other failed
    c->hadamard.emplace_back(h);
    return made;
}

std::size_t free_device_bytes() {
    std::size_t free = 0, total = 0;
    cudaMemGetInfo(&free, &total);
    return free;
}

// Copies whose round overflows L2 twice over, so that a copy is evicted before it comes back
// whatever L2's replacement policy; at least 4, and at most 64 (a tiny layer would want
// thousands; its row in the output then shows how few copies it had).
std::size_t cold_copies(std::size_t bytes, std::size_t l2_bytes) {
    constexpr std::size_t kMinCopies = 4, kMaxCopies = 64;
    return std::clamp(2 * l2_bytes / std::max<std::size_t>(bytes, 1) + 1, kMinCopies, kMaxCopies);
}

struct Copies {
    std::size_t ours = 1, base = 1;
};

// Fits the copies into `free` bytes beside `reserve`: the side whose copies take more gives up
// one at a time, down to `floor` each (2 for L2-cold: a single copy would stay warm). False when
// even that does not fit.
bool fit_copies(std::size_t free, std::size_t reserve, std::size_t ours_bytes, std::size_t base_bytes,
                std::size_t floor, Copies* n) {
    auto need = [&] { return n->ours * ours_bytes + n->base * base_bytes + reserve; };
    while (need() > free && (n->ours > floor || n->base > floor)) {
        const bool ours_larger = n->ours * ours_bytes >= n->base * base_bytes;
        if ((ours_larger && n->ours > floor) || n->base == floor) --n->ours;
        else --n->base;
    }
    return need() <= free;
}

// What the measurements of up to m_max tokens allocate besides the weights' copies (all at once,
// an upper bound), and room for cuBLAS's workspace and the graphs.
std::size_t buffer_bytes(wush_context* ctx, const Case& c, std::size_t m_max) {
    std::size_t cb = 0, sb = 0, ws = 0;
    wush_format_buffer_sizes(c.format, m_max, c.d_in, &cb, &sb);
    wush_linear_workspace_size(ctx, c.wush.front().get(), m_max, &ws);
    const std::size_t x = m_max * c.d_in * 2, y = m_max * c.d_out * 2;
    return 2 * x + cb + sb + 2 * y + ws + (std::size_t(256) << 20);
}

// The number of copies of each side: cold_copies of the bytes a call reads (our packed 4-bit
// weight; cuBLAS's BF16 weight), one each for --l2 warm, reduced to what device memory holds.
// Refuses (false, with a message) where not even the floor fits.
bool plan_copies(wush_context* ctx, const Settings& s, const Case& c, std::size_t m_max, std::size_t free,
                 std::size_t ours_device_bytes, Copies* n) {
    std::size_t cb = 0, sb = 0;
    wush_format_buffer_sizes(c.format, c.d_out, c.d_in, &cb, &sb);
    const std::size_t w_bf16 = c.d_out * c.d_in * 2;
    if (s.cold) *n = {cold_copies(cb + sb, s.l2_bytes), cold_copies(w_bf16, s.l2_bytes)};
    const Copies wanted = *n;
    const std::size_t reserve = buffer_bytes(ctx, c, m_max);
    if (!fit_copies(free, reserve, ours_device_bytes, w_bf16, s.cold ? 2 : 1, n)) {
        std::fprintf(stderr,
                     "wush bench: %s %s: not enough device memory: %zu MiB free, %zu MiB needed for %s of each "
                     "weight and the buffers of m = %zu%s\n",
                     c.layer.c_str(), wush_format_name(c.format), free >> 20,
                     (n->ours * ours_device_bytes + n->base * w_bf16 + reserve) >> 20, s.cold ? "2 copies" : "one copy",
                     m_max, s.cold ? " (--l2 warm needs one copy)" : "");
        return false;
    }
    if (n->ours != wanted.ours || n->base != wanted.base)
        std::fprintf(stderr, "wush bench: %s %s: device memory holds %zu + %zu weight copies, not %zu + %zu\n",
                     c.layer.c_str(), wush_format_name(c.format), n->ours, n->base, wanted.ours, wanted.base);
    return true;
}

// Builds the case from `src` (layer, shape and format as in `meta`), on `ctx` with its switches as
// they are now: the first copy of our layers (its device footprint measured around it), the plan,
// then the other copies, and cuBLAS's copies of a random BF16 weight of the same shape.
bool make_case(wush_context* ctx, const Sources& src, const Case& meta, const Settings& s, std::size_t m_max, Case* c,
               Copies* n) {
    c->layer = meta.layer, c->d_out = meta.d_out, c->d_in = meta.d_in, c->format = meta.format;
    const wush_format format = meta.format;
    const std::size_t before = free_device_bytes();
    if (!add_copy(ctx, src, c)) return false;
    const std::size_t free = free_device_bytes();
    std::size_t cb = 0, sb = 0;
    wush_format_buffer_sizes(format, c->d_out, c->d_in, &cb, &sb);
    // cudaMemGetInfo counts whole pages; the packed weights of both layers are a floor.
    const std::size_t ours = std::max(before > free ? before - free : 0, 2 * (cb + sb));
    if (!plan_copies(ctx, s, *c, m_max, free + ours, ours, n)) return false;
    while (c->wush.size() < n->ours)
        if (!add_copy(ctx, src, c)) return false;
    const std::vector<std::uint16_t> hw = random_bf16(c->d_out * c->d_in, 11);
    for (std::size_t i = 0; i < n->base; ++i) {
        c->w_bf16.emplace_back(hw.size() * 2);
        if (!c->w_bf16.back()) return ok(WUSH_ERR_OUT_OF_MEMORY, "device copies of the BF16 weight");
        cudaMemcpy(c->w_bf16.back().get(), hw.data(), hw.size() * 2, cudaMemcpyHostToDevice);
    }
    return true;
}

// A graph that failed to capture (graph_seconds < 0) fails the run, naming the call.
bool timed(const Times& t, const char* what) {
    if (!(t.graph < 0.0)) return true;
    std::fprintf(stderr, "wush bench: %s could not be captured in a CUDA graph\n", what);
    return false;
}

// The kernels a layer's last call ran (wush_linear_last_kernels), "?" if it cannot say.
std::string kernels_of(const Linear& layer) {
    char names[64] = "?";
    return wush_linear_last_kernels(layer.get(), names, sizeof names) == WUSH_OK ? names : "?";
}

bool bench_quantize(wush_context* ctx, cudaStream_t stream, const Settings& s, const Case& c, std::size_t m,
                    const void* x, std::vector<Result>* out) {
    std::size_t cb = 0, sb = 0;
    wush_format_buffer_sizes(c.format, m, c.d_in, &cb, &sb);
    DeviceBuffer codes(cb), scales(sb), copy(m * c.d_in * 2);
    if (!codes || !scales || !copy) return ok(WUSH_ERR_OUT_OF_MEMORY, "device buffers");
    wush_status st = WUSH_OK;
    auto run = [&](const std::vector<Linear>* copies) {
        return [&, copies](std::size_t i) {
            const wush_status r =
                wush_linear_quantize(ctx, (*copies)[i].get(), WUSH_DTYPE_BF16, x, m, codes.get(), cb, scales.get(), sb);
            if (r != WUSH_OK) st = r;
        };
    };
    const std::size_t n = c.wush.size();
    const Times t_wush = measure(stream, s, n, run(&c.wush));
    const Times t_had = measure(stream, s, n, run(&c.hadamard));
    const std::size_t x_bytes = m * c.d_in * 2;
    // The activations are the same on every side (warm: a model's previous layer just wrote them).
    const Times t_copy = measure(
        stream, s, 1, [&](std::size_t) { cudaMemcpyAsync(copy.get(), x, x_bytes, cudaMemcpyDeviceToDevice, stream); });
    if (!ok(st, "wush_linear_quantize") || !ok(wush_context_synchronize(ctx), "synchronize")) return false;
    if (!timed(t_wush, "wush_linear_quantize") || !timed(t_had, "the Hadamard quantize") ||
        !timed(t_copy, "the device copy"))
        return false;
    const double moved = double(x_bytes + cb + sb);
    const std::string f = wush_format_name(c.format);
    out->push_back({"quantize", c.layer, f, "hadamard", m, t_wush, t_had, n, n, moved, moved});
    out->push_back({"quantize", c.layer, f, "d2d_copy", m, t_wush, t_copy, n, 1, moved, 2.0 * double(x_bytes)});
    out->end()[-2].kernels = out->end()[-1].kernels = kernels_of(c.wush.front());
    return true;
}

bool bench_forward(wush_context* ctx, cudaStream_t stream, const Settings& s, cublasHandle_t blas, const Case& c,
                   std::size_t m, const void* x, std::vector<Result>* out) {
    std::size_t ws = 0;
    if (!ok(wush_linear_workspace_size(ctx, c.wush.front().get(), m, &ws), "workspace size")) return false;
    DeviceBuffer y(m * c.d_out * 2), workspace(ws), y_ref(m * c.d_out * 2);
    if (!y || !workspace || !y_ref) return ok(WUSH_ERR_OUT_OF_MEMORY, "device buffers");
    wush_status st = WUSH_OK;
    const Times t_ours = measure(stream, s, c.wush.size(), [&](std::size_t i) {
        const wush_status r = wush_linear_run(ctx, c.wush[i].get(), WUSH_DTYPE_BF16, x, m, WUSH_DTYPE_BF16, y.get(),
                                              m * c.d_out, workspace.get(), ws);
        if (r != WUSH_OK) st = r;
    });
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t bst = CUBLAS_STATUS_SUCCESS;
    // Y^T (d_out x m, column-major) = W (d_out x d_in, row-major = d_in x d_out column-major)^T X^T.
    const Times t_blas = measure(stream, s, c.w_bf16.size(), [&](std::size_t i) {
        const cublasStatus_t r =
            cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, int(c.d_out), int(m), int(c.d_in), &one, c.w_bf16[i].get(),
                         CUDA_R_16BF, int(c.d_in), x, CUDA_R_16BF, int(c.d_in), &zero, y_ref.get(), CUDA_R_16BF,
                         int(c.d_out), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (r != CUBLAS_STATUS_SUCCESS) bst = r;
    });
    if (!ok(st, "wush_linear_run") || !ok(wush_context_synchronize(ctx), "synchronize")) return false;
    if (bst != CUBLAS_STATUS_SUCCESS) {
        std::fprintf(stderr, "wush bench: cublasGemmEx failed (%d)\n", int(bst));
        return false;
    }
    if (!timed(t_ours, "wush_linear_run") || !timed(t_blas, "cublasGemmEx")) return false;
    out->push_back({"forward", c.layer, wush_format_name(c.format), "cublas_bf16", m, t_ours, t_blas, c.wush.size(),
                    c.w_bf16.size()});
    out->back().kernels = kernels_of(c.wush.front());
    // The GEMM alone (wush_linear_run_quantized) on activations quantized once: every copy is the
    // same transform, so the first copy's codes serve them all.
    std::size_t cb = 0, sb = 0;
    wush_format_buffer_sizes(c.format, m, c.d_in, &cb, &sb);
    DeviceBuffer codes(cb), scales(sb);
    if (!codes || !scales) return ok(WUSH_ERR_OUT_OF_MEMORY, "device buffers");
    if (!ok(wush_linear_quantize(ctx, c.wush.front().get(), WUSH_DTYPE_BF16, x, m, codes.get(), cb, scales.get(), sb),
            "wush_linear_quantize"))
        return false;
    const Times t_gemm = measure(stream, s, c.wush.size(), [&](std::size_t i) {
        const wush_status r = wush_linear_run_quantized(ctx, c.wush[i].get(), codes.get(), cb, scales.get(), sb, m,
                                                        WUSH_DTYPE_BF16, y.get(), m * c.d_out, workspace.get(), ws);
        if (r != WUSH_OK) st = r;
    });
    if (!ok(st, "wush_linear_run_quantized") || !ok(wush_context_synchronize(ctx), "synchronize") ||
        !timed(t_gemm, "wush_linear_run_quantized"))
        return false;
    out->push_back({"gemm", c.layer, wush_format_name(c.format), "cublas_bf16", m, t_gemm, t_blas, c.wush.size(),
                    c.w_bf16.size()});
    out->back().kernels = kernels_of(c.wush.front());
    return true;
}

// The device name comes from the driver: escaped for JSON all the same.
std::string json_string(const std::string& s) {
    std::string out;
    for (const char ch : s) {
        const unsigned char u = static_cast<unsigned char>(ch);
        if (ch == '"' || ch == '\\') out += '\\', out += ch;
        else if (u < 0x20) out += ' ';
        else out += ch;
    }
    return out;
}

// The time the fields of the earlier output (ours_us, baseline_us, speedup, *_gbps) report:
// eager where measured (the earlier default), else the graph's.
double primary(const Times& t) {
    return std::isnan(t.eager) ? t.graph : t.eager;
}

// `format` applied to v, or `missing` for a timing that was not measured.
std::string number(const char* format, double v, const char* missing) {
    if (!std::isfinite(v)) return missing;
    char buf[32];
    std::snprintf(buf, sizeof buf, format, v);
    return buf;
}

// One row: the earlier output's fields first (unchanged), then both timings and the copies.
std::string json_row(const Result& r) {
    const double ours = primary(r.ours), base = primary(r.base);
    auto us = [](double s) { return number("%.3f", s * 1e6, "null"); };
    auto x = [](double b, double o) { return number("%.4f", b / o, "null"); };
    auto gbps = [](double bytes, double s) { return number("%.1f", bytes / s / 1e9, "null"); };
    auto q = [](const std::string& v) { return "\"" + v + "\""; };
    const std::pair<const char*, std::string> fields[] = {
        {"kind", q(r.kind)},
        {"layer", q(r.layer)},
        {"format", q(r.format)},
        {"m", std::to_string(r.m)},
        {"baseline", q(r.baseline)},
        {"ours_us", us(ours)},
        {"baseline_us", us(base)},
        {"speedup", x(base, ours)},
        {"ours_gbps", gbps(r.ours_bytes, ours)},
        {"baseline_gbps", gbps(r.base_bytes, base)},
        {"ours_eager_us", us(r.ours.eager)},
        {"baseline_eager_us", us(r.base.eager)},
        {"speedup_eager", x(r.base.eager, r.ours.eager)},
        {"ours_graph_us", us(r.ours.graph)},
        {"baseline_graph_us", us(r.base.graph)},
        {"speedup_graph", x(r.base.graph, r.ours.graph)},
        {"copies_ours", std::to_string(r.copies_ours)},
        {"copies_baseline", std::to_string(r.copies_base)},
        {"variant", q(json_string(r.variant))},
        {"repeat", std::to_string(r.repeat)},
        {"kernels", q(json_string(r.kernels))},
        {"ours_eager_min_us", us(r.ours.eager_min)},
        {"ours_eager_max_us", us(r.ours.eager_max)},
        {"baseline_eager_min_us", us(r.base.eager_min)},
        {"baseline_eager_max_us", us(r.base.eager_max)},
        {"ours_graph_min_us", us(r.ours.graph_min)},
        {"ours_graph_max_us", us(r.ours.graph_max)},
        {"baseline_graph_min_us", us(r.base.graph_min)},
        {"baseline_graph_max_us", us(r.base.graph_max)},
    };
    std::string out = "{";
    for (const auto& [name, value] : fields)
        out += (out.size() > 1 ? ", \"" : "\"") + std::string(name) + "\": " + value;
    return out + "}";
}

void print_json(const std::vector<Result>& rs, const std::string& device, const char* timing, const Settings& s) {
    std::printf("{\"device\": \"%s\", \"timing\": \"%s\", \"l2\": \"%s\", \"l2_bytes\": %zu, \"results\": [",
                json_string(device).c_str(), timing, s.cold ? "cold" : "warm", s.l2_bytes);
    for (std::size_t i = 0; i < rs.size(); ++i) std::printf("%s\n  %s", i ? "," : "", json_row(rs[i]).c_str());
    std::printf("\n]}\n");
}

// `variants`: a last column with the variant and the round (--variants, --repeats).
void print_table(const std::vector<Result>& rs, const std::string& device, const char* timing, const Settings& s,
                 bool variants) {
    std::printf("device: %s, timing: %s, l2: %s (L2 %.1f MiB; copies: ours/baseline)\n", device.c_str(), timing,
                s.cold ? "cold" : "warm", double(s.l2_bytes) / 1048576.0);
    std::printf("%-9s %-11s %-7s %6s %-12s %6s %10s %10s %7s %10s %10s %7s %9s %9s", "kind", "layer", "format", "m",
                "baseline", "copies", "eager_us", "base_us", "speedup", "graph_us", "base_us", "speedup", "ours_GB/s",
                "base_GB/s");
    std::fputs(variants ? "  variant/round kernels\n" : "\n", stdout);
    for (const Result& r : rs) {
        const std::string copies = std::to_string(r.copies_ours) + "/" + std::to_string(r.copies_base);
        std::printf("%-9s %-11s %-7s %6zu %-12s %6s %10s %10s %7s %10s %10s %7s %9s %9s", r.kind.c_str(),
                    r.layer.c_str(), r.format.c_str(), r.m, r.baseline.c_str(), copies.c_str(),
                    number("%.2f", r.ours.eager * 1e6, "-").c_str(), number("%.2f", r.base.eager * 1e6, "-").c_str(),
                    number("%.3f", r.base.eager / r.ours.eager, "-").c_str(),
                    number("%.2f", r.ours.graph * 1e6, "-").c_str(), number("%.2f", r.base.graph * 1e6, "-").c_str(),
                    number("%.3f", r.base.graph / r.ours.graph, "-").c_str(),
                    number("%.1f", r.ours_bytes / primary(r.ours) / 1e9, "-").c_str(),
                    number("%.1f", r.base_bytes / primary(r.base) / 1e9, "-").c_str());
        if (variants) std::printf("  %s/%zu %s", r.variant.c_str(), r.repeat, r.kernels.c_str());
        std::printf("\n");
    }
}

}  // namespace

int bench_cuda(cli::Args& a) {
    // The command line first (cli::Args' rules), before the device is touched.
    const std::vector<std::size_t> ms = a.get_size_list("--m", "1,16,128,1024,4096", 1, cli::kMaxTokens);
    a.get_choice_list("--kind", "quantize,forward", {"quantize", "forward"});
    const std::string timing = a.get_choice("--timing", "both", {"both", "eager", "graph"});
    Settings s;
    s.eager = timing != "graph";
    s.graph = timing != "eager";
    s.cold = a.get_choice("--l2", "cold", {"cold", "warm"}) == "cold";
    const std::vector<std::string> layers = a.get_list("--layers", "4096x4096,14336x4096,4096x14336");
    const std::vector<std::string> formats = a.get_list("--format", "mxfp4,nvfp4,int4");
    // --repeats: rounds over every shape and variant (each round measures each in turn).
    const std::size_t repeats = a.get_size("--repeats", 1, 1, cli::kMaxRepeats);
    std::vector<CudaOption> options;
    std::vector<BenchVariant> variants;
    std::string option_error;
    if (a.ok() && a.has("--cuda-option") &&
        !parse_cuda_options(a.get_list("--cuda-option", ""), &options, &option_error))
        return cli::usage_error("bench", option_error);
    if (a.ok() && a.has("--variants") && !parse_variants(a.get_list("--variants", ""), &variants, &option_error))
        return cli::usage_error("bench", option_error);
    if (!a.ok()) return cli::usage_error("bench", a);
    const bool several = !variants.empty();
    if (variants.empty()) {  // one variant: the --cuda-option switches alone, named after them
        std::string name;
        for (const std::string& o : a.get_list("--cuda-option", "")) name += (name.empty() ? "" : "+") + o;
        variants.push_back({name.empty() ? "default" : name, {}});
    }
    Handle<wush_context, wush_context_destroy> ctx, cpu;
    if (!ok(wush_context_create(WUSH_BACKEND_CUDA, 0, &ctx.p), "CUDA context") ||
        !ok(wush_context_create(WUSH_BACKEND_CPU, 0, &cpu.p), "CPU context"))
        return 1;
    // A layer keeps the switches it was prepared with: each variant's layers are prepared on the
    // one context after its switches are set (every switch back to 0, then --cuda-option, then
    // the variant's own).
    auto apply = [&](const BenchVariant& v) {
        for (const wush_context_parameter p : cuda_switch_parameters())
            if (!ok(wush_context_set_parameter(ctx.p, p, 0), "--cuda-option")) return false;
        std::vector<CudaOption> all = options;
        all.insert(all.end(), v.options.begin(), v.options.end());
        for (const CudaOption& o : all)
            if (!ok(wush_context_set_parameter(ctx.p, o.parameter, int64_t(o.value)), "--cuda-option")) return false;
        return true;
    };
    char device[256] = "";
    wush_context_describe(ctx.p, device, sizeof device);
    int l2 = 0;
    cudaStream_t stream = nullptr;
    cublasHandle_t blas = nullptr;
    if (cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0) != cudaSuccess ||
        cudaStreamCreate(&stream) != cudaSuccess || cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS ||
        cublasSetStream(blas, stream) != CUBLAS_STATUS_SUCCESS ||
        !ok(wush_context_set_stream(ctx.p, stream), "stream")) {
        std::fprintf(stderr, "wush bench: cannot set up a CUDA stream and cuBLAS\n");
        return 1;
    }
    s.l2_bytes = std::size_t(l2);
    const std::size_t m_max = *std::max_element(ms.begin(), ms.end());
    const std::string kinds = a.get("--kind", "quantize,forward");
    std::vector<Result> results;
    int rc = 0;
    for (const std::string& layer : layers) {
        for (const std::string& fname : formats) {
            wush_format f;
            if (wush_format_from_name(fname.c_str(), &f) != WUSH_OK) {
                std::fprintf(stderr, "wush bench: unknown format '%s'\n", cli::printable(fname).c_str());
                return 2;
            }
            // The transforms and quantized weights once (CPU work), every variant's prepared copies,
            // then each shape measured for every variant in turn, round after round: the variants
            // alternate on the same card, none measured all at once.
            Sources src;
            Case meta;
            if (!make_sources(cpu.p, layer, f, &src, &meta)) return 1;
            std::vector<Case> cases(variants.size());
            for (std::size_t v = 0; v < variants.size(); ++v) {
                Copies n;
                if (!apply(variants[v]) || !make_case(ctx.p, src, meta, s, m_max, &cases[v], &n)) return 1;
            }
            const std::vector<std::uint16_t> hx = random_bf16(m_max * cases[0].d_in, 7);
            DeviceBuffer x(hx.size() * 2);
            if (!x) return ok(WUSH_ERR_OUT_OF_MEMORY, "device buffers") ? 0 : 1;
            cudaMemcpy(x.get(), hx.data(), hx.size() * 2, cudaMemcpyHostToDevice);
            for (std::size_t round = 0; round < repeats; ++round) {
                for (std::size_t m : ms) {
                    for (std::size_t v = 0; v < variants.size(); ++v) {
                        const std::size_t first = results.size();
                        if (kinds.find("quantize") != std::string::npos &&
                            !bench_quantize(ctx.p, stream, s, cases[v], m, x.get(), &results))
                            rc = 1;
                        if (kinds.find("forward") != std::string::npos &&
                            !bench_forward(ctx.p, stream, s, blas, cases[v], m, x.get(), &results))
                            rc = 1;
                        for (std::size_t i = first; i < results.size(); ++i)
                            results[i].variant = variants[v].name, results[i].repeat = round;
                    }
                }
            }
            if (!a.has("--json")) std::fprintf(stderr, "wush bench: %s %s done\n", layer.c_str(), fname.c_str());
        }
    }
    wush_context_set_stream(ctx.p, nullptr);
    cublasDestroy(blas);
    cudaStreamDestroy(stream);
    if (a.has("--json")) print_json(results, device, timing.c_str(), s);
    else print_table(results, device, timing.c_str(), s, several || repeats > 1);
    return rc;
}
