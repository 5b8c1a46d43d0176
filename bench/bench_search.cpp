// The cost of the per-block search over WUSH's free parameters (WUSH_OPTION_SEARCH, the `wush+s`
// transform; transforms/transform_search.h): wush::build_searched_transform with the search against the
// same build without it, in the same run.
//
// Layers: the built-in presets "small_512x256" and "4096x4096" (d_in x d_out), calibrated OUTSIDE
// the timing on 4096 tokens (block-diagonal moments). Formats: MXFP4 (G = 32), NVFP4 (G = 16).
// Variants: "plain" (Algorithm 1 only); "search256" and "search64", the search on a Gaussian
// surrogate sample of 256 tokens (the default without a token sample) and of 64
// (WUSH_OPTION_SEARCH_TOKENS = 64); "signs256", the default sample with MXFP4's candidate set (2
// sign patterns, no rotations, no screening) for every format, which for NVFP4 is its set before
// the rotations, so the rotations' cost is read within one run (this VM's plain build moves by 2x
// between runs); "tokens4096", the search on the 4096 calibration tokens themselves (a calibrator
// token sample that large), where MXFP4 searches its wider set of 16 sign patterns. Every search
// variant scores 256 weight rows per block, as the C API does.
// Two summaries print the median and the fastest repetition's times and the ratios search / plain.
//
// Run: bench_search --benchmark_repetitions=7 --benchmark_enable_random_interleaving=true
// (the summaries use the median and the fastest repetition)
#include <benchmark/benchmark.h>

#include <cstdio>
#include <map>
#include <memory>
#include <span>
#include <string>

#include "bench_report.h"
#include "calibration/calibrator.h"
#include "eval/synthetic_layer.h"
#include "formats/block_format.h"
#include "transforms/block_transform.h"
#include "transforms/transform_search.h"

namespace {

using wush::Calibrator;
using wush::TransformKind;
using wush::TransformOptions;

constexpr std::size_t kCalibrationTokens = 4096;
constexpr const char* kLayers[] = {"small_512x256", "4096x4096"};
constexpr wush_format kFormats[] = {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4};
// The timed variants: name, the search's sample (0 = no search), whether the candidate set is
// forced to the 2-sign-pattern one (signs256), and whether the sample is the real calibration
// tokens rather than the surrogate.
struct Variant {
    const char* name;
    std::size_t sample;
    bool signs_only;
    bool tokens;
};
constexpr Variant kVariants[] = {{"plain", 0, false, false},
                                 {"search256", 256, false, false},
                                 {"search64", 64, false, false},
                                 {"signs256", 256, true, false},
                                 {"tokens4096", kCalibrationTokens, false, true}};

struct Layer {
    wush::eval::SyntheticLayer data;
    std::map<std::size_t, std::unique_ptr<Calibrator>> calibrators;  // by G
};

// Generated and calibrated on first use (outside any timed region), kept for the whole run.
Layer& layer(const std::string& name, std::size_t g) {
    static std::map<std::string, std::unique_ptr<Layer>> cache;
    auto& slot = cache[name];
    if (!slot) {
        slot = std::make_unique<Layer>();
        slot->data = wush::eval::generate_layer(wush::eval::synthetic_preset(name, kCalibrationTokens, 0, 1));
    }
    auto& cal = slot->calibrators[g];
    if (!cal) {
        cal = std::make_unique<Calibrator>(slot->data.spec.d_in, g, wush::MomentMode::BlockDiagonal);
        cal->add(WUSH_DTYPE_F32, slot->data.calibration.data(), kCalibrationTokens);
    }
    return *slot;
}

std::string case_name(const char* layer_name, wush_format f, const Variant& v) {
    return std::string(layer_name) + "/" + wush::formats::spec(f).name + "/" + v.name;
}

void bm_build(benchmark::State& state, std::string layer_name, wush_format f, Variant v) {
    const wush::formats::FormatSpec& format = wush::formats::spec(f);
    Layer& l = layer(layer_name, format.group);
    const Calibrator& cal = *l.calibrators[format.group];
    TransformOptions options(TransformKind::WUSH, 0.01, 1);
    if (v.sample > 0) {
        options.search.enabled = true;
        options.search.format = f;
        options.search.sample_tokens = v.sample;
    }
    if (v.signs_only) {
        options.search.sign_patterns = 2;
        options.search.rotations = 0;
        options.search.screen_keep = 0;
    }
    for (auto _ : state) {
        const std::size_t n = v.tokens ? kCalibrationTokens : 0;
        const wush::BlockTransform t = wush::build_searched_transform(options, cal, l.data.weight, l.data.spec.d_out,
                                                                      nullptr, l.data.calibration, n);
        benchmark::DoNotOptimize(t.activation_matrices().data());
    }
}

}  // namespace

int main(int argc, char** argv) {
    for (const char* ln : kLayers)
        for (wush_format f : kFormats)
            for (const Variant& v : kVariants)
                wush::bench::register_wall_ms(case_name(ln, f, v), bm_build, std::string(ln), f, v);
    wush::bench::CollectingReporter reporter;
    if (!wush::bench::run_benchmarks(argc, argv, reporter)) return 1;

    // Median and fastest repetition: on a shared machine the fastest is the least disturbed (run
    // with --benchmark_enable_random_interleaving=true so that a busy spell hits every variant).
    const auto summary = [&](const char* what, auto seconds) {
        std::printf("\nSummary (%s wall time of build_searched_transform, ms; ratio = search / plain)\n", what);
        std::printf("%-22s %10s", "layer/format", "plain");
        for (const Variant& v : std::span(kVariants).subspan(1)) std::printf(" %12s %7s", v.name, "ratio");
        std::printf("\n");
        for (const char* ln : kLayers)
            for (wush_format f : kFormats) {
                const double p = seconds(case_name(ln, f, kVariants[0]));
                if (p <= 0.0) continue;  // filtered out of this run
                std::printf("%-22s %10.1f", (std::string(ln) + "/" + wush::formats::spec(f).name).c_str(), p * 1e3);
                for (const Variant& v : std::span(kVariants).subspan(1)) {
                    const double t = seconds(case_name(ln, f, v));
                    if (t < 0.0) std::printf(" %12s %7s", "-", "-");
                    else std::printf(" %12.1f %7.2f", t * 1e3, t / p);
                }
                std::printf("\n");
            }
    };
    summary("median", [&](const std::string& n) { return reporter.median_seconds(n); });
    summary("fastest", [&](const std::string& n) { return reporter.min_seconds(n); });
    return 0;
}
