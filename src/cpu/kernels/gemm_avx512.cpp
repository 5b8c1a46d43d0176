// AVX-512 VNNI kernels of the W4A4 GEMM (kernels.h describes the operands and the bias trick).
// Compiled with AVX-512 target flags: see kernels.h for what this file may include.
//
// Two kernels:
//  - gemv_rows (m <= 4): streams each weight row in its packed form. A 64-byte chunk holds 128
//    elements; its low nibbles (even elements) and high nibbles (odd ones) are looked up into
//    biased bytes and multiplied (vpdpbusd) with the activations' even / odd elements, laid out
//    the same way. Dword lane L then sums 8 elements of one group, so the group scales apply per
//    lane, and the lanes are summed once per output. One token's product only reads each weight
//    byte once, so the work per byte decides its speed: several weight rows at a time (4 of the
//    packed matrix, the 8 of a prepared layer's row block) share the activation loads, and the
//    scales are decoded 16 groups at a time. A prepared layer's row blocks store each span of 16
//    groups group-major, so a group sums in int32 across the span and is scaled once.
//  - panel_multiply (m > 4): a packed panel of 32 weight rows (for each group, G/4 steps of
//    32 rows x 4 bytes) against 4 activation rows at a time: each step broadcasts 4 activation
//    bytes per row and accumulates 4 x 2 vectors of 16 int32 dot products, which are scaled into
//    float accumulators once per group.
// GCC 12 reports its own AVX-512 intrinsics' deliberately undefined operands (__Y) as uninitialized.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "cpu/kernels/kernels.h"
#include "cpu/kernels/transpose_avx2.h"
#include "cpu/kernels/transpose_avx512.h"

namespace wush::cpu::avx512 {

namespace {

using namespace simd256;
using namespace simd512;

constexpr int kMxfp4 = 0, kNvfp4 = 1, kInt4 = 2;

bool is_int4(int format) {
    return format == kInt4;
}
int bias_of(int format) {
    return is_int4(format) ? 15 : 12;
}

// Code nibble -> doubled value + bias (weights, unsigned).
__m128i weight_lut(int format) {
    if (is_int4(format)) return _mm_setr_epi8(16, 18, 20, 22, 24, 26, 28, 30, 0, 2, 4, 6, 8, 10, 12, 14);
    return _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
}

// Code nibble -> doubled value (activations, signed).
__m128i act_lut(int format) {
    if (is_int4(format)) return _mm_setr_epi8(1, 3, 5, 7, 9, 11, 13, 15, -15, -13, -11, -9, -7, -5, -3, -1);
    return _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
}

__mmask64 byte_mask(std::size_t n) {
    return n >= 64 ? ~__mmask64(0) : (__mmask64(1) << n) - 1;
}

std::uint32_t load_u32(const void* p) {
    std::uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// ---- output -----------------------------------------------------------------------------------

__m256i to_bf16(__m512 v) {  // RNE; NaN stays a quiet NaN
    const __m512i b = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7FFF)), lsb), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7FC0));
    return _mm512_cvtepi32_epi16(r);
}

// Both stores add the bias, if any, before the rounding, and note NaN or infinite values as
// stored (a finite float32 can round to a bf16 infinity) in *out.non_finite (kernels.h).
void store16(const GemmOutput& out, std::size_t r, std::size_t n, __m512 v, __mmask16 mask) {
    if (out.bias != nullptr) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, out.bias + n));
    if (out.dtype == 2) {
        const __m256i h = to_bf16(v);
        const __m256i exp = _mm256_set1_epi16(0x7F80);
        *out.non_finite |= _mm256_mask_cmpeq_epi16_mask(mask, _mm256_and_si256(h, exp), exp);
        _mm256_mask_storeu_epi16(static_cast<std::uint16_t*>(out.y) + r * out.ld + n, mask, h);
    } else {
        const __m512i exp = _mm512_set1_epi32(0x7F800000);
        *out.non_finite |= _mm512_mask_cmpeq_epi32_mask(mask, _mm512_and_si512(_mm512_castps_si512(v), exp), exp);
        _mm512_mask_storeu_ps(static_cast<float*>(out.y) + r * out.ld + n, mask, v);
    }
}

void store_scalar(const GemmOutput& out, std::size_t r, std::size_t n, float v) {
    store16(out, r, n, _mm512_set1_ps(v), __mmask16(1));
}

// The lane sums of eight accumulators, in one vector (lane j: the sum of a[j]), each added up in
// the very order _mm512_reduce_add_ps adds (GCC's: halves, quarters, then lanes 0+2, 1+3, then
// those two), so the values are bit for bit those of eight reductions, in a quarter of the
// instructions, and stored with one store instead of eight.
[[gnu::always_inline]] inline __m512 reduce8(const __m512 a[8]) {
    __m512 p[4];  // p[k]: lanes 0-7 rows 2k, lanes 8-15 rows 2k + 1, each s[i] = a[i] + a[i + 8]
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k)
        p[k] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * k], a[2 * k + 1], 0x44),
                             _mm512_shuffle_f32x4(a[2 * k], a[2 * k + 1], 0xEE));
    // q[h]: quarter j = row 4h + j, t[i] = s[i] + s[i + 4]
    __m512 q[2];
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h)
        q[h] = _mm512_add_ps(_mm512_shuffle_f32x4(p[2 * h], p[2 * h + 1], 0x88),
                             _mm512_shuffle_f32x4(p[2 * h], p[2 * h + 1], 0xDD));
    // Quarter j: u of row j (lanes 0, 1) and of row j + 4 (lanes 2, 3), u[i] = t[i] + t[i + 2]
    const __m512 u = _mm512_add_ps(_mm512_shuffle_ps(q[0], q[1], 0x44), _mm512_shuffle_ps(q[0], q[1], 0xEE));
    // Quarter j: row j's sum u[0] + u[1] in lane 0, row j + 4's in lane 1
    const __m512 f = _mm512_add_ps(_mm512_shuffle_ps(u, u, 0x88), _mm512_shuffle_ps(u, u, 0xDD));
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0), f);
}

// ---- weight scales of a 128-element chunk, one per dword lane ---------------------------------

__m512 decode_e8m0(__m512i c) {
    const __m512i bits = _mm512_slli_epi32(c, 23);
    const __mmask16 zero = _mm512_cmpeq_epi32_mask(c, _mm512_setzero_si512());
    return _mm512_castsi512_ps(_mm512_mask_mov_epi32(bits, zero, _mm512_set1_epi32(0x00400000)));  // 2^-127
}

__m512 decode_e4m3(__m512i c) {
    const __m512i mag = _mm512_and_si512(c, _mm512_set1_epi32(0x7F));
    const __m512i normal = _mm512_add_epi32(_mm512_slli_epi32(mag, 20), _mm512_set1_epi32(120 << 23));
    const __m512 sub = _mm512_mul_ps(_mm512_cvtepi32_ps(mag), _mm512_set1_ps(0x1p-9f));
    const __mmask16 is_sub =
        _mm512_cmpeq_epi32_mask(_mm512_and_si512(mag, _mm512_set1_epi32(0x78)), _mm512_setzero_si512());
    const __m512 v = _mm512_mask_mov_ps(_mm512_castsi512_ps(normal), is_sub, sub);
    const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(c, _mm512_set1_epi32(0x80)), 24);
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(v), sign));
}

// ---- group scales of a span: 16 consecutive groups of a row -----------------------------------
//
// The row-streaming kernel decodes a row's weight scales 16 groups at a time (a span: 4 chunks of
// 128 elements for G = 32, 2 for G = 16), multiplies them by the activation row's group scales
// once, and hands each chunk its lanes with one permute: decoding each chunk's few scales on its
// own took as many instructions as the chunk's products.

__mmask16 lane_mask(std::size_t n) {
    return __mmask16(n >= 16 ? 0xFFFFu : (1u << n) - 1u);
}

// The 16 weight scales of a span (1 byte each, INT4 2) at `span`; groups past `left` read as 0.
// (Not as E8M0's code 0, 2^-127: a subnormal operand costs a multiply a microcode assist.)
__m512 weight_span_scales(int format, const std::uint8_t* span, std::size_t left) {
    const __mmask16 valid = lane_mask(left);
    if (format == kInt4) {  // BF16: the upper half of a float
        const __m256i h = _mm256_maskz_loadu_epi16(valid, span);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    const __m512i c = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(valid, span));
    return format == kNvfp4 ? decode_e4m3(c) : _mm512_maskz_mov_ps(valid, decode_e8m0(c));
}

std::size_t group_of(int format) {
    return format == kNvfp4 ? 16 : 32;
}

// 128-element chunks per span: G / 8.
std::size_t span_chunks(int format) {
    return group_of(format) / 8;
}

// Permute indices: lane i of chunk j of a span covers elements 128 j + 8 i .. + 7, which lie in
// group (128 j + 8 i) / G of the span.
struct SpanLanes {
    __m512i index[4];
    std::size_t chunks;  // span_chunks
};

SpanLanes span_lanes(int format) {
    SpanLanes s;
    s.chunks = span_chunks(format);
    const int group = int(group_of(format));
    for (int j = 0; j < 4; ++j) {
        alignas(64) std::int32_t idx[16];
        for (int i = 0; i < 16; ++i) idx[i] = (128 * j + 8 * i) / group % 16;
        s.index[j] = _mm512_load_si512(idx);
    }
    return s;
}

// ---- activation preparation ---------------------------------------------------------------------

}  // namespace

void prepare_rows(const GemmActivations& a, const std::uint8_t* codes, std::size_t r0, std::size_t r1, std::int8_t* x8,
                  std::int32_t* corr) {
    const __m512i lut = _mm512_broadcast_i32x4(act_lut(a.format));
    const __m512i ones = _mm512_set1_epi8(1), lo4 = _mm512_set1_epi16(0x000F), hi4 = _mm512_set1_epi16(0x00F0);
    const int bias = bias_of(a.format);
    const std::size_t k = a.k, g = std::size_t(a.group);
    for (std::size_t r = r0; r < r1; ++r) {
        const std::uint8_t* src = codes + r * (k / 2);
        for (std::size_t i = 0; i < k; i += 64) {
            const std::size_t elems = k - i < 64 ? k - i : 64;
            const __m256i v = _mm256_maskz_loadu_epi8(__mmask32(byte_mask(elems / 2)), src + i / 2);
            const __m512i w = _mm512_cvtepu8_epi16(v);  // element pair (2j, 2j+1) -> word j
            const __m512i e = _mm512_or_si512(_mm512_and_si512(w, lo4), _mm512_slli_epi16(_mm512_and_si512(w, hi4), 4));
            const __m512i x = _mm512_shuffle_epi8(lut, e);
            _mm512_mask_storeu_epi8(x8 + r * k + i, byte_mask(elems), x);
            const __m512i sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, x);  // 4 bytes per lane
            for (std::size_t g0 = 0; g0 < elems; g0 += g) {
                const __mmask16 lanes = __mmask16(((1u << (g / 4)) - 1u) << (g0 / 4));
                corr[r * a.groups + (i + g0) / g] = -bias * _mm512_mask_reduce_add_epi32(lanes, sums);
            }
        }
    }
}

void prepare_split(const GemmActivations& a, const std::uint8_t* codes, std::size_t r0, std::size_t r1, std::int8_t* xe,
                   std::int8_t* xo, std::int32_t* lane_corr) {
    const __m512i lut = _mm512_broadcast_i32x4(act_lut(a.format));
    const __m512i ones = _mm512_set1_epi8(1), low = _mm512_set1_epi8(0x0F);
    const __m512i neg_bias = _mm512_set1_epi32(-bias_of(a.format));
    const std::size_t row_bytes = a.k / 2, half = a.k_pad / 2, lanes = a.k_pad / 8;
    for (std::size_t r = r0; r < r1; ++r) {
        for (std::size_t c = 0; c < a.k_pad / 128; ++c) {
            const __mmask64 valid = byte_mask(row_bytes - 64 * c);
            const __m512i v = _mm512_maskz_loadu_epi8(valid, codes + r * row_bytes + 64 * c);
            // Padding stays 0 (not the value of code 0, which is +1 for INT4).
            const __m512i e = _mm512_maskz_shuffle_epi8(valid, lut, _mm512_and_si512(v, low));
            const __m512i o = _mm512_maskz_shuffle_epi8(valid, lut, _mm512_and_si512(_mm512_srli_epi16(v, 4), low));
            _mm512_storeu_si512(xe + r * half + 64 * c, e);
            _mm512_storeu_si512(xo + r * half + 64 * c, o);
            const __m512i s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, e), ones, o);
            _mm512_storeu_si512(lane_corr + r * lanes + 16 * c, _mm512_mullo_epi32(s, neg_bias));
        }
    }
}

// ---- row streaming (small m) --------------------------------------------------------------------

namespace {

// Where R weight rows' chunks and scale spans lie: the packed matrix row after row, or a prepared
// layer's row block (the rows interleaved span by span, so that the R rows are one stream).
// Chunk jj of span s of row j is at codes + s code_span_step + jj chunk_step + j row_step.
struct RowView {
    const std::uint8_t* codes;   // chunk 0 of the first row
    std::size_t row_step;        // bytes from a row's chunk to the next row's same chunk
    std::size_t chunk_step;      // bytes from a chunk of a span to the span's next chunk
    std::size_t code_span_step;  // bytes from a span's first chunk to the next span's
    const std::uint8_t* scales;  // span 0 of the first row
    std::size_t scale_row_step;  // bytes from a row's span to the next row's same span
    std::size_t span_step;       // bytes from a row's span to its next span
};

std::size_t scale_bytes_of(int format) {
    return is_int4(format) ? 2 : 1;
}

RowView plain_rows(const GemmWeights& w, std::size_t n) {
    const std::size_t row_bytes = w.k / 2, sb = scale_bytes_of(w.format), scale_row = w.groups * sb;
    return {w.codes + n * row_bytes,  row_bytes, 64,     64 * span_chunks(w.format),
            w.scales + n * scale_row, scale_row, 16 * sb};
}

// The R weight rows of `v` (outputs n .. n + R - 1) against activation rows r0 .. r0 + M - 1 (the
// split layout): the rows share every activation load, and each weight chunk is decoded once for
// the M activation rows. A lane's value is what one row at a time would give: (weight scale x
// activation scale) x its integer dot, accumulated chunk by chunk, the lanes summed at the end.
// Outputs n .. n + stored - 1 are stored (a block's rows past the matrix are not).
template <int M, int R>
void gemv_block(const GemmActivations& a, const SpanLanes& sl, const RowView& v, std::size_t n, std::size_t stored,
                std::size_t r0, const GemmOutput& out) {
    const int format = a.format;
    const __m512i lut = _mm512_broadcast_i32x4(weight_lut(format)), low = _mm512_set1_epi8(0x0F);
    const std::size_t row_bytes = a.k / 2, chunks = a.k_pad / 128, half = a.k_pad / 2, lanes = a.k_pad / 8;
    __m512 acc_f[R][M];
#pragma GCC unroll 32
    for (int j = 0; j < R; ++j)
#pragma GCC unroll 32
        for (int r = 0; r < M; ++r) acc_f[j][r] = _mm512_setzero_ps();
    for (std::size_t c0 = 0, g0 = 0, span = 0; c0 < chunks; c0 += sl.chunks, g0 += 16, ++span) {
        const std::size_t left = a.groups - g0;
        __m512 cs[R][M];
#pragma GCC unroll 32
        for (int j = 0; j < R; ++j) {
            const __m512 ws =
                weight_span_scales(format, v.scales + std::size_t(j) * v.scale_row_step + span * v.span_step, left);
#pragma GCC unroll 32
            for (int r = 0; r < M; ++r)
                cs[j][r] = _mm512_mul_ps(
                    ws, _mm512_maskz_loadu_ps(lane_mask(left), a.scale + (r0 + std::size_t(r)) * a.groups + g0));
        }
        const std::size_t c1 = c0 + sl.chunks < chunks ? c0 + sl.chunks : chunks;
        const std::uint8_t* span_codes = v.codes + span * v.code_span_step;
        for (std::size_t c = c0; c < c1; ++c) {
            const __m512i idx = sl.index[c - c0];
            const std::size_t left_bytes = row_bytes - 64 * c;
            __m512i xe[M], xo[M], corr[M];
#pragma GCC unroll 32
            for (int r = 0; r < M; ++r) {
                const std::size_t row = r0 + std::size_t(r);
                xe[r] = _mm512_loadu_si512(a.xe + row * half + 64 * c);
                xo[r] = _mm512_loadu_si512(a.xo + row * half + 64 * c);
                corr[r] = _mm512_loadu_si512(a.lane_corr + row * lanes + 16 * c);
            }
#pragma GCC unroll 32
            for (int j = 0; j < R; ++j) {
                const std::uint8_t* wr = span_codes + (c - c0) * v.chunk_step + std::size_t(j) * v.row_step;
                _mm_prefetch(reinterpret_cast<const char*>(wr + kPrefetchBytes), _MM_HINT_T0);
                const __m512i wv =
                    left_bytes >= 64 ? _mm512_loadu_si512(wr) : _mm512_maskz_loadu_epi8(byte_mask(left_bytes), wr);
                const __m512i wl = _mm512_shuffle_epi8(lut, _mm512_and_si512(wv, low));
                const __m512i wh = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(wv, 4), low));
#pragma GCC unroll 32
                for (int r = 0; r < M; ++r) {
                    const __m512i acc = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(corr[r], wl, xe[r]), wh, xo[r]);
                    acc_f[j][r] =
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_permutexvar_ps(idx, cs[j][r]), acc_f[j][r]);
                }
            }
        }
    }
#pragma GCC unroll 32
    for (int j = 0; j < R; ++j)
        if (std::size_t(j) < stored)
#pragma GCC unroll 32
            for (int r = 0; r < M; ++r)
                store_scalar(out, r0 + std::size_t(r), n + std::size_t(j), _mm512_reduce_add_ps(acc_f[j][r]));
}

// Weight rows n0 .. n1 of the packed matrix: R rows at a time, then the rest one at a time.
template <int M, int R>
void gemv(const GemmActivations& a, const GemmWeights& w, std::size_t n0, std::size_t n1, std::size_t r0,
          const GemmOutput& out) {
    const SpanLanes sl = span_lanes(a.format);
    std::size_t n = n0;
    for (; n + R <= n1; n += R) gemv_block<M, R>(a, sl, plain_rows(w, n), n, R, r0, out);
    for (; n < n1; ++n) gemv_block<M, 1>(a, sl, plain_rows(w, n), n, 1, r0, out);
}

// ---- prepared row blocks (small m) ------------------------------------------------------------
//
// Row block layout (kRowBlock rows): span after span (16 groups, C = G / 8 chunks of 64 bytes per
// vector), each holding 16 scales per vector (block_scale_bytes each, the area rounded up to 64
// bytes) and then its chunks (chunk jj of vector v at 64 (nv jj + v), nv vectors per chunk): one
// sequential stream. Vector lanes hold (row, group) pairs, p = lanes_per_row lanes per row: a
// full span has p = 16 (nv = 8 vectors: vector v = row v, lane L = group L of the span), a last
// span of q < 16 groups the smallest of 2, 4, 8, 16 that holds q, so that a short tail (576 = 512
// + 64 elements, say) has nv = p / 2 vectors per chunk instead of 8, and takes only their bytes
// (a tail span as large as a full one made a 576-wide layer 1.8x its weights' bytes, which one
// token streaming from memory paid for). Lane L of chunk jj holds the 4 bytes jj of its group
// (elements 8 jj .. 8 jj + 7 of the group): a group's C pieces sit in one lane, so it sums in
// int32 over the span's chunks and its scale applies once. Rows past the matrix and groups past q
// are zero, their scales 1 (E8M0) or 0.

// A row block's weight scales: E8M0 bytes (MXFP4); BF16 for INT4 (its own format) and NVFP4,
// whose E4M3 scales convert exactly (3 mantissa bits, exponents within BF16's). Decoding E4M3 in
// the kernel took 12 operations per vector of 16 groups, as many as the span's two chunks' lookups
// and products; BF16 takes 2, for 16 more bytes per 144.
std::size_t block_scale_bytes(int format) {
    return format == kNvfp4 || is_int4(format) ? 2 : 1;
}

__m512 block_span_scales(int format, const std::uint8_t* scales) {
    if (block_scale_bytes(format) == 2) {  // BF16: the upper half of a float
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    return decode_e8m0(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales))));
}

// Bytes of a span's scales area and of the whole span, for nv vectors per chunk (multiples of 64).
std::size_t span_scales_bytes(int format, std::size_t nv) {
    return (nv * 16 * block_scale_bytes(format) + 63) / 64 * 64;
}

std::size_t span_bytes(int format, std::size_t nv) {
    return span_scales_bytes(format, nv) + 64 * span_chunks(format) * nv;
}

std::size_t lanes_per_row(std::size_t q) {
    return q <= 2 ? 2 : q <= 4 ? 4 : q <= 8 ? 8 : 16;
}

// Where one span's activation chunks lie (chunk jj of row r at e / o + r stride + 64 jj).
struct SpanActs {
    const std::int8_t* e;
    const std::int8_t* o;
    std::size_t stride;
};

// The activation side of one span for M rows, lane by lane like the span's vectors: the groups'
// corrections and scales (zero past q).
template <int M>
struct SpanGroups {
    __m512i corr[M];
    __m512 scale[M];
};

template <int M>
SpanGroups<M> span_groups(const GemmActivations& a, std::size_t g0, std::size_t q, std::size_t r0) {
    SpanGroups<M> s;
#pragma GCC unroll 4
    for (int r = 0; r < M; ++r) {
        const std::size_t at = (r0 + std::size_t(r)) * a.groups + g0;
        s.corr[r] = _mm512_maskz_loadu_epi32(lane_mask(q), a.corr + at);
        s.scale[r] = _mm512_maskz_loadu_ps(lane_mask(q), a.scale + at);
    }
    const std::size_t p = lanes_per_row(q);
    if (p == 16) return s;
    alignas(64) std::int32_t idx[16];  // lane l: group l mod p, or lane 15, which is 0 (q < 16)
    for (std::size_t l = 0; l < 16; ++l) idx[l] = l % p < q ? int(l % p) : 15;
    const __m512i index = _mm512_load_si512(idx);
#pragma GCC unroll 4
    for (int r = 0; r < M; ++r) {
        s.corr[r] = _mm512_permutexvar_epi32(index, s.corr[r]);
        s.scale[r] = _mm512_permutexvar_ps(index, s.scale[r]);
    }
    return s;
}

// Vectors v0 .. v0 + V - 1 of one span against M activation rows: the int32 sums of each lane's
// group over the span's chunks (started at the corrections), times the lane's weight scale and
// activation scale, added to (Accumulate) or stored in acc[v][r].
template <int M, int V, bool Accumulate>
[[gnu::always_inline]] inline void span_product(const GemmActivations& a, const std::uint8_t* span, std::size_t nv,
                                                std::size_t v0, const SpanActs& x, const SpanGroups<M>& g,
                                                __m512 acc[V][M]) {
    const __m512i lut = _mm512_broadcast_i32x4(weight_lut(a.format)), low = _mm512_set1_epi8(0x0F);
    const std::uint8_t* codes = span + span_scales_bytes(a.format, nv);
    __m512i sum[V][M];
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v)
#pragma GCC unroll 4
        for (int r = 0; r < M; ++r) sum[v][r] = g.corr[r];
    for (std::size_t jj = 0; jj < span_chunks(a.format); ++jj) {
        __m512i xe[M], xo[M];
#pragma GCC unroll 4
        for (int r = 0; r < M; ++r) {
            xe[r] = _mm512_loadu_si512(x.e + std::size_t(r) * x.stride + 64 * jj);
            xo[r] = _mm512_loadu_si512(x.o + std::size_t(r) * x.stride + 64 * jj);
        }
#pragma GCC unroll 8
        for (int v = 0; v < V; ++v) {
            const std::uint8_t* wr = codes + 64 * (nv * jj + v0 + std::size_t(v));
            _mm_prefetch(reinterpret_cast<const char*>(wr + kPrefetchBytes), _MM_HINT_T0);
            const __m512i wv = _mm512_loadu_si512(wr);
            const __m512i wl = _mm512_shuffle_epi8(lut, _mm512_and_si512(wv, low));
            const __m512i wh = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(wv, 4), low));
#pragma GCC unroll 4
            for (int r = 0; r < M; ++r)
                sum[v][r] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(sum[v][r], wl, xe[r]), wh, xo[r]);
        }
    }
    const std::size_t sb = block_scale_bytes(a.format);
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) {
        const __m512 ws = block_span_scales(a.format, span + 16 * sb * (v0 + std::size_t(v)));
#pragma GCC unroll 4
        for (int r = 0; r < M; ++r) {
            const __m512 s = _mm512_mul_ps(ws, g.scale[r]);
            acc[v][r] = Accumulate ? _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[v][r]), s, acc[v][r])
                                   : _mm512_mul_ps(_mm512_cvtepi32_ps(sum[v][r]), s);
        }
    }
}

// The 8 rows' sums of a short tail's V = p / 2 vectors (p lanes per row), in lanes 0 .. 7.
template <int V>
[[gnu::always_inline]] inline __m512 tail_rows(const __m512 t[V]) {
    __m512 s[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {  // lane i p: the sum of the vector's row i
        s[v] = _mm512_add_ps(t[v], _mm512_shuffle_ps(t[v], t[v], 0xB1));
        if constexpr (V >= 2) s[v] = _mm512_add_ps(s[v], _mm512_shuffle_ps(s[v], s[v], 0x4E));
        if constexpr (V >= 4) s[v] = _mm512_add_ps(s[v], _mm512_shuffle_f32x4(s[v], s[v], 0xB1));
    }
    if constexpr (V == 1)
        return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 0, 0, 0, 0, 0, 0, 0), s[0]);
    if constexpr (V == 2)
        return _mm512_permutex2var_ps(s[0], _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 0, 0, 0, 0, 0, 0, 0),
                                      s[1]);
    if constexpr (V == 4) {
        const __m512i pairs = _mm512_setr_epi32(0, 8, 16, 24, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
        return _mm512_permutex2var_ps(_mm512_permutex2var_ps(s[0], pairs, s[1]),
                                      _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 0, 0, 0, 0, 0, 0, 0, 0),
                                      _mm512_permutex2var_ps(s[2], pairs, s[3]));
    }
}

// A short tail (p < 16) of one block against M activation rows: each row's 8 outputs' share.
template <int M, int V>
[[gnu::always_inline]] inline void short_tail(const GemmActivations& a, const std::uint8_t* span, const SpanActs& x,
                                              const SpanGroups<M>& g, __m512 rows[M]) {
    __m512 t[V][M];
    span_product<M, V, false>(a, span, V, 0, x, g, t);
#pragma GCC unroll 4
    for (int r = 0; r < M; ++r) {
        __m512 tr[V];
#pragma GCC unroll 4
        for (int v = 0; v < V; ++v) tr[v] = t[v][r];
        rows[r] = tail_rows<V>(tr);
    }
}

// One row block (outputs n .. n + valid - 1) against activation rows r0 .. r0 + M - 1, the split
// layout regrouped by regroup_split.
// `last`: the activation side of the last span if it is short (the same for every block).
template <int M>
void grouped_block(const GemmActivations& a, const std::uint8_t* block, std::size_t n, std::size_t valid,
                   std::size_t r0, const SpanGroups<M>& last, const GemmOutput& out) {
    constexpr int H = M == 1 ? 8 : 4;  // vectors per pass: more rows' accumulators would spill
    const std::size_t chunks = span_chunks(a.format), full = a.groups / 16, q = a.groups % 16;
    const std::size_t half = a.k_pad / 2;
    __m512 acc[8][M], tail[M];
#pragma GCC unroll 8
    for (int v = 0; v < 8; ++v)
#pragma GCC unroll 4
        for (int r = 0; r < M; ++r) acc[v][r] = _mm512_setzero_ps();
    for (std::size_t s = 0; s < full; ++s) {
        const std::uint8_t* span = block + s * span_bytes(a.format, kRowBlock);
        const SpanActs x{a.xe + r0 * half + 64 * chunks * s, a.xo + r0 * half + 64 * chunks * s, half};
        const SpanGroups<M> g = span_groups<M>(a, 16 * s, 16, r0);
#pragma GCC unroll 2
        for (int v0 = 0; v0 < 8; v0 += H) span_product<M, H, true>(a, span, kRowBlock, std::size_t(v0), x, g, acc + v0);
    }
    const std::uint8_t* span = block + full * span_bytes(a.format, kRowBlock);
    const SpanActs x{a.xt + r0 * 2 * kTailBytes, a.xt + r0 * 2 * kTailBytes + kTailBytes, 2 * kTailBytes};
#pragma GCC unroll 4
    for (int r = 0; r < M; ++r) tail[r] = _mm512_setzero_ps();
    switch (q == 0 ? 0 : lanes_per_row(q)) {
        case 2: short_tail<M, 1>(a, span, x, last, tail); break;
        case 4: short_tail<M, 2>(a, span, x, last, tail); break;
        case 8: short_tail<M, 4>(a, span, x, last, tail); break;
        case 16:  // one vector per row, like a full span
#pragma GCC unroll 2
            for (int v0 = 0; v0 < 8; v0 += H)
                span_product<M, H, true>(a, span, kRowBlock, std::size_t(v0), x, last, acc + v0);
            break;
        default: break;
    }
#pragma GCC unroll 4
    for (int r = 0; r < M; ++r) {
        const __m512 rows[8] = {acc[0][r], acc[1][r], acc[2][r], acc[3][r], acc[4][r], acc[5][r], acc[6][r], acc[7][r]};
        store16(out, r0 + std::size_t(r), n, _mm512_add_ps(reduce8(rows), tail[r]), lane_mask(valid));
    }
}

template <int M>
void grouped_blocks(const GemmActivations& a, const std::uint8_t* blocks, std::size_t block_bytes, std::size_t n0,
                    std::size_t n1, std::size_t r0, const GemmOutput& out) {
    const std::size_t q = a.groups % 16;
    const SpanGroups<M> last = q != 0 ? span_groups<M>(a, a.groups - q, q, r0) : SpanGroups<M>{};
    for (std::size_t n = n0; n < n1; n += kRowBlock)
        grouped_block<M>(a, blocks + n / kRowBlock * block_bytes, n, n1 - n < kRowBlock ? n1 - n : kRowBlock, r0, last,
                         out);
}
}  // namespace

void gemv_rows(const GemmActivations& a, const GemmWeights& w, std::size_t n0, std::size_t n1, const GemmOutput& out) {
    switch (a.m) {
        case 1: gemv<1, 4>(a, w, n0, n1, 0, out); break;
        case 2: gemv<2, 2>(a, w, n0, n1, 0, out); break;
        case 3: gemv<3, 2>(a, w, n0, n1, 0, out); break;
        default:  // 4 rows' operands would not fit in L1 next to the streamed weights: 2 + 2
            gemv<2, 2>(a, w, n0, n1, 0, out);
            gemv<2, 2>(a, w, n0, n1, 2, out);
            break;
    }
}

std::size_t row_block_bytes(int format, std::size_t k) {
    const std::size_t groups = k / group_of(format), q = groups % 16;
    return groups / 16 * span_bytes(format, kRowBlock) + (q != 0 ? span_bytes(format, lanes_per_row(q) / 2) : 0);
}

void pack_row_block(const GemmWeights& w, std::size_t n0, std::uint8_t* block) {
    std::memset(block, 0, row_block_bytes(w.format, w.k));
    const std::size_t sb = scale_bytes_of(w.format), bsb = block_scale_bytes(w.format), chunks = span_chunks(w.format),
                      g_bytes = group_of(w.format) / 2;
    const std::size_t valid = w.n - n0 < kRowBlock ? w.n - n0 : kRowBlock;
    const bool e8m0 = !is_int4(w.format) && w.format != kNvfp4;
    for (std::size_t s = 0, g0 = 0; g0 < w.groups; ++s, g0 += 16) {
        const std::size_t q = w.groups - g0 < 16 ? w.groups - g0 : 16, p = lanes_per_row(q), nv = p / 2;
        std::uint8_t* span = block + s * span_bytes(w.format, kRowBlock);  // only the last span is short
        const std::size_t codes_at = span_scales_bytes(w.format, nv);
        // Unused lanes (rows past the matrix, groups past q) multiply zero sums by their scale:
        // E8M0's code 0 would be 2^-127, a subnormal, which costs the multiply a microcode assist.
        if (e8m0) std::memset(span, 127, codes_at);
        for (std::size_t j = 0; j < valid; ++j) {
            const std::size_t v = j * p / 16, lane0 = j * p % 16;  // row j's vector and first lane
            const std::uint8_t* codes = w.codes + (n0 + j) * (w.k / 2) + g0 * g_bytes;
            const std::uint8_t* scales = w.scales + ((n0 + j) * w.groups + g0) * sb;
            for (std::size_t g = 0; g < q; ++g) {
                std::uint8_t* scale = span + (16 * v + lane0 + g) * bsb;
                if (w.format == kNvfp4) {  // as BF16 (block_scale_bytes): exact, the low half is zero
                    const float f = _mm512_cvtss_f32(decode_e4m3(_mm512_set1_epi32(scales[g])));
                    std::uint32_t bits;
                    std::memcpy(&bits, &f, 4);
                    const std::uint16_t h = std::uint16_t(bits >> 16);
                    std::memcpy(scale, &h, 2);
                } else {
                    std::memcpy(scale, scales + g * sb, sb);
                }
                for (std::size_t jj = 0; jj < chunks; ++jj)
                    std::memcpy(span + codes_at + 64 * (nv * jj + v) + 4 * (lane0 + g), codes + 4 * (g * chunks + jj),
                                4);
            }
        }
    }
}

void regroup_split(const GemmActivations& a, std::int8_t* xe, std::int8_t* xo, std::int8_t* xt) {
    const std::size_t chunks = span_chunks(a.format), span = 64 * chunks, half = a.k_pad / 2;
    const std::size_t full = a.groups / 16, q = a.groups % 16, p = lanes_per_row(q);
    std::int8_t tmp[4 * 64];
    for (std::size_t i = 0; i < 2 * a.m; ++i) {  // row i / 2, even (xe) or odd (xo) elements
        std::int8_t* x = (i % 2 == 0 ? xe : xo) + i / 2 * half;
        for (std::size_t s = 0; s < full; ++s) {  // in place: lane g of chunk jj is word g C + jj
            std::memcpy(tmp, x + s * span, span);
            for (std::size_t jj = 0; jj < chunks; ++jj)
                for (std::size_t g = 0; g < 16; ++g)
                    std::memcpy(x + s * span + 64 * jj + 4 * g, tmp + 4 * (g * chunks + jj), 4);
        }
        if (q == 0) continue;
        std::int8_t* t = xt + i * kTailBytes;  // the tail, once per row of each vector
        std::memset(t, 0, kTailBytes);
        for (std::size_t jj = 0; jj < chunks; ++jj)
            for (std::size_t l = 0; l < 16; ++l)
                if (l % p < q) std::memcpy(t + 64 * jj + 4 * l, x + full * span + 4 * (l % p * chunks + jj), 4);
    }
}

void rows_multiply(const GemmActivations& a, const std::uint8_t* blocks, std::size_t block_bytes, std::size_t n0,
                   std::size_t n1, const GemmOutput& out) {
    switch (a.m) {
        case 1: grouped_blocks<1>(a, blocks, block_bytes, n0, n1, 0, out); break;
        case 2: grouped_blocks<2>(a, blocks, block_bytes, n0, n1, 0, out); break;
        case 3: grouped_blocks<3>(a, blocks, block_bytes, n0, n1, 0, out); break;
        default:  // as gemv_rows: 2 + 2
            grouped_blocks<2>(a, blocks, block_bytes, n0, n1, 0, out);
            grouped_blocks<2>(a, blocks, block_bytes, n0, n1, 2, out);
            break;
    }
}

// ---- panels (larger m) --------------------------------------------------------------------------

namespace {

// Exponents (a.alpha_rest != 0): a group adds scalef(dot, e_a + e_b) = dot * 2^(e_a + e_b), exact
// above float32's normal minimum (the scales are powers of two), with one rounding in the sum, as
// on the multiplies' path. The exponents come from VGETEXPPS (exact, also for E8M0's subnormal
// 2^-127; the zero scales of a panel's padding rows give -inf and so 0).
template <int M, int G, bool Exponents>
void panel_tile(const GemmActivations& a, const std::uint8_t* panel, std::size_t n0, std::size_t m0,
                const GemmOutput& out, std::size_t n_total) {
    constexpr std::size_t kGroupBytes = kPanelRows * (G + 4);
    __m512 yacc[M][2];
#pragma GCC unroll 32
    for (int r = 0; r < M; ++r) yacc[r][0] = yacc[r][1] = _mm512_setzero_ps();
    for (std::size_t g = 0; g < a.groups; ++g) {
        const std::uint8_t* pg = panel + g * kGroupBytes;
        const std::int8_t* xg = a.x8 + m0 * a.k + g * G;
        __m512i acc[M][2];
#pragma GCC unroll 32
        for (int r = 0; r < M; ++r)
            acc[r][0] = acc[r][1] = _mm512_set1_epi32(a.corr[(m0 + std::size_t(r)) * a.groups + g]);
#pragma GCC unroll 32
        for (int s = 0; s < G / 4; ++s) {
            const __m512i w0 = _mm512_load_si512(pg + s * 128), w1 = _mm512_load_si512(pg + s * 128 + 64);
#pragma GCC unroll 32
            for (int r = 0; r < M; ++r) {
                const __m512i xb = _mm512_set1_epi32(int(load_u32(xg + std::size_t(r) * a.k + 4 * s)));
                acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], w0, xb);
                acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], w1, xb);
            }
        }
        const __m512 sb0 = _mm512_load_ps(pg + G * kPanelRows), sb1 = _mm512_load_ps(pg + G * kPanelRows + 64);
        if constexpr (Exponents) {
            const __m512 eb0 = _mm512_getexp_ps(sb0), eb1 = _mm512_getexp_ps(sb1);
#pragma GCC unroll 32
            for (int r = 0; r < M; ++r) {
                const __m512 ea = _mm512_getexp_ps(_mm512_set1_ps(a.scale[(m0 + std::size_t(r)) * a.groups + g]));
                yacc[r][0] =
                    _mm512_add_ps(_mm512_scalef_ps(_mm512_cvtepi32_ps(acc[r][0]), _mm512_add_ps(eb0, ea)), yacc[r][0]);
                yacc[r][1] =
                    _mm512_add_ps(_mm512_scalef_ps(_mm512_cvtepi32_ps(acc[r][1]), _mm512_add_ps(eb1, ea)), yacc[r][1]);
            }
        } else {
#pragma GCC unroll 32
            for (int r = 0; r < M; ++r) {
                const __m512 sa = _mm512_set1_ps(a.scale[(m0 + std::size_t(r)) * a.groups + g]);
                yacc[r][0] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(acc[r][0]), sb0), sa, yacc[r][0]);
                yacc[r][1] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(acc[r][1]), sb1), sa, yacc[r][1]);
            }
        }
    }
    if constexpr (Exponents) {
        const __m512 rest = _mm512_set1_ps(a.alpha_rest);
#pragma GCC unroll 32
        for (int r = 0; r < M; ++r) {
            yacc[r][0] = _mm512_mul_ps(yacc[r][0], rest);
            yacc[r][1] = _mm512_mul_ps(yacc[r][1], rest);
        }
    }
    const std::size_t valid = n_total - n0 < kPanelRows ? n_total - n0 : kPanelRows;
    const __mmask16 m_lo = valid >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << valid) - 1);
    const __mmask16 m_hi = valid >= 32  ? __mmask16(0xFFFF)
                           : valid > 16 ? __mmask16((1u << (valid - 16)) - 1)
                                        : __mmask16(0);
#pragma GCC unroll 32
    for (int r = 0; r < M; ++r) {
        store16(out, m0 + std::size_t(r), n0, yacc[r][0], m_lo);
        if (m_hi) store16(out, m0 + std::size_t(r), n0 + 16, yacc[r][1], m_hi);
    }
}

template <int G, bool Exponents>
void panel_rows(const GemmActivations& a, const std::uint8_t* panel, std::size_t n0, std::size_t m0, std::size_t m1,
                const GemmOutput& out, std::size_t n_total) {
    std::size_t m = m0;
    for (; m + 4 <= m1; m += 4) panel_tile<4, G, Exponents>(a, panel, n0, m, out, n_total);
    switch (m1 - m) {
        case 3: panel_tile<3, G, Exponents>(a, panel, n0, m, out, n_total); break;
        case 2: panel_tile<2, G, Exponents>(a, panel, n0, m, out, n_total); break;
        case 1: panel_tile<1, G, Exponents>(a, panel, n0, m, out, n_total); break;
        default: break;
    }
}

}  // namespace

// The panel layout is the AVX2 kernels' (32 rows x 4 bytes per step = two 64-byte vectors of 16
// rows), and packing is memory-bound: the AVX2 code serves (every AVX-512 CPU has AVX2).
void pack_panel(const GemmWeights& w, std::size_t n0, std::uint8_t* panel) {
    avx2::pack_panel(w, n0, panel);
}

void panel_multiply(const GemmActivations& a, const std::uint8_t* panel, std::size_t n0, std::size_t m0, std::size_t m1,
                    const GemmOutput& out, std::size_t n_total) {
    if (a.group == 16) panel_rows<16, false>(a, panel, n0, m0, m1, out, n_total);  // E4M3: never exponents
    else if (a.alpha_rest != 0.0f) panel_rows<32, true>(a, panel, n0, m0, m1, out, n_total);
    else panel_rows<32, false>(a, panel, n0, m0, m1, out, n_total);
}

}  // namespace wush::cpu::avx512
