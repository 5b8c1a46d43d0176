// GPTQ-WUSH (Algorithm 2, GPTQ case) against the RTN path of the same layer, in the same run
// (docs/ARCHITECTURE.md, "Verification").
//
// Layers: the built-in presets "4096x4096" and "4096x14336" (d_in x d_out), MXFP4, WUSH
// transforms, 2048 calibration tokens accumulated OUTSIDE the timing into a full-mode calibrator
// (GPTQ's Hessian; RTN reads the same diagonal blocks). Variants:
//   gptq  wush::gptq::quantize: damped Hessian inverse and its Cholesky factor, then the block
//         loop (transform from the updated weights, intra-block GPTQ, lazy-batch propagation).
//   rtn   wush::build_transform + wush::prequantize_rtn (the RTN path).
// The summary prints the median times and the ratio GPTQ / RTN.
//
// Run: bench_gptq --benchmark_repetitions=3
#include <benchmark/benchmark.h>

#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "bench_report.h"
#include "calibration/calibrator.h"
#include "eval/layer_loss.h"
#include "eval/synthetic_layer.h"
#include "formats/block_format.h"
#include "prequant/gptq.h"
#include "prequant/rtn.h"
#include "transforms/block_transform.h"

namespace {

constexpr std::size_t kCalibrationTokens = 2048;
constexpr const char* kLayers[] = {"4096x4096", "4096x14336"};

struct Layer {
    wush::eval::SyntheticLayer data;
    std::unique_ptr<wush::Calibrator> hessian;
};

Layer& layer(const std::string& name) {
    static std::map<std::string, std::unique_ptr<Layer>> cache;
    auto& slot = cache[name];
    if (!slot) {
        slot = std::make_unique<Layer>();
        slot->data = wush::eval::generate_layer(wush::eval::synthetic_preset(name, kCalibrationTokens, 0, 1));
        const auto& s = slot->data.spec;
        slot->hessian = std::make_unique<wush::Calibrator>(s.d_in, 32, wush::MomentMode::Full);
        slot->hessian->add(WUSH_DTYPE_F32, slot->data.calibration.data(), s.n_tokens);
        slot->data.calibration.clear();
    }
    return *slot;
}

void bm(benchmark::State& state, std::string name, bool gptq) {
    Layer& l = layer(name);
    const wush::formats::FormatSpec& mx = wush::formats::spec(WUSH_FORMAT_MXFP4);
    const wush::TransformOptions options{wush::TransformKind::WUSH, 0.01, 0};
    const std::size_t d_out = l.data.spec.d_out;
    for (auto _ : state) {
        if (gptq) {
            auto r = wush::gptq::quantize(options, mx, *l.hessian, l.data.weight, d_out);
            benchmark::DoNotOptimize(r.weights.codes.data());
        } else {
            const wush::BlockTransform t = wush::build_transform(options, *l.hessian, l.data.weight, d_out);
            auto q = wush::prequantize_rtn(t, mx, l.data.weight, d_out);
            benchmark::DoNotOptimize(q.codes.data());
        }
    }
}

}  // namespace

int main(int argc, char** argv) {
    for (const char* name : kLayers)
        for (bool gptq : {true, false})
            wush::bench::register_wall_ms(std::string(name) + "/" + (gptq ? "gptq" : "rtn"), bm, std::string(name),
                                          gptq)
                ->Iterations(1);
    wush::bench::CollectingReporter reporter;
    if (!wush::bench::run_benchmarks(argc, argv, reporter)) return 1;
    std::printf("\nSummary (median wall time per layer, ms; MXFP4, WUSH transforms)\n");
    std::printf("%-12s %10s %10s %10s\n", "layer", "gptq", "rtn", "gptq/rtn");
    for (const char* name : kLayers) {
        const double g = reporter.median_seconds(std::string(name) + "/gptq");
        const double r = reporter.median_seconds(std::string(name) + "/rtn");
        if (g > 0.0 && r > 0.0) std::printf("%-12s %10.0f %10.0f %10.2f\n", name, g * 1e3, r * 1e3, g / r);
    }
    return 0;
}
