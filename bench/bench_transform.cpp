// Building WUSH transforms and RTN weights for one layer from a ready calibrator
// (docs/ARCHITECTURE.md, "Verification"), against the data-free Hadamard transform, in the same run.
//
// Layers: the built-in synthetic presets "4096x4096" and "4096x14336" (d_in x d_out), calibrated
// OUTSIDE the timing on 2048 tokens (block-diagonal moments). Formats: MXFP4 (G = 32) and
// NVFP4 (G = 16). Variants, each for kind = wush and kind = hadamard:
//   build  wush::build_transform(kind): for WUSH, per block M_W from the weights, Cholesky of both
//          moments, SVD, T_act, then the float64 weight side T_act^{-T}; for Hadamard, the fixed
//          matrices and the same inverse-transpose step (same entry point, no data).
//   rtn    wush::prequantize_rtn with an already built transform: apply the weight-side
//          transform in float64 and RTN-quantize into packed codes + scales.
//   total  both, i.e. weights + calibrator in, transform + packed weights out.
// The summary prints median times and the ratio WUSH / Hadamard (the cost of being data-aware).
//
// Run: bench_transform --benchmark_repetitions=5   (the summary uses the median repetition)
#include <benchmark/benchmark.h>

#include <cstdio>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "bench_report.h"
#include "calibration/calibrator.h"
#include "eval/layer_loss.h"
#include "eval/synthetic_layer.h"
#include "formats/block_format.h"
#include "prequant/rtn.h"
#include "transforms/block_transform.h"

namespace {

using wush::BlockTransform;
using wush::Calibrator;
using wush::TransformKind;
using wush::TransformOptions;

constexpr std::size_t kCalibrationTokens = 2048;
constexpr const char* kLayers[] = {"4096x4096", "4096x14336"};
constexpr wush_format kFormats[] = {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4};
constexpr TransformKind kKinds[] = {TransformKind::WUSH, TransformKind::Hadamard};

struct Layer {
    wush::eval::SyntheticLayer data;
    std::map<std::size_t, std::unique_ptr<Calibrator>> calibrators;  // by G
};

// Generated and calibrated on first use (outside any timed region), kept for the whole run.
Layer& layer(const std::string& name) {
    static std::map<std::string, std::unique_ptr<Layer>> cache;
    auto& slot = cache[name];
    if (!slot) {
        slot = std::make_unique<Layer>();
        slot->data = wush::eval::generate_layer(wush::eval::synthetic_preset(name, kCalibrationTokens, 0, 1));
        slot->data.heldout.clear();
    }
    return *slot;
}

const Calibrator& calibrator(Layer& l, std::size_t g) {
    auto& slot = l.calibrators[g];
    if (!slot) {
        const auto& spec = l.data.spec;
        slot = std::make_unique<Calibrator>(spec.d_in, g, wush::MomentMode::BlockDiagonal);
        slot->add(WUSH_DTYPE_F32, l.data.calibration.data(), spec.n_tokens);
    }
    return *slot;
}

std::string case_name(const char* layer_name, wush_format f) {
    return std::string(layer_name) + "/" + wush::formats::spec(f).name;
}

enum class Step { Build, Rtn, Total };
const char* step_name(Step s) {
    return s == Step::Build ? "build" : s == Step::Rtn ? "rtn" : "total";
}

void bm_step(benchmark::State& state, std::string layer_name, wush_format f, TransformKind kind, Step step) {
    Layer& l = layer(layer_name);
    const wush::formats::FormatSpec& format = wush::formats::spec(f);
    const Calibrator& cal = calibrator(l, format.group);
    const std::span<const float> w = l.data.weight;
    const std::size_t d_out = l.data.spec.d_out;
    TransformOptions options;
    options.kind = kind;
    if (step == Step::Rtn) {
        const BlockTransform t = wush::build_transform(options, cal, w, d_out);
        for (auto _ : state) {
            auto q = wush::prequantize_rtn(t, format, w, d_out);
            benchmark::DoNotOptimize(q.codes.data());
        }
    } else {
        for (auto _ : state) {
            const BlockTransform t = wush::build_transform(options, cal, w, d_out);
            benchmark::DoNotOptimize(t.activation_matrices().data());
            if (step == Step::Total) {
                auto q = wush::prequantize_rtn(t, format, w, d_out);
                benchmark::DoNotOptimize(q.codes.data());
            }
        }
    }
}

void register_all() {
    for (const char* ln : kLayers)
        for (wush_format f : kFormats)
            for (Step s : {Step::Build, Step::Rtn, Step::Total})
                for (TransformKind k : kKinds) {
                    const std::string name = case_name(ln, f) + "/" + step_name(s) + "/" + wush::transform_kind_name(k);
                    wush::bench::register_wall_ms(name, bm_step, std::string(ln), f, k, s);
                }
}

}  // namespace

int main(int argc, char** argv) {
    register_all();
    wush::bench::CollectingReporter reporter;
    if (!wush::bench::run_benchmarks(argc, argv, reporter)) return 1;

    std::printf("\nSummary (median wall time per call, ms; ratio = WUSH / Hadamard)\n");
    std::printf("%-22s %-6s %10s %10s %8s\n", "layer/format", "step", "wush", "hadamard", "ratio");
    for (const char* ln : kLayers)
        for (wush_format f : kFormats)
            for (Step s : {Step::Build, Step::Rtn, Step::Total}) {
                const std::string base = case_name(ln, f) + "/" + step_name(s) + "/";
                const double wt = reporter.median_seconds(base + "wush");
                const double ht = reporter.median_seconds(base + "hadamard");
                if (wt < 0.0 || ht < 0.0) continue;
                std::printf("%-22s %-6s %10.1f %10.1f %8.2f%s\n", case_name(ln, f).c_str(), step_name(s), wt * 1e3,
                            ht * 1e3, wt / ht,
                            s == Step::Total ? (wt < 1.0 ? "  (WUSH total < 1 s)" : "  (WUSH total >= 1 s)") : "");
            }
    return 0;
}
