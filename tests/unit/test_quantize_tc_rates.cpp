// How often the tensor-core quantize falls back to float64 (cuda/quantize/quantize_tc_kernel.cuh): per
// element (an element within its tolerance of a rounding boundary) and per group (a scale within
// the bound of changing), beside the CUDA-core kernel's whole-group fall-back rate, with the same
// per-element functions the kernels run (the MMA result taken as the exactly rounded sum: the rate,
// not the bytes, is measured here). On synthetic Gaussian activations always (with a loose ceiling,
// so that a bound gone wrong shows), and on real activations when WUSH_TC_RATE_DIR names a folder
// of raw float32 files named NAME.<rows>x<cols>.f32 (docs/record/cuda-gemm-notes.md says how the
// MiniLM ones were made).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/float_bits.h"
#include "formats/block_format.h"
#include "formats/certified_group.h"
#include "quantize/bf16_fragments.h"
#include "quantize/mma_error_bound.h"
#include "transforms/block_transform.h"
#include "transforms/runtime_layer.h"

namespace {

using namespace wush;

struct Rates {
    std::size_t groups = 0, elements = 0, tc_group = 0, tc_element = 0, tc_groups_touched = 0, core_group = 0;
};

// x: rows x cols float32 (rounded to BF16 here, as the kernel is fed).
Rates measure(wush_format f, TransformKind kind, const std::vector<float>& x, std::size_t rows, std::size_t cols) {
    const int g = f == WUSH_FORMAT_NVFP4 ? 16 : 32;
    const BlockTransform t = build_data_free_transform({kind, 0.01, 7}, cols, std::size_t(g));
    const bool per_block = classify_matrices(t) == MatrixUse::PerBlock;
    const std::size_t count = per_block ? t.blocks() : 1;
    std::vector<tc::PartNorms> norms(count);
    std::vector<float> row_norm(count);
    std::vector<std::uint32_t> w(tc::fragment_words(g));
    for (std::size_t m = 0; m < count; ++m) {
        norms[m] = tc::pack_fragments(t.activation_matrices().data() + m * std::size_t(g * g), g, w.data());
        row_norm[m] = formats::max_row_norm_bound(t.activation_matrices().data() + m * std::size_t(g * g), g);
    }
    Rates r;
    for (std::size_t row = 0; row < rows; ++row)
        for (std::size_t grp = 0; grp < cols / std::size_t(g); ++grp) {
            const std::size_t m = per_block ? grp : 0;
            const float* tm = t.activation_matrices().data() + m * std::size_t(g * g);
            float xv[32], y[32], y32[32], ss = 0.0f;
            for (int j = 0; j < g; ++j) {
                xv[j] =
                    bits::bf16_decode(bits::bf16_encode(double(x[row * cols + grp * std::size_t(g) + std::size_t(j)])));
                ss = std::fma(xv[j], xv[j], ss);
            }
            double yd[32];
            formats::transform_group_f64(tm, xv, g, yd);
            float amax = 0.0f, yss = 0.0f;
            for (int i = 0; i < g; ++i) {
                y[i] = float(yd[i]);
                amax = std::fmax(amax, std::fabs(y[i]));
                yss = std::fma(y[i], y[i], yss);
            }
            ++r.groups;
            r.elements += std::size_t(g);
            // tensor-core path
            const float bound = tc::split_product_error_bound(norms[m], std::sqrt(ss), false, g);
            formats::certify_detail::GroupScaling sc;
            if (!formats::certify_scaling(f, amax, yss, g, bound, sc)) {
                ++r.tc_group;
            } else {
                std::size_t near_count = 0;
                for (int i = 0; i < g; ++i) {
                    bool near = false;
                    formats::certify_element_grid(f, y[i], sc, near);
                    near_count += near;
                }
                r.tc_element += near_count;
                r.tc_groups_touched += near_count > 0;
            }
            // CUDA-core path: the float32 chain and its bound; any near element recomputes the group
            formats::transform_group_f32(tm, xv, g, y32);
            std::uint8_t codes[16], scale[2];
            if (!formats::certify_group(f, y32, g, formats::group_error_bound(xv, g, false, row_norm[m]), codes, scale))
                ++r.core_group;
        }
    return r;
}

void print(const std::string& what, const Rates& r) {
    std::printf(
        "%-46s groups %8zu | tc: group %.4f%%  element %.5f%% (groups touched %.3f%%) | cuda-core: group %.3f%%\n",
        what.c_str(), r.groups, 100.0 * double(r.tc_group) / double(r.groups),
        100.0 * double(r.tc_element) / double(r.elements), 100.0 * double(r.tc_groups_touched) / double(r.groups),
        100.0 * double(r.core_group) / double(r.groups));
}

const wush_format kFormats[] = {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4, WUSH_FORMAT_INT4};

TEST(QuantizeTcRates, SyntheticGaussian) {
    const std::size_t rows = 512, cols = 1024;
    std::mt19937 rng(3);
    std::normal_distribution<float> gauss;
    std::vector<float> x(rows * cols);
    for (float& v : x) v = gauss(rng);
    for (wush_format f : kFormats)
        for (TransformKind kind : {TransformKind::Hadamard, TransformKind::Random}) {
            const Rates r = measure(f, kind, x, rows, cols);
            print(std::string("gaussian ") + formats::spec(f).name + (kind == TransformKind::Hadamard ? " H" : " R"),
                  r);
            // Loose ceilings: a bound off by orders of magnitude shows here.
            EXPECT_LT(double(r.tc_element) / double(r.elements), 1e-3);
            // INT4's scale (the BF16 rounding of the rms) is the bound's most sensitive decision.
            EXPECT_LT(double(r.tc_group) / double(r.groups), f == WUSH_FORMAT_INT4 ? 3e-2 : 1e-3);
        }
}

TEST(QuantizeTcRates, RealActivations) {
    const char* dir = std::getenv("WUSH_TC_RATE_DIR");
    if (dir == nullptr) GTEST_SKIP() << "WUSH_TC_RATE_DIR not set";
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
        const std::string name = e.path().filename().string();
        std::size_t rows = 0, cols = 0;
        const std::size_t dot = name.rfind('.', name.size() - 5);
        if (std::sscanf(name.c_str() + dot + 1, "%zux%zu.f32", &rows, &cols) != 2) continue;
        std::vector<float> x(rows * cols);
        std::ifstream in(e.path(), std::ios::binary);
        in.read(reinterpret_cast<char*>(x.data()), std::streamsize(x.size() * sizeof(float)));
        for (wush_format f : kFormats)
            for (TransformKind kind : {TransformKind::Hadamard, TransformKind::Random})
                print(
                    name.substr(0, dot) + " " + formats::spec(f).name + (kind == TransformKind::Hadamard ? " H" : " R"),
                    measure(f, kind, x, rows, cols));
    }
}

}  // namespace
