#include "eval/quantized_product.h"

#include <cmath>
#include <string>

#include "common/checked_math.h"
#include "common/error.h"
#include "eval/quantized_product_kernel.h"
#include "formats/group_quantizer.h"

namespace wush::eval {

namespace {

double group_scale(const formats::FormatSpec& f, const std::uint8_t* scales, std::size_t index) {
    const double s = formats::decode_scale(f.id, scales + index * f.scale_bytes);
    if (!std::isfinite(s)) fail(WUSH_ERR_NON_FINITE, "quantized product: a group scale is NaN or infinite");
    return s;
}

// The portable kernel: the SIMD kernels' arithmetic, one row at a time (quantized_product_kernel.h).
void portable(const ProductWeights& w, const ProductActivations& a, std::size_t b0, std::size_t b1, std::size_t n,
              double* y, std::size_t ld) {
    const std::size_t quads = std::size_t(w.quads), group_bytes = quads * kProductRows * 4;
    for (std::size_t b = b0; b < b1; ++b)
        for (std::size_t r = 0; r < std::size_t(kProductRows) && b * kProductRows + r < n; ++r)
            for (std::size_t t = 0; t < a.m; ++t) {
                double sum = 0.0;
                for (std::size_t g = 0; g < w.groups; ++g) {
                    const std::size_t i = (b * w.groups + g) * kProductRows + r;
                    const std::int8_t* wc = w.codes + (b * w.groups + g) * group_bytes + r * 4;
                    const std::uint8_t* ac = a.a + t * a.k + g * quads * 4;
                    std::int32_t dot = 0;
                    for (std::size_t q = 0; q < quads; ++q)
                        for (std::size_t e = 0; e < 4; ++e)
                            dot += std::int32_t(ac[q * 4 + e]) * std::int32_t(wc[q * kProductRows * 4 + e]);
                    sum += (a.scale[t * w.groups + g] * w.scale[i]) * double(dot - w.offset_sum[i]);
                }
                y[t * ld + b * kProductRows + r] = sum;
            }
}

}  // namespace

QuantizedProduct::DoubledPairs::DoubledPairs(wush_format f) {
    int doubled[16];
    for (int c = 0; c < 16; ++c)
        doubled[c] = int(std::lround(2.0 * double(formats::decode_element(f, std::uint8_t(c)))));
    for (int b = 0; b < 256; ++b) {
        const std::uint8_t byte = std::uint8_t(b);
        value[b][0] = std::int8_t(doubled[formats::get_nibble(&byte, 0)]);
        value[b][1] = std::int8_t(doubled[formats::get_nibble(&byte, 1)]);
        sum[b] = std::int8_t(value[b][0] + value[b][1]);
    }
}

QuantizedProduct::QuantizedProduct(const formats::PackedMatrix& w)
    : format_(formats::spec(w.format)), d_out_(w.d_out), d_in_(w.d_in), pairs_(w.format) {
    const formats::FormatSpec& f = format_;
    require(f.group % 4 == 0 && d_in_ % f.group == 0, "quantized product: d_in must be a multiple of G");
    groups_ = d_in_ / f.group;
    blocks_ = (d_out_ + kProductRows - 1) / kProductRows;
    const std::size_t quads = f.group / 4;
    const formats::PackedSizes row = formats::packed_sizes(f, 1, d_in_);
    codes_.assign(checked_mul(blocks_ * kProductRows, d_in_, "product weights"), 0);
    offset_sum_.assign(blocks_ * groups_ * kProductRows, 0);
    scale_.assign(blocks_ * groups_ * kProductRows, 0.0);
    const DoubledPairs& pairs = pairs_;
    for (std::size_t o = 0; o < d_out_; ++o) {
        const std::size_t b = o / kProductRows, r = o % kProductRows;
        const std::uint8_t* codes = w.codes.span().data() + o * row.codes;
        for (std::size_t g = 0; g < groups_; ++g) {
            const std::size_t i = (b * groups_ + g) * kProductRows + r;
            std::int8_t* out = codes_.data() + (b * groups_ + g) * quads * kProductRows * 4 + r * 4;
            const std::uint8_t* group = codes + g * f.group / 2;
            std::int32_t sum = 0;
            for (std::size_t q = 0; q < quads; ++q, out += kProductRows * 4) {
                const std::uint8_t lo = group[2 * q], hi = group[2 * q + 1];
                out[0] = pairs.value[lo][0];
                out[1] = pairs.value[lo][1];
                out[2] = pairs.value[hi][0];
                out[3] = pairs.value[hi][1];
                sum += pairs.sum[lo] + pairs.sum[hi];
            }
            offset_sum_[i] = kProductOffset * sum;
            scale_[i] = group_scale(f, w.scales.span().data() + o * row.scales, g);
        }
    }
}

void QuantizedProduct::multiply(std::span<const std::uint8_t> a_codes, std::span<const std::uint8_t> a_scales,
                                std::size_t m, std::span<double> y, Isa isa) const {
    const formats::FormatSpec& f = format_;
    const formats::PackedSizes need = formats::packed_sizes(f, m, d_in_);
    require(a_codes.size() >= need.codes && a_scales.size() >= need.scales && y.size() >= m * d_out_,
            "quantized product: buffers smaller than the shape requires");
    const DoubledPairs& pairs = pairs_;
    std::vector<std::uint8_t> a(m * d_in_);
    std::vector<double> a_scale(m * groups_);
    for (std::size_t i = 0; i < m * d_in_ / 2; ++i) {
        a[2 * i] = std::uint8_t(kProductOffset + pairs.value[a_codes[i]][0]);
        a[2 * i + 1] = std::uint8_t(kProductOffset + pairs.value[a_codes[i]][1]);
    }
    for (std::size_t i = 0; i < m * groups_; ++i) a_scale[i] = group_scale(f, a_scales.data(), i);
    const ProductWeights w{codes_.data(), offset_sum_.data(), scale_.data(), groups_, int(f.group / 4)};
    const ProductActivations act{a.data(), a_scale.data(), m, d_in_};
    // Blocks of weight rows are independent: any split gives the same bits.
#pragma omp parallel for schedule(dynamic, 2)
    for (std::size_t b = 0; b < blocks_; ++b) {
        switch (isa) {
            case Isa::Avx512Vnni: avx512::quantized_product(w, act, b, b + 1, d_out_, y.data(), d_out_); break;
            case Isa::Avx2: avx2::quantized_product(w, act, b, b + 1, d_out_, y.data(), d_out_); break;
            default: portable(w, act, b, b + 1, d_out_, y.data(), d_out_); break;
        }
    }
    // Elements were doubled on both sides; the per-tensor divisor applies once per side.
    const double divisor = 4.0 * f.tensor_divisor * f.tensor_divisor;
    for (std::size_t i = 0; i < m * d_out_; ++i) y[i] /= divisor;
}

}  // namespace wush::eval
