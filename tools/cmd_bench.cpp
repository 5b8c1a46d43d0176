// `wush bench`: the CPU runtime against its baselines, measured in the same run (median of warm
// repeats), on the built-in Llama-like layers:
//   gemm      wush_gemm (packed activations x qweight)    vs OpenBLAS SGEMM on the same weights
//                                                            dequantized to float32
//   quantize  wush_quantize_activations with WUSH          vs (a) the same kernel with one shared
//             (per-block matrices)                             Hadamard matrix, (b) memcpy of the
//                                                            same number of bytes (GB/s)
//   forward   wush_linear_forward (quantize + GEMM)        vs OpenBLAS SGEMM (float32 X W^T)
//   prepared  wush_linear_run (a prepared layer: weight    vs wush_linear_forward (packs the
//             panels packed once)                            weight panels on every call)
//   decode    wush_linear_run, one token (prepared)        vs a streaming read of as many bytes as
//                                                            the weights, same threads (GB/s of
//                                                            weight bytes; stream_read.h)
//   l2        wush_linear_run, one token (prepared), warm   vs one thread reading the weights' bytes
//             (the same layer every call: its bytes stay      (codes and scales) from a buffer as
//             in the caches, as a small model's do)          warm (the same one every read); also
//                                                            the excess over twice that read
// --contend [--contend-cpu C] [--contend-process]: while a busy-loop thread (a child process with
// --contend-process; pinned to CPU C if given) keeps one core busy, wush_gemm and wush_linear_run
// with --threads threads (default: all) against the same call on 1 thread, samples alternating
// between the two (kinds contend_gemm / contend_prepared; speedup < 1: the parallel call lost).
// --paired: the same paired rows with no busy loop (kinds paired_gemm / paired_prepared: what the
// threads gain on the machine as it is).
// --transform-dtype bf16: the WUSH transforms' matrices rounded to bf16, as quantize-model stores
// them (default f32).
// speedup = baseline_s / ours_s. Default: the three Llama-like layers x MXFP4/NVFP4/INT4 x
// m in {1, 16, 128, 512, 1024}; --quick drops m = 1024 and repeats less (about a minute on 2
// cores). The library is used through its public C API only; OpenBLAS is linked here for the
// SGEMM baseline.
#include <cblas.h>

#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bench_options.h"
#include "cli.h"
#include "commands.h"
#include "cuda_variants.h"
#include "layers.h"
#include "stream_read.h"

namespace {

struct Result {
    std::string kind;
    std::size_t m, n, k;
    std::string format, baseline;
    double ours_s, baseline_s;
    double ours_gbps = 0.0, baseline_gbps = 0.0;  // quantize vs memcpy only
    bool excess = false;                          // l2 only: print ours_s - 2 x baseline_s
};

struct Settings {
    std::size_t min_repeats = 5;
    double min_seconds = 0.3;
    bool gemm = true, quantize = true, forward = true, decode = true, l2 = false;
    bool contend = false;
    int contend_cpu = -1;          // pin the busy loop there (-1: leave it to the scheduler)
    bool contend_process = false;  // the busy loop is a child process (else a thread)
    bool paired = false;           // the paired 1-vs-N-thread rows without a busy loop
    std::size_t threads = 1;       // the context's thread count outside the contention rows
};

// Another process's busy core: a child process (or, with process = false, a thread of ours) that
// spins until destroyed, pinned to `cpu` if cpu >= 0.
class BusyLoop {
public:
    BusyLoop(int cpu, bool process) {
        if (process) {
            child_ = fork();
            if (child_ == 0) {  // the child: spin until killed
                pin(cpu);
                volatile unsigned long spin = 0;
                for (;;) spin = spin + 1;
            }
            if (child_ > 0) return;
        }
        thread_ = std::thread([this, cpu] {
            pin(cpu);
            volatile unsigned long spin = 0;
            while (!stop_.load(std::memory_order_relaxed)) spin = spin + 1;
        });
    }
    ~BusyLoop() {
        if (child_ > 0) {
            kill(child_, SIGKILL);
            waitpid(child_, nullptr, 0);
        }
        stop_.store(true);
        if (thread_.joinable()) thread_.join();
    }
    BusyLoop(const BusyLoop&) = delete;
    BusyLoop& operator=(const BusyLoop&) = delete;

private:
    static void pin(int cpu) {
        if (cpu < 0) return;
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpu, &set);
        sched_setaffinity(0, sizeof set, &set);
    }
    pid_t child_ = -1;
    std::atomic<bool> stop_{false};
    std::thread thread_;
};

// Median wall time of fn() over at least min_repeats samples and min_seconds, after one warm-up.
// Calls shorter than 50 us are batched into samples of several calls, so the clock's granularity
// does not decide the result.
template <typename Fn>
double median_seconds(const Settings& s, Fn&& fn) {
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    fn();
    const double once = std::chrono::duration<double>(clock::now() - t0).count();
    const int batch = once >= 50e-6 ? 1 : int(std::min(1000.0, 50e-6 / std::max(once, 1e-8))) + 1;
    std::vector<double> t;
    double total = 0.0;
    while ((t.size() < s.min_repeats || total < s.min_seconds) && t.size() < 200) {
        const auto a = clock::now();
        for (int i = 0; i < batch; ++i) fn();
        const double d = std::chrono::duration<double>(clock::now() - a).count();
        t.push_back(d / batch);
        total += d;
    }
    std::sort(t.begin(), t.end());
    return t.size() % 2 ? t[t.size() / 2] : 0.5 * (t[t.size() / 2 - 1] + t[t.size() / 2]);
}

// Medians of fa() and fb(), samples taken alternately (a b, b a, ...) so that both see the same
// background load: under contention the machine changes from one moment to the next, and separate
// measurements would compare two different machines. set_a() / set_b() run untimed before each
// sample of fa() / fb().
template <typename SetA, typename FnA, typename SetB, typename FnB>
std::pair<double, double> alternating_medians(const Settings& s, SetA&& set_a, FnA&& fa, SetB&& set_b, FnB&& fb) {
    using clock = std::chrono::steady_clock;
    set_a();
    fa();
    set_b();
    const auto t0 = clock::now();
    fb();
    const double once = std::chrono::duration<double>(clock::now() - t0).count();
    const int batch = once >= 50e-6 ? 1 : int(std::min(1000.0, 50e-6 / std::max(once, 1e-8))) + 1;
    std::vector<double> ta, tb;
    double total = 0.0;
    auto sample = [&](auto& set, auto& fn, std::vector<double>* into) {
        set();
        const auto start = clock::now();
        for (int i = 0; i < batch; ++i) fn();
        const double d = std::chrono::duration<double>(clock::now() - start).count();
        into->push_back(d / batch);
        total += d;
    };
    while ((ta.size() < std::max<std::size_t>(s.min_repeats, 11) || total < 2 * s.min_seconds) && ta.size() < 400) {
        if (ta.size() % 2) {
            sample(set_b, fb, &tb);
            sample(set_a, fa, &ta);
        } else {
            sample(set_a, fa, &ta);
            sample(set_b, fb, &tb);
        }
    }
    auto median = [](std::vector<double>& t) {
        std::sort(t.begin(), t.end());
        return t.size() % 2 ? t[t.size() / 2] : 0.5 * (t[t.size() / 2 - 1] + t[t.size() / 2]);
    };
    return {median(ta), median(tb)};
}

// Medians of fn() run with `a` and with `b` threads, samples alternating (alternating_medians).
template <typename Fn>
std::pair<double, double> paired_medians(const Settings& s, wush_context* ctx, std::size_t a, std::size_t b,
                                         wush_status* st, Fn&& fn) {
    auto threads = [&](std::size_t t) {
        if (*st == WUSH_OK) *st = wush_context_set_parameter(ctx, WUSH_CONTEXT_NUM_THREADS, int64_t(t));
    };
    return alternating_medians(
        s, [&] { threads(a); }, fn, [&] { threads(b); }, fn);
}

// One layer shape's data and objects for one format.
struct Case {
    std::size_t k = 0, n = 0;
    wush_format format = WUSH_FORMAT_MXFP4;
    Handle<wush_transform, wush_transform_destroy> wush, hadamard;
    Handle<wush_qweight, wush_qweight_destroy> q;
    // The same layer with its transform stored as BF16 (what quantize-model writes), for bf16
    // activations: built only for the forward kind.
    Handle<wush_transform, wush_transform_destroy> wush_bf16;
    Handle<wush_qweight, wush_qweight_destroy> q_bf16;
    std::vector<float> w_dequantized;  // n x k: the SGEMM baseline's weights
};

// The layer's WUSH transform; `bf16`: its matrices rounded to bf16, as `quantize-model` stores
// them (a prepared layer then reads one token's matrices as bf16 pairs: docs/RUNTIME.md).
wush_status build_wush(wush_context* ctx, const wush_calibrator* cal, const std::vector<float>& weight, const Case& c,
                       bool bf16, wush_transform** out) {
    Handle<wush_options, wush_options_destroy> opts;
    wush_status st = bf16 ? wush_options_create(&opts.p) : WUSH_OK;
    if (st == WUSH_OK && bf16) st = wush_options_set_int(opts.p, WUSH_OPTION_TRANSFORM_DTYPE, WUSH_DTYPE_BF16);
    if (st == WUSH_OK)
        st = wush_transform_build(ctx, cal, WUSH_DTYPE_F32, weight.data(), c.n, c.k, WUSH_TRANSFORM_WUSH, opts.p, out);
    return st;
}

// The WUSH transform stored as BF16 and its qweight.
wush_status make_bf16_layer(wush_context* ctx, const wush_calibrator* cal, const std::vector<float>& weight, Case* c) {
    wush_status st = build_wush(ctx, cal, weight, *c, true, &c->wush_bf16.p);
    if (st == WUSH_OK)
        st = wush_qweight_create(ctx, c->wush_bf16.p, c->format, WUSH_METHOD_RTN, WUSH_DTYPE_F32, weight.data(), c->n,
                                 c->k, nullptr, &c->q_bf16.p);
    return st;
}

// `bf16_transform`: the case's WUSH transform with bf16 matrices (build_wush).
int make_case(wush_context* ctx, const std::string& layer, const std::vector<float>& weight,
              const std::vector<float>& calib, std::size_t n_calib, wush_format format, bool bf16_layer,
              bool bf16_transform, Case* c) {
    std::size_t d_out = 0, d_in = 0, g = 0;
    wush_example_layer_shape(layer.c_str(), &d_out, &d_in);
    wush_format_group_size(format, &g);
    c->k = d_in;
    c->n = d_out;
    c->format = format;
    Handle<wush_calibrator, wush_calibrator_destroy> cal;
    wush_status st = wush_calibrator_create(d_in, g, WUSH_MOMENTS_BLOCK_DIAGONAL, &cal.p);
    if (st == WUSH_OK) st = wush_calibrator_add(ctx, cal.p, WUSH_DTYPE_F32, calib.data(), n_calib);
    if (st == WUSH_OK) st = build_wush(ctx, cal.p, weight, *c, bf16_transform, &c->wush.p);
    if (st == WUSH_OK) st = wush_transform_create_fixed(WUSH_TRANSFORM_HADAMARD, d_in, g, nullptr, &c->hadamard.p);
    if (st == WUSH_OK)
        st = wush_qweight_create(ctx, c->wush.p, format, WUSH_METHOD_RTN, WUSH_DTYPE_F32, weight.data(), d_out, d_in,
                                 nullptr, &c->q.p);
    if (st == WUSH_OK && bf16_layer) st = make_bf16_layer(ctx, cal.p, weight, c);
    if (st != WUSH_OK) return cli::report("preparing the layer", st);
    const void *codes = nullptr, *scales = nullptr;
    std::size_t codes_bytes = 0, scales_bytes = 0;
    wush_qweight_data(c->q.p, &codes, &codes_bytes, &scales, &scales_bytes);
    c->w_dequantized.resize(d_out * d_in);
    st = wush_dequantize_rows(ctx, format, codes, codes_bytes, scales, scales_bytes, d_out, d_in,
                              c->w_dequantized.data(), c->w_dequantized.size());
    return st == WUSH_OK ? 0 : cli::report("wush_dequantize_rows", st);
}

// What one layer's case holds at once, about: the weights and their dequantized copy, the
// calibration and activation rows, two outputs (ours and the baseline's), all float32, plus the
// quantized operands (under a byte per element). Saturates instead of wrapping.
std::size_t bench_bytes(std::size_t d_out, std::size_t d_in, std::size_t m) {
    const double floats =
        2.0 * double(d_out) * double(d_in) + (256.0 + double(m)) * double(d_in) + 2.0 * double(m) * double(d_out);
    const double bytes = 4.0 * floats + double(d_out) * double(d_in) + double(m) * double(d_in);
    return bytes >= 1.8e19 ? SIZE_MAX : std::size_t(bytes);
}

// bf16 activations (the first m rows of x, truncated) through the prepared layer whose transform
// is stored as BF16, against the float32-stored layer `f32_layer` on the same input, samples
// alternating: on a CPU with AVX512_BF16 the first multiplies with the bf16 dot product.
wush_status bench_bf16_input(wush_context* ctx, const Settings& s, const Case& c, wush_linear* f32_layer,
                             const std::vector<float>& x, std::size_t m, std::vector<Result>* out) {
    std::vector<std::uint16_t> xb(m * c.k);
    for (std::size_t i = 0; i < xb.size(); ++i) {
        std::uint32_t u;
        std::memcpy(&u, &x[i], 4);
        xb[i] = std::uint16_t(u >> 16);
    }
    Handle<wush_linear, wush_linear_destroy> layer;
    std::size_t bytes_bf16 = 0, bytes_f32 = 0;
    wush_status st = wush_linear_create(ctx, c.wush_bf16.p, c.q_bf16.p, &layer.p);
    if (st == WUSH_OK) st = wush_linear_workspace_size(ctx, layer.p, m, &bytes_bf16);
    if (st == WUSH_OK) st = wush_linear_workspace_size(ctx, f32_layer, m, &bytes_f32);
    if (st != WUSH_OK) return st;
    std::vector<unsigned char> ws(std::max(bytes_bf16, bytes_f32));
    std::vector<std::uint16_t> y(m * c.n);
    auto run = [&](wush_linear* l) {
        return [&, l] {
            if (st == WUSH_OK)
                st = wush_linear_run(ctx, l, WUSH_DTYPE_BF16, xb.data(), m, WUSH_DTYPE_BF16, y.data(), y.size(),
                                     ws.data(), ws.size());
        };
    };
    const auto none = [] {};
    const auto [ours, baseline] = alternating_medians(s, none, run(layer.p), none, run(f32_layer));
    out->push_back({"prepared_bf16", m, c.n, c.k, wush_format_name(c.format), "f32_stored_transform", ours, baseline});
    return st;
}

// Runs every kind for m tokens (the first m rows of x) of one case.
int bench_m(wush_context* ctx, const Settings& s, const Case& c, const std::vector<float>& x, std::size_t m,
            std::vector<Result>* out) {
    const std::string fname = wush_format_name(c.format);
    std::size_t codes_bytes = 0, scales_bytes = 0, ws_bytes = 0;
    wush_format_buffer_sizes(c.format, m, c.k, &codes_bytes, &scales_bytes);
    std::vector<unsigned char> codes(codes_bytes), scales(scales_bytes);
    std::vector<float> y(m * c.n), y_ref(m * c.n);
    wush_status st = WUSH_OK;
    auto quantize = [&](const wush_transform* t) {
        if (st == WUSH_OK)
            st = wush_quantize_activations(ctx, t, c.format, WUSH_DTYPE_F32, x.data(), m, c.k, codes.data(),
                                           codes_bytes, scales.data(), scales_bytes);
    };
    const double sgemm = median_seconds(s, [&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(m), int(c.n), int(c.k), 1.0f, x.data(), int(c.k),
                    c.w_dequantized.data(), int(c.k), 0.0f, y_ref.data(), int(c.n));
    });
    if (s.quantize) {
        const double ours = median_seconds(s, [&] { quantize(c.wush.p); });
        const double shared = median_seconds(s, [&] { quantize(c.hadamard.p); });
        const std::size_t moved = m * c.k * sizeof(float) + codes_bytes + scales_bytes;  // read + written
        std::vector<unsigned char> src(moved / 2 + 1, 1), dst(moved / 2 + 1);
        const double copy = median_seconds(s, [&] { std::memcpy(dst.data(), src.data(), src.size()); });
        out->push_back({"quantize", m, c.n, c.k, fname, "shared_hadamard_quantize", ours, shared});
        out->push_back({"quantize", m, c.n, c.k, fname, "memcpy", ours, copy, double(moved) / ours * 1e-9,
                        double(2 * src.size()) / copy * 1e-9});
    }
    quantize(c.wush.p);
    if (s.gemm) {
        const double ours = median_seconds(s, [&] {
            if (st == WUSH_OK)
                st = wush_gemm(ctx, c.q.p, codes.data(), codes_bytes, scales.data(), scales_bytes, m, WUSH_DTYPE_F32,
                               y.data(), y.size());
        });
        out->push_back({"gemm", m, c.n, c.k, fname, "openblas_sgemm", ours, sgemm});
    }
    if (s.forward && st == WUSH_OK) {
        st = wush_linear_forward_workspace_size(ctx, c.wush.p, c.q.p, m, &ws_bytes);
        std::vector<unsigned char> ws(ws_bytes);
        const double ours = median_seconds(s, [&] {
            if (st == WUSH_OK)
                st = wush_linear_forward(ctx, c.wush.p, c.q.p, WUSH_DTYPE_F32, x.data(), m, WUSH_DTYPE_F32, y.data(),
                                         y.size(), ws.data(), ws.size());
        });
        out->push_back({"forward", m, c.n, c.k, fname, "openblas_sgemm", ours, sgemm});
        // The prepared layer (panels packed once) against the per-call forward just measured.
        Handle<wush_linear, wush_linear_destroy> layer;
        std::size_t lw_bytes = 0;
        if (st == WUSH_OK) st = wush_linear_create(ctx, c.wush.p, c.q.p, &layer.p);
        if (st == WUSH_OK) st = wush_linear_workspace_size(ctx, layer.p, m, &lw_bytes);
        std::vector<unsigned char> lw(lw_bytes);
        const double prepared = median_seconds(s, [&] {
            if (st == WUSH_OK)
                st = wush_linear_run(ctx, layer.p, WUSH_DTYPE_F32, x.data(), m, WUSH_DTYPE_F32, y.data(), y.size(),
                                     lw.data(), lw.size());
        });
        out->push_back({"prepared", m, c.n, c.k, fname, "per_call_forward", prepared, ours});
        if (st == WUSH_OK) st = bench_bf16_input(ctx, s, c, layer.p, x, m, out);
    }
    if ((s.contend || s.paired) && st == WUSH_OK) {
        Handle<wush_linear, wush_linear_destroy> layer;
        std::size_t lw_bytes = 0;
        st = wush_linear_create(ctx, c.wush.p, c.q.p, &layer.p);
        if (st == WUSH_OK) st = wush_linear_workspace_size(ctx, layer.p, m, &lw_bytes);
        std::vector<unsigned char> lw(lw_bytes);
        auto gemm = [&] {
            if (st == WUSH_OK)
                st = wush_gemm(ctx, c.q.p, codes.data(), codes_bytes, scales.data(), scales_bytes, m, WUSH_DTYPE_F32,
                               y.data(), y.size());
        };
        auto run = [&] {
            if (st == WUSH_OK)
                st = wush_linear_run(ctx, layer.p, WUSH_DTYPE_F32, x.data(), m, WUSH_DTYPE_F32, y.data(), y.size(),
                                     lw.data(), lw.size());
        };
        std::optional<BusyLoop> busy;
        if (s.contend) busy.emplace(s.contend_cpu, s.contend_process);
        const auto [g1, gn] = paired_medians(s, ctx, 1, s.threads, &st, gemm);
        const auto [r1, rn] = paired_medians(s, ctx, 1, s.threads, &st, run);
        if (st == WUSH_OK) st = wush_context_set_parameter(ctx, WUSH_CONTEXT_NUM_THREADS, int64_t(s.threads));
        const std::string prefix = s.contend ? "contend_" : "paired_";
        out->push_back({prefix + "gemm", m, c.n, c.k, fname, "same_on_1_thread", gn, g1});
        out->push_back({prefix + "prepared", m, c.n, c.k, fname, "same_on_1_thread", rn, r1});
    }
    return st == WUSH_OK ? 0 : cli::report("the runtime", st);
}

// Copies of a layer's weights that together overflow the last-level cache twice, so that every
// call reads its weights from memory, as a model's decode step does (its layers together are far
// larger than any cache).
std::size_t cold_copies(std::size_t weight_bytes) {
    const long l3 = ::sysconf(_SC_LEVEL3_CACHE_SIZE);
    const double cache = l3 > 0 ? double(l3) : 32.0 * 1024 * 1024;
    return std::max<std::size_t>(1,
                                 std::size_t(std::ceil(2.0 * cache / double(std::max<std::size_t>(weight_bytes, 1)))));
}

// One token through the prepared layer against a streaming read of as many bytes as the layer's
// weights (codes and scales) on the same number of threads, samples alternating: a one-token
// product is bound by reading the weights, so the ratio says how close it comes to that bound.
// Both rotate through cold_copies() copies (prepared layers; slices of one read buffer).
int bench_decode(wush_context* ctx, const Settings& s, const Case& c, const std::vector<float>& x,
                 std::vector<Result>* out) {
    const void *codes = nullptr, *scales = nullptr;
    std::size_t codes_bytes = 0, scales_bytes = 0, lw_bytes = 0;
    wush_status st = wush_qweight_data(c.q.p, &codes, &codes_bytes, &scales, &scales_bytes);
    const std::size_t weight_bytes = codes_bytes + scales_bytes, copies = cold_copies(weight_bytes);
    std::vector<Handle<wush_linear, wush_linear_destroy>> layers(copies);
    for (auto& layer : layers)
        if (st == WUSH_OK) st = wush_linear_create(ctx, c.wush.p, c.q.p, &layer.p);
    if (st == WUSH_OK) st = wush_linear_workspace_size(ctx, layers[0].p, 1, &lw_bytes);
    if (st != WUSH_OK) return cli::report("preparing the decode layers", st);
    std::vector<unsigned char> lw(lw_bytes);
    std::vector<float> y(c.n);
    StreamRead read(s.threads, weight_bytes, copies);
    std::size_t next_layer = 0;
    auto run = [&] {
        if (st == WUSH_OK)
            st = wush_linear_run(ctx, layers[next_layer].p, WUSH_DTYPE_F32, x.data(), 1, WUSH_DTYPE_F32, y.data(),
                                 y.size(), lw.data(), lw.size());
        next_layer = (next_layer + 1) % copies;
    };
    const auto none = [] {};
    const auto [ours, baseline] = alternating_medians(s, none, run, none, [&] { read.run(); });
    if (st != WUSH_OK) return cli::report("the runtime", st);
    out->push_back({"decode", 1, c.n, c.k, wush_format_name(c.format), "stream_read", ours, baseline,
                    double(weight_bytes) / ours * 1e-9, double(read.bytes()) / baseline * 1e-9});
    return 0;
}

// One token through the prepared layer, the same layer every call (its weights stay in the caches,
// as a small model's do), against one thread reading as many bytes as the weights (codes and
// scales) from one buffer, also warm, samples alternating. What a call costs beyond reading its
// bytes is its fixed overhead: the excess ours - 2 x read is what the targets bound.
int bench_l2(wush_context* ctx, const Settings& s, const Case& c, const std::vector<float>& x,
             std::vector<Result>* out) {
    const void *codes = nullptr, *scales = nullptr;
    std::size_t codes_bytes = 0, scales_bytes = 0, lw_bytes = 0;
    wush_status st = wush_qweight_data(c.q.p, &codes, &codes_bytes, &scales, &scales_bytes);
    Handle<wush_linear, wush_linear_destroy> layer;
    if (st == WUSH_OK) st = wush_linear_create(ctx, c.wush.p, c.q.p, &layer.p);
    if (st == WUSH_OK) st = wush_linear_workspace_size(ctx, layer.p, 1, &lw_bytes);
    if (st != WUSH_OK) return cli::report("preparing the layer", st);
    std::vector<unsigned char> lw(lw_bytes);
    std::vector<float> y(c.n);
    const std::size_t weight_bytes = codes_bytes + scales_bytes;
    WarmRead read(weight_bytes);
    auto run = [&] {
        if (st == WUSH_OK)
            st = wush_linear_run(ctx, layer.p, WUSH_DTYPE_F32, x.data(), 1, WUSH_DTYPE_F32, y.data(), y.size(),
                                 lw.data(), lw.size());
    };
    const auto none = [] {};
    const auto [ours, baseline] = alternating_medians(s, none, run, none, [&] { read.run(); });
    if (st != WUSH_OK) return cli::report("the runtime", st);
    Result r{"l2",
             1,
             c.n,
             c.k,
             wush_format_name(c.format),
             "l2_read_1_thread",
             ours,
             baseline,
             double(weight_bytes) / ours * 1e-9,
             double(read.bytes()) / baseline * 1e-9};
    r.excess = true;
    out->push_back(r);
    return 0;
}

void print_json(const std::vector<Result>& results, const char* isa, std::size_t threads) {
    std::printf("{\"results\": [");
    for (std::size_t i = 0; i < results.size(); ++i) {
        const Result& r = results[i];
        // %#.6g keeps the decimal point: a speedup of exactly 15 to six digits is 15.0000, which
        // JSON readers take as a float like every other speedup, not the integer 15.
        std::printf(
            "%s\n  {\"kind\": \"%s\", \"m\": %zu, \"n\": %zu, \"k\": %zu, \"format\": \"%s\", \"ours_s\": %.6e, "
            "\"baseline\": \"%s\", \"baseline_s\": %.6e, \"speedup\": %#.6g, \"isa\": \"%s\", \"threads\": %zu",
            i ? "," : "", r.kind.c_str(), r.m, r.n, r.k, r.format.c_str(), r.ours_s, r.baseline.c_str(), r.baseline_s,
            r.baseline_s / r.ours_s, isa, threads);
        if (r.ours_gbps > 0.0)
            std::printf(", \"ours_gbps\": %.3f, \"baseline_gbps\": %.3f", r.ours_gbps, r.baseline_gbps);
        if (r.excess) std::printf(", \"excess_s\": %.6e", r.ours_s - 2.0 * r.baseline_s);
        std::printf("}");
    }
    std::printf("\n]}\n");
}

void print_table(const std::vector<Result>& results, const char* isa, std::size_t threads) {
    std::printf("CPU runtime, ISA %s, %zu threads; times are medians of warm repeats\n", isa, threads);
    std::printf("%-16s %6s %6s %6s %-7s %12s  %-25s %12s %8s\n", "kind", "m", "n", "k", "format", "ours", "baseline",
                "baseline", "speedup");
    for (const Result& r : results) {
        std::printf("%-16s %6zu %6zu %6zu %-7s %10.1f us  %-25s %9.1f us %7.2fx", r.kind.c_str(), r.m, r.n, r.k,
                    r.format.c_str(), r.ours_s * 1e6, r.baseline.c_str(), r.baseline_s * 1e6, r.baseline_s / r.ours_s);
        if (r.ours_gbps > 0.0) std::printf("  (%.1f vs %.1f GB/s)", r.ours_gbps, r.baseline_gbps);
        if (r.excess) std::printf("  excess over 2x read %.2f us", (r.ours_s - 2.0 * r.baseline_s) * 1e6);
        std::printf("\n");
    }
}

// `--device cuda` runs the separate program wush-bench-cuda (tools/bench_cuda_main.cpp), installed
// beside this one: it links the CUDA runtime and cuBLAS for its baselines, which `wush` itself
// must not (a CPU-only machine runs `wush` without them).
int run_cuda_bench(int argc, char** argv) {
    char self[4096];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    std::string program = "wush-bench-cuda";
    if (n > 0) {
        const std::string path(self, std::size_t(n));
        program = path.substr(0, path.rfind('/') + 1) + program;
    }
    std::vector<char*> args{program.data()};
    for (int i = 0; i < argc; ++i) args.push_back(argv[i]);
    args.push_back(nullptr);
    execv(program.c_str(), args.data());
    std::fprintf(stderr, "wush bench: --device cuda needs %s (built with the CUDA backend): %s\n", program.c_str(),
                 std::strerror(errno));
    return 2;
}

}  // namespace

int cmd_bench(int argc, char** argv) {
    cli::Args a = bench_args(argc, argv);
    const std::string device = a.get_choice("--device", "cpu", {"cpu", "cuda"});
    // The bounded numbers first, whatever device runs: none may run until killed.
    const bool quick = a.has("--quick");
    Settings s;
    s.min_repeats = a.get_size("--repeats", quick ? 3 : 5, 1, cli::kMaxRepeats);
    s.min_seconds = a.get_double("--min-time", quick ? 0.1 : 0.3, 0.0, cli::kMaxMinTime);
    const std::size_t threads = a.get_size("--threads", 0, 1, cli::kMaxThreads);
    if (a.ok() && device == "cuda") {
        // The CUDA switches are checked here too, so that a bad one is a usage error on any machine
        // (wush-bench-cuda checks them again).
        std::vector<CudaOption> options;
        std::vector<BenchVariant> variants;
        std::string error;
        if (a.has("--cuda-option") && !parse_cuda_options(a.get_list("--cuda-option", ""), &options, &error))
            return cli::usage_error("bench", error);
        if (a.has("--variants") && !parse_variants(a.get_list("--variants", ""), &variants, &error))
            return cli::usage_error("bench", error);
        if (a.has("--transform-dtype"))
            return cli::usage_error("bench", "--transform-dtype applies to the CPU bench only");
        return run_cuda_bench(argc, argv);
    }
    // After a.ok(): a malformed command line is reported as such, whatever device it names.
    if (a.ok() && a.has("--timing")) return cli::usage_error("bench", "--timing applies to --device cuda only");
    if (a.ok() && a.has("--l2")) return cli::usage_error("bench", "--l2 applies to --device cuda only");
    if (a.ok() && a.has("--cuda-option"))
        return cli::usage_error("bench", "--cuda-option applies to --device cuda only");
    if (a.ok() && a.has("--variants")) return cli::usage_error("bench", "--variants applies to --device cuda only");
    s.contend = a.has("--contend") || a.has("--contend-cpu") || a.has("--contend-process");
    s.contend_process = a.has("--contend-process");
    s.paired = a.has("--paired");
    // A CPU the machine does not have would leave the busy loop unpinned without a word.
    const long n_cpus = ::sysconf(_SC_NPROCESSORS_CONF);
    if (a.has("--contend-cpu"))
        s.contend_cpu = int(a.get_size("--contend-cpu", 0, 0, n_cpus > 0 ? std::size_t(n_cpus - 1) : 0));
    const std::vector<std::string> kinds =
        a.get_choice_list("--kind", "gemm,quantize,forward,decode", {"gemm", "quantize", "forward", "decode", "l2"});
    const std::vector<std::size_t> ms =
        a.get_size_list("--m", quick ? "1,16,128,512" : "1,16,128,512,1024", 1, cli::kMaxTokens);
    const std::vector<std::string> layers = a.get_list("--layers", "4096x4096,4096x14336,14336x4096");
    const std::vector<std::string> format_names = a.get_list("--format", "mxfp4,nvfp4,int4");
    const std::string isa_name = a.get_choice("--isa", "auto", {"auto", "scalar", "avx2", "avx512_vnni"});
    const bool bf16_transforms = a.get_choice("--transform-dtype", "f32", {"f32", "bf16"}) == "bf16";
    if (!a.ok()) return cli::usage_error("bench", a);
    const auto wanted = [&](const char* k) { return std::find(kinds.begin(), kinds.end(), k) != kinds.end(); };
    s.gemm = wanted("gemm");
    s.quantize = wanted("quantize");
    s.forward = wanted("forward");
    s.decode = wanted("decode");
    s.l2 = wanted("l2");
    std::vector<wush_format> formats;
    for (const std::string& f : format_names) {
        wush_format fmt;
        if (wush_format_from_name(f.c_str(), &fmt) != WUSH_OK)
            return cli::usage_error("bench",
                                    "unknown format '" + cli::printable(f) + "' (mxfp4, nvfp4, int4, mxfp4_ocp)");
        formats.push_back(fmt);
    }
    // Layers are checked before any work: an unknown one used to be found after the first ran,
    // and a batch too large for the machine after minutes of set-up.
    const std::size_t max_m = *std::max_element(ms.begin(), ms.end());
    for (const std::string& layer : layers) {
        std::size_t d_out = 0, d_in = 0;
        if (wush_example_layer_shape(layer.c_str(), &d_out, &d_in) != WUSH_OK)
            return cli::usage_error("bench", "unknown layer '" + cli::printable(layer) + "' (see wush eval --help)");
        if (!cli::fits_in_memory("bench", "layer " + layer + " at m = " + std::to_string(max_m),
                                 bench_bytes(d_out, d_in, max_m)))
            return 1;
    }
    wush_cpu_isa isa = WUSH_CPU_ISA_AUTO;
    for (int i = 0; i <= 3; ++i)
        if (isa_name == wush_cpu_isa_name(wush_cpu_isa(i))) isa = wush_cpu_isa(i);

    Handle<wush_context, wush_context_destroy> ctx;
    wush_status st = wush_context_create(WUSH_BACKEND_CPU, 0, &ctx.p);
    if (st == WUSH_OK && threads) st = wush_context_set_parameter(ctx.p, WUSH_CONTEXT_NUM_THREADS, int64_t(threads));
    if (st == WUSH_OK) st = wush_context_set_parameter(ctx.p, WUSH_CONTEXT_CPU_ISA, int64_t(isa));
    wush_cpu_isa used = WUSH_CPU_ISA_AUTO;
    if (st == WUSH_OK) st = wush_context_cpu_isa(ctx.p, &used);
    if (st != WUSH_OK) return cli::report("setting up", st);
    if (threads) openblas_set_num_threads(int(threads));
    const std::size_t n_threads = threads ? threads : std::size_t(openblas_get_num_threads());
    s.threads = n_threads;

    const std::size_t n_calib = 256, n_tokens = *std::max_element(ms.begin(), ms.end());
    std::vector<Result> results;
    for (const std::string& layer : layers) {
        std::size_t d_out = 0, d_in = 0;
        wush_example_layer_shape(layer.c_str(), &d_out, &d_in);  // checked above
        std::vector<float> weight(d_out * d_in), calib(n_calib * d_in), x(n_tokens * d_in);
        st = wush_example_layer_generate(layer.c_str(), 1, n_calib, n_tokens, weight.data(), weight.size(),
                                         calib.data(), calib.size(), x.data(), x.size());
        if (st != WUSH_OK) return cli::report("wush_example_layer_generate", st);
        for (wush_format f : formats) {
            if (!a.has("--json")) std::fprintf(stderr, "wush bench: %s %s\n", layer.c_str(), wush_format_name(f));
            Case c;
            if (make_case(ctx.p, layer, weight, calib, n_calib, f, s.forward, bf16_transforms, &c) != 0) return 1;
            const bool per_m = s.gemm || s.quantize || s.forward || s.contend || s.paired;
            for (std::size_t m : per_m ? ms : std::vector<std::size_t>{})
                if (bench_m(ctx.p, s, c, x, m, &results) != 0) return 1;
            if (s.decode && bench_decode(ctx.p, s, c, x, &results) != 0) return 1;
            if (s.l2 && bench_l2(ctx.p, s, c, x, &results) != 0) return 1;
        }
    }
    if (a.has("--json")) print_json(results, wush_cpu_isa_name(used), n_threads);
    else print_table(results, wush_cpu_isa_name(used), n_threads);
    return 0;
}
