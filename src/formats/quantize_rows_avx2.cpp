// AVX2 kernel of quantize_rows for the E2M1 formats: each group's largest magnitude, then its
// elements' codes, four float64 lanes at a time. The scales are chosen by block_format.cpp with the
// float64 definition; this file evaluates the same element rule (codec::e2m1_encode) with the same
// float64 operations, so the codes are the definition's bit for bit. Compiled with AVX2 target
// flags: see quantize_rows_kernel.h for what this file may include.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "formats/quantize_rows_kernel.h"

namespace wush::formats::avx2 {

namespace {

// Adds 1 to a lane's count where `passed` is set (a comparison's all-ones mask is -1).
__m256i count(__m256i below, __m256d passed) {
    return _mm256_sub_epi64(below, _mm256_castpd_si256(passed));
}

// E2M1 codes of four float64 values, one per 64-bit lane: the magnitude code is 7 minus the
// thresholds |v| does not pass (<= at the midpoints that round down to the even code, < where
// they round up), bit 3 is v's sign bit.
__m256i encode4(__m256d v) {
    const __m256d a = _mm256_andnot_pd(_mm256_set1_pd(-0.0), v);
    __m256i below = _mm256_setzero_si256();
    below = count(below, _mm256_cmp_pd(a, _mm256_set1_pd(0.25), _CMP_LE_OQ));
    below = count(below, _mm256_cmp_pd(a, _mm256_set1_pd(0.75), _CMP_LT_OQ));
    below = count(below, _mm256_cmp_pd(a, _mm256_set1_pd(1.25), _CMP_LE_OQ));
    below = count(below, _mm256_cmp_pd(a, _mm256_set1_pd(1.75), _CMP_LT_OQ));
    below = count(below, _mm256_cmp_pd(a, _mm256_set1_pd(2.5), _CMP_LE_OQ));
    below = count(below, _mm256_cmp_pd(a, _mm256_set1_pd(3.5), _CMP_LT_OQ));
    below = count(below, _mm256_cmp_pd(a, _mm256_set1_pd(5.0), _CMP_LE_OQ));
    const __m256i sign = _mm256_slli_epi64(_mm256_srli_epi64(_mm256_castpd_si256(v), 63), 3);
    return _mm256_or_si256(_mm256_sub_epi64(_mm256_set1_epi64x(7), below), sign);
}

// Writes the two bytes of four codes (c0 | c1 << 4, c2 | c3 << 4): each 128-bit half's two codes
// are brought into one 64-bit lane (c0 | c1 << 32), and c1 shifted down to bits 4-7.
void put_pairs(__m256i c, std::uint8_t* out) {
    const __m256i both = _mm256_shuffle_epi32(c, _MM_SHUFFLE(2, 0, 2, 0));
    const __m256i bytes = _mm256_or_si256(both, _mm256_srli_epi64(both, 28));
    out[0] = std::uint8_t(_mm256_extract_epi8(bytes, 0));
    out[1] = std::uint8_t(_mm256_extract_epi8(bytes, 16));
}

}  // namespace

void group_amax(const float* x, std::size_t groups, int g, float* amax) {
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    for (std::size_t k = 0; k < groups; ++k) {
        const float* xg = x + k * std::size_t(g);
        __m256 m = _mm256_and_ps(_mm256_loadu_ps(xg), magnitude);
        for (int j = 8; j < g; j += 8) m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(xg + j), magnitude));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
        amax[k] = _mm_cvtss_f32(h);
    }
}

void encode_e2m1(const float* x, std::size_t groups, int g, const double* mul, const double* div, bool divide,
                 std::uint8_t* codes) {
    for (std::size_t k = 0; k < groups; ++k) {
        const float* xg = x + k * std::size_t(g);
        std::uint8_t* cg = codes + k * std::size_t(g) / 2;
        const __m256d m = _mm256_set1_pd(mul[k]), d = _mm256_set1_pd(div[k]);
        for (int j = 0; j < g; j += 8) {
            const __m256 xf = _mm256_loadu_ps(xg + j);
            __m256d lo = _mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(xf)), m);
            __m256d hi = _mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(xf, 1)), m);
            if (divide) {
                lo = _mm256_div_pd(lo, d);
                hi = _mm256_div_pd(hi, d);
            }
            put_pairs(encode4(lo), cg + j / 2);
            put_pairs(encode4(hi), cg + j / 2 + 2);
        }
    }
}

}  // namespace wush::formats::avx2
