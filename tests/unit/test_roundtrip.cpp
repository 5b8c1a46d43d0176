// Round-trip (quantize -> dequantize) error on Gaussian data, against bounds derived from the
// formats themselves.
//
// Derivation. Each format maps an element x to v = x / u, where u is the group's unit (MXFP4:
// 2^e / 3, MXFP4_OCP: 2^e, NVFP4: s / 10, INT4: s), rounds v to the nearest point of its grid,
// and decodes grid_point * u.
//  - Inside the grid's range the error is at most half the local spacing h(v) times u: E2M1 has
//    spacing 0.5 on [0, 2], 1 on [2, 4], 2 on [4, 6]; INT4 has spacing 1 on [-8, 8) (midrise
//    levels q + 1/2, so the error is at most u / 2).
//  - Beyond the range (E2M1 above 6: only NVFP4, when s rounded down, and the OCP rule; INT4
//    beyond [-8, 8)), the error is the distance to the outermost level: |v| - 6, or |v| - 7.5.
//  - A zero unit (NVFP4/INT4 scale underflow) decodes to 0: error |x|.
//  - NVFP4 pins each group's largest element to the top of the grid: its v is 6 t / RNE_e4m3(t)
//    with t = amax * 10 / 6, within 1/16 of 6, and it decodes to exactly +-6 units, so its
//    error is the deterministic | |v| - 6 |, not a uniform draw from the [4, 6] cell.
// So every element obeys  |x - q(x)| <= u * max(h(v)/2, overflow(v)) (+ one float rounding of the
// decoded value).  For the mean square error, if v is spread smoothly over each grid cell (true
// for Gaussian data at these spacings), the in-range error is uniform on [-h/2, h/2] with mean
// square h^2/12; the overflow error is deterministic. Summing u^2 h(v)^2/12 (or the overflow
// error squared) over all elements predicts the total squared error; the measured total must
// lie within 10% of the prediction.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "formats/block_format.h"
#include "formats/group_quantizer.h"

namespace {

using wush::formats::FormatSpec;

struct ElementModel {
    double bound;     // hard bound on |x - q(x)|
    double expected;  // model mean square error
};

double e2m1_spacing(double a) {
    return a <= 2.0 ? 0.5 : a <= 4.0 ? 1.0 : 2.0;
}

ElementModel model(const FormatSpec& f, double x, double scale, bool group_max) {
    double unit = scale;
    if (f.id == WUSH_FORMAT_MXFP4) unit = scale / 3.0;
    if (f.id == WUSH_FORMAT_NVFP4) unit = scale / 10.0;
    if (unit == 0.0) return {std::fabs(x), x * x};
    const double v = std::fabs(x / unit);
    if (f.id == WUSH_FORMAT_INT4) {
        const double over = v - 7.5;  // the outermost levels are +-7.5
        const bool clipped = x >= 0 ? v >= 8.0 : v > 8.0;
        if (clipped) return {over * unit, over * over * unit * unit};
        return {0.5 * unit, unit * unit / 12.0};
    }
    if (v > 6.0 || (f.id == WUSH_FORMAT_NVFP4 && group_max))
        return {std::fabs(v - 6.0) * unit, (v - 6.0) * (v - 6.0) * unit * unit};
    const double h = e2m1_spacing(v);
    return {0.5 * h * unit, h * h * unit * unit / 12.0};
}

class RoundTrip : public ::testing::TestWithParam<wush_format> {};

TEST_P(RoundTrip, GaussianErrorWithinTheFormatDerivedBand) {
    const FormatSpec& f = wush::formats::spec(GetParam());
    const std::size_t rows = 128, cols = 4096, n = rows * cols;
    std::mt19937_64 rng(11);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(n), y(n);
    for (float& v : x) v = normal(rng);
    const auto sizes = wush::formats::packed_sizes(f, rows, cols);
    std::vector<std::uint8_t> codes(sizes.codes), scales(sizes.scales);
    wush::formats::quantize_rows(f, x, rows, cols, codes, scales);
    wush::formats::dequantize_rows(f, codes, scales, rows, cols, y);

    double measured = 0.0, predicted = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
        const double scale = wush::formats::decode_scale(f.id, scales.data() + (i / f.group) * f.scale_bytes);
        const float amax = wush::formats::group_amax(x.data() + i / f.group * f.group, int(f.group));
        const ElementModel m = model(f, x[i], scale, std::fabs(x[i]) == amax);
        const double err = std::fabs(double(y[i]) - double(x[i]));
        ASSERT_LE(err, m.bound * (1 + 1e-6) + std::fabs(x[i]) * 0x1p-23) << f.name << " element " << i << " = " << x[i];
        measured += err * err;
        predicted += m.expected;
    }
    const double ratio = measured / predicted;
    RecordProperty("mse_ratio", std::to_string(ratio));
    EXPECT_GT(ratio, 0.9) << f.name << ": measured " << measured / n << " predicted " << predicted / n;
    EXPECT_LT(ratio, 1.1) << f.name << ": measured " << measured / n << " predicted " << predicted / n;
}

INSTANTIATE_TEST_SUITE_P(AllFormats, RoundTrip,
                         ::testing::Values(WUSH_FORMAT_MXFP4, WUSH_FORMAT_MXFP4_OCP, WUSH_FORMAT_NVFP4,
                                           WUSH_FORMAT_INT4),
                         [](const auto& info) { return std::string(wush::formats::spec(info.param).name); });

}  // namespace

// dequantize_rows decodes the 16 element values once per call (a table) instead of per element:
// every code under every decodable scale byte (MXFP4, NVFP4, INT4 with a range of bf16 scales)
// gives, bit for bit, element x scale / divisor with the elements written out here (E2M1:
// 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives; INT4: q + 0.5 for q in -8..7).
TEST(DequantizeRows, EveryCodeUnderEveryScaleIsElementTimesScale) {
    const float e2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    for (const wush_format id : {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4, WUSH_FORMAT_INT4}) {
        const FormatSpec& f = wush::formats::spec(id);
        std::vector<std::vector<std::uint8_t>> scale_codes;
        if (id == WUSH_FORMAT_INT4) {
            for (int b = 0; b < 256; ++b) scale_codes.push_back({std::uint8_t(b), std::uint8_t(0x3f)});  // ~[0.5, 1)
            for (int b = 0; b < 256; ++b) scale_codes.push_back({std::uint8_t(b), std::uint8_t(0x3c)});
        } else {
            for (int b = 0; b < 256; ++b) scale_codes.push_back({std::uint8_t(b)});
        }
        for (const auto& sc : scale_codes) {
            const double scale = wush::formats::decode_scale(id, sc.data());
            // A NaN scale code, or one under which an element leaves float32, is not decodable.
            if (!std::isfinite(scale) || 8.0 * scale / f.tensor_divisor > 3.4e38) continue;
            // One row of `group` elements per code pattern: codes c, c + 1, ... (all 16 appear).
            const std::size_t g = f.group, rows = 16;
            std::vector<std::uint8_t> codes(rows * g / 2), scales(rows * f.scale_bytes);
            for (std::size_t r = 0; r < rows; ++r) {
                for (std::size_t i = 0; i < g; i += 2)
                    codes[(r * g + i) / 2] = std::uint8_t(((r + i) & 15) | (((r + i + 1) & 15) << 4));
                std::copy(sc.begin(), sc.end(), scales.begin() + std::ptrdiff_t(r * f.scale_bytes));
            }
            std::vector<float> y(rows * g);
            wush::formats::dequantize_rows(f, codes, scales, rows, g, y);
            for (std::size_t r = 0; r < rows; ++r)
                for (std::size_t i = 0; i < g; ++i) {
                    const int c = int((r + i) & 15);
                    const float elem = id == WUSH_FORMAT_INT4 ? float((c & 8) ? c - 16 : c) + 0.5f
                                                              : ((c & 8) ? -e2m1[c & 7] : e2m1[c & 7]);
                    const float want = float(double(elem) * scale / f.tensor_divisor);
                    ASSERT_EQ(std::bit_cast<std::uint32_t>(y[r * g + i]), std::bit_cast<std::uint32_t>(want))
                        << f.name << " code " << c << " scale byte " << int(sc[0]);
                }
        }
    }
}
