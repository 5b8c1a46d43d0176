// AVX-512 tile kernel of the fused transform + quantization: 16 tokens x one block per call, one
// token per lane. Compiled with AVX-512 target flags: see kernels.h for what this file may include.
//
// Layout. Every lane holds one group (token, block). With lanes = tokens, the tile's G columns are
// transposed so that vector j holds column j of the 16 tokens; then y_i = sum_j T[i][j] x_j is a
// chain of FMAs with T[i][j] broadcast from memory (no horizontal sums). With lanes = blocks (one
// token), each block's y = T_b x_b is computed with dot products and horizontal sums, and the 16
// results are transposed into the same layout. Either way every per-group quantity (amax, sum of
// squares, the scale) is then computed "vertically", one group per lane.
//
// Certification. y is computed in float32; the float64 definition is the reference. For the
// FMA chain, |y - y_exact| <= gamma_G * sum_j |T_ij x_j| <= gamma_G ||T_i|| ||x||  (gamma_G ~ G u,
// u = 2^-24; any summation order keeps gamma_G), bounded here by `bound`. A lane is flagged (redone in
// float64 by the driver) when any value it rounds, or its scale, lies within the bound (plus the
// float32 rounding of the scaling itself) of a rounding boundary, or when the group is tiny,
// huge or non-finite. Everything not flagged is exactly what float64 gives.
// GCC 12 reports its own AVX-512 intrinsics' deliberately undefined operands (__Y) as uninitialized.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "cpu/kernels/kernels.h"
#include "cpu/kernels/lane_blocks.h"
#include "cpu/kernels/transpose_avx2.h"
#include "cpu/kernels/transpose_avx512.h"
#include "formats/certified_constants.h"

namespace wush::cpu::avx512 {

namespace {

using namespace simd256;
using namespace simd512;

using namespace formats::certified;  // kU, kTiny, kHuge, kAbsSlack, kGammaRoundUp, ...

// ---- loading and transposing ------------------------------------------------------------------

__m512 load16(const void* x, int dtype, std::size_t offset) {
    switch (dtype) {
        case 1: {  // f16
            const __m256i h =
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const std::uint16_t*>(x) + offset));
            return _mm512_cvtph_ps(h);
        }
        case 2: {  // bf16: the upper half of a float32
            const __m256i h =
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const std::uint16_t*>(x) + offset));
            return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
        }
        default: return _mm512_loadu_ps(static_cast<const float*>(x) + offset);
    }
}

// xc[j] = column j of the tile (lane = token); missing rows are zero.
template <int G>
void load_columns(const QuantTile& tile, __m512 xc[G]) {
    for (int half = 0; half < G / 16; ++half) {
        __m512 r[16];
#pragma GCC unroll 32
        for (int row = 0; row < 16; ++row)
            r[row] = row < tile.rows ? load16(tile.x, tile.dtype,
                                              (tile.row0 + std::size_t(row)) * tile.d_in + tile.block * std::size_t(G) +
                                                  std::size_t(16 * half))
                                     : _mm512_setzero_ps();
        transpose16(r);
#pragma GCC unroll 32
        for (int j = 0; j < 16; ++j) xc[16 * half + j] = r[j];
    }
}

// y[i] = sum_j T[i][j] xc[j], j ascending (the order the error bound assumes).
template <int G>
void multiply(const float* t, const __m512 xc[G], __m512 y[G]) {
    for (int i0 = 0; i0 < G; i0 += 16) {
        __m512 acc[16];
#pragma GCC unroll 32
        for (int ii = 0; ii < 16; ++ii) acc[ii] = _mm512_setzero_ps();
// Not unrolled: fully unrolled, GCC spills the accumulators.
#pragma GCC unroll 1
        for (int j = 0; j < G; ++j) {
            const __m512 xj = xc[j];
#pragma GCC unroll 32
            for (int ii = 0; ii < 16; ++ii)
                acc[ii] = _mm512_fmadd_ps(_mm512_set1_ps(t[(i0 + ii) * G + j]), xj, acc[ii]);
        }
#pragma GCC unroll 32
        for (int ii = 0; ii < 16; ++ii) y[i0 + ii] = acc[ii];
    }
}

// The bf16 path: y = T x for 16 bf16 tokens of one block with T given as bf16 pairs (tile.pairs,
// word k of row i = T[i][2k] | T[i][2k+1] << 16). Each VDPBF16PS does two multiply-adds per lane
// (the products are exact in float32), so the transform costs half the float path's instructions,
// and the raw bf16 rows need one dword transpose instead of a conversion and two float ones.
// Within the bound: G roundings per output, in some order (gamma_G holds); the instruction treats
// subnormal inputs as zero and flushes subnormal results, which quantize_tile_g's extra bound term
// (subnormal x) and kAbsSlack (flushed products and sums) cover; subnormal T entries never get
// here (bf16_matrix_pairs refuses them). ss = sum of squares of x, for the bound.
template <int G>
__attribute__((target("avx512bf16"), noinline)) void multiply_bf16(const QuantTile& tile, __m512 y[G], __m512& ss) {
    __m512 xp[16];  // after the transpose: xp[k] lane l = pair k of token row0 + l
    const auto* x = static_cast<const std::uint16_t*>(tile.x);
#pragma GCC unroll 32
    for (int row = 0; row < 16; ++row) {
        const std::uint16_t* p = x + (tile.row0 + std::size_t(row)) * tile.d_in + tile.block * std::size_t(G);
        const __m512i v = row >= tile.rows ? _mm512_setzero_si512()
                          : G == 32        ? _mm512_loadu_si512(p)
                                    : _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
        xp[row] = _mm512_castsi512_ps(v);
    }
    transpose16(xp);
    __m512 sq = _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int k = 0; k < G / 2; ++k) sq = _mm512_dpbf16_ps(sq, (__m512bh)xp[k], (__m512bh)xp[k]);
    ss = sq;
    const std::uint32_t* t = tile.pairs;
    for (int i0 = 0; i0 < G; i0 += 16) {
        __m512 acc[16];
#pragma GCC unroll 32
        for (int ii = 0; ii < 16; ++ii) acc[ii] = _mm512_setzero_ps();
#pragma GCC unroll 1
        for (int k = 0; k < G / 2; ++k) {
            const __m512bh xk = (__m512bh)xp[k];
#pragma GCC unroll 32
            for (int ii = 0; ii < 16; ++ii)
                acc[ii] = _mm512_dpbf16_ps(acc[ii], (__m512bh)_mm512_set1_epi32(int(t[(i0 + ii) * (G / 2) + k])), xk);
        }
#pragma GCC unroll 32
        for (int ii = 0; ii < 16; ++ii) y[i0 + ii] = acc[ii];
    }
}

// y = T x for one block: dot products of T's rows with x, then horizontal sums (any summation
// order keeps the error within the bound's gamma_G). With kNorm, also the block's max row norm
// (rounded up) into *norm, from the rows just loaded: a separate pass would read T twice (a
// prepared layer gives the norms instead: matrix_norm_bounds).
template <int G, bool kNorm>
void multiply_row(const float* t, const __m512 x[G / 16], __m512 y[G / 16], float* norm, const float* ahead) {
    __m512 rows2 = _mm512_setzero_ps();
#pragma GCC unroll 1
    for (int i0 = 0; i0 < G; i0 += 16) {
        __m512 p[16], q[16];
#pragma GCC unroll 32
        for (int ii = 0; ii < 16; ++ii) {
            prefetch_row<G>(ahead, i0 + ii);
            const __m512 t0 = _mm512_loadu_ps(t + (i0 + ii) * G);
            p[ii] = _mm512_mul_ps(t0, x[0]);
            if (kNorm) q[ii] = _mm512_mul_ps(t0, t0);
            if (G == 32) {
                const __m512 t1 = _mm512_loadu_ps(t + (i0 + ii) * G + 16);
                p[ii] = _mm512_fmadd_ps(t1, x[1], p[ii]);
                if (kNorm) q[ii] = _mm512_fmadd_ps(t1, t1, q[ii]);
            }
        }
        y[i0 / 16] = transpose_sum16(p);
        if (kNorm) rows2 = _mm512_max_ps(rows2, transpose_sum16(q));
    }
    if (kNorm) *norm = __builtin_sqrtf(_mm512_reduce_max_ps(rows2)) * (1.0f + 1e-5f);
}

// multiply_row from the matrix's bf16 pairs (QuantTile::pairs): a row is G / 2 words, half the
// float row's bytes; each word's halves are two entries, exactly float32 once shifted into place,
// against x's even and odd elements. The same products, summed in another order (the bound holds
// for any order); G = 16 loads 8 words and zeroes the other lanes.
template <int G>
void multiply_row_pairs(const std::uint32_t* t, const __m512 x[G / 16], __m512 y[G / 16], const std::uint32_t* ahead) {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    const __m512 x1 = G == 32 ? x[G / 16 - 1] : _mm512_setzero_ps();
    const __m512 xe = _mm512_permutex2var_ps(x[0], even, x1), xo = _mm512_permutex2var_ps(x[0], odd, x1);
    const __m512i high = _mm512_set1_epi32(int(0xFFFF0000u));
    constexpr __mmask16 kWords = G == 32 ? 0xFFFF : 0x00FF;
#pragma GCC unroll 1
    for (int i0 = 0; i0 < G; i0 += 16) {
        __m512 p[16];
#pragma GCC unroll 32
        for (int ii = 0; ii < 16; ++ii) {
            prefetch_pairs_row<G>(ahead, i0 + ii);
            const __m512i w = _mm512_maskz_loadu_epi32(kWords, t + (i0 + ii) * (G / 2));
            p[ii] = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(w, 16)), xe);
            p[ii] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(w, high)), xo, p[ii]);
        }
        y[i0 / 16] = transpose_sum16(p);
    }
}

// Lanes = blocks block..block+15 of token row0: y[i] = element i of every lane's T_b x_b, and
// ss = every lane's sum of squares of x_b. Each block's matrix is a page of its own (G = 32: 4 KB),
// and the hardware's prefetchers stop at page ends: with the matrices coming from memory (a token
// loop over a model's layers), each block started with a miss. So every row read prefetches the
// same row kMatrixPrefetchBlocks blocks ahead (past the last block, harmlessly).
template <int G>
void load_blocks(const QuantTile& tile, __m512 y[G], __m512& ss, __m512& norm) {
    __m512 r[G / 16][16];
    alignas(64) float sums[16], norms[16] = {};
#pragma GCC unroll 1
    for (int lane = 0; lane < 16; ++lane) {
        __m512 x[G / 16], v[G / 16];
        __m512 sq = _mm512_setzero_ps();
#pragma GCC unroll 2
        for (int h = 0; h < G / 16; ++h) {
            x[h] = lane < tile.rows ? load16(tile.x, tile.dtype,
                                             tile.row0 * tile.d_in + (tile.block + std::size_t(lane)) * G + 16 * h)
                                    : _mm512_setzero_ps();
            sq = _mm512_fmadd_ps(x[h], x[h], sq);
        }
        sums[lane] = _mm512_reduce_add_ps(sq);
        if (tile.matrix != nullptr && lane < tile.rows) {
            const LaneMatrix m = lane_matrix(tile, lane, &norms[lane]);
            if (m.pairs != nullptr && m.given) multiply_row_pairs<G>(m.pairs, x, v, m.pairs_ahead);  // no norms
            else if (m.given) multiply_row<G, false>(m.t, x, v, nullptr, m.ahead);
            else multiply_row<G, true>(m.t, x, v, &norms[lane], m.ahead);
        }
#pragma GCC unroll 2
        for (int h = 0; h < G / 16; ++h) r[h][lane] = tile.matrix != nullptr && lane < tile.rows ? v[h] : x[h];
    }
#pragma GCC unroll 2
    for (int h = 0; h < G / 16; ++h) {
        transpose16(r[h]);
#pragma GCC unroll 32
        for (int i = 0; i < 16; ++i) y[16 * h + i] = r[h][i];
    }
    ss = _mm512_load_ps(sums);
    norm = _mm512_load_ps(norms);  // row norms computed or given above; 0 for the identity
}

// ---- element encoders with boundary checks ----------------------------------------------------

__m512 abs_ps(__m512 v) {
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7FFFFFFF)));
}

// E2M1 RNE of v. `dist` becomes the smaller of itself and |v|'s distance to the nearer threshold
// of its rounding interval, `zmin` the smaller of itself and |v| (0 is the boundary where only the
// sign changes, which the scaling's rounding cannot move: near_boundary() treats it apart). The
// code is looked up by |v|'s exponent and top two mantissa bits: each threshold (0.25, 0.75, 1.25,
// 1.75, 2.5, 3.5, 5) has at most two mantissa bits, so it starts such a bucket and every bucket
// lies on one side of it. The table rounds a value exactly on a threshold up, where RNE may round
// down; its distance is 0, so the lane is flagged and float64 decides it (a wrong table entry
// would only flag more lanes: the value then lies outside its code's interval).
__m512i e2m1_encode(__m512 v, __m512& dist, __m512& zmin) {
    const __m512 a = abs_ps(v);
    // Bucket (exponent, 2 mantissa bits) = bits >> 21: 0.25 is 500, 8 is 520. Index 0: below 0.25;
    // 1..20: the buckets from 0.25; 21: 8 and above (and NaN, whose group is redone anyway).
    __m512i b = _mm512_min_epu32(_mm512_srli_epi32(_mm512_castps_si512(a), 21), _mm512_set1_epi32(520));
    b = _mm512_subs_epu16(b, _mm512_set1_epi32(499));  // the upper 16 bits are 0 - 0
    const __m512i m = _mm512_permutex2var_epi32(_mm512_setr_epi32(0, 1, 1, 1, 1, 1, 1, 2, 2, 2, 3, 3, 4, 4, 5, 5), b,
                                                _mm512_setr_epi32(6, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7));
    // The thresholds below and above code m (none below 0: zmin covers it).
    const __m512 lo = _mm512_permutexvar_ps(
        m, _mm512_setr_ps(-__builtin_inff(), 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 0, 0, 0, 0, 0, 0, 0, 0));
    const __m512 hi = _mm512_permutexvar_ps(
        m, _mm512_setr_ps(0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, __builtin_inff(), 0, 0, 0, 0, 0, 0, 0, 0));
    dist = _mm512_min_ps(dist, _mm512_min_ps(_mm512_sub_ps(a, lo), _mm512_sub_ps(hi, a)));
    zmin = _mm512_min_ps(zmin, a);
    const __mmask16 neg = _mm512_movepi32_mask(_mm512_castps_si512(v));
    return _mm512_mask_or_epi32(m, neg, m, _mm512_set1_epi32(8));
}

// The per-group tolerances cover the scaling's rounding for |v| <= kMaxScaled (8). A larger |v| has
// code 7 and distance |v| - 5 > 3 to its one threshold; counting that distance as 3 keeps it
// certified: v_exact >= |v| (1 - 1.01 u) - bound > 5 whenever 3 >= tol = bound + 16 u or more.
// The lanes to redo: a value within `tol` of a threshold (dist: the encoder's), or a sign that the
// transform's error (tol0, in units of v) could flip (|v| <= tol0; none without a transform).
__mmask16 near_boundary(__m512 dist, __m512 tol, __m512 zmin, __m512 tol0, __m512 bound) {
    const __m512 capped = _mm512_min_ps(dist, _mm512_set1_ps(kMaxScaled - 5.0f));
    return _mm512_cmp_ps_mask(capped, tol, _CMP_LT_OQ) |
           (_mm512_cmp_ps_mask(zmin, tol0, _CMP_LE_OQ) & _mm512_cmp_ps_mask(bound, _mm512_setzero_ps(), _CMP_GT_OQ));
}

// ---- per-tile state ---------------------------------------------------------------------------

struct Lanes {
    __m512 bound;    // |y - y_exact| <= bound, per lane
    __mmask16 redo;  // lanes to recompute in float64
};

// Collects the codes of element i into the packed dwords (element 8q + s at bits 4s of dword q).
template <int G>
void put_code(__m512i d[G / 8], int i, __m512i code) {
    d[i / 8] = _mm512_or_si512(d[i / 8], _mm512_slli_epi32(code, 4 * (i % 8)));
}

// Where lane l's codes and scale go.
std::size_t lane_token(const QuantTile& t, int l) {
    return t.by_block ? t.row0 : t.row0 + std::size_t(l);
}
std::size_t lane_block(const QuantTile& t, int l) {
    return t.by_block ? t.block + std::size_t(l) : t.block;
}

template <int G>
void store_codes(const QuantTile& tile, const __m512i d[G / 8]) {
    alignas(64) std::uint8_t buf[4][64];
    if (G == 32) {  // 4x4 dword transpose in each 128-bit lane: buf[r] lane L = tile lane 4L + r
        const __m512i t0 = _mm512_unpacklo_epi32(d[0], d[1]), t1 = _mm512_unpackhi_epi32(d[0], d[1]);
        const __m512i t2 = _mm512_unpacklo_epi32(d[2], d[3]), t3 = _mm512_unpackhi_epi32(d[2], d[3]);
        _mm512_store_si512(buf[0], _mm512_unpacklo_epi64(t0, t2));
        _mm512_store_si512(buf[1], _mm512_unpackhi_epi64(t0, t2));
        _mm512_store_si512(buf[2], _mm512_unpacklo_epi64(t1, t3));
        _mm512_store_si512(buf[3], _mm512_unpackhi_epi64(t1, t3));
    } else {  // G == 16: buf[0] lane L = tile lanes 4L, 4L+1 (8 bytes each); buf[1] = 4L+2, 4L+3
        _mm512_store_si512(buf[0], _mm512_unpacklo_epi32(d[0], d[1]));
        _mm512_store_si512(buf[1], _mm512_unpackhi_epi32(d[0], d[1]));
    }
    for (int l = 0; l < tile.rows; ++l) {
        std::uint8_t* dst =
            tile.codes + lane_token(tile, l) * (tile.d_in / 2) + lane_block(tile, l) * std::size_t(G / 2);
        if (G == 32) std::memcpy(dst, buf[l % 4] + 16 * (l / 4), 16);
        else std::memcpy(dst, buf[(l % 4) / 2] + 16 * (l / 4) + 8 * (l % 2), 8);
    }
}

void store_scales(const QuantTile& tile, __m512i s, int bytes) {
    alignas(64) std::int32_t v[16];
    _mm512_store_si512(v, s);
    const std::size_t blocks = tile.d_in / std::size_t(tile.group);
    for (int l = 0; l < tile.rows; ++l) {
        std::uint8_t* p = tile.scales + (lane_token(tile, l) * blocks + lane_block(tile, l)) * std::size_t(bytes);
        p[0] = std::uint8_t(v[l] & 0xFF);
        if (bytes == 2) p[1] = std::uint8_t((v[l] >> 8) & 0xFF);
    }
}

template <int G>
__m512 abs_max(const __m512 y[G]) {
    __m512 m = _mm512_setzero_ps();
#pragma GCC unroll 32
    for (int i = 0; i < G; ++i) m = _mm512_max_ps(m, abs_ps(y[i]));
    return m;
}

// Flags groups outside the range where the float32 kernel is certified (NaN included).
__mmask16 out_of_range(__m512 amax) {
    return _mm512_knot(_mm512_cmp_ps_mask(amax, _mm512_set1_ps(kTiny), _CMP_GE_OQ) &
                       _mm512_cmp_ps_mask(amax, _mm512_set1_ps(kHuge), _CMP_LE_OQ));
}

// ---- the formats ------------------------------------------------------------------------------

template <int G>
void quantize_mx(const QuantTile& tile, const __m512 y[G], Lanes& l, bool ocp) {
    const __m512 amax = abs_max<G>(y);
    l.redo |= out_of_range(amax);
    const __m512 e = _mm512_getexp_ps(amax);                     // floor(log2(amax))
    const __m512 p = _mm512_scalef_ps(_mm512_set1_ps(1.0f), e);  // 2^e
    // The exponent changes if amax_exact may lie on the other side of 2^e or 2^(e+1).
    l.redo |= _mm512_cmp_ps_mask(_mm512_sub_ps(amax, p), l.bound, _CMP_LT_OQ) |
              _mm512_cmp_ps_mask(_mm512_sub_ps(_mm512_add_ps(p, p), amax), l.bound, _CMP_LT_OQ);
    const __m512 es = ocp ? _mm512_sub_ps(e, _mm512_set1_ps(2.0f)) : e;
    const __m512 neg_es = _mm512_sub_ps(_mm512_setzero_ps(), es);
    // factor x 2^-es is exact (|e| <= 60 in range), so y * mult rounds once, as (y 2^-es) x factor.
    const __m512 mult = _mm512_scalef_ps(_mm512_set1_ps(ocp ? 1.0f : 3.0f), neg_es);
    // The transform's error in units of v, plus the rounding of the scaling (|v| <= kMaxScaled).
    const __m512 tol0 = _mm512_mul_ps(l.bound, mult);
    const __m512 tol = _mm512_fmadd_ps(l.bound, mult, _mm512_set1_ps(kMaxScaled * 2.0f * kU));
    __m512i d[G / 8];
#pragma GCC unroll 32
    for (int q = 0; q < G / 8; ++q) d[q] = _mm512_setzero_si512();
    __m512 dist = _mm512_set1_ps(__builtin_inff()), zmin = dist;
#pragma GCC unroll 32
    for (int i = 0; i < G; ++i) put_code<G>(d, i, e2m1_encode(_mm512_mul_ps(y[i], mult), dist, zmin));
    l.redo |= near_boundary(dist, tol, zmin, tol0, l.bound);
    store_codes<G>(tile, d);
    store_scales(tile, _mm512_add_epi32(_mm512_cvtps_epi32(es), _mm512_set1_epi32(127)), 1);
}

template <int G>
void quantize_nvfp4(const QuantTile& tile, const __m512 y[G], Lanes& l) {
    const __m512 amax = abs_max<G>(y);
    l.redo |= out_of_range(amax);
    // s = RNE_e4m3(amax * 10 / 6): round w to 3 mantissa bits, exponent at least -6, saturate.
    const __m512 w = _mm512_mul_ps(_mm512_mul_ps(amax, _mm512_set1_ps(10.0f)), _mm512_set1_ps(1.0f / 6.0f));
    const __m512 tol_w =
        _mm512_fmadd_ps(w, _mm512_set1_ps(4.0f * kU), _mm512_mul_ps(l.bound, _mm512_set1_ps(10.0f / 6.0f * 1.01f)));
    const __m512 ew = _mm512_max_ps(_mm512_getexp_ps(w), _mm512_set1_ps(-6.0f));
    const __m512 t = _mm512_scalef_ps(w, _mm512_sub_ps(_mm512_set1_ps(3.0f), ew));  // w in units of the step
    const __m512 rt = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 step = _mm512_scalef_ps(_mm512_set1_ps(1.0f), _mm512_sub_ps(ew, _mm512_set1_ps(3.0f)));
    const __m512 margin = _mm512_mul_ps(_mm512_sub_ps(_mm512_set1_ps(0.5f), abs_ps(_mm512_sub_ps(t, rt))), step);
    l.redo |= _mm512_cmp_ps_mask(margin, tol_w, _CMP_LT_OQ);
    const __m512 sv = _mm512_min_ps(_mm512_mul_ps(rt, step), _mm512_set1_ps(448.0f));
    // The E4M3 byte: normal values keep float32's top exponent/mantissa bits, rebiased.
    const __mmask16 normal = _mm512_cmp_ps_mask(sv, _mm512_set1_ps(0x1p-6f), _CMP_GE_OQ);
    const __m512i byte_sub = _mm512_cvtps_epi32(_mm512_mul_ps(sv, _mm512_set1_ps(512.0f)));
    const __m512i byte_norm =
        _mm512_sub_epi32(_mm512_srli_epi32(_mm512_castps_si512(sv), 20), _mm512_set1_epi32(120 << 3));
    const __m512i sbyte = _mm512_mask_blend_epi32(normal, byte_sub, byte_norm);
    // A zero scale keeps only the signs (y * 0): certify those only when y is exact.
    const __mmask16 zero = _mm512_cmp_ps_mask(sv, _mm512_setzero_ps(), _CMP_EQ_OQ);
    l.redo |= zero & _mm512_cmp_ps_mask(l.bound, _mm512_setzero_ps(), _CMP_GT_OQ);
    const __m512 mult = _mm512_maskz_div_ps(_mm512_knot(zero), _mm512_set1_ps(10.0f), sv);
    // The transform's error in units of v (mult rounded: 1.01), plus the roundings of mult and
    // y * mult (|v| <= kMaxScaled).
    const __m512 tol0 = _mm512_mul_ps(l.bound, _mm512_mul_ps(mult, _mm512_set1_ps(1.01f)));
    const __m512 tol = _mm512_add_ps(tol0, _mm512_set1_ps(kMaxScaled * 3.0f * kU));
    __m512i d[G / 8];
#pragma GCC unroll 32
    for (int q = 0; q < G / 8; ++q) d[q] = _mm512_setzero_si512();
    __m512 dist = _mm512_set1_ps(__builtin_inff()), zmin = dist;
#pragma GCC unroll 32
    for (int i = 0; i < G; ++i) put_code<G>(d, i, e2m1_encode(_mm512_mul_ps(y[i], mult), dist, zmin));
    l.redo |= near_boundary(dist, tol, zmin, tol0, l.bound);
    store_codes<G>(tile, d);
    store_scales(tile, sbyte, 1);
}

template <int G>
void quantize_int4(const QuantTile& tile, const __m512 y[G], Lanes& l) {
    const __m512 amax = abs_max<G>(y);
    l.redo |= out_of_range(amax);
    __m512 ss = _mm512_setzero_ps();
#pragma GCC unroll 32
    for (int i = 0; i < G; ++i) ss = _mm512_fmadd_ps(y[i], y[i], ss);
    const __m512 w =
        _mm512_mul_ps(_mm512_sqrt_ps(_mm512_mul_ps(ss, _mm512_set1_ps(1.0f / G))), _mm512_set1_ps(kInt4ScalePerRmsF));
    // |rms - rms_exact| <= bound (from y) + the float32 sum of squares (<= G u relative).
    const __m512 tol_w = _mm512_fmadd_ps(w, _mm512_set1_ps(float(G + 8) * kU),
                                         _mm512_mul_ps(l.bound, _mm512_set1_ps(kInt4ScalePerRmsF * 1.01f)));
    // bf16 RNE on the bits; the boundary is the midpoint between the two bf16 neighbours of w.
    const __m512i wb = _mm512_castps_si512(w);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(wb, 16), _mm512_set1_epi32(1));
    const __m512i rb = _mm512_and_si512(_mm512_add_epi32(_mm512_add_epi32(wb, _mm512_set1_epi32(0x7FFF)), lsb),
                                        _mm512_set1_epi32(int(0xFFFF0000u)));
    const __m512 mid = _mm512_castsi512_ps(
        _mm512_or_si512(_mm512_and_si512(wb, _mm512_set1_epi32(int(0xFFFF0000u))), _mm512_set1_epi32(0x8000)));
    l.redo |= _mm512_cmp_ps_mask(abs_ps(_mm512_sub_ps(w, mid)), tol_w, _CMP_LT_OQ);
    const __m512 sv = _mm512_castsi512_ps(rb);
    const __m512 inv = _mm512_div_ps(_mm512_set1_ps(1.0f), sv);
    const __m512 tol_base = _mm512_mul_ps(l.bound, _mm512_mul_ps(inv, _mm512_set1_ps(1.01f)));
    __m512i d[G / 8];
#pragma GCC unroll 32
    for (int q = 0; q < G / 8; ++q) d[q] = _mm512_setzero_si512();
    __mmask16 near = 0;
#pragma GCC unroll 32
    for (int i = 0; i < G; ++i) {
        const __m512 t = _mm512_mul_ps(y[i], inv);  // 2 roundings vs y / s: in the tolerance
        const __m512 tol = _mm512_fmadd_ps(abs_ps(t), _mm512_set1_ps(3.0f * kU), tol_base);
        const __m512 rnd = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        // Boundaries are the integers -7..7 (below -7 and from 7 on, the clamp decides).
        near |= _mm512_cmp_ps_mask(abs_ps(_mm512_sub_ps(t, rnd)), tol, _CMP_LT_OQ) &
                _mm512_cmp_ps_mask(abs_ps(rnd), _mm512_set1_ps(7.0f), _CMP_LE_OQ);
        // y / s underflowing to -0 floors to 0 where float64 floors a tiny negative to -1.
        near |= _mm512_cmp_ps_mask(t, _mm512_setzero_ps(), _CMP_EQ_OQ) &
                _mm512_cmp_ps_mask(y[i], _mm512_setzero_ps(), _CMP_NEQ_OQ);
        __m512 q = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
        q = _mm512_min_ps(_mm512_max_ps(q, _mm512_set1_ps(-8.0f)), _mm512_set1_ps(7.0f));
        put_code<G>(d, i, _mm512_and_si512(_mm512_cvtps_epi32(q), _mm512_set1_epi32(0xF)));
    }
    l.redo |= near;
    store_codes<G>(tile, d);
    store_scales(tile, _mm512_srli_epi32(rb, 16), 2);
}

template <int G>
std::uint32_t quantize_tile_g(const QuantTile& tile) {
    __m512 y[G], ss, norm;
    if (tile.by_block) {
        load_blocks<G>(tile, y, ss, norm);
    } else if (tile.pairs != nullptr) {
        multiply_bf16<G>(tile, y, ss);
        norm = _mm512_set1_ps(tile.row_norms[0]);
    } else {
        __m512 xc[G];
        load_columns<G>(tile, xc);
        ss = _mm512_setzero_ps();
#pragma GCC unroll 32
        for (int j = 0; j < G; ++j) ss = _mm512_fmadd_ps(xc[j], xc[j], ss);
        if (tile.matrix != nullptr) {
            multiply<G>(tile.matrix, xc, y);
        } else {
#pragma GCC unroll 32
            for (int i = 0; i < G; ++i) y[i] = xc[i];
        }
        norm = _mm512_set1_ps(tile.matrix ? tile.row_norms[0] : 0.0f);
    }
    Lanes l;
    // Non-finite or overflowing inputs: float64 decides (and reports NaN/Inf).
    l.redo = _mm512_knot(_mm512_cmp_ps_mask(ss, _mm512_set1_ps(0x1p126f), _CMP_LE_OQ));
    const float c = float(G + 2) * kU * kGammaRoundUp;  // gamma_G, rounded up
    l.bound = tile.matrix == nullptr ? _mm512_setzero_ps()
                                     : _mm512_fmadd_ps(_mm512_mul_ps(_mm512_sqrt_ps(ss), norm), _mm512_set1_ps(c),
                                                       _mm512_set1_ps(kAbsSlack));
    // The bf16 path reads subnormal x as zero: sum_j |T_ij x_j| over those j is below
    // 2^-126 ||T_i||_1 <= 2^-126 sqrt(G) ||T_i|| < 2^-122 norm.
    if (tile.pairs != nullptr && !tile.by_block) l.bound = _mm512_fmadd_ps(norm, _mm512_set1_ps(0x1p-122f), l.bound);
    switch (tile.format) {
        case 0: quantize_mx<G>(tile, y, l, false); break;  // WUSH_FORMAT_MXFP4
        case 3: quantize_mx<G>(tile, y, l, true); break;   // WUSH_FORMAT_MXFP4_OCP
        case 1: quantize_nvfp4<G>(tile, y, l); break;      // WUSH_FORMAT_NVFP4
        default: quantize_int4<G>(tile, y, l); break;      // WUSH_FORMAT_INT4
    }
    return std::uint32_t(l.redo) & ((1u << tile.rows) - 1u);
}

}  // namespace

std::uint32_t quantize_tile(const QuantTile& tile) {
    return tile.group == 16 ? quantize_tile_g<16>(tile) : quantize_tile_g<32>(tile);
}

float max_row_norm(const float* matrix, int group) {
    float best = 0.0f;
    for (int i = 0; i < group; ++i) {
        __m512 s = _mm512_setzero_ps();
        for (int j = 0; j < group; j += 16) {
            const __m512 r = _mm512_loadu_ps(matrix + i * group + j);
            s = _mm512_fmadd_ps(r, r, s);
        }
        const float v = _mm512_reduce_add_ps(s);
        best = v > best ? v : best;
    }
    // Rounded up well beyond the float32 error of the sum and the square root.
    return __builtin_sqrtf(best) * (1.0f + 1e-5f);
}

}  // namespace wush::cpu::avx512
