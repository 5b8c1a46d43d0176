// AVX2 kernel of the transform search's RTN round trip (transforms/round_trip_errors.h): one group per
// iteration, its elements in 2 or 4 vectors. A group's magnitude code is the number of thresholds
// its magnitude passes (the scalar path's chain of selects gives the last one passed, the same
// for increasing thresholds), which indexes the 8 decoded magnitudes by one permute; the sign is
// the input's own. Compiled with AVX2 target flags: see round_trip_kernel.h for what this file may include.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "transforms/round_trip_kernel.h"

namespace wush::avx2 {

namespace {

constexpr int kMaxVectors = 4;  // G <= 32

// The scale index of a group whose largest magnitude has the bits `amax` (kernels.h).
int scale_index(const RoundTripTable& t, std::uint32_t amax) {
    if (t.cell == nullptr) {
        const int e = int(amax >> 23) - t.exponent_offset;
        return e < 0 ? 0 : e;
    }
    const int k = t.cell[amax >> 19];
    float a;
    std::memcpy(&a, &amax, sizeof a);
    return k + (a >= t.bound[k] ? 1 : 0);
}

std::uint32_t horizontal_max(__m256i m) {
    __m128i h = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(1, 0, 3, 2)));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(2, 3, 0, 1)));
    return std::uint32_t(_mm_cvtsi128_si32(h));
}

}  // namespace

int round_trip_errors(const RoundTripTable& table, const float* v, float* e, std::size_t n, std::size_t stride,
                      int group) {
    const int vectors = group / 8;
    const __m256i magnitude = _mm256_set1_epi32(0x7FFFFFFF);
    const __m256i exponent = _mm256_set1_epi32(0x7F800000);
    const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32(int(0x80000000u)));
    for (std::size_t r = 0; r < n; ++r) {
        const float* x = v + r * stride;
        __m256 xv[kMaxVectors];
        __m256i amax = _mm256_setzero_si256(), non_finite = _mm256_setzero_si256();
        for (int j = 0; j < vectors; ++j) {
            xv[j] = _mm256_loadu_ps(x + 8 * j);
            const __m256i bits = _mm256_castps_si256(xv[j]);
            amax = _mm256_max_epu32(amax, _mm256_and_si256(bits, magnitude));
            non_finite = _mm256_or_si256(non_finite, _mm256_cmpeq_epi32(_mm256_and_si256(bits, exponent), exponent));
        }
        if (!_mm256_testz_si256(non_finite, non_finite)) return 1;
        const float* entry = table.entries + 16 * scale_index(table, horizontal_max(amax));
        const __m256 values = _mm256_loadu_ps(entry + 8);
        __m256 t[7];
        for (int k = 0; k < 7; ++k) t[k] = _mm256_broadcast_ss(entry + k);
        for (int j = 0; j < vectors; ++j) {
            const __m256 a = _mm256_andnot_ps(sign, xv[j]);
            __m256i code = _mm256_setzero_si256();  // minus the count of thresholds passed
            for (int k = 0; k < 7; ++k)
                code = _mm256_add_epi32(code, _mm256_castps_si256(_mm256_cmp_ps(a, t[k], _CMP_GT_OQ)));
            const __m256 m = _mm256_permutevar8x32_ps(values, _mm256_sub_epi32(_mm256_setzero_si256(), code));
            const __m256 q = _mm256_or_ps(m, _mm256_and_ps(sign, xv[j]));
            _mm256_storeu_ps(e + r * stride + 8 * j, _mm256_sub_ps(q, xv[j]));
        }
    }
    return 0;
}

}  // namespace wush::avx2
