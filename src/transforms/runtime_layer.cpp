#include "transforms/runtime_layer.h"

#include <algorithm>
#include <cstddef>
#include <string>

#include "common/error.h"
#include "formats/block_format.h"

namespace wush {

namespace {

bool is_identity(const float* m, std::size_t g) {
    for (std::size_t i = 0; i < g; ++i)
        for (std::size_t j = 0; j < g; ++j)
            if (m[i * g + j] != (i == j ? 1.0f : 0.0f)) return false;
    return true;
}

}  // namespace

MatrixUse classify_matrices(const BlockTransform& transform) {
    const std::size_t g = transform.group(), gg = g * g, blocks = transform.blocks();
    const float* m = transform.activation_matrices().data();
    bool shared = true;
    for (std::size_t b = 1; b < blocks && shared; ++b) shared = std::equal(m, m + gg, m + b * gg);
    if (!shared) return MatrixUse::PerBlock;
    return is_identity(m, g) ? MatrixUse::None : MatrixUse::Shared;
}

void require_layer(const BlockTransform& transform, const formats::PackedMatrix& weights) {
    const formats::FormatSpec& f = formats::spec(weights.format);
    formats::require_group(f, transform.group());
    if (weights.d_in != transform.d_in())
        fail(WUSH_ERR_INVALID_ARGUMENT, "the qweight's d_in (" + std::to_string(weights.d_in) +
                                            ") differs from the transform's (" + std::to_string(transform.d_in()) +
                                            ")");
    if (f.group != 16 && f.group != 32) fail(WUSH_ERR_UNSUPPORTED, "the runtime supports group sizes 16 and 32");
}

}  // namespace wush
