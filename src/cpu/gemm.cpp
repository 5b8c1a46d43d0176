#include "cpu/gemm.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>
#include <vector>

#include "common/checked_math.h"
#include "common/dtype.h"
#include "common/error.h"
#include "common/float_bits.h"
#include "cpu/kernels/kernels.h"
#include "cpu/workspace.h"
#include "formats/group_quantizer.h"
#include "threads/work_pool.h"

namespace wush::cpu {

namespace {

// Below this many multiply-adds a call stays on the calling thread: waking a pool's threads
// costs more, and on a busy machine a descheduled one can stall a small call for a scheduler tick.
// The AVX2 kernels on the own pool take one-token products from half a million (a 384 x 1536
// token: about 10 us of one thread) to the pool's measured policy, which tries its helpers while
// they are awake (team_policy.h): there two threads won (median 0.77-1.0x one thread's time). The
// AVX-512 kernels do the same product in about half the time, and on two threads their median
// lost as often as it won (0.69-1.20x, above 1 in 9 of 15 runs), so they keep the 4 M bar, as
// does a host's OpenMP team, whose workers may be anywhere in their spin or asleep.
double parallel_macs(Isa isa) {
    return isa == Isa::Avx2 && !threads::on_openmp_team() ? double(1 << 19) : double(1 << 22);
}

std::size_t round_up(std::size_t v, std::size_t to) {
    return (v + to - 1) / to * to;
}

std::size_t panel_bytes(const formats::FormatSpec& f, std::size_t groups) {
    return checked_mul(groups, kPanelRows * (f.group + 4), "panel size");
}

// The doubled values of the 16 codes: E2M1 2v in {0,..,12} with sign, INT4 2q + 1.
struct DoubledCodes {
    std::int8_t value[16];
    explicit DoubledCodes(wush_format format) {
        for (int c = 0; c < 16; ++c) value[c] = std::int8_t(2.0f * formats::decode_element(format, std::uint8_t(c)));
    }
};

// Unpacks n (even) packed elements into their doubled values.
void unpack_doubled(const DoubledCodes& lut, const std::uint8_t* codes, std::size_t n, std::int8_t* out) {
    for (std::size_t i = 0; i < n / 2; ++i) {
        out[2 * i] = lut.value[codes[i] & 0x0F];
        out[2 * i + 1] = lut.value[codes[i] >> 4];
    }
}

// alpha = tensor_factor^2 / 4: the per-tensor factors of both operands and the two halvings of the
// doubled values, folded into the activation scales.
double alpha(const formats::FormatSpec& f) {
    return 1.0 / (f.tensor_divisor * f.tensor_divisor * 4.0);
}

// Formats whose group scales (of both operands) are E8M0: powers of two.
bool has_e8m0_scales(wush_format format) {
    return format == WUSH_FORMAT_MXFP4 || format == WUSH_FORMAT_MXFP4_OCP;
}

// The scratch arrays of one call; null pointers when measuring.
struct Plan {
    float* scale = nullptr;        // m x groups
    std::int8_t* x8 = nullptr;     // m x k
    std::int32_t* corr = nullptr;  // m x groups
    std::int8_t* xe = nullptr;     // m x k_pad / 2 (split layout, m <= kSplitMaxRows)
    std::int8_t* xo = nullptr;
    std::int32_t* lane_corr = nullptr;  // m x k_pad / 8
    float* lane_scale = nullptr;
    std::int8_t* xt = nullptr;  // m x 2 x kTailBytes
    std::size_t k_pad = 0;
    std::uint8_t* panels = nullptr;  // slots x panel_bytes
    std::size_t slot_bytes = 0;
    std::size_t slots = 0;
};

// Carves everything but the panel slots, then as many slots (at most `threads`) as fit.
Plan carve(Carver& c, const formats::FormatSpec& f, std::size_t m, std::size_t k, std::size_t threads) {
    Plan p;
    const std::size_t groups = k / f.group;
    const std::size_t mg = checked_mul(m, groups, "m x groups");
    p.scale = c.take<float>(mg);
    p.x8 = c.take<std::int8_t>(checked_mul(m, k, "m x k"));
    p.corr = c.take<std::int32_t>(mg);
    if (m <= kSplitMaxRows) {
        p.k_pad = round_up(k, 128);
        p.xe = c.take<std::int8_t>(m * p.k_pad / 2);
        p.xo = c.take<std::int8_t>(m * p.k_pad / 2);
        p.lane_corr = c.take<std::int32_t>(m * p.k_pad / 8);
        p.lane_scale = c.take<float>(m * p.k_pad / 8);
        p.xt = c.take<std::int8_t>(m * 2 * kTailBytes);
    }
    p.slot_bytes = checked_add(panel_bytes(f, groups), 64, "panel slot");
    p.slots = threads;
    return p;
}

// ---- the portable path ------------------------------------------------------------------------

void scalar_prepare(const formats::FormatSpec& f, const std::uint8_t* codes, std::size_t r0, std::size_t r1,
                    std::size_t k, std::int8_t* x8) {
    const DoubledCodes lut(f.id);
    for (std::size_t r = r0; r < r1; ++r) unpack_doubled(lut, codes + r * (k / 2), k, x8 + r * k);
}

void store(const GemmOutput& out, std::size_t r, std::size_t n, float v) {
    if (out.bias != nullptr) v += out.bias[n];
    if (out.dtype == WUSH_DTYPE_BF16) {
        const std::uint16_t h = bits::bf16_encode(double(v));
        if ((h & 0x7F80u) == 0x7F80u) *out.non_finite = 1;
        static_cast<std::uint16_t*>(out.y)[r * out.ld + n] = h;
    } else {
        if (!std::isfinite(v)) *out.non_finite = 1;
        static_cast<float*>(out.y)[r * out.ld + n] = v;
    }
}

// Y rows for weight rows n0..n1: each weight row is decoded once into `row` / `row_scale`.
void scalar_multiply(const formats::FormatSpec& f, const GemmActivations& a, const GemmWeights& w, std::size_t n0,
                     std::size_t n1, const GemmOutput& out, std::int8_t* row, float* row_scale) {
    const std::size_t k = w.k, groups = w.groups, g = f.group;
    const DoubledCodes lut(f.id);
    for (std::size_t n = n0; n < n1; ++n) {
        unpack_doubled(lut, w.codes + n * (k / 2), k, row);
        for (std::size_t b = 0; b < groups; ++b)
            row_scale[b] = formats::decode_scale(f.id, w.scales + (n * groups + b) * f.scale_bytes);
        for (std::size_t r = 0; r < a.m; ++r) {
            float acc = 0.0f;
            for (std::size_t b = 0; b < groups; ++b) {
                std::int32_t dot = 0;
                const std::int8_t* x = a.x8 + r * k + b * g;
                for (std::size_t i = 0; i < g; ++i) dot += std::int32_t(x[i]) * std::int32_t(row[b * g + i]);
                acc = std::fma(float(dot) * row_scale[b], a.scale[r * groups + b], acc);
            }
            store(out, r, n, acc);
        }
    }
}

// ---- dispatch -----------------------------------------------------------------------------------

void prepare_rows(Isa isa, const GemmActivations& a, const std::uint8_t* codes, std::size_t r0, std::size_t r1,
                  std::int8_t* x8, std::int32_t* corr) {
    if (isa == Isa::Avx512Vnni) avx512::prepare_rows(a, codes, r0, r1, x8, corr);
    else avx2::prepare_rows(a, codes, r0, r1, x8, corr);
}

void prepare_split(Isa isa, const GemmActivations& a, const std::uint8_t* codes, std::size_t r0, std::size_t r1,
                   std::int8_t* xe, std::int8_t* xo, std::int32_t* lane_corr) {
    if (isa == Isa::Avx512Vnni) avx512::prepare_split(a, codes, r0, r1, xe, xo, lane_corr);
    else avx2::prepare_split(a, codes, r0, r1, xe, xo, lane_corr);
}

void gemv_rows(Isa isa, const GemmActivations& a, const GemmWeights& w, std::size_t n0, std::size_t n1,
               const GemmOutput& out) {
    if (isa == Isa::Avx512Vnni) avx512::gemv_rows(a, w, n0, n1, out);
    else avx2::gemv_rows(a, w, n0, n1, out);
}

void pack_panel(Isa isa, const GemmWeights& w, std::size_t n0, std::uint8_t* panel) {
    if (isa == Isa::Avx512Vnni) avx512::pack_panel(w, n0, panel);
    else avx2::pack_panel(w, n0, panel);
}

void panel_multiply(Isa isa, const GemmActivations& a, const std::uint8_t* panel, std::size_t n0, std::size_t m0,
                    std::size_t m1, const GemmOutput& out, std::size_t n_total) {
    if (isa == Isa::Avx512Vnni) avx512::panel_multiply(a, panel, n0, m0, m1, out, n_total);
    else avx2::panel_multiply(a, panel, n0, m0, m1, out, n_total);
}

std::size_t row_block_bytes(Isa isa, wush_format format, std::size_t k) {
    return isa == Isa::Avx512Vnni ? avx512::row_block_bytes(int(format), k) : avx2::row_block_bytes(int(format), k);
}

void pack_row_block(Isa isa, const GemmWeights& w, std::size_t n0, std::uint8_t* block) {
    if (isa == Isa::Avx512Vnni) avx512::pack_row_block(w, n0, block);
    else avx2::pack_row_block(w, n0, block);
}

void rows_multiply(Isa isa, const GemmActivations& a, const std::uint8_t* blocks, std::size_t block_bytes,
                   std::size_t n0, std::size_t n1, std::size_t n_total, const GemmOutput& out) {
    if (isa == Isa::Avx512Vnni) avx512::rows_multiply(a, blocks, block_bytes, n0, n1, out);
    else avx2::rows_multiply(a, blocks, block_bytes, n0, n1, n_total, out);
}

std::uint8_t* aligned_slot(const Plan& p, std::size_t slot) {
    const auto addr = reinterpret_cast<std::uintptr_t>(p.panels + slot * p.slot_bytes);
    return reinterpret_cast<std::uint8_t*>((addr + 63) & ~std::uintptr_t(63));
}

}  // namespace

std::size_t gemm_scratch_bytes(const formats::FormatSpec& format, std::size_t m, std::size_t n, std::size_t k,
                               std::size_t threads) {
    (void)n;
    Carver measure;
    const Plan p = carve(measure, format, m, k, std::max<std::size_t>(threads, 1));
    measure.take<std::uint8_t>(checked_mul(p.slots, p.slot_bytes, "panel slots"));
    return measure.used();
}

void require_finite_product(wush_dtype y_dtype, const void* y, std::size_t m, std::size_t n) {
    require_finite(y_dtype, y, m, n,
                   y_dtype == WUSH_DTYPE_BF16 ? "y (the product overflows bf16)" : "y (the product overflows float32)");
}

void check_activation_scales(const formats::FormatSpec& f, std::span<const std::uint8_t> scales, std::size_t m,
                             std::size_t k) {
    const std::size_t groups = k / f.group;
    for (std::size_t i = 0; i < m * groups; ++i)
        if (!std::isfinite(formats::decode_scale(f.id, scales.data() + i * f.scale_bytes)))
            fail(WUSH_ERR_NON_FINITE, std::string("activation scale of row ") + std::to_string(i / groups) +
                                          ", group " + std::to_string(i % groups) + " is NaN or infinite");
}

namespace {

// The kernels' view of one call's operands (plain aggregates: see kernels.h). `out` has no
// non_finite word: each chunk gets its own (ChunkOutput), reported to `non_finite`.
struct Operands {
    GemmActivations a;
    GemmWeights w;
    GemmOutput out;
    std::atomic<bool>* non_finite;
};

// One chunk's view of the output: its own non-finite word, reported to the call at the chunk's end.
class ChunkOutput {
public:
    explicit ChunkOutput(const Operands& o) : out_(o.out), call_(*o.non_finite) { out_.non_finite = &word_; }
    ~ChunkOutput() {
        if (word_ != 0) call_.store(true, std::memory_order_relaxed);
    }
    ChunkOutput(const ChunkOutput&) = delete;
    ChunkOutput& operator=(const ChunkOutput&) = delete;
    const GemmOutput& get() const { return out_; }

private:
    std::uint32_t word_ = 0;
    GemmOutput out_;
    std::atomic<bool>& call_;
};

Operands operands(const formats::FormatSpec& f, const formats::PackedMatrix& w, const Plan& p, std::size_t m, void* y,
                  wush_dtype y_dtype, const float* bias) {
    Operands o{};
    const std::size_t k = w.d_in, groups = k / f.group;
    o.a.format = int(f.id);
    o.a.group = int(f.group);
    o.a.m = m;
    o.a.k = k;
    o.a.groups = groups;
    o.a.x8 = p.x8;
    o.a.corr = p.corr;
    o.a.scale = p.scale;
    o.a.xe = p.xe;
    o.a.xo = p.xo;
    o.a.lane_corr = p.lane_corr;
    o.a.lane_scale = p.lane_scale;
    o.a.k_pad = p.k_pad;
    o.a.xt = p.xt;
    o.w.format = int(f.id);
    o.w.n = w.d_out;
    o.w.k = k;
    o.w.groups = groups;
    o.w.codes = w.codes.data();
    o.w.scales = w.scales.data();
    o.out.y = y;
    o.out.dtype = int(y_dtype);
    o.out.ld = w.d_out;
    o.out.bias = bias;
    return o;
}

// Activation group scales times `a_factor` (alpha, or its power-of-two part: GemmActivations),
// one per (row, group).
void decode_activation_scales(const formats::FormatSpec& f, const std::uint8_t* scales, std::size_t m, std::size_t k,
                              double a_factor, const Plan& p) {
    const std::size_t groups = k / f.group;
    // E8M0 / E4M3 with more scales than bytes: a table of the 256 bytes (the loop is serial); one
    // token's 12-48 scales are decoded one by one (the table took more than a small layer's call).
    if (f.scale_bytes == 1 && m * groups > 256) {
        float table[256];
        for (int b = 0; b < 256; ++b) {
            const std::uint8_t bytes[2] = {std::uint8_t(b), 0};
            table[b] = float(double(formats::decode_scale(f.id, bytes)) * a_factor);
        }
        for (std::size_t i = 0; i < m * groups; ++i) p.scale[i] = table[scales[i]];
    } else {
        for (std::size_t i = 0; i < m * groups; ++i)
            p.scale[i] = float(double(formats::decode_scale(f.id, scales + i * f.scale_bytes)) * a_factor);
    }
}

// The split layout's copy of the scales that its row-streaming kernels read: one per lane of 8
// elements (lane L: elements 8L .. 8L + 7 of the row), 0 in the padding.
void spread_lane_scales(const Plan& p, std::size_t m, std::size_t k, std::size_t group) {
    const std::size_t lanes = p.k_pad / 8, groups = k / group, per_group = group / 8;
    for (std::size_t r = 0; r < m; ++r) {
        float* dst = p.lane_scale + r * lanes;
        for (std::size_t b = 0; b < groups; ++b)
            for (std::size_t i = 0; i < per_group; ++i) dst[b * per_group + i] = p.scale[r * groups + b];
        std::fill(dst + groups * per_group, dst + lanes, 0.0f);
    }
}

// Chunk sizes of the dynamic partition: a few microseconds to a millisecond of work each, so a
// thread that stops being scheduled holds little, and enough chunks to balance two threads.
constexpr std::size_t kRowsPerChunk = 64;  // weight rows of the row-streaming kernels
constexpr std::size_t kPrepareRowsPerChunk = 16;

// The work estimates the pool's straggler policy compares jobs of one kind by (work_pool.h).
double macs(const Operands& o) {
    return double(o.a.m) * double(o.w.n) * double(o.a.k);
}

void run_scalar(const formats::FormatSpec& f, const Operands& o, const Plan& p, const std::uint8_t* codes,
                std::size_t threads) {
    scalar_prepare(f, codes, 0, o.a.m, o.a.k, p.x8);
    threads::parallel_chunks(o.w.n, 16, threads, macs(o), [&](std::size_t slot, std::size_t n0, std::size_t n1) {
        std::uint8_t* s = aligned_slot(p, slot);
        scalar_multiply(f, o.a, o.w, n0, n1, ChunkOutput(o).get(), reinterpret_cast<std::int8_t*>(s),
                        reinterpret_cast<float*>(s + round_up(o.a.k, 64)));
    });
}

// Few activation rows: the threads stream chunks of the weight rows.
void run_split(Isa isa, const Operands& o, const Plan& p, const std::uint8_t* codes, std::size_t threads) {
    prepare_split(isa, o.a, codes, 0, o.a.m, p.xe, p.xo, p.lane_corr);
    spread_lane_scales(p, o.a.m, o.a.k, std::size_t(o.a.group));
    threads::parallel_chunks(o.w.n, kRowsPerChunk, threads, macs(o), [&](std::size_t, std::size_t n0, std::size_t n1) {
        gemv_rows(isa, o.a, o.w, n0, n1, ChunkOutput(o).get());
    });
}

// Few activation rows against a prepared layer's row blocks: chunks of blocks.
void run_row_blocks(Isa isa, const Operands& o, const Plan& p, const std::uint8_t* codes, std::size_t threads,
                    const PanelPack& packed) {
    prepare_split(isa, o.a, codes, 0, o.a.m, p.xe, p.xo, p.lane_corr);
    // The kernels sum each group in int32: one correction per group, the sum of its G / 8 lane ones.
    const std::size_t lanes = p.k_pad / 8, per_group = std::size_t(o.a.group) / 8;
    for (std::size_t r = 0; r < o.a.m; ++r)
        for (std::size_t b = 0; b < o.a.groups; ++b) {
            std::int32_t c = 0;
            for (std::size_t i = 0; i < per_group; ++i) c += p.lane_corr[r * lanes + b * per_group + i];
            p.corr[r * o.a.groups + b] = c;
        }
    if (isa == Isa::Avx512Vnni) avx512::regroup_split(o.a, p.xe, p.xo, p.xt);
    const std::size_t blocks = (o.w.n + kRowBlock - 1) / kRowBlock;
    threads::parallel_chunks(blocks, kRowsPerChunk / kRowBlock, threads, macs(o),
                             [&](std::size_t, std::size_t b0, std::size_t b1) {
                                 rows_multiply(isa, o.a, packed.row_blocks(), packed.block_bytes(), b0 * kRowBlock,
                                               std::min(o.w.n, b1 * kRowBlock), o.w.n, ChunkOutput(o).get());
                             });
}

// Activation rows per work item of a prepared layer's panels: about kPanelRowBytes of decoded
// activations, which stay in the core's L2 cache for the next panels of the same rows, and many
// items per thread, so that a thread the OS pauses holds back little of the call (with one item per
// panel, a 384-wide output had only 12, of about a millisecond each).
constexpr std::size_t kPanelRowBytes = 256 * 1024;

std::size_t panel_row_block(std::size_t k) {
    return std::max<std::size_t>(64, kPanelRowBytes / k / 4 * 4);
}

// More rows: the threads share the activation decoding, then each packs (unless a prepared layer
// packed them once) and multiplies panels.
void run_panels(Isa isa, const Operands& o, const Plan& p, const std::uint8_t* codes, std::size_t threads,
                const PanelPack* packed) {
    const std::size_t panels = (o.w.n + kPanelRows - 1) / kPanelRows;
    threads::parallel_chunks(
        o.a.m, kPrepareRowsPerChunk, threads, double(o.a.m) * double(o.a.k),
        [&](std::size_t, std::size_t r0, std::size_t r1) { prepare_rows(isa, o.a, codes, r0, r1, p.x8, p.corr); });
    if (packed != nullptr) {
        // Items (row block, panel), the panels of one row block after another.
        const std::size_t rows = panel_row_block(o.a.k), blocks = (o.a.m + rows - 1) / rows;
        threads::parallel_chunks(blocks * panels, 1, threads, macs(o), [&](std::size_t, std::size_t b, std::size_t e) {
            const ChunkOutput out(o);
            for (std::size_t item = b; item < e; ++item) {
                const std::size_t panel = item % panels, m0 = item / panels * rows;
                panel_multiply(isa, o.a, packed->panel(panel), panel * kPanelRows, m0, std::min(o.a.m, m0 + rows),
                               out.get(), o.w.n);
            }
        });
        return;
    }
    threads::parallel_chunks(panels, 1, threads, macs(o), [&](std::size_t slot, std::size_t b, std::size_t e) {
        const ChunkOutput out(o);
        for (std::size_t panel = b; panel < e; ++panel) {
            std::uint8_t* s = aligned_slot(p, slot);
            pack_panel(isa, o.w, panel * kPanelRows, s);
            panel_multiply(isa, o.a, s, panel * kPanelRows, 0, o.a.m, out.get(), o.w.n);
        }
    });
}

}  // namespace

bool gemm(Isa isa, std::size_t threads, const formats::PackedMatrix& w, std::span<const std::uint8_t> a_codes,
          std::span<const std::uint8_t> a_scales, std::size_t m, wush_dtype y_dtype, void* y,
          std::span<std::byte> scratch, const PanelPack* packed, const float* bias) {
    const formats::FormatSpec& f = formats::spec(w.format);
    const std::size_t k = w.d_in, n = w.d_out;
    const formats::PackedSizes need = formats::packed_sizes(f, m, k);
    require(a_codes.size() >= need.codes && a_scales.size() >= need.scales, "gemm: activation buffers too small");
    require_output_dtype(y_dtype);
    if (m == 0 || n == 0) return true;

    Carver carver(scratch.data(), scratch.size());
    Plan p = carve(carver, f, m, k, 1);
    const std::size_t room = carver.left() > 63 ? carver.left() - 63 : 0;
    p.slots = std::min<std::size_t>(std::max<std::size_t>(threads, 1), room / p.slot_bytes);
    require(p.slots >= 1, "gemm: scratch too small");
    p.panels = carver.take<std::uint8_t>(p.slots * p.slot_bytes);
    std::atomic<bool> non_finite{false};
    Operands o = operands(f, w, p, m, y, y_dtype, bias);
    o.non_finite = &non_finite;
    // The AVX-512 panels apply E8M0 scales as exponents (kernels.h, GemmActivations::alpha_rest).
    const bool exponents = isa == Isa::Avx512Vnni && m > kSplitMaxRows && has_e8m0_scales(f.id);
    const double a_factor = alpha(f);
    const double a_power = exponents ? std::ldexp(1.0, std::ilogb(a_factor)) : a_factor;
    o.a.alpha_rest = exponents ? float(a_factor / a_power) : 0.0f;
    decode_activation_scales(f, a_scales.data(), m, k, a_power, p);
    // Small products stay on the calling thread (see parallel_macs).
    const std::size_t team = double(m) * double(n) * double(k) >= parallel_macs(isa) ? p.slots : 1;
    const PanelPack* pack = packed != nullptr && packed->isa() == isa && !packed->empty() ? packed : nullptr;
    if (isa == Isa::Scalar) run_scalar(f, o, p, a_codes.data(), team);
    else if (m <= kSplitMaxRows && pack != nullptr && pack->row_blocks() != nullptr)
        run_row_blocks(isa, o, p, a_codes.data(), team, *pack);
    else if (m <= kSplitMaxRows) run_split(isa, o, p, a_codes.data(), team);
    else run_panels(isa, o, p, a_codes.data(), team, pack);
    return !non_finite.load();
}

PanelPack::PanelPack(Isa isa, std::size_t threads, const formats::PackedMatrix& w) : isa_(isa) {
    if (isa == Isa::Scalar || w.d_out == 0) return;
    const formats::FormatSpec& f = formats::spec(w.format);
    const std::size_t groups = w.d_in / f.group, panels = (w.d_out + kPanelRows - 1) / kPanelRows;
    stride_ = round_up(panel_bytes(f, groups), 64);
    bytes_.resize(checked_add(checked_mul(panels, stride_, "packed panels"), 63, "packed panels"));
    offset_ = (64 - reinterpret_cast<std::uintptr_t>(bytes_.data()) % 64) % 64;
    GemmWeights gw{};
    gw.format = int(f.id);
    gw.n = w.d_out;
    gw.k = w.d_in;
    gw.groups = groups;
    gw.codes = w.codes.data();
    gw.scales = w.scales.data();
    // Packing runs on the work pool, like the GEMM (the runtime uses no OpenMP: see docs/RUNTIME.md).
    threads = std::max<std::size_t>(threads, 1);
    const double bytes = double(w.d_out) * double(w.d_in);
    threads::parallel_chunks(panels, 1, threads, bytes, [&](std::size_t, std::size_t b, std::size_t e) {
        for (std::size_t panel = b; panel < e; ++panel)
            pack_panel(isa, gw, panel * kPanelRows, bytes_.data() + offset_ + panel * stride_);
    });
    // The small-m layout: row blocks, which one token's product reads as a single stream.
    if (w.d_in % 32 != 0) return;
    const std::size_t blocks = (w.d_out + kRowBlock - 1) / kRowBlock;
    block_bytes_ = row_block_bytes(isa, f.id, w.d_in);
    blocks_.resize(checked_add(checked_mul(blocks, block_bytes_, "row blocks"), 63, "row blocks"));
    blocks_offset_ = (64 - reinterpret_cast<std::uintptr_t>(blocks_.data()) % 64) % 64;
    threads::parallel_chunks(blocks, 1, threads, bytes, [&](std::size_t, std::size_t b0, std::size_t b1) {
        for (std::size_t b = b0; b < b1; ++b)
            pack_row_block(isa, gw, b * kRowBlock, blocks_.data() + blocks_offset_ + b * block_bytes_);
    });
}

}  // namespace wush::cpu
