#include "cpu/exact_quantizer.h"

#include <algorithm>
#include <cmath>
#include <span>

#include "common/dtype.h"
#include "formats/group_quantizer.h"

namespace wush::runtime {

namespace {

void put_code(std::uint8_t* codes, int i, std::uint8_t nibble) { formats::put_nibble(codes, i, nibble); }

double abs_max(const double* y, int n) {
    double m = 0.0;
    for (int i = 0; i < n; ++i) m = std::fmax(m, std::fabs(y[i]));
    return m;
}

void quantize_mx(const double* y, int n, bool ocp, std::uint8_t* codes, std::uint8_t* scale) {
    const double amax = abs_max(y, n);
    int e = amax > 0.0 ? bits::floor_log2(amax) : codec::kE8M0MinExp;
    if (ocp) e -= 2;
    e = std::min(std::max(e, codec::kE8M0MinExp), codec::kE8M0MaxExp);
    const double mult = std::ldexp(ocp ? 1.0 : 3.0, -e);  // an exact multiple of a power of two
    for (int i = 0; i < n; ++i) put_code(codes, i, codec::e2m1_encode(y[i] * mult));
    *scale = codec::e8m0_from_exponent(e);
}

void quantize_nvfp4(const double* y, int n, std::uint8_t* codes, std::uint8_t* scale) {
    const std::uint8_t s = codec::e4m3_encode(abs_max(y, n) * 10.0 / 6.0);
    const double sv = codec::e4m3_decode(s);
    for (int i = 0; i < n; ++i) put_code(codes, i, codec::e2m1_encode(sv > 0.0 ? y[i] * 10.0 / sv : y[i] * 0.0));
    *scale = s;
}

void quantize_int4(const double* y, int n, std::uint8_t* codes, std::uint8_t* scale) {
    double sum_sq = 0.0;
    for (int i = 0; i < n; ++i) sum_sq += y[i] * y[i];
    const std::uint16_t s = bits::bf16_encode(formats::kInt4ScalePerRms * std::sqrt(sum_sq / n));
    const double sv = bits::bf16_decode(s);
    for (int i = 0; i < n; ++i) {
        const double q = sv > 0.0 ? std::fmin(std::fmax(std::floor(y[i] / sv), -8.0), 7.0) : 0.0;
        put_code(codes, i, std::uint8_t(int(q) & 0xF));
    }
    scale[0] = std::uint8_t(s & 0xFF);  // little-endian bf16
    scale[1] = std::uint8_t(s >> 8);
}

}  // namespace

void quantize_group_f64(wush_format format, const double* y, int n, std::uint8_t* codes, std::uint8_t* scale) {
    switch (format) {
        case WUSH_FORMAT_MXFP4: quantize_mx(y, n, false, codes, scale); return;
        case WUSH_FORMAT_MXFP4_OCP: quantize_mx(y, n, true, codes, scale); return;
        case WUSH_FORMAT_NVFP4: quantize_nvfp4(y, n, codes, scale); return;
        case WUSH_FORMAT_INT4: quantize_int4(y, n, codes, scale); return;
        default: break;  // formats are validated by the callers
    }
}

std::optional<std::size_t> quantize_block_exact(const QuantTile& tile, int lane) {
    const int g = tile.group;
    const std::size_t l = std::size_t(lane);
    const std::size_t token = tile.by_block ? tile.row0 : tile.row0 + l;
    const std::size_t block = tile.by_block ? tile.block + l : tile.block;
    const float* matrix = tile.matrix == nullptr ? nullptr : tile.matrix + (tile.by_block ? l * tile.matrix_stride : 0);
    const std::size_t col0 = block * std::size_t(g);
    float x[32];
    const std::span<float> xs(x, std::size_t(g));
    to_float(wush_dtype(tile.dtype), tile.x, token * tile.d_in + col0, xs);
    for (int j = 0; j < g; ++j)
        if (!std::isfinite(x[j])) return token * tile.d_in + col0 + std::size_t(j);
    double y[32];
    for (int i = 0; i < g; ++i) {
        if (matrix == nullptr) {
            y[i] = x[i];
            continue;
        }
        const float* t = matrix + std::size_t(i) * std::size_t(g);
        double s = 0.0;
        for (int j = 0; j < g; ++j) s += double(t[j]) * double(x[j]);
        y[i] = s;
    }
    const wush_format f = wush_format(tile.format);
    const std::size_t scale_bytes = f == WUSH_FORMAT_INT4 ? 2 : 1;
    const std::size_t blocks = tile.d_in / std::size_t(g);
    quantize_group_f64(f, y, g, tile.codes + token * (tile.d_in / 2) + col0 / 2,
                       tile.scales + (token * blocks + block) * scale_bytes);
    return std::nullopt;
}

}  // namespace wush::runtime
