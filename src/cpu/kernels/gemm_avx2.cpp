// AVX2 kernels of the W4A4 GEMM: the structure of gemm_avx512.cpp (read its header comment) on
// 256-bit vectors, with vpmaddubsw + vpmaddwd in place of vpdpbusd. The int16 partial sums are
// exact: a pair of biased-weight x activation products is at most 2 x 30 x 15 = 900, and a group
// of 32 adds 8 of them per lane (7200 < 32767).
// Compiled with AVX2 target flags: see kernels.h for what this file may include.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "cpu/kernels/kernels.h"
#include "cpu/kernels/transpose_avx2.h"

namespace wush::cpu::avx2 {

namespace {

using namespace simd256;

constexpr int kNvfp4 = 1, kInt4 = 2;

bool is_int4(int format) {
    return format == kInt4;
}
int bias_of(int format) {
    return is_int4(format) ? 15 : 12;
}

__m256i weight_lut(int format) {
    const __m128i l = is_int4(format) ? _mm_setr_epi8(16, 18, 20, 22, 24, 26, 28, 30, 0, 2, 4, 6, 8, 10, 12, 14)
                                      : _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
    return _mm256_broadcastsi128_si256(l);
}

__m256i act_lut(int format) {
    const __m128i l = is_int4(format) ? _mm_setr_epi8(1, 3, 5, 7, 9, 11, 13, 15, -15, -13, -11, -9, -7, -5, -3, -1)
                                      : _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    return _mm256_broadcastsi128_si256(l);
}

// Loads n <= 32 bytes, zero-filling the rest (no read past n).
__m256i load_partial(const std::uint8_t* p, std::size_t n) {
    if (n >= 32) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    alignas(32) std::uint8_t buf[32] = {};
    std::memcpy(buf, p, n);
    return _mm256_load_si256(reinterpret_cast<const __m256i*>(buf));
}

// All-ones in the first n bytes.
__m256i byte_mask(std::size_t n) {
    const __m256i idx = _mm256_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
                                         22, 23, 24, 25, 26, 27, 28, 29, 30, 31);
    return _mm256_cmpgt_epi8(_mm256_set1_epi8(char(n > 32 ? 32 : n)), idx);
}

std::uint32_t load_u32(const void* p) {
    std::uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

int hsum(__m256i v) {
    const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    const __m128i t = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtsi128_si32(_mm_add_epi32(t, _mm_shuffle_epi32(t, _MM_SHUFFLE(2, 3, 0, 1))));
}

float hsum(__m256 v) {
    const __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(q, _mm_shuffle_ps(q, q, 1)));
}

// Sum of each dword lane's 4 signed bytes.
__m256i lane_sums(__m256i x) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), x), _mm256_set1_epi16(1));
}

// ---- output ---------------------------------------------------------------------------------

__m128i to_bf16(__m256 v) {
    const __m256i b = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7FFF)), lsb), 16);
    const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), _mm256_castps_si256(nan));
    // Pack the 8 low halves: within each 128-bit half, then join the halves.
    const __m256i p = _mm256_packus_epi32(r, r);
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(p, _MM_SHUFFLE(3, 1, 2, 0)));
}

void store8(const GemmOutput& out, std::size_t r, std::size_t n, __m256 v, std::size_t count) {
    if (out.bias != nullptr) {  // bias[n .. n + count), added before the rounding (kernels.h)
        alignas(32) float b[8] = {};
        std::memcpy(b, out.bias + n, 4 * count);
        v = _mm256_add_ps(v, _mm256_load_ps(b));
    }
    // NaN or infinite values as stored (after the rounding: a finite float32 can round to a bf16
    // infinity) are noted in *out.non_finite (kernels.h).
    if (out.dtype == 2) {
        const __m128i h = to_bf16(v), exp = _mm_set1_epi16(0x7F80);
        const unsigned bad = unsigned(_mm_movemask_epi8(_mm_cmpeq_epi16(_mm_and_si128(h, exp), exp)));
        *out.non_finite |= bad & ((1u << (2 * count)) - 1u);
        alignas(16) std::uint16_t b16[8];
        _mm_store_si128(reinterpret_cast<__m128i*>(b16), h);
        std::memcpy(static_cast<std::uint16_t*>(out.y) + r * out.ld + n, b16, 2 * count);
    } else {
        const __m256i exp = _mm256_set1_epi32(0x7F800000);
        const __m256i e = _mm256_and_si256(_mm256_castps_si256(v), exp);
        const unsigned bad = unsigned(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(e, exp))));
        *out.non_finite |= bad & ((1u << count) - 1u);
        alignas(32) float f[8];
        _mm256_store_ps(f, v);
        std::memcpy(static_cast<float*>(out.y) + r * out.ld + n, f, 4 * count);
    }
}

void store_scalar(const GemmOutput& out, std::size_t r, std::size_t n, float v) {
    store8(out, r, n, _mm256_set1_ps(v), 1);
}

// ---- scales ---------------------------------------------------------------------------------

__m256 decode_e8m0(__m256i c) {
    const __m256i bits = _mm256_slli_epi32(c, 23);
    const __m256i zero = _mm256_cmpeq_epi32(c, _mm256_setzero_si256());
    return _mm256_castsi256_ps(_mm256_blendv_epi8(bits, _mm256_set1_epi32(0x00400000), zero));
}

__m256 decode_e4m3(__m256i c) {
    const __m256i mag = _mm256_and_si256(c, _mm256_set1_epi32(0x7F));
    const __m256i normal = _mm256_add_epi32(_mm256_slli_epi32(mag, 20), _mm256_set1_epi32(120 << 23));
    const __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(mag), _mm256_set1_ps(0x1p-9f));
    const __m256i is_sub = _mm256_cmpeq_epi32(_mm256_and_si256(mag, _mm256_set1_epi32(0x78)), _mm256_setzero_si256());
    const __m256 v = _mm256_blendv_ps(_mm256_castsi256_ps(normal), sub, _mm256_castsi256_ps(is_sub));
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x80)), 24);
    return _mm256_castsi256_ps(_mm256_or_si256(_mm256_castps_si256(v), sign));
}

// Scales of a 32-byte piece (64 elements) of a weight row, one per dword lane (8 elements).
__m256 piece_scales(int format, const std::uint8_t* row_scales, std::size_t piece, std::size_t avail) {
    const int z = int(0x80808000u);
    const std::size_t per_piece = format == kNvfp4 || is_int4(format) ? 4 : 2;
    std::uint32_t raw = 0;
    const std::uint8_t* p = row_scales + piece * per_piece;
    if (avail >= per_piece) {  // fixed-size copies compile to single loads
        if (per_piece == 4) std::memcpy(&raw, p, 4);
        else raw = std::uint32_t(p[0] | (p[1] << 8));
    } else {
        for (std::size_t i = 0; i < avail; ++i) raw |= std::uint32_t(p[i]) << (8 * i);
    }
    const __m256i src = _mm256_set1_epi32(int(raw));
    if (format == kNvfp4)  // lane i -> group i / 2
        return decode_e4m3(_mm256_shuffle_epi8(src, _mm256_setr_epi32(z, z, z | 1, z | 1, z | 2, z | 2, z | 3, z | 3)));
    if (is_int4(format)) {  // lane i -> bf16 of group i / 4, in the upper half
        const int c0 = 0x01008080, c1 = 0x03028080;
        return _mm256_castsi256_ps(_mm256_shuffle_epi8(src, _mm256_setr_epi32(c0, c0, c0, c0, c1, c1, c1, c1)));
    }
    return decode_e8m0(_mm256_shuffle_epi8(src, _mm256_setr_epi32(z, z, z, z, z | 1, z | 1, z | 1, z | 1)));
}

}  // namespace

// ---- activation preparation -----------------------------------------------------------------

void prepare_rows(const GemmActivations& a, const std::uint8_t* codes, std::size_t r0, std::size_t r1, std::int8_t* x8,
                  std::int32_t* corr) {
    const __m256i lut = act_lut(a.format);
    const int bias = bias_of(a.format);
    const std::size_t k = a.k, g = std::size_t(a.group);
    for (std::size_t r = r0; r < r1; ++r) {
        const std::uint8_t* src = codes + r * (k / 2);
        for (std::size_t i = 0; i < k; i += 32) {
            const std::size_t elems = k - i < 32 ? k - i : 32;  // 16 or 32
            __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + i / 2));
            if (elems == 32) v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i / 2));
            const __m256i w = _mm256_cvtepu8_epi16(v);
            const __m256i e = _mm256_or_si256(_mm256_and_si256(w, _mm256_set1_epi16(0x000F)),
                                              _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x00F0)), 4));
            const __m256i x = _mm256_shuffle_epi8(lut, e);
            alignas(32) std::int8_t buf[32];
            _mm256_store_si256(reinterpret_cast<__m256i*>(buf), x);
            std::memcpy(x8 + r * k + i, buf, elems);
            const __m256i sums = lane_sums(x);
            if (g == 32) {
                corr[r * a.groups + i / 32] = -bias * hsum(sums);
            } else {
                const __m256i lo = _mm256_blend_epi32(sums, _mm256_setzero_si256(), 0xF0);
                corr[r * a.groups + i / 16] = -bias * hsum(lo);
                if (elems == 32) corr[r * a.groups + i / 16 + 1] = -bias * hsum(_mm256_sub_epi32(sums, lo));
            }
        }
    }
}

void prepare_split(const GemmActivations& a, const std::uint8_t* codes, std::size_t r0, std::size_t r1, std::int8_t* xe,
                   std::int8_t* xo, std::int32_t* lane_corr) {
    const __m256i lut = act_lut(a.format), low = _mm256_set1_epi8(0x0F);
    const __m256i neg_bias = _mm256_set1_epi32(-bias_of(a.format));
    const std::size_t row_bytes = a.k / 2, half = a.k_pad / 2, lanes = a.k_pad / 8;
    for (std::size_t r = r0; r < r1; ++r) {
        for (std::size_t p = 0; p < half / 32; ++p) {
            const std::size_t left = row_bytes > 32 * p ? row_bytes - 32 * p : 0;
            const __m256i v = load_partial(codes + r * row_bytes + 32 * p, left);
            const __m256i valid = byte_mask(left);  // padding stays 0, not the value of code 0
            const __m256i e = _mm256_and_si256(_mm256_shuffle_epi8(lut, _mm256_and_si256(v, low)), valid);
            const __m256i o =
                _mm256_and_si256(_mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), low)), valid);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(xe + r * half + 32 * p), e);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(xo + r * half + 32 * p), o);
            const __m256i s = _mm256_add_epi32(lane_sums(e), lane_sums(o));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(lane_corr + r * lanes + 8 * p),
                                _mm256_mullo_epi32(s, neg_bias));
        }
    }
}

// ---- row streaming (small m) ----------------------------------------------------------------

namespace {

template <int M>
void gemv(const GemmActivations& a, const GemmWeights& w, std::size_t n0, std::size_t n1, std::size_t r0,
          const GemmOutput& out) {
    const __m256i lut = weight_lut(w.format), low = _mm256_set1_epi8(0x0F), ones16 = _mm256_set1_epi16(1);
    const std::size_t row_bytes = w.k / 2, pieces = a.k_pad / 64, half = a.k_pad / 2, lanes = a.k_pad / 8;
    const std::size_t scale_row = w.groups * (is_int4(w.format) ? 2 : 1);
    const std::size_t per_piece = w.format == kNvfp4 || is_int4(w.format) ? 4 : 2;
    for (std::size_t n = n0; n < n1; ++n) {
        const std::uint8_t* wr = w.codes + n * row_bytes;
        const std::uint8_t* sr = w.scales + n * scale_row;
        __m256 acc_f[M];
#pragma GCC unroll 32
        for (int r = 0; r < M; ++r) acc_f[r] = _mm256_setzero_ps();
        for (std::size_t p = 0; p < pieces; ++p) {
            const std::size_t left = row_bytes > 32 * p ? row_bytes - 32 * p : 0;
            if (left == 0) break;  // the rest is padding
            const __m256i v = load_partial(wr + 32 * p, left);
            const __m256i wl = _mm256_shuffle_epi8(lut, _mm256_and_si256(v, low));
            const __m256i wh = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), low));
            const std::size_t used = p * per_piece;
            const __m256 sb = piece_scales(w.format, sr, p, scale_row > used ? scale_row - used : 0);
#pragma GCC unroll 32
            for (int r = 0; r < M; ++r) {
                const std::size_t row = r0 + std::size_t(r);
                const __m256i xe = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.xe + row * half + 32 * p));
                const __m256i xo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.xo + row * half + 32 * p));
                const __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(wl, xe), _mm256_maddubs_epi16(wh, xo));
                __m256i acc = _mm256_madd_epi16(s16, ones16);
                acc = _mm256_add_epi32(
                    acc, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.lane_corr + row * lanes + 8 * p)));
                const __m256 s = _mm256_mul_ps(sb, _mm256_loadu_ps(a.lane_scale + row * lanes + 8 * p));
                acc_f[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), s, acc_f[r]);
            }
        }
#pragma GCC unroll 32
        for (int r = 0; r < M; ++r) store_scalar(out, r0 + std::size_t(r), n, hsum(acc_f[r]));
    }
}

}  // namespace

void gemv_rows(const GemmActivations& a, const GemmWeights& w, std::size_t n0, std::size_t n1, const GemmOutput& out) {
    switch (a.m) {
        case 1: gemv<1>(a, w, n0, n1, 0, out); break;
        case 2: gemv<2>(a, w, n0, n1, 0, out); break;
        case 3: gemv<3>(a, w, n0, n1, 0, out); break;
        default:  // 4 rows' operands would not fit in L1 next to the streamed weights: 2 + 2
            gemv<2>(a, w, n0, n1, 0, out);
            gemv<2>(a, w, n0, n1, 2, out);
            break;
    }
}

// ---- row blocks (small m, prepared layers) ---------------------------------------------------

// NVFP4's E4M3 scales are stored as BF16 (exact: 3 mantissa bits, exponents within BF16's): two
// per unit and row, and decoding E4M3 in the kernel (about 11 instructions per 8) cost more than
// the 16 bytes per unit that BF16 adds.
std::size_t row_block_bytes(int format, std::size_t k) {
    const std::size_t scale_bytes = format == kNvfp4 ? 32 : is_int4(format) ? 16 : 8;
    return k / 32 * (128 + scale_bytes);
}

void pack_row_block(const GemmWeights& w, std::size_t n0, std::uint8_t* block) {
    const std::size_t g = w.k / w.groups, per_unit = 32 / g;  // groups per 32-element unit
    const bool to_bf16 = w.format == kNvfp4;
    const std::size_t src_bytes = is_int4(w.format) ? 2 : 1, sbytes = to_bf16 ? 2 : src_bytes;
    const std::size_t unit_bytes = row_block_bytes(w.format, 32), row_bytes = w.k / 2;
    const std::size_t valid = w.n - n0 < kRowBlock ? w.n - n0 : kRowBlock;
    std::memset(block, 0, row_block_bytes(w.format, w.k));  // padding rows: their outputs are never stored
    for (std::size_t u = 0; u < w.k / 32; ++u) {
        std::uint8_t* dst = block + u * unit_bytes;
        for (std::size_t row = 0; row < valid; ++row) {
            const std::uint8_t* codes = w.codes + (n0 + row) * row_bytes + 16 * u;
            for (std::size_t j = 0; j < 4; ++j) {
                std::uint8_t* d = dst + 32 * j + 4 * row;
                std::memcpy(d, codes + 4 * j, 4);
                // INT4: code c ^ 8 is q + 8, half the biased weight 2q + 1 + 15 (see row_blocks)
                if (is_int4(w.format))
                    for (int b = 0; b < 4; ++b) d[b] ^= 0x88;
            }
            const std::uint8_t* src = w.scales + ((n0 + row) * w.groups + u * per_unit) * src_bytes;
            for (std::size_t i = 0; i < per_unit; ++i) {
                std::uint8_t* scale_dst = dst + 128 + (i * kRowBlock + row) * sbytes;
                if (to_bf16) {
                    const __m256 v = decode_e4m3(_mm256_set1_epi32(src[i]));
                    const std::uint32_t bits = std::uint32_t(_mm256_cvtsi256_si32(_mm256_castps_si256(v)));
                    const std::uint16_t h = std::uint16_t(bits >> 16);  // the low half is zero
                    std::memcpy(scale_dst, &h, 2);
                } else {
                    std::memcpy(scale_dst, src + i * src_bytes, src_bytes);
                }
            }
        }
    }
}

namespace {

// The 8 weight scales of one group of a unit (one per row), as float32.
template <bool kBf16>
__m256 unit_scales(const std::uint8_t* p) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    if (kBf16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
    return decode_e8m0(_mm256_cvtepu8_epi32(raw));
}

// M activation rows x the 8 rows of each block. Lane i of every code vector belongs to row i, so
// the unit's products sum vertically: vector j's lanes take 4 code bytes (8 elements) of their
// row against the same 4 + 4 activations, broadcast. Per group, the int16 pair sums (exact: at
// most 4 x 1800 < 32767) meet in one vpmaddwd, which leaves lane i = row i's dot product.
// INT4's biased weight 2q + 1 + 15 is 2 (c ^ 8) for its code c, stored as c ^ 8 (pack_row_block):
// the nibbles multiply as they are, and the vpmaddwd by 2 restores the same exact sums, without
// the two lookups per vector that E2M1 needs.
template <int M, int G, bool kInt4>
void row_blocks(const GemmActivations& a, const std::uint8_t* blocks, std::size_t block_bytes, std::size_t n0,
                std::size_t n1, std::size_t n_total, const GemmOutput& out) {
    constexpr int kGroups = 32 / G;           // per unit
    constexpr bool kBf16 = kInt4 || G == 16;  // scales stored as BF16 (else E8M0)
    const __m256i lut = weight_lut(a.format), low = _mm256_set1_epi8(0x0F);
    const __m256i pair_weight = _mm256_set1_epi16(kInt4 ? 2 : 1);
    const std::size_t units = a.k / 32, half = a.k_pad / 2, groups = a.groups;
    const std::size_t unit_bytes = row_block_bytes(a.format, 32), scale_step = kBf16 ? 16 : 8;
    for (std::size_t nb = n0; nb < n1; nb += kRowBlock) {
        const std::uint8_t* blk = blocks + nb / kRowBlock * block_bytes;
        __m256 acc[M][kGroups];
#pragma GCC unroll 8
        for (int r = 0; r < M; ++r)
#pragma GCC unroll 2
            for (int g = 0; g < kGroups; ++g) acc[r][g] = _mm256_setzero_ps();
        for (std::size_t u = 0; u < units; ++u) {
            const std::uint8_t* pu = blk + u * unit_bytes;
            // Each of the unit's (up to 3) lines, kPrefetchBytes ahead (kernels.h).
#pragma GCC unroll 3
            for (std::size_t l = 0; l < unit_bytes; l += 64)
                _mm_prefetch(reinterpret_cast<const char*>(pu + kPrefetchBytes + l), _MM_HINT_T0);
            __m256i wl[4], wh[4];
#pragma GCC unroll 4
            for (int j = 0; j < 4; ++j) {
                const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pu + 32 * j));
                wl[j] = _mm256_and_si256(v, low);
                wh[j] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
                if constexpr (!kInt4) {
                    wl[j] = _mm256_shuffle_epi8(lut, wl[j]);
                    wh[j] = _mm256_shuffle_epi8(lut, wh[j]);
                }
            }
            __m256 ws[kGroups];
#pragma GCC unroll 2
            for (int g = 0; g < kGroups; ++g) ws[g] = unit_scales<kBf16>(pu + 128 + g * scale_step);
#pragma GCC unroll 8
            for (int r = 0; r < M; ++r) {
                const std::int8_t* xe = a.xe + std::size_t(r) * half + 16 * u;
                const std::int8_t* xo = a.xo + std::size_t(r) * half + 16 * u;
                __m256i p[4];
#pragma GCC unroll 4
                for (int j = 0; j < 4; ++j)
                    p[j] = _mm256_add_epi16(_mm256_maddubs_epi16(wl[j], _mm256_set1_epi32(int(load_u32(xe + 4 * j)))),
                                            _mm256_maddubs_epi16(wh[j], _mm256_set1_epi32(int(load_u32(xo + 4 * j)))));
                __m256i s[kGroups];
                if constexpr (G == 16) {
                    s[0] = _mm256_add_epi16(p[0], p[1]);
                    s[kGroups - 1] = _mm256_add_epi16(p[2], p[3]);
                } else {
                    s[0] = _mm256_add_epi16(_mm256_add_epi16(p[0], p[1]), _mm256_add_epi16(p[2], p[3]));
                }
                const std::size_t gi = std::size_t(r) * groups + u * kGroups;
#pragma GCC unroll 2
                for (int g = 0; g < kGroups; ++g) {
                    const __m256i d =
                        _mm256_add_epi32(_mm256_madd_epi16(s[g], pair_weight), _mm256_set1_epi32(a.corr[gi + g]));
                    acc[r][g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d),
                                                _mm256_mul_ps(ws[g], _mm256_set1_ps(a.scale[gi + g])), acc[r][g]);
                }
            }
        }
        const std::size_t count = n_total - nb < kRowBlock ? n_total - nb : kRowBlock;
#pragma GCC unroll 8
        for (int r = 0; r < M; ++r) {
            __m256 y = acc[r][0];
            if constexpr (G == 16) y = _mm256_add_ps(y, acc[r][kGroups - 1]);
            store8(out, std::size_t(r), nb, y, count);
        }
    }
}

template <int G, bool kInt4>
void rows_multiply_g(const GemmActivations& a, const std::uint8_t* blocks, std::size_t block_bytes, std::size_t n0,
                     std::size_t n1, std::size_t n_total, const GemmOutput& out) {
    switch (a.m) {
        case 1: row_blocks<1, G, kInt4>(a, blocks, block_bytes, n0, n1, n_total, out); break;
        case 2: row_blocks<2, G, kInt4>(a, blocks, block_bytes, n0, n1, n_total, out); break;
        case 3: row_blocks<3, G, kInt4>(a, blocks, block_bytes, n0, n1, n_total, out); break;
        default: row_blocks<4, G, kInt4>(a, blocks, block_bytes, n0, n1, n_total, out); break;
    }
}

}  // namespace

void rows_multiply(const GemmActivations& a, const std::uint8_t* blocks, std::size_t block_bytes, std::size_t n0,
                   std::size_t n1, std::size_t n_total, const GemmOutput& out) {
    if (a.group == 16) rows_multiply_g<16, false>(a, blocks, block_bytes, n0, n1, n_total, out);
    else if (is_int4(a.format)) rows_multiply_g<32, true>(a, blocks, block_bytes, n0, n1, n_total, out);
    else rows_multiply_g<32, false>(a, blocks, block_bytes, n0, n1, n_total, out);
}

// ---- panels (larger m) ----------------------------------------------------------------------

namespace {

// 32 (or the last 16) elements of a weight row as biased bytes in element order.
__m256i decode_group(const std::uint8_t* src, int elems, __m256i lut) {
    if (elems == 32) {
        const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
        const __m256i e = _mm256_or_si256(_mm256_and_si256(w, _mm256_set1_epi16(0x000F)),
                                          _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x00F0)), 4));
        return _mm256_shuffle_epi8(lut, e);
    }
    const __m128i w = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src)));
    const __m128i e = _mm_or_si128(_mm_and_si128(w, _mm_set1_epi16(0x000F)),
                                   _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x00F0)), 4));
    return _mm256_inserti128_si256(_mm256_setzero_si256(), _mm_shuffle_epi8(_mm256_castsi256_si128(lut), e), 0);
}

// Scales of groups b0..b0+count-1 of weight row `row` as floats (count <= 8; the rest 0).
__m256 row_scales8(const GemmWeights& w, std::size_t row, std::size_t b0, std::size_t count) {
    const std::size_t bytes = is_int4(w.format) ? 2 : 1;
    const std::uint8_t* src = w.scales + (row * w.groups + b0) * bytes;
    __m128i v;
    if (count == 8) {  // direct loads: a byte copy here would stall the vector load
        v = bytes == 2 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(src))
                       : _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src));
    } else {
        alignas(16) std::uint8_t raw[16] = {};
        std::memcpy(raw, src, count * bytes);
        v = _mm_load_si128(reinterpret_cast<const __m128i*>(raw));
    }
    if (bytes == 2) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
    const __m256i c = _mm256_cvtepu8_epi32(v);
    const __m256 f = w.format == kNvfp4 ? decode_e4m3(c) : decode_e8m0(c);
    return _mm256_and_ps(f, _mm256_castsi256_ps(byte_mask(4 * count)));  // code 0 of E8M0 is not 0.0
}

// The panel's scale rows (see gemm_avx512.cpp): 8 rows x 8 groups at a time, transposed.
void pack_scales(const GemmWeights& w, std::size_t n0, std::size_t valid, std::uint8_t* panel, std::size_t g) {
    const std::size_t group_bytes = kPanelRows * (g + 4);
    for (std::size_t part = 0; part < kPanelRows / 8; ++part) {
        for (std::size_t b0 = 0; b0 < w.groups; b0 += 8) {
            const std::size_t count = w.groups - b0 < 8 ? w.groups - b0 : 8;
            __m256 r[8];
#pragma GCC unroll 8
            for (int i = 0; i < 8; ++i) {
                const std::size_t row = 8 * part + std::size_t(i);
                r[i] = row < valid ? row_scales8(w, n0 + row, b0, count) : _mm256_setzero_ps();
            }
            transpose8(r);
            for (std::size_t j = 0; j < count; ++j)
                _mm256_store_ps(reinterpret_cast<float*>(panel + (b0 + j) * group_bytes + g * kPanelRows + 32 * part),
                                r[j]);
        }
    }
}

// M activation rows x S x 8 weight rows (sub-panels sub .. sub + S - 1 of the 32-row panel). Two
// sub-panels per tile load each broadcast activation word once for two vpmaddubsw (one per
// sub-panel), which is what the single-sub-panel tile was short of: one load per multiply.
template <int M, int S, int G>
void panel_tile(const GemmActivations& a, const std::uint8_t* panel, std::size_t sub, std::size_t n0, std::size_t m0,
                const GemmOutput& out, std::size_t valid) {
    constexpr std::size_t kGroupBytes = kPanelRows * (G + 4);
    const __m256i ones16 = _mm256_set1_epi16(1);
    __m256 yacc[M][S];
#pragma GCC unroll 32
    for (int r = 0; r < M; ++r)
#pragma GCC unroll 2
        for (int c = 0; c < S; ++c) yacc[r][c] = _mm256_setzero_ps();
    for (std::size_t g = 0; g < a.groups; ++g) {
        const std::uint8_t* pg = panel + g * kGroupBytes + 32 * sub;
        const std::int8_t* xg = a.x8 + m0 * a.k + g * G;
        __m256i acc16[M][S];
#pragma GCC unroll 32
        for (int r = 0; r < M; ++r)
#pragma GCC unroll 2
            for (int c = 0; c < S; ++c) acc16[r][c] = _mm256_setzero_si256();
#pragma GCC unroll 32
        for (int s = 0; s < G / 4; ++s) {
            __m256i w[S];
#pragma GCC unroll 2
            for (int c = 0; c < S; ++c)
                w[c] = _mm256_load_si256(reinterpret_cast<const __m256i*>(pg + s * 128 + 32 * c));
#pragma GCC unroll 32
            for (int r = 0; r < M; ++r) {
                const __m256i xb = _mm256_set1_epi32(int(load_u32(xg + std::size_t(r) * a.k + 4 * s)));
#pragma GCC unroll 2
                for (int c = 0; c < S; ++c) acc16[r][c] = _mm256_add_epi16(acc16[r][c], _mm256_maddubs_epi16(w[c], xb));
            }
// Keep the accumulators in registers step by step: left alone, GCC reassociates the
// (associative) int16 sums of the unrolled steps into trees over all products of the
// group, which spill most of them to the stack.
#pragma GCC unroll 32
            for (int r = 0; r < M; ++r)
#pragma GCC unroll 2
                for (int c = 0; c < S; ++c) asm("" : "+x"(acc16[r][c]));
        }
        __m256 sb[S];
#pragma GCC unroll 2
        for (int c = 0; c < S; ++c)
            sb[c] = _mm256_load_ps(reinterpret_cast<const float*>(pg + G * kPanelRows + 32 * c));
#pragma GCC unroll 32
        for (int r = 0; r < M; ++r) {
            const std::size_t row = m0 + std::size_t(r);
            const __m256i corr = _mm256_set1_epi32(a.corr[row * a.groups + g]);
            const __m256 sa = _mm256_set1_ps(a.scale[row * a.groups + g]);
#pragma GCC unroll 2
            for (int c = 0; c < S; ++c) {
                const __m256i acc = _mm256_add_epi32(_mm256_madd_epi16(acc16[r][c], ones16), corr);
                yacc[r][c] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(acc), sb[c]), sa, yacc[r][c]);
            }
        }
    }
#pragma GCC unroll 32
    for (int r = 0; r < M; ++r)
#pragma GCC unroll 2
        for (int c = 0; c < S; ++c) {
            const std::size_t first = 8 * (sub + std::size_t(c));
            if (first < valid)
                store8(out, m0 + std::size_t(r), n0 + first, yacc[r][c], valid - first < 8 ? valid - first : 8);
        }
}

template <int S, int G>
void panel_span(const GemmActivations& a, const std::uint8_t* panel, std::size_t sub, std::size_t n0, std::size_t m0,
                std::size_t m1, const GemmOutput& out, std::size_t valid) {
    std::size_t m = m0;
    for (; m + 4 <= m1; m += 4) panel_tile<4, S, G>(a, panel, sub, n0, m, out, valid);
    switch (m1 - m) {
        case 3: panel_tile<3, S, G>(a, panel, sub, n0, m, out, valid); break;
        case 2: panel_tile<2, S, G>(a, panel, sub, n0, m, out, valid); break;
        case 1: panel_tile<1, S, G>(a, panel, sub, n0, m, out, valid); break;
        default: break;
    }
}

template <int G>
void panel_rows(const GemmActivations& a, const std::uint8_t* panel, std::size_t n0, std::size_t m0, std::size_t m1,
                const GemmOutput& out, std::size_t n_total) {
    const std::size_t valid = n_total - n0 < kPanelRows ? n_total - n0 : kPanelRows;
    for (std::size_t sub = 0; sub * 8 < valid; sub += 2) {
        if (sub * 8 + 8 < valid) panel_span<2, G>(a, panel, sub, n0, m0, m1, out, valid);
        else panel_span<1, G>(a, panel, sub, n0, m0, m1, out, valid);  // the last 8 or fewer rows
    }
}

}  // namespace

void pack_panel(const GemmWeights& w, std::size_t n0, std::uint8_t* panel) {
    const std::size_t g = w.k / w.groups;
    const std::size_t group_bytes = kPanelRows * (g + 4), row_bytes = w.k / 2;
    const std::size_t valid = w.n - n0 < kPanelRows ? w.n - n0 : kPanelRows;
    const __m256i lut = weight_lut(w.format);
    const __m256i zero_weight = _mm256_set1_epi8(char(bias_of(w.format)));
    // 8 rows x 32 elements at a time (two groups of 16 for NVFP4): decode, transpose the 8 x 8
    // dwords, and store each 4-element step at its group's place: rows 8rb..8rb+7 of the step.
    for (std::size_t rb = 0; rb < kPanelRows / 8; ++rb) {
        for (std::size_t e0 = 0; e0 < w.k; e0 += 32) {
            const int elems = w.k - e0 >= 32 ? 32 : 16;
            __m256 r[8];
            for (std::size_t i = 0; i < 8; ++i) {
                const std::size_t row = rb * 8 + i;
                r[i] = _mm256_castsi256_ps(
                    row < valid ? decode_group(w.codes + (n0 + row) * row_bytes + e0 / 2, elems, lut) : zero_weight);
            }
            transpose8(r);
            // Step s of these 32 elements is step s % (G/4) of group e0/G + s / (G/4).
            std::uint8_t* dst = panel + (g == 32 ? e0 / 32 : e0 / 16) * group_bytes + rb * 32;
            for (int s = 0; s < elems / 4; ++s) {
                const std::size_t step = g == 32 ? std::size_t(s) : std::size_t(s & 3);
                const std::size_t next = g == 32 ? 0 : std::size_t(s >> 2) * group_bytes;
                _mm256_store_ps(reinterpret_cast<float*>(dst + next + step * 128), r[s]);
            }
        }
    }
    pack_scales(w, n0, valid, panel, std::size_t(g));
}

void panel_multiply(const GemmActivations& a, const std::uint8_t* panel, std::size_t n0, std::size_t m0, std::size_t m1,
                    const GemmOutput& out, std::size_t n_total) {
    if (a.group == 16) panel_rows<16>(a, panel, n0, m0, m1, out, n_total);
    else panel_rows<32>(a, panel, n0, m0, m1, out, n_total);
}

}  // namespace wush::cpu::avx2
