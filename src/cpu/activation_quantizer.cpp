#include "cpu/activation_quantizer.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <optional>
#include <string>

#include "common/checked_math.h"
#include "common/dtype.h"
#include "common/error.h"
#include "common/float_bits.h"
#include "cpu/exact_quantizer.h"
#include "cpu/kernels/kernels.h"
#include "formats/block_format.h"
#include "threads/work_pool.h"

namespace wush::cpu {

namespace {

// Below this much work a call stays on the calling thread: waking the pool's helpers costs more,
// and on a busy machine a descheduled helper can stall a tiny call for a whole scheduler tick.
constexpr std::size_t kParallelWork = 1 << 17;  // multiply-adds (or elements for the identity)
// Work items per chunk of the pool: at least this much work each, so claiming one costs little.
constexpr std::size_t kChunkWork = 1 << 15;

std::size_t tile_lanes(Isa isa) {
    return isa == Isa::Avx512Vnni ? 16 : isa == Isa::Avx2 ? 8 : 1;
}

// Below this many tokens a tile's lanes hold blocks of one token instead of one block of many
// tokens (whose lanes would mostly idle). Measured crossover on Zen 4 (docs/record/performance-record.md).
std::size_t by_block_below(Isa isa) {
    return isa == Isa::Avx512Vnni ? 6 : isa == Isa::Avx2 ? 4 : 0;
}

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
        std::size_t seen = first_.load(std::memory_order_relaxed);
        while (index < seen && !first_.compare_exchange_weak(seen, index, std::memory_order_relaxed)) {
        }
    }
    void raise_if_any(std::size_t d_in) const {
        const std::size_t first = first_.load(std::memory_order_relaxed);
        if (first == kNone) return;
        fail(WUSH_ERR_NON_FINITE, "x holds a NaN or infinite value at row " + std::to_string(first / d_in) +
                                      ", column " + std::to_string(first % d_in));
    }

private:
    static constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();
    std::atomic<std::size_t> first_{kNone};
};

}  // namespace

std::size_t quantize_scratch_floats(const BlockTransform& transform, MatrixUse use) {
    switch (use) {
        case MatrixUse::None: return 0;
        case MatrixUse::Shared: return 1;
        case MatrixUse::PerBlock: return transform.blocks();
    }
    return transform.blocks();
}

namespace {

// The bf16 bits of v when v is exactly a bf16 value that is zero or normal (VDPBF16PS reads
// subnormal inputs as zero).
std::optional<std::uint32_t> exact_bf16(float v) {
    const std::uint32_t u = bits::bits_from_float(v);
    const bool subnormal = (u & 0x7F800000u) == 0 && (u & 0x007FFFFFu) != 0;
    if ((u & 0xFFFFu) != 0 || subnormal) return std::nullopt;
    return u >> 16;
}

}  // namespace

std::vector<std::uint32_t> bf16_matrix_pairs(const BlockTransform& transform, MatrixUse use) {
    if (use == MatrixUse::None) return {};
    const std::span<const float> m = transform.activation_matrices();
    const std::size_t count = use == MatrixUse::Shared ? transform.group() * transform.group() : m.size();
    std::vector<std::uint32_t> pairs(count / 2);
    for (std::size_t e = 0; e < count; e += 2) {  // G is even: a pair never crosses a row
        const auto lo = exact_bf16(m[e]), hi = exact_bf16(m[e + 1]);
        if (!lo || !hi) return {};
        pairs[e / 2] = *lo | *hi << 16;
    }
    return pairs;
}

std::vector<float> matrix_norm_bounds(const BlockTransform& transform, MatrixUse use) {
    const std::size_t g = transform.group(), count = quantize_scratch_floats(transform, use);
    const float* m = transform.activation_matrices().data();
    std::vector<float> bounds(count);
    for (std::size_t b = 0; b < count; ++b) {
        double best = 0.0;
        for (std::size_t i = 0; i < g; ++i) {
            double sum = 0.0;
            for (std::size_t j = 0; j < g; ++j) sum += double(m[(b * g + i) * g + j]) * double(m[(b * g + i) * g + j]);
            best = std::max(best, sum);
        }
        // A relative 2^-40 covers the float64 sum's rounding; the float32 result is then rounded up.
        const double bound = std::sqrt(best) * (1.0 + 0x1p-40);
        float f = float(bound);
        if (double(f) < bound) f = std::nextafter(f, std::numeric_limits<float>::infinity());
        bounds[b] = f;
    }
    return bounds;
}

namespace {

// How one call is cut into tiles (work items), and what each tile reads.
struct Layout {
    MatrixUse use;
    bool by_block;     // lanes are blocks of one token (few tokens) instead of tokens of one block
    bool norms_given;  // row-norm bounds given to the kernels (else: they compute them, or none)
    bool pairs;        // tiles multiply with the bf16 pairs (QuantTile::pairs)
    std::size_t lanes, outer, inner, stride;
};

Layout plan(const BlockTransform& t, MatrixUse use, std::size_t n_tokens, Isa isa, wush_dtype dtype,
            const PreparedMatrices& prepared) {
    Layout l;
    l.use = use;
    l.lanes = tile_lanes(isa);
    l.by_block = n_tokens < by_block_below(isa);
    // Without prepared bounds, lanes = blocks tiles compute theirs while they read the matrices
    // (one pass, not two); the others get them from the scratch (given_norms).
    l.norms_given = isa != Isa::Scalar && l.use != MatrixUse::None &&
                    (!prepared.norm_bounds.empty() || l.use == MatrixUse::Shared || !l.by_block);
    l.outer = l.by_block ? n_tokens : (n_tokens + l.lanes - 1) / l.lanes;
    l.inner = l.by_block ? (t.blocks() + l.lanes - 1) / l.lanes : t.blocks();
    l.stride = l.use == MatrixUse::PerBlock ? t.group() * t.group() : 0;
    // The pairs: for one token, half the matrix bytes to read (both SIMD kernels, any x; the
    // kernels then need the norms given); for many bf16 tokens, the bf16 dot product.
    const bool pairs_one_token = l.by_block && isa != Isa::Scalar && l.norms_given;
    const bool pairs_dot = isa == Isa::Avx512Vnni && !l.by_block && dtype == WUSH_DTYPE_BF16 && cpu_has_avx512_bf16();
    l.pairs = !prepared.bf16_pairs.empty() && (pairs_one_token || pairs_dot);
    return l;
}

// Runs fn(item) for every item in [0, items) of `work_per_item` each, on the pool's threads when
// the call is large enough to gain from them.
template <typename Fn>
void for_items(std::size_t items, std::size_t work_per_item, std::size_t threads, Fn&& fn) {
    const std::size_t work = items * work_per_item;
    const std::size_t grain = std::max<std::size_t>(1, kChunkWork / std::max<std::size_t>(work_per_item, 1));
    threads::parallel_chunks(items, grain, work >= kParallelWork ? threads : 1, double(work),
                             [&](std::size_t, std::size_t begin, std::size_t end) {
                                 for (std::size_t item = begin; item < end; ++item) fn(item);
                             });
}

// The kernels' row-norm bounds: the prepared ones, or computed into the scratch; nullptr when the
// kernels compute them (or need none).
const float* given_norms(const BlockTransform& t, const Layout& l, Isa isa, const PreparedMatrices& prepared,
                         std::span<float> scratch, std::size_t threads) {
    if (!l.norms_given) return nullptr;
    if (!prepared.norm_bounds.empty()) return prepared.norm_bounds.data();
    const std::size_t g = t.group(), distinct = l.use == MatrixUse::Shared ? 1 : t.blocks();
    const float* m = t.activation_matrices().data();
    for_items(distinct, g * g, threads, [&](std::size_t b) { scratch[b] = max_row_norm(isa, m + b * g * g, int(g)); });
    return scratch.data();
}

// The work item's tile; `base` carries the call-wide fields.
QuantTile tile_of(const Layout& l, const QuantTile& base, const BlockTransform& t, std::size_t n_tokens,
                  std::size_t item, const float* norms, const std::uint32_t* pairs) {
    const std::size_t o = item / l.inner, i = item % l.inner;
    QuantTile tile = base;
    tile.by_block = l.by_block ? 1 : 0;
    tile.row0 = l.by_block ? o : o * l.lanes;
    tile.block = l.by_block ? i * l.lanes : i;
    tile.rows = int(l.by_block ? std::min(l.lanes, t.blocks() - tile.block) : std::min(l.lanes, n_tokens - tile.row0));
    tile.matrix = l.use == MatrixUse::None ? nullptr : t.activation_matrices().data() + tile.block * l.stride;
    tile.matrix_stride = l.stride;
    tile.pairs = l.pairs ? pairs + tile.block * (l.stride / 2) : nullptr;
    tile.row_norms = l.norms_given ? norms + (l.stride ? tile.block : 0) : nullptr;
    return tile;
}

}  // namespace

void quantize_activations(const BlockTransform& transform, MatrixUse use, const formats::FormatSpec& format,
                          wush_dtype dtype, const void* x, std::size_t n_tokens, std::span<std::uint8_t> codes,
                          std::span<std::uint8_t> scales, Isa isa, std::span<float> scratch, std::size_t threads,
                          const PreparedMatrices& prepared) {
    formats::require_group(format, transform.group());
    const std::size_t d_in = transform.d_in(), g = transform.group();
    require(g == 16 || g == 32, "quantize_activations: the runtime supports groups of 16 and 32");
    const formats::PackedSizes need = formats::packed_sizes(format, n_tokens, d_in);
    require(codes.size() >= need.codes && scales.size() >= need.scales, "quantize_activations: buffers too small");
    require(scratch.size() >= quantize_scratch_floats(transform, use) || !prepared.norm_bounds.empty(),
            "quantize_activations: scratch too small");
    dtype_size(dtype);  // validates
    if (n_tokens == 0) return;

    const std::size_t distinct = quantize_scratch_floats(transform, use);
    require(prepared.bf16_pairs.empty() ||
                prepared.bf16_pairs.size() == distinct * transform.group() * transform.group() / 2,
            "quantize_activations: bf16 pairs of another transform");
    require(prepared.norm_bounds.empty() || prepared.norm_bounds.size() == distinct,
            "quantize_activations: row-norm bounds of another transform");
    const Layout l = plan(transform, use, n_tokens, isa, dtype, prepared);
    const float* norms = given_norms(transform, l, isa, prepared, scratch, threads);
    QuantTile base{};
    base.x = x;
    base.dtype = int(dtype);
    base.format = int(format.id);
    base.group = int(g);
    base.d_in = d_in;
    base.codes = codes.data();
    base.scales = scales.data();
    const std::size_t items = checked_mul(l.outer, l.inner, "work items");
    const std::size_t work = n_tokens * d_in * (l.use == MatrixUse::None ? 1 : g);
    FirstNonFinite non_finite;
    for_items(items, std::max<std::size_t>(work / items, 1), threads, [&](std::size_t item) {
        const QuantTile tile = tile_of(l, base, transform, n_tokens, item, norms, prepared.bf16_pairs.data());
        const std::uint32_t redo = isa == Isa::Scalar ? (1u << tile.rows) - 1 : quantize_tile(isa, tile);
        for (int r = 0; r < tile.rows; ++r)
            if (redo >> r & 1u)
                if (const auto bad = quantize_block_exact(tile, r)) non_finite.note(*bad);
    });
    non_finite.raise_if_any(d_in);
    // MXFP4's overflow is decided by the transformed values, which only the kernels see: a value
    // with |y| * 3 > 5 * 2^127 gets code 6 under scale 2^127, which decodes to 2^128. Refused as
    // quantize_rows refuses such inputs, so that what this writes, dequantize_rows accepts. Only a
    // scale of 2^127 (E8M0 byte 254; 255 is never written) can overflow with elements up to 6, so
    // the bytes are scanned first (one pass a compiler vectorizes; the full check decodes every
    // scale in double and took a twentieth of the call).
    const auto near_top = [&] {
        const std::span<const std::uint8_t> written = scales.first(need.scales);
        return std::any_of(written.begin(), written.end(), [](std::uint8_t b) { return b >= 254; });
    };
    if (format.id == WUSH_FORMAT_MXFP4 && near_top()) {
        try {
            formats::require_decodable(format, codes, scales, n_tokens, d_in);
        } catch (const Error& e) {
            fail(WUSH_ERR_NON_FINITE, std::string("the transformed activations leave MXFP4's range: ") + e.what());
        }
    }
}

}  // namespace wush::cpu
