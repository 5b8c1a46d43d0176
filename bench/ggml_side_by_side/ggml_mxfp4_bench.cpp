// ggml's MXFP4 x float32 MUL_MAT on its CPU backend, timed two ways for the side-by-side table
// in docs/record/performance-record.md (run through run.sh; not part of libwush's build or of ctest):
//   repacked  the weight lives in the CPU device's extra buffer type "CPU_REPACK", so ggml-cpu
//             repacks it once at upload and runs its interleaved mxfp4 x q8_0 kernels
//   plain     the same weight in an ordinary CPU buffer (row-wise mxfp4 x q8_0 dot products)
// Both quantize the float32 activations to Q8_0 inside every call; that is part of the timing.
// Only ggml's public headers are used.
//
//   ggml_mxfp4_bench --k K --n N --m 1,16,128,512 --threads T [--repeats R] [--min-time S]
//
// Prints one line per m: "ggml k n m threads repacked_s plain_s repacked_relerr plain_relerr".
// A setup that is not what it claims fails loudly (exit 1): the weight must sit in a CPU_REPACK
// buffer with a repack kernel chosen for it, and both results must match a float64 product of
// the dequantized weight and the float32 input to within Q8_0 activation rounding.
#include <ggml-alloc.h>
#include <ggml-backend.h>
#include <ggml-cpu.h>
#include <ggml.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace {

struct Options {
    int64_t k = 4096, n = 4096;
    std::vector<int64_t> ms{1, 16, 128, 512};
    int threads = 1;
    int repeats = 5;
    double min_time = 0.3;
};

// Q8_0 rounds each activation to 1/254 of its block's largest magnitude; for Gaussian inputs the
// product's relative error is about 0.5%. A wrong layout or kernel gives errors of order 1.
constexpr double kMaxRelErr = 0.02;
// The two ggml paths quantize the activations identically; they differ only in float summation
// order.
constexpr double kMaxPathDiff = 1e-4;

bool parse(int argc, char** argv, Options* o) {
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string key = argv[i];
        const char* v = argv[i + 1];
        if (key == "--k") o->k = std::atoll(v);
        else if (key == "--n") o->n = std::atoll(v);
        else if (key == "--threads") o->threads = std::atoi(v);
        else if (key == "--repeats") o->repeats = std::atoi(v);
        else if (key == "--min-time") o->min_time = std::atof(v);
        else if (key == "--m") {
            o->ms.clear();
            const std::string list = v;
            for (std::size_t pos = 0; pos <= list.size();) {
                const std::size_t comma = std::min(list.find(',', pos), list.size());
                const int64_t m = std::atoll(list.substr(pos, comma - pos).c_str());
                if (m <= 0) return false;
                o->ms.push_back(m);
                pos = comma + 1;
            }
        } else return false;
    }
    return argc % 2 == 1 && o->k % 32 == 0 && o->n % 8 == 0 && o->threads > 0;
}

// The CPU device's "CPU_REPACK" buffer type, reached the way ggml's own tools do it: through the
// registry's "ggml_backend_dev_get_extra_bufts" entry point.
ggml_backend_buffer_type_t repack_buffer_type() {
    ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (!dev) return nullptr;
    auto get = (ggml_backend_dev_get_extra_bufts_t)ggml_backend_reg_get_proc_address(
        ggml_backend_dev_backend_reg(dev), "ggml_backend_dev_get_extra_bufts");
    for (ggml_backend_buffer_type_t* p = get ? get(dev) : nullptr; p && *p; ++p)
        if (std::strcmp(ggml_backend_buft_name(*p), "CPU_REPACK") == 0) return *p;
    return nullptr;
}

// One MXFP4 weight (n rows of k) uploaded into a buffer of type `buft`; the upload is where a
// CPU_REPACK buffer repacks it.
struct Weight {
    ggml_context* ctx = nullptr;
    ggml_tensor* t = nullptr;
    ggml_backend_buffer_t buf = nullptr;
    ~Weight() {
        ggml_backend_buffer_free(buf);
        ggml_free(ctx);
    }
};

bool upload(ggml_backend_buffer_type_t buft, int64_t k, int64_t n, const std::vector<uint8_t>& codes, Weight* w) {
    ggml_init_params p{ggml_tensor_overhead(), nullptr, true};
    w->ctx = ggml_init(p);
    w->t = ggml_new_tensor_2d(w->ctx, GGML_TYPE_MXFP4, k, n);
    w->buf = ggml_backend_alloc_ctx_tensors_from_buft(w->ctx, buft);
    if (!w->buf || ggml_nbytes(w->t) != codes.size()) return false;
    ggml_backend_tensor_set(w->t, codes.data(), 0, codes.size());
    return true;
}

// y = w x for m tokens: the graph, the input and output tensors in a plain CPU buffer.
struct Matmul {
    ggml_context* ctx = nullptr;
    ggml_tensor *x = nullptr, *y = nullptr;
    ggml_cgraph* graph = nullptr;
    ggml_backend_buffer_t buf = nullptr;
    ~Matmul() {
        ggml_backend_buffer_free(buf);
        ggml_free(ctx);
    }
};

bool build(ggml_backend_t backend, ggml_tensor* w, int64_t m, Matmul* mm) {
    ggml_init_params p{4 * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true};
    mm->ctx = ggml_init(p);
    mm->x = ggml_new_tensor_2d(mm->ctx, GGML_TYPE_F32, w->ne[0], m);
    mm->y = ggml_mul_mat(mm->ctx, w, mm->x);
    mm->graph = ggml_new_graph(mm->ctx);
    ggml_build_forward_expand(mm->graph, mm->y);
    mm->buf = ggml_backend_alloc_ctx_tensors(mm->ctx, backend);
    return mm->buf != nullptr;
}

// The repack path is taken only if the weight's buffer is CPU_REPACK and ggml-cpu found a repack
// kernel for it (init_tensor leaves it in tensor->extra; null means the plain kernel).
bool is_repacked(const ggml_tensor* w) {
    return w->buffer &&
           std::strcmp(ggml_backend_buft_name(ggml_backend_buffer_get_type(w->buffer)), "CPU_REPACK") == 0 &&
           w->extra != nullptr;
}

// Medians of alternating samples of the two graphs, so that both see the same background load.
std::pair<double, double> paired_medians(ggml_backend_t backend, ggml_cgraph* a, ggml_cgraph* b, const Options& o) {
    using clock = std::chrono::steady_clock;
    auto once = [&](ggml_cgraph* g) {
        const auto t0 = clock::now();
        ggml_backend_graph_compute(backend, g);
        return std::chrono::duration<double>(clock::now() - t0).count();
    };
    once(a);  // warm: first-touch pages, thread start-up
    once(b);
    std::vector<double> ta, tb;
    double total = 0.0;
    while (int(ta.size()) < o.repeats || total < o.min_time) {
        ta.push_back(once(a));
        tb.push_back(once(b));
        total += ta.back() + tb.back();
    }
    auto median = [](std::vector<double> v) {
        std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
        return v[v.size() / 2];
    };
    return {median(ta), median(tb)};
}

// Relative Frobenius error of y (m x n, row-major per token) against a float64 product of the
// dequantized weight wd (n x k) and x (m x k), on up to 32 tokens x 256 outputs spread evenly.
double rel_error(const std::vector<float>& y, const std::vector<float>& wd, const std::vector<float>& x, int64_t m,
                 int64_t n, int64_t k) {
    const int64_t step_t = std::max<int64_t>(1, m / 32), step_o = std::max<int64_t>(1, n / 256);
    double err = 0.0, ref = 0.0;
    for (int64_t t = 0; t < m; t += step_t)
        for (int64_t o = 0; o < n; o += step_o) {
            double s = 0.0;
            for (int64_t i = 0; i < k; ++i) s += double(wd[o * k + i]) * double(x[t * k + i]);
            const double d = double(y[t * n + o]) - s;
            err += d * d;
            ref += s * s;
        }
    return std::sqrt(err / ref);
}

double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
    double err = 0.0, ref = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        err += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
        ref += double(b[i]) * b[i];
    }
    return std::sqrt(err / ref);
}

std::vector<float> gaussian(std::size_t count, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> v(count);
    for (float& f : v) f = dist(rng);
    return v;
}

// Times and checks one m on both paths; prints the line. Returns false on a failed check.
bool bench_m(ggml_backend_t backend, const Weight& repacked, const Weight& plain, const std::vector<float>& wd,
             int64_t m, const Options& o) {
    Matmul a, b;
    if (!build(backend, repacked.t, m, &a) || !build(backend, plain.t, m, &b)) {
        std::fprintf(stderr, "ggml_mxfp4_bench: could not allocate the m = %lld graphs\n", (long long)m);
        return false;
    }
    const std::vector<float> x = gaussian(std::size_t(m * o.k), 7);
    ggml_backend_tensor_set(a.x, x.data(), 0, ggml_nbytes(a.x));
    ggml_backend_tensor_set(b.x, x.data(), 0, ggml_nbytes(b.x));
    const auto [ta, tb] = paired_medians(backend, a.graph, b.graph, o);
    std::vector<float> ya(std::size_t(m * o.n)), yb(ya.size());
    ggml_backend_tensor_get(a.y, ya.data(), 0, ggml_nbytes(a.y));
    ggml_backend_tensor_get(b.y, yb.data(), 0, ggml_nbytes(b.y));
    const double ea = rel_error(ya, wd, x, m, o.n, o.k), eb = rel_error(yb, wd, x, m, o.n, o.k);
    const double dab = rel_diff(ya, yb);
    std::printf("ggml %lld %lld %lld %d %.6e %.6e %.2e %.2e\n", (long long)o.k, (long long)o.n, (long long)m, o.threads,
                ta, tb, ea, eb);
    std::fflush(stdout);
    if (ea < kMaxRelErr && eb < kMaxRelErr && dab < kMaxPathDiff) return true;
    std::fprintf(stderr,
                 "ggml_mxfp4_bench: m = %lld results off: repacked %.3g, plain %.3g vs float64 (limit %.3g), "
                 "repacked vs plain %.3g (limit %.3g)\n",
                 (long long)m, ea, eb, kMaxRelErr, dab, kMaxPathDiff);
    return false;
}

}  // namespace

int main(int argc, char** argv) {
    Options o;
    if (!parse(argc, argv, &o)) {
        std::fprintf(stderr,
                     "usage: ggml_mxfp4_bench --k K(%%32) --n N(%%8) --m M1,M2,.. --threads T "
                     "[--repeats R] [--min-time S]\n");
        return 2;
    }
    ggml_backend_t backend = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(backend, o.threads);
    ggml_backend_buffer_type_t repack = repack_buffer_type();
    if (!repack) {
        std::fprintf(stderr, "ggml_mxfp4_bench: this ggml build has no CPU_REPACK buffer type\n");
        return 1;
    }
    const std::vector<float> w = gaussian(std::size_t(o.n * o.k), 1);
    std::vector<uint8_t> codes(ggml_row_size(GGML_TYPE_MXFP4, o.k) * o.n);
    ggml_quantize_chunk(GGML_TYPE_MXFP4, w.data(), codes.data(), 0, o.n, o.k, nullptr);
    std::vector<float> wd(w.size());
    ggml_get_type_traits(GGML_TYPE_MXFP4)->to_float(codes.data(), wd.data(), int64_t(wd.size()));

    Weight repacked, plain;
    if (!upload(repack, o.k, o.n, codes, &repacked) ||
        !upload(ggml_backend_cpu_buffer_type(), o.k, o.n, codes, &plain)) {
        std::fprintf(stderr, "ggml_mxfp4_bench: could not allocate the weights\n");
        return 1;
    }
    if (!is_repacked(repacked.t) || is_repacked(plain.t)) {
        std::fprintf(stderr, "ggml_mxfp4_bench: the weight was not repacked (buffer %s, kernel %s); avx2 = %d\n",
                     ggml_backend_buft_name(ggml_backend_buffer_get_type(repacked.t->buffer)),
                     repacked.t->extra ? "chosen" : "none", ggml_cpu_has_avx2());
        return 1;
    }
    std::printf("# ggml CPU: avx2 %d, avx512 %d, avx512_vnni %d; weight buffers %s (repacked) and %s (plain)\n",
                ggml_cpu_has_avx2(), ggml_cpu_has_avx512(), ggml_cpu_has_avx512_vnni(),
                ggml_backend_buft_name(ggml_backend_buffer_get_type(repacked.t->buffer)),
                ggml_backend_buft_name(ggml_backend_buffer_get_type(plain.t->buffer)));
    bool ok = true;
    for (int64_t m : o.ms) ok = bench_m(backend, repacked, plain, wd, m, o) && ok;
    ggml_backend_free(backend);
    return ok ? 0 : 1;
}
