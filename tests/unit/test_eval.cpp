// Evaluation: layerwise loss of transform x format on the built-in LLM-like layers (ordering of
// the transforms), the loss against an independent direct computation, bad inputs, and the
// synthetic generator's determinism.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "calibration/calibrator.h"
#include "common/error.h"
#include "eval/layer_loss.h"
#include "eval/synthetic_layer.h"
#include "formats/block_format.h"
#include "formats/group_quantizer.h"
#include "prequant/rtn.h"
#include "transforms/block_transform.h"

namespace wush {
namespace {

using eval::layer_loss;

const std::vector<TransformKind> kKinds = {TransformKind::Identity, TransformKind::Hadamard, TransformKind::Random,
                                           TransformKind::WUS, TransformKind::WUSH};

// Loss of every transform kind for one layer and format (RTN, default damping 0.01).
std::map<TransformKind, double> loss_table(const eval::SyntheticLayer& layer, wush_format format_id) {
    const formats::FormatSpec& format = formats::spec(format_id);
    const auto& s = layer.spec;
    Calibrator cal(s.d_in, format.group, MomentMode::BlockDiagonal);
    cal.add(WUSH_DTYPE_F32, layer.calibration.data(), s.n_tokens);
    std::map<TransformKind, double> out;
    for (TransformKind kind : kKinds) {
        const BlockTransform t = build_transform({kind, 0.01, 1}, cal, layer.weight, s.d_out);
        out[kind] = layer_loss(t, format, layer.weight, s.d_out, layer.heldout, s.n_heldout);
    }
    return out;
}

class EvalOnPreset : public ::testing::TestWithParam<const char*> {};

TEST_P(EvalOnPreset, WushBeatsBaselines) {
    const eval::SyntheticLayer layer = eval::generate_layer(eval::synthetic_preset(GetParam(), 2048, 512, 1));
    for (wush_format f : {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4, WUSH_FORMAT_INT4}) {
        const auto l = loss_table(layer, f);
        std::printf("[ loss     ] %-14s %-6s I %.4e  H %.4e  R %.4e  WUS %.4e  WUSH %.4e\n", GetParam(),
                    formats::spec(f).name, l.at(TransformKind::Identity), l.at(TransformKind::Hadamard),
                    l.at(TransformKind::Random), l.at(TransformKind::WUS), l.at(TransformKind::WUSH));
        for (const auto& [kind, v] : l) EXPECT_TRUE(std::isfinite(v) && v > 0.0) << transform_kind_name(kind);
        EXPECT_LT(l.at(TransformKind::WUSH), l.at(TransformKind::Identity)) << formats::spec(f).name;
        if (f != WUSH_FORMAT_NVFP4) {
            EXPECT_LT(l.at(TransformKind::WUSH), l.at(TransformKind::Hadamard)) << formats::spec(f).name;
            EXPECT_LT(l.at(TransformKind::Hadamard), l.at(TransformKind::Identity)) << formats::spec(f).name;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Small, EvalOnPreset, ::testing::Values("small_256x512", "small_512x256"));

// Independent computation for the identity transform: quantize W and X row-wise with the format,
// dequantize, and form ||Xq Wq^T - X W^T||_F^2 / (d_out n) with plain float64 loops.
TEST(LayerLoss, IdentityEqualsDirectComputation) {
    eval::SyntheticLayerSpec spec;
    spec.d_in = 64;
    spec.d_out = 24;
    spec.n_tokens = 8;
    spec.n_heldout = 40;
    const eval::SyntheticLayer layer = eval::generate_layer(spec);
    for (wush_format f : {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4, WUSH_FORMAT_INT4}) {
        const formats::FormatSpec& format = formats::spec(f);
        // The dequantized values exactly (element x scale / divisor in float64; dequantize_rows
        // rounds them to float32, which moves the loss by about 1e-7).
        auto roundtrip = [&](const std::vector<float>& m, std::size_t rows) {
            const auto sz = formats::packed_sizes(format, rows, spec.d_in);
            std::vector<std::uint8_t> codes(sz.codes), scales(sz.scales);
            std::vector<double> out(m.size());
            formats::quantize_rows(format, m, rows, spec.d_in, codes, scales);
            for (std::size_t i = 0; i < m.size(); ++i) {
                const double scale =
                    formats::decode_scale(format.id, scales.data() + i / format.group * format.scale_bytes);
                out[i] = double(formats::decode_element(format.id, formats::get_nibble(codes.data(), int(i)))) * scale /
                         format.tensor_divisor;
            }
            return out;
        };
        const auto wq = roundtrip(layer.weight, spec.d_out);
        const auto xq = roundtrip(layer.heldout, spec.n_heldout);
        double sum = 0.0;
        for (std::size_t t = 0; t < spec.n_heldout; ++t)
            for (std::size_t o = 0; o < spec.d_out; ++o) {
                double yq = 0.0, y = 0.0;
                for (std::size_t k = 0; k < spec.d_in; ++k) {
                    yq += double(xq[t * spec.d_in + k]) * double(wq[o * spec.d_in + k]);
                    y += double(layer.heldout[t * spec.d_in + k]) * double(layer.weight[o * spec.d_in + k]);
                }
                sum += (yq - y) * (yq - y);
            }
        const double expected = sum / double(spec.d_out * spec.n_heldout);
        const BlockTransform id = build_data_free_transform({TransformKind::Identity, 0.0, 0}, spec.d_in, format.group);
        const double got = layer_loss(id, format, layer.weight, spec.d_out, layer.heldout, spec.n_heldout);
        EXPECT_NEAR(got, expected, 1e-10 * expected) << format.name;
        // Pre-quantized weights of the identity transform are the plain RTN weights.
        const std::vector<float> w_rtn = eval::dequantize(prequantize_rtn(id, format, layer.weight, spec.d_out));
        ASSERT_EQ(w_rtn.size(), wq.size());
        for (std::size_t i = 0; i < wq.size(); ++i) ASSERT_EQ(w_rtn[i], float(wq[i])) << format.name << " " << i;
    }
}

wush_status status_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.status();
    }
    return WUSH_OK;
}

TEST(LayerLoss, RejectsBadInput) {
    const std::size_t d_in = 64, d_out = 8, n = 16;
    std::vector<float> w(d_out * d_in, 0.5f), x(n * d_in, 0.25f);
    const BlockTransform t32 = build_data_free_transform({TransformKind::Hadamard, 0.0, 0}, d_in, 32);
    const formats::FormatSpec& nv = formats::spec(WUSH_FORMAT_NVFP4);
    const formats::FormatSpec& mx = formats::spec(WUSH_FORMAT_MXFP4);
    try {
        layer_loss(t32, nv, w, d_out, x, n);
        ADD_FAILURE() << "G mismatch accepted";
    } catch (const Error& e) {
        EXPECT_EQ(e.status(), WUSH_ERR_INVALID_ARGUMENT);
        const std::string msg = e.what();
        EXPECT_NE(msg.find("16"), std::string::npos) << msg;
        EXPECT_NE(msg.find("32"), std::string::npos) << msg;
    }
    EXPECT_EQ(status_of([&] { prequantize_rtn(t32, nv, w, d_out); }), WUSH_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(status_of([&] { layer_loss(t32, mx, std::span(w).first(w.size() - 1), d_out, x, n); }),
              WUSH_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(status_of([&] { layer_loss(t32, mx, w, d_out, std::span(x).first(x.size() - d_in), n); }),
              WUSH_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(status_of([&] { layer_loss(t32, mx, w, d_out, x, 0); }), WUSH_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(status_of([&] { layer_loss(t32, mx, w, d_out + 1, x, n); }), WUSH_ERR_INVALID_ARGUMENT);
    const auto q = prequantize_rtn(t32, mx, w, d_out);
    const BlockTransform t128 = build_data_free_transform({TransformKind::Hadamard, 0.0, 0}, 128, 32);
    EXPECT_EQ(status_of([&] { layer_loss(t128, q, w, x, n); }), WUSH_ERR_INVALID_ARGUMENT);  // d_in mismatch
    x[5] = NAN;
    EXPECT_EQ(status_of([&] { layer_loss(t32, q, w, x, n); }), WUSH_ERR_NON_FINITE);
    EXPECT_EQ(status_of([&] { eval::synthetic_preset("huge", 1, 1, 1); }), WUSH_ERR_INVALID_ARGUMENT);
}

TEST(SyntheticLayer, DeterministicAndPrefixStable) {
    eval::SyntheticLayerSpec spec;
    spec.d_in = 64;
    spec.d_out = 32;
    spec.n_tokens = 100;
    spec.n_heldout = 10;
    const auto a = eval::generate_layer(spec), b = eval::generate_layer(spec);
    EXPECT_EQ(a.weight, b.weight);
    EXPECT_EQ(a.calibration, b.calibration);
    EXPECT_EQ(a.heldout, b.heldout);
    EXPECT_NE(a.calibration, std::vector<float>(a.heldout.begin(), a.heldout.end()));
    spec.n_tokens = 50;
    const auto c = eval::generate_layer(spec);
    EXPECT_EQ(c.weight, a.weight);  // token counts do not change the weights
    EXPECT_TRUE(std::equal(c.calibration.begin(), c.calibration.end(), a.calibration.begin()));
    spec.seed = 2;
    EXPECT_NE(eval::generate_layer(spec).weight, a.weight);
    // Heavy tails and outlier channels: the largest |x| is far above the RMS.
    double sq = 0.0, mx = 0.0;
    for (float v : a.calibration) {
        sq += double(v) * v;
        mx = std::max(mx, double(std::fabs(v)));
    }
    EXPECT_GT(mx, 10.0 * std::sqrt(sq / double(a.calibration.size())));
}

}  // namespace
}  // namespace wush

namespace wush {
namespace {

TEST(Prequantize, RefusesWeightsWhoseGroupsWouldNotDecode) {
    // 3.2e38 gets the largest MXFP4 scale, 2^127, and code 6: 6 x 2^127 / 3 = 2^128 overflows
    // float32. Such weights used to quantize "successfully" and then give infinities in every
    // product; now they are refused when quantized.
    TransformOptions options;
    options.kind = TransformKind::Identity;
    const BlockTransform t = build_data_free_transform(options, 32, 32);
    std::vector<float> w(32, 1.0f);
    const formats::FormatSpec& f = formats::spec(WUSH_FORMAT_MXFP4);
    EXPECT_NO_THROW(prequantize_rtn(t, f, w, 1));
    w[5] = 3.2e38f;
    try {
        prequantize_rtn(t, f, w, 1);
        ADD_FAILURE() << "a weight whose group decodes to infinity was accepted";
    } catch (const Error& e) {
        EXPECT_EQ(e.status(), WUSH_ERR_NON_FINITE) << e.what();
    }
}

}  // namespace
}  // namespace wush
