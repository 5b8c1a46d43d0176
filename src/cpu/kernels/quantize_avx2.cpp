// AVX2 tile kernel of the fused transform + quantization: 8 tokens x one block per call, one token
// per lane. The algorithm and its certification are those of quantize_avx512.cpp (read its
// header comment); AVX2 lacks getexp/scalef and mask registers, so exponents come from the float
// bits (valid because certified groups have amax in [2^-60, 2^60]) and masks are vectors.
// Compiled with AVX2 target flags: see kernels.h for what this file may include.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "cpu/kernels/kernels.h"
#include "cpu/kernels/lane_blocks.h"
#include "cpu/kernels/transpose_avx2.h"
#include "formats/certified_constants.h"

namespace wush::cpu::avx2 {

namespace {

using namespace simd256;

using namespace formats::certified;  // kU, kTiny, kHuge, kAbsSlack, kGammaRoundUp, ...

__m256 load8(const void* x, int dtype, std::size_t offset) {
    switch (dtype) {
        case 1: {  // f16
            const __m128i h =
                _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(x) + offset));
            return _mm256_cvtph_ps(h);
        }
        case 2: {  // bf16
            const __m128i h =
                _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(x) + offset));
            return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
        }
        default: return _mm256_loadu_ps(static_cast<const float*>(x) + offset);
    }
}

template <int G>
void load_columns(const QuantTile& tile, __m256 xc[G]) {
    for (int part = 0; part < G / 8; ++part) {
        __m256 r[8];
#pragma GCC unroll 32
        for (int row = 0; row < 8; ++row)
            r[row] = row < tile.rows ? load8(tile.x, tile.dtype,
                                             (tile.row0 + std::size_t(row)) * tile.d_in + tile.block * std::size_t(G) +
                                                 std::size_t(8 * part))
                                     : _mm256_setzero_ps();
        transpose8(r);
#pragma GCC unroll 32
        for (int j = 0; j < 8; ++j) xc[8 * part + j] = r[j];
    }
}

template <int G>
void multiply(const float* t, const __m256 xc[G], __m256 y[G]) {
    for (int i0 = 0; i0 < G; i0 += 8) {
        __m256 acc[8];
#pragma GCC unroll 32
        for (int ii = 0; ii < 8; ++ii) acc[ii] = _mm256_setzero_ps();
// Not unrolled: fully unrolled, GCC spills the accumulators.
#pragma GCC unroll 1
        for (int j = 0; j < G; ++j) {
            const __m256 xj = xc[j];
#pragma GCC unroll 32
            for (int ii = 0; ii < 8; ++ii)
                acc[ii] = _mm256_fmadd_ps(_mm256_broadcast_ss(t + (i0 + ii) * G + j), xj, acc[ii]);
        }
#pragma GCC unroll 32
        for (int ii = 0; ii < 8; ++ii) y[i0 + ii] = acc[ii];
    }
}

// y = T x for one block with dot products and horizontal sums; with kNorm, also the block's max
// row norm, rounded up, into *norm (see quantize_avx512.cpp).
template <int G, bool kNorm>
void multiply_row(const float* t, const __m256 x[G / 8], __m256 y[G / 8], float* norm, const float* ahead) {
    __m256 rows2 = _mm256_setzero_ps();
#pragma GCC unroll 1
    for (int i0 = 0; i0 < G; i0 += 8) {
        __m256 p[8], q[8];
#pragma GCC unroll 8
        for (int ii = 0; ii < 8; ++ii) {
            prefetch_row<G>(ahead, i0 + ii);
            const __m256 t0 = _mm256_loadu_ps(t + (i0 + ii) * G);
            p[ii] = _mm256_mul_ps(t0, x[0]);
            if (kNorm) q[ii] = _mm256_mul_ps(t0, t0);
#pragma GCC unroll 4
            for (int h = 1; h < G / 8; ++h) {
                const __m256 th = _mm256_loadu_ps(t + (i0 + ii) * G + 8 * h);
                p[ii] = _mm256_fmadd_ps(th, x[h], p[ii]);
                if (kNorm) q[ii] = _mm256_fmadd_ps(th, th, q[ii]);
            }
        }
        y[i0 / 8] = transpose_sum8(p);
        if (kNorm) rows2 = _mm256_max_ps(rows2, transpose_sum8(q));
    }
    if (kNorm) {
        alignas(32) float v[8];
        _mm256_store_ps(v, rows2);
        float m = v[0];
        for (int i = 1; i < 8; ++i) m = v[i] > m ? v[i] : m;
        *norm = __builtin_sqrtf(m) * (1.0f + 1e-5f);
    }
}

// x's even and odd elements: xe[h] lane l = x[16h + 2l], xo[h] lane l = x[16h + 2l + 1] (the
// entries that the bf16 pairs' low and high halves multiply).
template <int G>
void split_even_odd(const __m256 x[G / 8], __m256 xe[G / 16], __m256 xo[G / 16]) {
#pragma GCC unroll 2
    for (int h = 0; h < G / 16; ++h) {
        // Within 128-bit halves: a0 a2 b0 b2 | a4 a6 b4 b6; then the 64-bit pieces in order.
        const __m256 e = _mm256_shuffle_ps(x[2 * h], x[2 * h + 1], _MM_SHUFFLE(2, 0, 2, 0));
        const __m256 o = _mm256_shuffle_ps(x[2 * h], x[2 * h + 1], _MM_SHUFFLE(3, 1, 3, 1));
        xe[h] = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), _MM_SHUFFLE(3, 1, 2, 0)));
        xo[h] = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(o), _MM_SHUFFLE(3, 1, 2, 0)));
    }
}

// multiply_row from the matrix's bf16 pairs (QuantTile::pairs): a row is G / 2 words, half the
// float row's bytes; each word's halves are two entries, exactly float32 once shifted into place.
// The same products, summed in another order (the bound holds for any order).
template <int G>
void multiply_row_pairs(const std::uint32_t* t, const __m256 xe[G / 16], const __m256 xo[G / 16], __m256 y[G / 8],
                        const std::uint32_t* ahead) {
    const __m256i high = _mm256_set1_epi32(int(0xFFFF0000u));
#pragma GCC unroll 1
    for (int i0 = 0; i0 < G; i0 += 8) {
        __m256 p[8];
#pragma GCC unroll 8
        for (int ii = 0; ii < 8; ++ii) {
            prefetch_pairs_row<G>(ahead, i0 + ii);
            p[ii] = _mm256_setzero_ps();
#pragma GCC unroll 2
            for (int h = 0; h < G / 16; ++h) {
                const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + (i0 + ii) * (G / 2) + 8 * h));
                p[ii] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(w, 16)), xe[h], p[ii]);
                p[ii] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(w, high)), xo[h], p[ii]);
            }
        }
        y[i0 / 8] = transpose_sum8(p);
    }
}

// Lanes = blocks block..block+7 of token row0 (see quantize_avx512.cpp's load_blocks, and there
// why the matrices are prefetched).
template <int G>
void load_blocks(const QuantTile& tile, __m256 y[G], __m256& ss, __m256& norm) {
    __m256 r[G / 8][8];
    alignas(32) float sums[8], norms[8] = {};
#pragma GCC unroll 1
    for (int lane = 0; lane < 8; ++lane) {
        __m256 x[G / 8], v[G / 8];
        __m256 sq = _mm256_setzero_ps();
#pragma GCC unroll 4
        for (int h = 0; h < G / 8; ++h) {
            x[h] = lane < tile.rows
                       ? load8(tile.x, tile.dtype, tile.row0 * tile.d_in + (tile.block + std::size_t(lane)) * G + 8 * h)
                       : _mm256_setzero_ps();
            sq = _mm256_fmadd_ps(x[h], x[h], sq);
        }
        const __m128 h2 = _mm_add_ps(_mm256_castps256_ps128(sq), _mm256_extractf128_ps(sq, 1));
        const __m128 h1 = _mm_add_ps(h2, _mm_movehl_ps(h2, h2));
        sums[lane] = _mm_cvtss_f32(_mm_add_ss(h1, _mm_shuffle_ps(h1, h1, 1)));
        if (tile.matrix != nullptr && lane < tile.rows) {
            const LaneMatrix m = lane_matrix(tile, lane, &norms[lane]);
            if (m.pairs != nullptr && m.given) {  // the pairs path computes no norms
                __m256 xe[G / 16], xo[G / 16];
                split_even_odd<G>(x, xe, xo);
                multiply_row_pairs<G>(m.pairs, xe, xo, v, m.pairs_ahead);
            } else if (m.given) {
                multiply_row<G, false>(m.t, x, v, nullptr, m.ahead);
            } else {
                multiply_row<G, true>(m.t, x, v, &norms[lane], m.ahead);
            }
        }
#pragma GCC unroll 4
        for (int h = 0; h < G / 8; ++h) r[h][lane] = tile.matrix != nullptr && lane < tile.rows ? v[h] : x[h];
    }
#pragma GCC unroll 4
    for (int h = 0; h < G / 8; ++h) {
        transpose8(r[h]);
#pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) y[8 * h + i] = r[h][i];
    }
    ss = _mm256_load_ps(sums);
    norm = _mm256_load_ps(norms);  // computed or given above; 0 for the identity
}

__m256 abs_ps(__m256 v) {
    return _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF)));
}
__m256 lt(__m256 a, __m256 b) {
    return _mm256_cmp_ps(a, b, _CMP_LT_OQ);
}
__m256i as_int(__m256 v) {
    return _mm256_castps_si256(v);
}

// 2^k for integer-valued float k in [-126, 127], from the bits.
__m256 pow2(__m256i k) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k, _mm256_set1_epi32(127)), 23));
}
// floor(log2(a)) of normal positive a, from the bits.
__m256i exponent(__m256 a) {
    return _mm256_sub_epi32(_mm256_srli_epi32(as_int(a), 23), _mm256_set1_epi32(127));
}

// E2M1 RNE of v (the same comparisons as codec::e2m1_encode). `dist` becomes the smaller of
// itself and |v|'s distance to the nearer threshold of its rounding interval, `zmin` the smaller
// of itself and |v| (0, where only the sign changes, is checked apart: near_boundary()).
__m256i e2m1_encode(__m256 v, __m256& dist, __m256& zmin) {
    const __m256 a = abs_ps(v);
    const __m256 b2 = _mm256_cmp_ps(a, _mm256_set1_ps(1.75f), _CMP_GE_OQ);
    const __m256 t1 = _mm256_blendv_ps(_mm256_set1_ps(0.75f), _mm256_set1_ps(3.5f), b2);
    const __m256 b1 = _mm256_cmp_ps(a, t1, _CMP_GE_OQ);
    const __m256i idx = _mm256_or_si256(_mm256_and_si256(as_int(b2), _mm256_set1_epi32(2)),
                                        _mm256_and_si256(as_int(b1), _mm256_set1_epi32(1)));
    const __m256 t0 = _mm256_permutevar8x32_ps(_mm256_setr_ps(0.25f, 1.25f, 2.5f, 5.0f, 0, 0, 0, 0), idx);
    const __m256 b0 = _mm256_cmp_ps(a, t0, _CMP_GT_OQ);
    const __m256i m = _mm256_or_si256(_mm256_slli_epi32(idx, 1), _mm256_and_si256(as_int(b0), _mm256_set1_epi32(1)));
    const __m256 lo =
        _mm256_permutevar8x32_ps(_mm256_setr_ps(-__builtin_inff(), 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f), m);
    const __m256 hi =
        _mm256_permutevar8x32_ps(_mm256_setr_ps(0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, __builtin_inff()), m);
    dist = _mm256_min_ps(dist, _mm256_min_ps(_mm256_sub_ps(a, lo), _mm256_sub_ps(hi, a)));
    zmin = _mm256_min_ps(zmin, a);
    const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(as_int(v), 28), _mm256_set1_epi32(8));
    return _mm256_or_si256(m, sign);
}

// As the AVX-512 kernel's (quantize_avx512.cpp says why counting a distance above 3 as 3 keeps
// values beyond kMaxScaled certified): the lanes to redo.
__m256 near_boundary(__m256 dist, __m256 tol, __m256 zmin, __m256 tol0, __m256 bound) {
    const __m256 capped = _mm256_min_ps(dist, _mm256_set1_ps(kMaxScaled - 5.0f));
    return _mm256_or_ps(lt(capped, tol), _mm256_and_ps(_mm256_cmp_ps(zmin, tol0, _CMP_LE_OQ),
                                                       _mm256_cmp_ps(bound, _mm256_setzero_ps(), _CMP_GT_OQ)));
}

struct Lanes {
    __m256 bound;
    __m256 redo;  // all-ones lanes: recompute in float64
};

template <int G>
void put_code(__m256i d[G / 8], int i, __m256i code) {
    d[i / 8] = _mm256_or_si256(d[i / 8], _mm256_slli_epi32(code, 4 * (i % 8)));
}

std::size_t lane_token(const QuantTile& t, int l) {
    return t.by_block ? t.row0 : t.row0 + std::size_t(l);
}
std::size_t lane_block(const QuantTile& t, int l) {
    return t.by_block ? t.block + std::size_t(l) : t.block;
}

template <int G>
void store_codes(const QuantTile& tile, const __m256i d[G / 8]) {
    alignas(32) std::uint8_t buf[4][32];
    if (G == 32) {  // buf[r] half L = tile lane 4L + r
        const __m256i t0 = _mm256_unpacklo_epi32(d[0], d[1]), t1 = _mm256_unpackhi_epi32(d[0], d[1]);
        const __m256i t2 = _mm256_unpacklo_epi32(d[2], d[3]), t3 = _mm256_unpackhi_epi32(d[2], d[3]);
        _mm256_store_si256(reinterpret_cast<__m256i*>(buf[0]), _mm256_unpacklo_epi64(t0, t2));
        _mm256_store_si256(reinterpret_cast<__m256i*>(buf[1]), _mm256_unpackhi_epi64(t0, t2));
        _mm256_store_si256(reinterpret_cast<__m256i*>(buf[2]), _mm256_unpacklo_epi64(t1, t3));
        _mm256_store_si256(reinterpret_cast<__m256i*>(buf[3]), _mm256_unpackhi_epi64(t1, t3));
    } else {
        _mm256_store_si256(reinterpret_cast<__m256i*>(buf[0]), _mm256_unpacklo_epi32(d[0], d[1]));
        _mm256_store_si256(reinterpret_cast<__m256i*>(buf[1]), _mm256_unpackhi_epi32(d[0], d[1]));
    }
    for (int l = 0; l < tile.rows; ++l) {
        std::uint8_t* dst =
            tile.codes + lane_token(tile, l) * (tile.d_in / 2) + lane_block(tile, l) * std::size_t(G / 2);
        if (G == 32) std::memcpy(dst, buf[l % 4] + 16 * (l / 4), 16);
        else std::memcpy(dst, buf[(l % 4) / 2] + 16 * (l / 4) + 8 * (l % 2), 8);
    }
}

void store_scales(const QuantTile& tile, __m256i s, int bytes) {
    alignas(32) std::int32_t v[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(v), s);
    const std::size_t blocks = tile.d_in / std::size_t(tile.group);
    for (int l = 0; l < tile.rows; ++l) {
        std::uint8_t* p = tile.scales + (lane_token(tile, l) * blocks + lane_block(tile, l)) * std::size_t(bytes);
        p[0] = std::uint8_t(v[l] & 0xFF);
        if (bytes == 2) p[1] = std::uint8_t((v[l] >> 8) & 0xFF);
    }
}

template <int G>
__m256 abs_max(const __m256 y[G]) {
    __m256 m = _mm256_setzero_ps();
#pragma GCC unroll 32
    for (int i = 0; i < G; ++i) m = _mm256_max_ps(m, abs_ps(y[i]));
    return m;
}

__m256 out_of_range(__m256 amax) {
    const __m256 ok = _mm256_and_ps(_mm256_cmp_ps(amax, _mm256_set1_ps(kTiny), _CMP_GE_OQ),
                                    _mm256_cmp_ps(amax, _mm256_set1_ps(kHuge), _CMP_LE_OQ));
    return _mm256_xor_ps(ok, _mm256_castsi256_ps(_mm256_set1_epi32(-1)));
}

template <int G>
void quantize_mx(const QuantTile& tile, const __m256 y[G], Lanes& l, bool ocp) {
    const __m256 amax = abs_max<G>(y);
    l.redo = _mm256_or_ps(l.redo, out_of_range(amax));
    const __m256i e = exponent(amax);
    const __m256 p = pow2(e);
    l.redo = _mm256_or_ps(l.redo, _mm256_or_ps(lt(_mm256_sub_ps(amax, p), l.bound),
                                               lt(_mm256_sub_ps(_mm256_add_ps(p, p), amax), l.bound)));
    const __m256i es = ocp ? _mm256_sub_epi32(e, _mm256_set1_epi32(2)) : e;
    const __m256 scale_down = pow2(_mm256_sub_epi32(_mm256_setzero_si256(), es));  // 2^-es, |es| <= 62
    // factor x 2^-es is exact, so y * mult rounds once, as (y 2^-es) x factor.
    const __m256 mult = _mm256_mul_ps(scale_down, _mm256_set1_ps(ocp ? 1.0f : 3.0f));
    // The transform's error in units of v, plus the rounding of the scaling (|v| <= kMaxScaled).
    const __m256 tol0 = _mm256_mul_ps(l.bound, mult);
    const __m256 tol = _mm256_fmadd_ps(l.bound, mult, _mm256_set1_ps(kMaxScaled * 2.0f * kU));
    __m256i d[G / 8];
#pragma GCC unroll 32
    for (int q = 0; q < G / 8; ++q) d[q] = _mm256_setzero_si256();
    __m256 dist = _mm256_set1_ps(__builtin_inff()), zmin = dist;
#pragma GCC unroll 32
    for (int i = 0; i < G; ++i) put_code<G>(d, i, e2m1_encode(_mm256_mul_ps(y[i], mult), dist, zmin));
    l.redo = _mm256_or_ps(l.redo, near_boundary(dist, tol, zmin, tol0, l.bound));
    store_codes<G>(tile, d);
    store_scales(tile, _mm256_add_epi32(es, _mm256_set1_epi32(127)), 1);
}

template <int G>
void quantize_nvfp4(const QuantTile& tile, const __m256 y[G], Lanes& l) {
    const __m256 amax = abs_max<G>(y);
    l.redo = _mm256_or_ps(l.redo, out_of_range(amax));
    const __m256 w = _mm256_mul_ps(_mm256_mul_ps(amax, _mm256_set1_ps(10.0f)), _mm256_set1_ps(1.0f / 6.0f));
    const __m256 tol_w =
        _mm256_fmadd_ps(w, _mm256_set1_ps(4.0f * kU), _mm256_mul_ps(l.bound, _mm256_set1_ps(10.0f / 6.0f * 1.01f)));
    // w >= 2^-61 here (certified lanes), so the bits give its exponent; E4M3's is at least -6.
    const __m256i ew = _mm256_max_epi32(exponent(w), _mm256_set1_epi32(-6));
    const __m256 step = pow2(_mm256_sub_epi32(ew, _mm256_set1_epi32(3)));
    const __m256 t = _mm256_mul_ps(w, pow2(_mm256_sub_epi32(_mm256_set1_epi32(3), ew)));
    const __m256 rt = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 margin = _mm256_mul_ps(_mm256_sub_ps(_mm256_set1_ps(0.5f), abs_ps(_mm256_sub_ps(t, rt))), step);
    l.redo = _mm256_or_ps(l.redo, lt(margin, tol_w));
    const __m256 sv = _mm256_min_ps(_mm256_mul_ps(rt, step), _mm256_set1_ps(448.0f));
    const __m256 normal = _mm256_cmp_ps(sv, _mm256_set1_ps(0x1p-6f), _CMP_GE_OQ);
    const __m256i byte_sub = _mm256_cvtps_epi32(_mm256_mul_ps(sv, _mm256_set1_ps(512.0f)));
    const __m256i byte_norm = _mm256_sub_epi32(_mm256_srli_epi32(as_int(sv), 20), _mm256_set1_epi32(120 << 3));
    const __m256i sbyte = _mm256_blendv_epi8(byte_sub, byte_norm, as_int(normal));
    const __m256 zero = _mm256_cmp_ps(sv, _mm256_setzero_ps(), _CMP_EQ_OQ);
    l.redo = _mm256_or_ps(l.redo, _mm256_and_ps(zero, _mm256_cmp_ps(l.bound, _mm256_setzero_ps(), _CMP_GT_OQ)));
    const __m256 mult = _mm256_andnot_ps(zero, _mm256_div_ps(_mm256_set1_ps(10.0f), sv));
    // The transform's error in units of v (mult rounded: 1.01), plus the roundings of mult and
    // y * mult (|v| <= kMaxScaled).
    const __m256 tol0 = _mm256_mul_ps(l.bound, _mm256_mul_ps(mult, _mm256_set1_ps(1.01f)));
    const __m256 tol = _mm256_add_ps(tol0, _mm256_set1_ps(kMaxScaled * 3.0f * kU));
    __m256i d[G / 8];
#pragma GCC unroll 32
    for (int q = 0; q < G / 8; ++q) d[q] = _mm256_setzero_si256();
    __m256 dist = _mm256_set1_ps(__builtin_inff()), zmin = dist;
#pragma GCC unroll 32
    for (int i = 0; i < G; ++i) put_code<G>(d, i, e2m1_encode(_mm256_mul_ps(y[i], mult), dist, zmin));
    l.redo = _mm256_or_ps(l.redo, near_boundary(dist, tol, zmin, tol0, l.bound));
    store_codes<G>(tile, d);
    store_scales(tile, sbyte, 1);
}

template <int G>
void quantize_int4(const QuantTile& tile, const __m256 y[G], Lanes& l) {
    const __m256 amax = abs_max<G>(y);
    l.redo = _mm256_or_ps(l.redo, out_of_range(amax));
    __m256 ss = _mm256_setzero_ps();
#pragma GCC unroll 32
    for (int i = 0; i < G; ++i) ss = _mm256_fmadd_ps(y[i], y[i], ss);
    const __m256 w =
        _mm256_mul_ps(_mm256_sqrt_ps(_mm256_mul_ps(ss, _mm256_set1_ps(1.0f / G))), _mm256_set1_ps(kInt4ScalePerRmsF));
    const __m256 tol_w = _mm256_fmadd_ps(w, _mm256_set1_ps(float(G + 8) * kU),
                                         _mm256_mul_ps(l.bound, _mm256_set1_ps(kInt4ScalePerRmsF * 1.01f)));
    const __m256i wb = as_int(w);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(wb, 16), _mm256_set1_epi32(1));
    const __m256i rb = _mm256_and_si256(_mm256_add_epi32(_mm256_add_epi32(wb, _mm256_set1_epi32(0x7FFF)), lsb),
                                        _mm256_set1_epi32(int(0xFFFF0000u)));
    const __m256 mid = _mm256_castsi256_ps(
        _mm256_or_si256(_mm256_and_si256(wb, _mm256_set1_epi32(int(0xFFFF0000u))), _mm256_set1_epi32(0x8000)));
    l.redo = _mm256_or_ps(l.redo, lt(abs_ps(_mm256_sub_ps(w, mid)), tol_w));
    const __m256 sv = _mm256_castsi256_ps(rb);
    const __m256 inv = _mm256_div_ps(_mm256_set1_ps(1.0f), sv);
    const __m256 tol_base = _mm256_mul_ps(l.bound, _mm256_mul_ps(inv, _mm256_set1_ps(1.01f)));
    __m256i d[G / 8];
#pragma GCC unroll 32
    for (int q = 0; q < G / 8; ++q) d[q] = _mm256_setzero_si256();
    __m256 near = _mm256_setzero_ps();
#pragma GCC unroll 32
    for (int i = 0; i < G; ++i) {
        const __m256 t = _mm256_mul_ps(y[i], inv);
        const __m256 tol = _mm256_fmadd_ps(abs_ps(t), _mm256_set1_ps(3.0f * kU), tol_base);
        const __m256 rnd = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        near = _mm256_or_ps(near, _mm256_and_ps(lt(abs_ps(_mm256_sub_ps(t, rnd)), tol),
                                                _mm256_cmp_ps(abs_ps(rnd), _mm256_set1_ps(7.0f), _CMP_LE_OQ)));
        // y / s underflowing to -0 floors to 0 where float64 floors a tiny negative to -1.
        near = _mm256_or_ps(near, _mm256_and_ps(_mm256_cmp_ps(t, _mm256_setzero_ps(), _CMP_EQ_OQ),
                                                _mm256_cmp_ps(y[i], _mm256_setzero_ps(), _CMP_NEQ_OQ)));
        __m256 q = _mm256_floor_ps(t);
        q = _mm256_min_ps(_mm256_max_ps(q, _mm256_set1_ps(-8.0f)), _mm256_set1_ps(7.0f));
        put_code<G>(d, i, _mm256_and_si256(_mm256_cvtps_epi32(q), _mm256_set1_epi32(0xF)));
    }
    l.redo = _mm256_or_ps(l.redo, near);
    store_codes<G>(tile, d);
    store_scales(tile, _mm256_srli_epi32(rb, 16), 2);
}

template <int G>
std::uint32_t quantize_tile_g(const QuantTile& tile) {
    __m256 y[G], ss, norm;
    if (tile.by_block) {
        load_blocks<G>(tile, y, ss, norm);
    } else {
        __m256 xc[G];
        load_columns<G>(tile, xc);
        ss = _mm256_setzero_ps();
#pragma GCC unroll 32
        for (int j = 0; j < G; ++j) ss = _mm256_fmadd_ps(xc[j], xc[j], ss);
        if (tile.matrix != nullptr) {
            multiply<G>(tile.matrix, xc, y);
        } else {
#pragma GCC unroll 32
            for (int i = 0; i < G; ++i) y[i] = xc[i];
        }
        norm = _mm256_set1_ps(tile.matrix ? tile.row_norms[0] : 0.0f);
    }
    Lanes l;
    l.redo = _mm256_xor_ps(_mm256_cmp_ps(ss, _mm256_set1_ps(0x1p126f), _CMP_LE_OQ),
                           _mm256_castsi256_ps(_mm256_set1_epi32(-1)));
    const float c = float(G + 2) * kU * kGammaRoundUp;  // gamma_G, rounded up
    l.bound = tile.matrix == nullptr ? _mm256_setzero_ps()
                                     : _mm256_fmadd_ps(_mm256_mul_ps(_mm256_sqrt_ps(ss), norm), _mm256_set1_ps(c),
                                                       _mm256_set1_ps(kAbsSlack));
    switch (tile.format) {
        case 0: quantize_mx<G>(tile, y, l, false); break;
        case 3: quantize_mx<G>(tile, y, l, true); break;
        case 1: quantize_nvfp4<G>(tile, y, l); break;
        default: quantize_int4<G>(tile, y, l); break;
    }
    return std::uint32_t(_mm256_movemask_ps(l.redo)) & ((1u << tile.rows) - 1u);
}

}  // namespace

std::uint32_t quantize_tile(const QuantTile& tile) {
    return tile.group == 16 ? quantize_tile_g<16>(tile) : quantize_tile_g<32>(tile);
}

float max_row_norm(const float* matrix, int group) {
    float best = 0.0f;
    for (int i = 0; i < group; ++i) {
        __m256 s = _mm256_setzero_ps();
        for (int j = 0; j < group; j += 8) {
            const __m256 r = _mm256_loadu_ps(matrix + i * group + j);
            s = _mm256_fmadd_ps(r, r, s);
        }
        const __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
        const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
        const float v = _mm_cvtss_f32(_mm_add_ss(q, _mm_shuffle_ps(q, q, 1)));
        best = v > best ? v : best;
    }
    return __builtin_sqrtf(best) * (1.0f + 1e-5f);
}

}  // namespace wush::cpu::avx2
