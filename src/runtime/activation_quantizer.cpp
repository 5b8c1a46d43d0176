#include "runtime/activation_quantizer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>

#include "common/checked_math.h"
#include "common/dtype.h"
#include "common/error.h"
#include "eval/layer_loss.h"
#include "runtime/exact_quantizer.h"
#include "runtime/kernels.h"

namespace wush::runtime {

namespace {

// How the blocks' matrices are laid out for the kernels.
enum class MatrixUse { None, Shared, PerBlock };

MatrixUse matrix_use(const BlockTransform& t) {
    // The identity needs no multiply; Hadamard blocks are all the same matrix, so the kernels read
    // one G x G matrix (it stays in L1) instead of C of them.
    switch (t.kind()) {
        case TransformKind::Identity: return MatrixUse::None;
        case TransformKind::Hadamard: return MatrixUse::Shared;
        default: return MatrixUse::PerBlock;
    }
}

// Below this much work a call stays on the calling thread: waking OpenMP workers costs more, and
// on a busy machine a descheduled worker can stall a tiny call for a whole scheduler tick.
constexpr std::size_t kParallelWork = 1 << 17;  // multiply-adds (or elements for the identity)

std::size_t tile_lanes(Isa isa) { return isa == Isa::Avx512Vnni ? 16 : isa == Isa::Avx2 ? 8 : 1; }

// Below this many tokens a tile's lanes hold blocks of one token instead of one block of many
// tokens (whose lanes would mostly idle). Measured crossover on Zen 4 (docs/PERFORMANCE.md).
std::size_t by_block_below(Isa isa) { return isa == Isa::Avx512Vnni ? 6 : isa == Isa::Avx2 ? 4 : 0; }

float max_row_norm(Isa isa, const float* m, int g) {
    return isa == Isa::Avx512Vnni ? avx512::max_row_norm(m, g) : avx2::max_row_norm(m, g);
}

std::uint32_t quantize_tile(Isa isa, const QuantTile& tile) {
    return isa == Isa::Avx512Vnni ? avx512::quantize_tile(tile) : avx2::quantize_tile(tile);
}

// The first NaN/Inf seen by any thread, as a linear index into x (the smallest one wins, so the
// message does not depend on the thread schedule).
class FirstNonFinite {
public:
    void note(std::size_t index) {
#pragma omp critical(wush_runtime_non_finite)
        first_ = std::min(first_, index);
    }
    void raise_if_any(std::size_t d_in) const {
        if (first_ == kNone) return;
        fail(WUSH_ERR_NON_FINITE, "x holds a NaN or infinite value at row " + std::to_string(first_ / d_in) +
                                      ", column " + std::to_string(first_ % d_in));
    }

private:
    static constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();
    std::size_t first_ = kNone;
};

}  // namespace

std::size_t quantize_scratch_floats(const BlockTransform& transform) {
    switch (matrix_use(transform)) {
        case MatrixUse::None: return 0;
        case MatrixUse::Shared: return 1;
        case MatrixUse::PerBlock: return transform.blocks();
    }
    return transform.blocks();
}

void quantize_activations(const BlockTransform& transform, const formats::FormatSpec& format, wush_dtype dtype,
                          const void* x, std::size_t n_tokens, std::span<std::uint8_t> codes,
                          std::span<std::uint8_t> scales, Isa isa, std::span<float> scratch) {
    eval::require_matching_group(transform, format);
    const std::size_t d_in = transform.d_in(), g = transform.group(), blocks = transform.blocks();
    require(g == 16 || g == 32, "quantize_activations: the runtime supports groups of 16 and 32");
    const formats::PackedSizes need = formats::packed_sizes(format, n_tokens, d_in);
    require(codes.size() >= need.codes && scales.size() >= need.scales, "quantize_activations: buffers too small");
    require(scratch.size() >= quantize_scratch_floats(transform), "quantize_activations: scratch too small");
    dtype_size(dtype);  // validates
    if (n_tokens == 0) return;

    const MatrixUse use = matrix_use(transform);
    const float* matrices = transform.activation_matrices().data();
    const std::size_t lanes = tile_lanes(isa);
    const bool by_block = n_tokens < by_block_below(isa);
    // Row-norm bounds of the distinct matrices, for the SIMD kernels' error bounds; lanes = blocks
    // tiles compute their own while they read the matrices.
    const bool norms_here = isa != Isa::Scalar && (use == MatrixUse::Shared || (use == MatrixUse::PerBlock && !by_block));
    if (norms_here) {
        const std::size_t distinct = use == MatrixUse::Shared ? 1 : blocks;
#pragma omp parallel for schedule(static) if (distinct * g * g >= kParallelWork)
        for (std::size_t b = 0; b < distinct; ++b) scratch[b] = max_row_norm(isa, matrices + b * g * g, int(g));
    }

    // Work items: (tile of tokens, block), or (token, tile of blocks).
    const std::size_t outer = by_block ? n_tokens : (n_tokens + lanes - 1) / lanes;
    const std::size_t inner = by_block ? (blocks + lanes - 1) / lanes : blocks;
    const std::size_t items = checked_mul(outer, inner, "work items");
    const std::size_t stride = use == MatrixUse::PerBlock ? g * g : 0;
    FirstNonFinite non_finite;
    const std::size_t work = n_tokens * d_in * (use == MatrixUse::None ? 1 : g);
#pragma omp parallel for schedule(static) if (items > 1 && work >= kParallelWork)
    for (std::size_t item = 0; item < items; ++item) {
        const std::size_t o = item / inner, i = item % inner;
        QuantTile tile;
        tile.x = x;
        tile.dtype = int(dtype);
        tile.format = int(format.id);
        tile.group = int(g);
        tile.by_block = by_block ? 1 : 0;
        tile.row0 = by_block ? o : o * lanes;
        tile.block = by_block ? i * lanes : i;
        tile.rows = int(by_block ? std::min(lanes, blocks - tile.block) : std::min(lanes, n_tokens - tile.row0));
        tile.d_in = d_in;
        tile.matrix = use == MatrixUse::None ? nullptr : matrices + (stride ? tile.block * stride : 0);
        tile.matrix_stride = stride;
        tile.row_norms = norms_here ? scratch.data() + (stride ? tile.block : 0) : nullptr;
        tile.codes = codes.data();
        tile.scales = scales.data();
        const std::uint32_t redo = isa == Isa::Scalar ? (1u << tile.rows) - 1 : quantize_tile(isa, tile);
        for (int r = 0; r < tile.rows; ++r) {
            if (!(redo >> r & 1u)) continue;
            if (const auto bad = quantize_block_exact(tile, r)) non_finite.note(*bad);
        }
    }
    non_finite.raise_if_any(d_in);
}

}  // namespace wush::runtime
