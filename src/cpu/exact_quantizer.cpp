#include "cpu/exact_quantizer.h"

#include <cmath>
#include <span>

#include "common/dtype.h"
#include "formats/certified_group.h"
#include "formats/group_quantizer.h"

namespace wush::cpu {

// The rules live in formats/group_quantizer.h (shared with the CUDA kernels); this file only
// gathers a lane's inputs.
void quantize_group_f64(wush_format format, const double* y, int n, std::uint8_t* codes, std::uint8_t* scale) {
    formats::quantize_group<double>(format, y, n, codes, scale);
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
    formats::transform_group_f64(matrix, x, g, y);
    const wush_format f = wush_format(tile.format);
    const std::size_t scale_bytes = f == WUSH_FORMAT_INT4 ? 2 : 1;
    const std::size_t blocks = tile.d_in / std::size_t(g);
    quantize_group_f64(f, y, g, tile.codes + token * (tile.d_in / 2) + col0 / 2,
                       tile.scales + (token * blocks + block) * scale_bytes);
    return std::nullopt;
}

}  // namespace wush::cpu
