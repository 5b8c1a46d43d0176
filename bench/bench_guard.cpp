// The cost of the search's default per-layer guard (WUSH_OPTION_SEARCH_GUARD; pipeline/
// layer_pipeline.h): one layer from a ready calibrator to its transform and RTN weights, as
// wush_layer_quantize() makes it (wush::pipeline::guarded_layer), in three variants measured in the
// same run:
//   "plain"   WUSH (Algorithm 1, no search);
//   "search"  wush+s with the guard off (WUSH_OPTION_SEARCH_GUARD = 0): the search scores the
//             calibrator's token sample of 256 tokens (the default WUSH_OPTION_SEARCH_TOKENS);
//   "guard"   wush+s with the default guard: the calibrator keeps 512 tokens
//             (wush_options_sample_size()), the search scores the even 256, and the searched layer
//             competes with plain WUSH, shrunk WUSH, I, H and R on the odd 256 (six layer
//             losses, on the guard's 512 scored output rows of the 4096);
//   "guard_seq" the same with the calibration tokens added as 32 sequences of 128
//             (wush_calibrator_add_sequences): the guard holds out whole sequences of the sample;
//   "guard_doc" the same with the calibration tokens added as 8 documents of 512
//             (wush_calibrator_add_document): the guard holds out whole documents and scores the
//             searched and plain layers as built without them (a cross-fit: the search runs on
//             the other documents' sample; a kept searched layer is built on every token with
//             those per-block choices replayed, not searched again);
//   "gptq_plain", "gptq_guard": the same two with GPTQ (a full-mode calibrator; the guard's four
//             alternatives are each a GPTQ build);
// "guard_before", the same guard as first implemented (commit 4d73e40), written out here: plain
// WUSH built again after the search, and each of the five layer losses computing its own
// reference product X W^T (now the searched build hands out the plain layer it computes anyway,
// and the reference is computed once; the result is the same bit for bit, tests
// TransformSearch.PlainByProductIsThePlainBuildBitForBit and capi_validation);
// and, to read the guard's cost, "loss256": one layer loss (eval::layer_loss with its own
// reference product) on 256 tokens.
//
// Layer: the built-in preset "4096x4096", calibrated OUTSIDE the timing on 4096 tokens
// (block-diagonal moments, with the token sample). Formats: MXFP4 (G = 32), NVFP4 (G = 16).
// The summaries print the median and the fastest repetition and the ratios to plain.
//
// Run: [OMP_NUM_THREADS=1] bench_guard --benchmark_repetitions=3 --benchmark_enable_random_interleaving=true
// (on a shared machine the single-thread run's CPU-time summary is the steady one)
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bench_report.h"
#include "calibration/calibrator.h"
#include "eval/layer_loss.h"
#include "eval/synthetic_layer.h"
#include "formats/block_format.h"
#include "pipeline/layer_pipeline.h"
#include "prequant/rtn.h"
#include "transforms/block_transform.h"
#include "transforms/transform_search.h"

namespace {

using wush::Calibrator;
using wush::TransformKind;
using wush::TransformOptions;

constexpr std::size_t kCalibrationTokens = 4096;
constexpr std::size_t kSearchTokens = 256;  // WUSH_OPTION_SEARCH_TOKENS' default
constexpr const char* kLayer = "4096x4096";
constexpr wush_format kFormats[] = {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4};
constexpr const char* kVariants[] = {"plain",        "search",  "guard",      "guard_seq", "guard_doc",
                                     "guard_before", "loss256", "gptq_plain", "gptq_guard"};
constexpr std::size_t kSequenceLength = 128;  // "guard_seq": the calibration tokens as 32 sequences
constexpr std::size_t kDocumentLength = 512;  // "guard_doc": the calibration tokens as 8 documents

struct Layer {
    wush::eval::SyntheticLayer data;
    // By G, sample size (256: the unguarded search's, 512: the default guard's), moment mode and
    // sequence length (0: tokens added without sequences) and document length (0: no documents).
    std::map<std::tuple<std::size_t, std::size_t, bool, std::size_t, std::size_t>, std::unique_ptr<Calibrator>>
        calibrators;
};

Layer& layer() {
    static Layer l = [] {
        Layer x;
        x.data = wush::eval::generate_layer(wush::eval::synthetic_preset(kLayer, kCalibrationTokens, kSearchTokens, 1));
        return x;
    }();
    return l;
}

const Calibrator& calibrator(std::size_t g, std::size_t sample, bool full = false, std::size_t sequence_length = 0,
                             std::size_t document_length = 0) {
    Layer& l = layer();
    auto& cal = l.calibrators[{g, sample, full, sequence_length, document_length}];
    if (!cal) {
        cal = std::make_unique<Calibrator>(l.data.spec.d_in, g,
                                           full ? wush::MomentMode::Full : wush::MomentMode::BlockDiagonal);
        cal->set_sample_capacity(sample);
        if (document_length == 0) {
            cal->add(WUSH_DTYPE_F32, l.data.calibration.data(), kCalibrationTokens, sequence_length);
            return *cal;
        }
        const std::size_t d = l.data.spec.d_in;
        for (std::size_t start = 0; start < kCalibrationTokens; start += document_length) {
            const Calibrator::DocumentScope scope(*cal, start / document_length);
            cal->add(WUSH_DTYPE_F32, l.data.calibration.data() + start * d, document_length);
        }
    }
    return *cal;
}

std::string case_name(wush_format f, const std::string& v) {
    return std::string(kLayer) + "/" + wush::formats::spec(f).name + "/" + v;
}

void bm_layer(benchmark::State& state, wush_format f, std::string variant) {
    const wush::formats::FormatSpec& format = wush::formats::spec(f);
    Layer& l = layer();
    const std::size_t d_out = l.data.spec.d_out;
    const bool gptq = variant.rfind("gptq_", 0) == 0;
    const bool search = variant != "plain" && variant != "gptq_plain";
    const bool sequences = variant == "guard_seq", documents = variant == "guard_doc";
    const bool guarded =
        variant == "guard" || sequences || documents || variant == "guard_before" || variant == "gptq_guard";
    const Calibrator& cal = calibrator(format.group, guarded ? 2 * kSearchTokens : kSearchTokens, gptq,
                                       sequences ? kSequenceLength : 0, documents ? kDocumentLength : 0);
    TransformOptions options(TransformKind::WUSH, 0.01, 1);
    if (search) {
        options.search.enabled = true;
        options.search.format = f;
        options.search.sample_tokens = kSearchTokens;
    }
    wush::pipeline::GuardSettings guard;
    guard.hold_out_sample = guarded;
    if (variant == "guard_before") {
        // The first implementation's work: search on the even sample tokens, then plain WUSH, I,
        // H and R built separately, five losses on the odd ones, each with its own reference.
        const std::vector<float> all = cal.sample();
        const std::size_t d = cal.d_in(), n = cal.sample_count();
        std::vector<float> even, odd;
        for (std::size_t t = 0; t < n; ++t)
            (t % 2 ? odd : even)
                .insert((t % 2 ? odd : even).end(), all.begin() + std::ptrdiff_t(t * d),
                        all.begin() + std::ptrdiff_t((t + 1) * d));
        for (auto _ : state) {
            std::vector<double> errors(n / 2);
            const wush::BlockTransform s =
                wush::build_searched_transform(options, cal, l.data.weight, d_out, nullptr, even, n / 2);
            const wush::formats::PackedMatrix sq = wush::prequantize_rtn(s, format, l.data.weight, d_out);
            double total = wush::eval::layer_loss(s, sq, l.data.weight, odd, n / 2, errors);
            TransformOptions plain = options;
            plain.search = {};
            for (TransformKind k :
                 {TransformKind::WUSH, TransformKind::Identity, TransformKind::Hadamard, TransformKind::Random}) {
                plain.kind = k;
                const wush::BlockTransform t = wush::build_transform(plain, cal, l.data.weight, d_out);
                const wush::formats::PackedMatrix q = wush::prequantize_rtn(t, format, l.data.weight, d_out);
                std::fill(errors.begin(), errors.end(), 0.0);
                total += wush::eval::layer_loss(t, q, l.data.weight, odd, n / 2, errors);
            }
            benchmark::DoNotOptimize(total);
        }
        return;
    }
    if (variant == "loss256") {
        const wush::BlockTransform t = wush::build_searched_transform(options, cal, l.data.weight, d_out);
        const wush::formats::PackedMatrix q = wush::prequantize_rtn(t, format, l.data.weight, d_out);
        for (auto _ : state) {
            const double loss = wush::eval::layer_loss(t, q, l.data.weight, l.data.heldout, kSearchTokens);
            benchmark::DoNotOptimize(loss);
        }
        return;
    }
    for (auto _ : state) {
        wush::pipeline::QuantizedLayer q = wush::pipeline::guarded_layer(
            options, format, gptq ? wush::pipeline::Method::Gptq : wush::pipeline::Method::Rtn, cal, l.data.weight,
            d_out, nullptr, guard);
        benchmark::DoNotOptimize(q.weights.codes.data());
        const auto want = sequences   ? wush::pipeline::GuardSource::HoldOutSequences
                          : documents ? wush::pipeline::GuardSource::HoldOutDocuments
                                      : wush::pipeline::GuardSource::HoldOut;
        if (guarded && q.guard.source != want) state.SkipWithError("the default guard did not run as asked");
    }
}

}  // namespace

int main(int argc, char** argv) {
    for (wush_format f : kFormats)
        for (const char* v : kVariants) wush::bench::register_wall_ms(case_name(f, v), bm_layer, f, std::string(v));
    wush::bench::CollectingReporter reporter;
    if (!wush::bench::run_benchmarks(argc, argv, reporter)) return 1;

    const auto summary = [&](const char* what, auto seconds) {
        std::printf("\nSummary (%s of one layer's transform + RTN weights, ms; ratios to plain)\n", what);
        std::printf("%-16s %8s %8s %6s %8s %6s %9s %6s %9s %6s %12s %13s %6s %8s\n", "layer/format", "plain", "search",
                    "ratio", "guard", "ratio", "guard_seq", "ratio", "guard_doc", "ratio", "guard/search",
                    "guard_before", "ratio", "loss256");
        // One column: value (ms or a ratio) or "-" where a variant was filtered out of this run.
        const auto cell = [](bool have, double v, int width, int digits) {
            if (have) std::printf(" %*.*f", width, digits, v);
            else std::printf(" %*s", width, "-");
        };
        for (wush_format f : kFormats) {
            const double p = seconds(case_name(f, "plain")), s = seconds(case_name(f, "search")),
                         g = seconds(case_name(f, "guard")), q = seconds(case_name(f, "guard_seq")),
                         dq = seconds(case_name(f, "guard_doc")), b = seconds(case_name(f, "guard_before")),
                         l = seconds(case_name(f, "loss256"));
            if (p <= 0.0) continue;  // filtered out of this run
            std::printf("%-16s %8.1f", (std::string(kLayer) + "/" + wush::formats::spec(f).name).c_str(), p * 1e3);
            for (auto [v, width] : {std::pair{s, 8}, {g, 8}, {q, 9}, {dq, 9}}) {
                cell(v > 0.0, v * 1e3, width, 1);
                cell(v > 0.0, v / p, 6, 2);
            }
            cell(g > 0.0 && s > 0.0, g / s, 12, 2);
            cell(b > 0.0, b * 1e3, 13, 1);
            cell(b > 0.0, b / p, 6, 2);
            cell(l > 0.0, l * 1e3, 8, 1);
            std::printf("\n");
        }
    };
    const auto summary_gptq = [&](const char* what, auto seconds) {
        std::printf("\nGPTQ (%s, ms; ratio to plain GPTQ-WUSH)\n", what);
        std::printf("%-16s %10s %10s %6s\n", "layer/format", "gptq_plain", "gptq_guard", "ratio");
        for (wush_format f : kFormats) {
            const double p = seconds(case_name(f, "gptq_plain")), g = seconds(case_name(f, "gptq_guard"));
            if (p <= 0.0 || g <= 0.0) continue;  // filtered out of this run
            std::printf("%-16s %10.1f %10.1f %6.2f\n",
                        (std::string(kLayer) + "/" + wush::formats::spec(f).name).c_str(), p * 1e3, g * 1e3, g / p);
        }
    };
    summary("median wall time", [&](const std::string& n) { return reporter.median_seconds(n); });
    summary("fastest wall time", [&](const std::string& n) { return reporter.min_seconds(n); });
    summary("median CPU time of the calling thread (all of the work with OMP_NUM_THREADS=1)",
            [&](const std::string& n) { return reporter.median_cpu_seconds(n); });
    summary_gptq("median CPU time of the calling thread",
                 [&](const std::string& n) { return reporter.median_cpu_seconds(n); });
    return 0;
}
