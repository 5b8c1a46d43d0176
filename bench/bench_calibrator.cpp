// Calibrator accumulation throughput (docs/ARCHITECTURE.md, "Verification") against OpenBLAS DSYRK, in the same run.
//
// Cases (d_in = 4096, float32 activations streamed through one Calibrator::add call):
//   block_G32  block-diagonal moments, G = 32 (MXFP4), 4096 tokens per add()
//   block_G16  block-diagonal moments, G = 16 (NVFP4), 4096 tokens per add()
//   full       the whole 4096 x 4096 moment (GPTQ Hessian), 2048 tokens per add()
// Variants of each case:
//   calibrator  wush::Calibrator::add(WUSH_DTYPE_F32, ...): validation (NaN/Inf scan), float32 ->
//               float64 conversion and the accumulation, i.e. everything a caller pays for.
//   dsyrk       the baseline: the same activations ALREADY converted to float64 (conversion not
//               timed), and the same symmetric rank-n updates as single cblas_dsyrk calls over
//               the whole batch: one per G x G block (strided view, lda = d_in), the blocks
//               spread over the cores with OpenMP (each call single-threaded inside), or one
//               d_in x d_in call in full mode (threaded by OpenBLAS itself).
//   dsyrk_seq   (block cases only) the same per-block calls in a plain loop, leaving the threading
//               to OpenBLAS. The summary compares against the faster of dsyrk / dsyrk_seq.
//
// FLOP count (what DSYRK performs): an n x k operand (n tokens, k = side of the accumulator)
// costs n * k * (k + 1) flops (k(k+1)/2 upper-triangle entries, one multiply and one add per token
// each), summed over the accumulators: block mode (d_in / G) * n * G * (G + 1), full mode
// n * d_in * (d_in + 1). The "FLOPS" counter is that count per second of wall time.
//
// Run: bench_calibrator --benchmark_repetitions=5   (the summary uses the median repetition)
#include <benchmark/benchmark.h>

#include <cblas.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "bench_report.h"
#include "calibration/calibrator.h"

namespace {

using wush::Calibrator;
using wush::MomentMode;

constexpr std::size_t kDin = 4096;
constexpr std::size_t kBlockTokens = 4096;
constexpr std::size_t kFullTokens = 2048;

struct Case {
    const char* name;
    MomentMode mode;
    std::size_t group;
    std::size_t tokens;
};
constexpr Case kCases[] = {
    {"block_G32", MomentMode::BlockDiagonal, 32, kBlockTokens},
    {"block_G16", MomentMode::BlockDiagonal, 16, kBlockTokens},
    {"full", MomentMode::Full, 32, kFullTokens},
};

double flops_per_add(const Case& c) {
    const double n = double(c.tokens);
    if (c.mode == MomentMode::Full) return n * double(kDin) * double(kDin + 1);
    return double(kDin / c.group) * n * double(c.group) * double(c.group + 1);
}

// kBlockTokens x kDin activations with channel scales spread over two decades (LLM-like), built
// once; and the same values as float64 for the baseline.
const std::vector<float>& activations_f32() {
    static const std::vector<float> x = [] {
        std::mt19937_64 gen(20261122);
        std::normal_distribution<float> normal(0.0f, 1.0f);
        std::vector<float> scale(kDin);
        for (std::size_t j = 0; j < kDin; ++j) scale[j] = float(std::pow(10.0, double(j % 97) / 48.0 - 1.0));
        std::vector<float> v(kBlockTokens * kDin);
        for (std::size_t i = 0; i < v.size(); ++i) v[i] = normal(gen) * scale[i % kDin];
        return v;
    }();
    return x;
}

const std::vector<double>& activations_f64() {
    static const std::vector<double> x(activations_f32().begin(), activations_f32().end());
    return x;
}

void bm_calibrator(benchmark::State& state, Case c) {
    const float* x = activations_f32().data();
    Calibrator cal(kDin, c.group, c.mode);
    for (auto _ : state) {
        cal.add(WUSH_DTYPE_F32, x, c.tokens);
        benchmark::ClobberMemory();
    }
    benchmark::DoNotOptimize(cal.tokens());
    state.counters["FLOPS"] = benchmark::Counter(flops_per_add(c), benchmark::Counter::kIsIterationInvariantRate);
}

void bm_dsyrk(benchmark::State& state, Case c, bool omp_blocks) {
    const double* x = activations_f64().data();
    const int n = int(c.tokens), lda = int(kDin);
    if (c.mode == MomentMode::Full) {
        std::vector<double> sums(kDin * kDin, 0.0);
        for (auto _ : state) {
            cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, int(kDin), n, 1.0, x, lda, 1.0, sums.data(), lda);
            benchmark::ClobberMemory();
        }
        benchmark::DoNotOptimize(sums.data());
    } else {
        const std::size_t g = c.group, blocks = kDin / g;
        std::vector<double> sums(blocks * g * g, 0.0);
        double* s = sums.data();
        for (auto _ : state) {
            if (omp_blocks) {
#pragma omp parallel for schedule(static)
                for (std::size_t b = 0; b < blocks; ++b)
                    cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, int(g), n, 1.0, x + b * g, lda, 1.0,
                                s + b * g * g, int(g));
            } else {
                for (std::size_t b = 0; b < blocks; ++b)
                    cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, int(g), n, 1.0, x + b * g, lda, 1.0,
                                s + b * g * g, int(g));
            }
            benchmark::ClobberMemory();
        }
        benchmark::DoNotOptimize(sums.data());
    }
    state.counters["FLOPS"] = benchmark::Counter(flops_per_add(c), benchmark::Counter::kIsIterationInvariantRate);
}

void register_all() {
    for (const Case& c : kCases) {
        const std::string base = c.name;
        wush::bench::register_wall_ms(base + "/calibrator", bm_calibrator, c);
        wush::bench::register_wall_ms(base + "/dsyrk", bm_dsyrk, c, true);
        if (c.mode == MomentMode::BlockDiagonal) wush::bench::register_wall_ms(base + "/dsyrk_seq", bm_dsyrk, c, false);
    }
}

}  // namespace

int main(int argc, char** argv) {
    register_all();
    wush::bench::CollectingReporter reporter;
    if (!wush::bench::run_benchmarks(argc, argv, reporter)) return 1;

    std::printf("\nSummary (median wall time per add() call; FLOP/s from the DSYRK flop count)\n");
    std::printf("%-10s %12s %12s %12s %12s %12s %8s\n", "case", "ours ms", "dsyrk ms", "ours GF/s", "dsyrk GF/s",
                "ours/dsyrk", "target");
    for (const Case& c : kCases) {
        const std::string base = c.name;
        const double ours = reporter.median_seconds(base + "/calibrator");
        double blas = reporter.median_seconds(base + "/dsyrk");
        const double seq = reporter.median_seconds(base + "/dsyrk_seq");
        if (seq > 0.0 && (blas < 0.0 || seq < blas)) blas = seq;  // the stronger baseline
        if (ours < 0.0 || blas < 0.0) continue;
        const double f = flops_per_add(c);
        const double ratio = blas / ours;  // = (f / ours) / (f / blas)
        std::printf("%-10s %12.2f %12.2f %12.1f %12.1f %12.3f %8s\n", c.name, ours * 1e3, blas * 1e3, f / ours * 1e-9,
                    f / blas * 1e-9, ratio, ratio >= 0.70 ? ">=0.70" : "MISSED");
    }
    return 0;
}
