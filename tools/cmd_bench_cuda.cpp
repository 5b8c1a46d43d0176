// `wush bench --device cuda`: the CUDA backend against its baselines, measured in the same run
// with CUDA events (median of batches after a warm-up), on the built-in Llama-like layers:
//   quantize  wush_linear_quantize, WUSH (per-block matrices)  vs (a) the same kernel with one
//             shared Hadamard matrix, (b) a device-to-device copy of the activations' bytes
//   forward   wush_linear_run (quantize + W4A4 GEMM)          vs cuBLAS BF16 GEMM (X W^T, float32
//                                                               accumulation) on the same shape
// Activations are BF16. speedup = baseline_s / ours_s. `--timing graph` replays each batch of
// calls from a captured CUDA graph (no host launch cost); the default, eager, launches each call. The library is used through its public C
// API only; the CUDA runtime and cuBLAS are linked here for the baselines.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cli.h"
#include "commands.h"
#include "layers.h"

namespace {

struct Result {
    std::string kind, layer, format, baseline;
    std::size_t m;
    double ours_s, baseline_s;
    double ours_gbps = 0.0, baseline_gbps = 0.0;  // quantize only: bytes moved per second
};

// Device memory owned for the length of one measurement.
class DeviceBuffer {
public:
    explicit DeviceBuffer(std::size_t bytes) {
        if (cudaMalloc(&p_, bytes ? bytes : 1) != cudaSuccess) p_ = nullptr;
    }
    ~DeviceBuffer() { cudaFree(p_); }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    void* get() const { return p_; }
    explicit operator bool() const { return p_ != nullptr; }

private:
    void* p_ = nullptr;
};

// Median seconds per call of fn() on `stream`: batches of kBatch calls timed with CUDA events,
// after a warm-up. With `graph` each batch is one replay of a CUDA graph captured once (global
// mode) from kBatch calls: the host's launch cost drops out, as for a framework that replays
// graphs, which is what the small-m figures need. Negative when the capture fails.
template <typename Fn>
double median_seconds(cudaStream_t stream, bool graph, Fn&& fn) {
    constexpr int kBatch = 20;
    for (int i = 0; i < 3; ++i) fn();  // warm-up
    cudaStreamSynchronize(stream);
    cudaGraphExec_t exec = nullptr;
    if (graph) {
        cudaGraph_t g = nullptr;
        if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) != cudaSuccess) return -1.0;
        for (int i = 0; i < kBatch; ++i) fn();
        const bool captured = cudaStreamEndCapture(stream, &g) == cudaSuccess && g != nullptr;
        const bool ready = captured && cudaGraphInstantiate(&exec, g, 0) == cudaSuccess;
        if (g != nullptr) cudaGraphDestroy(g);
        if (!ready) {
            cudaGetLastError();  // clear the capture's error for the next measurement
            return -1.0;
        }
        cudaGraphLaunch(exec, stream);  // warm-up of the graph itself
        cudaStreamSynchronize(stream);
    }
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    std::vector<double> t;
    for (int sample = 0; sample < 7; ++sample) {
        cudaEventRecord(a, stream);
        if (exec != nullptr) cudaGraphLaunch(exec, stream);
        else
            for (int i = 0; i < kBatch; ++i) fn();
        cudaEventRecord(b, stream);
        cudaEventSynchronize(b);
        float ms = 0.0f;
        cudaEventElapsedTime(&ms, a, b);
        t.push_back(double(ms) * 1e-3 / kBatch);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
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
    std::fprintf(stderr, "wush bench: %s: %s: %s\n", what, wush_status_string(st), wush_last_error());
    return false;
}

// One layer and format: prepared WUSH and Hadamard layers on `ctx`.
struct Case {
    std::string layer;
    std::size_t d_out = 0, d_in = 0;
    wush_format format = WUSH_FORMAT_MXFP4;
    Handle<wush_linear, wush_linear_destroy> wush, hadamard;
};

bool make_case(wush_context* ctx, wush_context* cpu, const std::string& name, wush_format format, Case* c) {
    Layer l;
    if (load_builtin(name, 1, 256, 0, &l) != 0) return false;
    c->layer = name;
    c->d_out = l.d_out;
    c->d_in = l.d_in;
    c->format = format;
    std::size_t g = 0;
    wush_format_group_size(format, &g);
    Handle<wush_calibrator, wush_calibrator_destroy> cal;
    Handle<wush_transform, wush_transform_destroy> tw, th;
    Handle<wush_qweight, wush_qweight_destroy> qw, qh;
    return ok(wush_calibrator_create(l.d_in, g, WUSH_MOMENTS_BLOCK_DIAGONAL, &cal.p), "calibrator") &&
           ok(wush_calibrator_add(cpu, cal.p, l.x_dtype, l.x.data(), l.n_calibration), "calibrate") &&
           ok(wush_transform_build(cpu, cal.p, l.w_dtype, l.weight.data(), l.d_out, l.d_in, WUSH_TRANSFORM_WUSH,
                                   nullptr, &tw.p),
              "wush transform") &&
           ok(wush_transform_create_fixed(WUSH_TRANSFORM_HADAMARD, l.d_in, g, nullptr, &th.p), "hadamard") &&
           ok(wush_qweight_create(cpu, tw.p, format, WUSH_METHOD_RTN, l.w_dtype, l.weight.data(), l.d_out, l.d_in,
                                  nullptr, &qw.p),
              "qweight") &&
           ok(wush_qweight_create(cpu, th.p, format, WUSH_METHOD_RTN, l.w_dtype, l.weight.data(), l.d_out, l.d_in,
                                  nullptr, &qh.p),
              "qweight") &&
           ok(wush_linear_create(ctx, tw.p, qw.p, &c->wush.p), "prepare") &&
           ok(wush_linear_create(ctx, th.p, qh.p, &c->hadamard.p), "prepare");
}

// A measurement that failed to capture (median_seconds < 0) fails the run, naming it.
bool timed(double t, const char* what) {
    if (t >= 0.0) return true;
    std::fprintf(stderr, "wush bench: %s could not be captured in a CUDA graph\n", what);
    return false;
}

bool bench_quantize(wush_context* ctx, cudaStream_t stream, bool graph, const Case& c, std::size_t m, const void* x,
                    std::vector<Result>* out) {
    std::size_t cb = 0, sb = 0;
    wush_format_buffer_sizes(c.format, m, c.d_in, &cb, &sb);
    DeviceBuffer codes(cb), scales(sb), copy(m * c.d_in * 2);
    if (!codes || !scales || !copy) return ok(WUSH_ERR_OUT_OF_MEMORY, "device buffers");
    wush_status st = WUSH_OK;
    auto run = [&](wush_linear* l) {
        return [&, l] {
            const wush_status s =
                wush_linear_quantize(ctx, l, WUSH_DTYPE_BF16, x, m, codes.get(), cb, scales.get(), sb);
            if (s != WUSH_OK) st = s;
        };
    };
    const double t_wush = median_seconds(stream, graph, run(c.wush.p));
    const double t_had = median_seconds(stream, graph, run(c.hadamard.p));
    const std::size_t x_bytes = m * c.d_in * 2;
    const double t_copy = median_seconds(
        stream, graph, [&] { cudaMemcpyAsync(copy.get(), x, x_bytes, cudaMemcpyDeviceToDevice, stream); });
    if (!ok(st, "wush_linear_quantize") || !ok(wush_context_synchronize(ctx), "synchronize")) return false;
    if (!timed(t_wush, "wush_linear_quantize") || !timed(t_had, "the Hadamard quantize") ||
        !timed(t_copy, "the device copy"))
        return false;
    const double moved = double(x_bytes + cb + sb);
    out->push_back({"quantize", c.layer, wush_format_name(c.format), "hadamard", m, t_wush, t_had, moved / t_wush / 1e9,
                    moved / t_had / 1e9});
    out->push_back({"quantize", c.layer, wush_format_name(c.format), "d2d_copy", m, t_wush, t_copy,
                    moved / t_wush / 1e9, 2.0 * double(x_bytes) / t_copy / 1e9});
    return true;
}

bool bench_forward(wush_context* ctx, cudaStream_t stream, bool graph, cublasHandle_t blas, const Case& c,
                   std::size_t m, const void* x, const void* w_bf16, std::vector<Result>* out) {
    std::size_t ws = 0;
    if (!ok(wush_linear_workspace_size(ctx, c.wush.p, m, &ws), "workspace size")) return false;
    DeviceBuffer y(m * c.d_out * 2), workspace(ws), y_ref(m * c.d_out * 2);
    if (!y || !workspace || !y_ref) return ok(WUSH_ERR_OUT_OF_MEMORY, "device buffers");
    wush_status st = WUSH_OK;
    const double t_ours = median_seconds(stream, graph, [&] {
        const wush_status s = wush_linear_run(ctx, c.wush.p, WUSH_DTYPE_BF16, x, m, WUSH_DTYPE_BF16, y.get(),
                                              m * c.d_out, workspace.get(), ws);
        if (s != WUSH_OK) st = s;
    });
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t bst = CUBLAS_STATUS_SUCCESS;
    // Y^T (d_out x m, column-major) = W (d_out x d_in, row-major = d_in x d_out column-major)^T X^T.
    const double t_blas = median_seconds(stream, graph, [&] {
        const cublasStatus_t s =
            cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, int(c.d_out), int(m), int(c.d_in), &one, w_bf16, CUDA_R_16BF,
                         int(c.d_in), x, CUDA_R_16BF, int(c.d_in), &zero, y_ref.get(), CUDA_R_16BF, int(c.d_out),
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (s != CUBLAS_STATUS_SUCCESS) bst = s;
    });
    if (!ok(st, "wush_linear_run") || !ok(wush_context_synchronize(ctx), "synchronize")) return false;
    if (bst != CUBLAS_STATUS_SUCCESS) {
        std::fprintf(stderr, "wush bench: cublasGemmEx failed (%d)\n", int(bst));
        return false;
    }
    if (!timed(t_ours, "wush_linear_run") || !timed(t_blas, "cublasGemmEx")) return false;
    out->push_back({"forward", c.layer, wush_format_name(c.format), "cublas_bf16", m, t_ours, t_blas});
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

void print(const std::vector<Result>& rs, const std::string& device, bool graph, bool json) {
    const char* timing = graph ? "graph" : "eager";
    if (json) {
        std::printf("{\"device\": \"%s\", \"timing\": \"%s\", \"results\": [", json_string(device).c_str(), timing);
        for (std::size_t i = 0; i < rs.size(); ++i) {
            const Result& r = rs[i];
            std::printf(
                "%s\n  {\"kind\": \"%s\", \"layer\": \"%s\", \"format\": \"%s\", \"m\": %zu, \"baseline\": \"%s\", "
                "\"ours_us\": %.3f, \"baseline_us\": %.3f, \"speedup\": %.4f, \"ours_gbps\": %.1f, "
                "\"baseline_gbps\": %.1f}",
                i ? "," : "", r.kind.c_str(), r.layer.c_str(), r.format.c_str(), r.m, r.baseline.c_str(),
                r.ours_s * 1e6, r.baseline_s * 1e6, r.baseline_s / r.ours_s, r.ours_gbps, r.baseline_gbps);
        }
        std::printf("\n]}\n");
        return;
    }
    std::printf("device: %s, timing: %s\n%-9s %-11s %-7s %6s %-12s %11s %11s %8s %9s %9s\n", device.c_str(), timing,
                "kind", "layer", "format", "m", "baseline", "ours_us", "base_us", "speedup", "ours_GB/s", "base_GB/s");
    for (const Result& r : rs)
        std::printf("%-9s %-11s %-7s %6zu %-12s %11.2f %11.2f %8.3f %9.1f %9.1f\n", r.kind.c_str(), r.layer.c_str(),
                    r.format.c_str(), r.m, r.baseline.c_str(), r.ours_s * 1e6, r.baseline_s * 1e6,
                    r.baseline_s / r.ours_s, r.ours_gbps, r.baseline_gbps);
}

}  // namespace

int bench_cuda(cli::Args& a) {
    // The command line first (cli::Args' rules), before the device is touched.
    const std::vector<std::size_t> ms = a.get_size_list("--m", "1,16,128,1024,4096");
    a.get_choice_list("--kind", "quantize,forward", {"quantize", "forward"});
    const bool graph = a.get_choice("--timing", "eager", {"eager", "graph"}) == "graph";
    const std::vector<std::string> layers = a.get_list("--layers", "4096x4096,14336x4096,4096x14336");
    const std::vector<std::string> formats = a.get_list("--format", "mxfp4,nvfp4,int4");
    if (!a.ok()) return cli::usage_error("bench", a);
    Handle<wush_context, wush_context_destroy> ctx, cpu;
    if (!ok(wush_context_create(WUSH_BACKEND_CUDA, 0, &ctx.p), "CUDA context") ||
        !ok(wush_context_create(WUSH_BACKEND_CPU, 0, &cpu.p), "CPU context"))
        return 1;
    char device[256] = "";
    wush_context_describe(ctx.p, device, sizeof device);
    cudaStream_t stream = nullptr;
    cublasHandle_t blas = nullptr;
    if (cudaStreamCreate(&stream) != cudaSuccess || cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS ||
        cublasSetStream(blas, stream) != CUBLAS_STATUS_SUCCESS ||
        !ok(wush_context_set_stream(ctx.p, stream), "stream")) {
        std::fprintf(stderr, "wush bench: cannot set up a CUDA stream and cuBLAS\n");
        return 1;
    }
    const std::size_t m_max = *std::max_element(ms.begin(), ms.end());
    const std::string kinds = a.get("--kind", "quantize,forward");
    std::vector<Result> results;
    int rc = 0;
    for (const std::string& layer : layers) {
        for (const std::string& fname : formats) {
            wush_format f;
            if (wush_format_from_name(fname.c_str(), &f) != WUSH_OK) {
                std::fprintf(stderr, "wush bench: unknown format '%s'\n", fname.c_str());
                return 2;
            }
            Case c;
            if (!make_case(ctx.p, cpu.p, layer, f, &c)) return 1;
            const std::vector<std::uint16_t> hx = random_bf16(m_max * c.d_in, 7);
            const std::vector<std::uint16_t> hw = random_bf16(c.d_out * c.d_in, 11);
            DeviceBuffer x(hx.size() * 2), w(hw.size() * 2);
            if (!x || !w) return ok(WUSH_ERR_OUT_OF_MEMORY, "device buffers") ? 0 : 1;
            cudaMemcpy(x.get(), hx.data(), hx.size() * 2, cudaMemcpyHostToDevice);
            cudaMemcpy(w.get(), hw.data(), hw.size() * 2, cudaMemcpyHostToDevice);
            for (std::size_t m : ms) {
                if (kinds.find("quantize") != std::string::npos &&
                    !bench_quantize(ctx.p, stream, graph, c, m, x.get(), &results))
                    rc = 1;
                if (kinds.find("forward") != std::string::npos &&
                    !bench_forward(ctx.p, stream, graph, blas, c, m, x.get(), w.get(), &results))
                    rc = 1;
            }
            if (!a.has("--json")) std::fprintf(stderr, "wush bench: %s %s done\n", layer.c_str(), fname.c_str());
        }
    }
    wush_context_set_stream(ctx.p, nullptr);
    cublasDestroy(blas);
    cudaStreamDestroy(stream);
    print(results, device, graph, a.has("--json"));
    return rc;
}
