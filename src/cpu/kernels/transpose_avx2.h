// Register transposes on 256-bit vectors, for the AVX2 (and AVX-512) kernel files only. Every
// function is `static`: each kernel file gets its own copy, compiled with its own target flags,
// so no copy can be shared with code built for another ISA (kernels.h explains why that matters).
#pragma once

#include <immintrin.h>

namespace wush::cpu::simd256 {

// In place: r[a] (row a, 8 columns) becomes column a (8 rows).
[[maybe_unused]] static inline __attribute__((always_inline)) void transpose8(__m256 r[8]) {
    __m256 t[8], s[8];
#pragma GCC unroll 32
    for (int i = 0; i < 4; ++i) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 32
    for (int i = 0; i < 2; ++i) {  // s[4i+k], 128-bit half L: column 4L+k of rows 4i..4i+3
        s[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        s[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        s[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        s[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
#pragma GCC unroll 32
    for (int k = 0; k < 4; ++k) {
        r[k] = _mm256_permute2f128_ps(s[k], s[4 + k], 0x20);
        r[4 + k] = _mm256_permute2f128_ps(s[k], s[4 + k], 0x31);
    }
}

// The 8 lane sums of p[0..7], in one vector (lane i = sum of p[i]).
[[maybe_unused]] static inline __attribute__((always_inline)) __m256 transpose_sum8(const __m256 p[8]) {
    __m256 a[4], b[2];
#pragma GCC unroll 8
    for (int i = 0; i < 4; ++i)
        a[i] = _mm256_add_ps(_mm256_unpacklo_ps(p[2 * i], p[2 * i + 1]), _mm256_unpackhi_ps(p[2 * i], p[2 * i + 1]));
#pragma GCC unroll 8
    for (int i = 0; i < 2; ++i) {  // 128-bit half H of b[i]: rows 4i..4i+3 summed over half H
        const __m256d lo = _mm256_unpacklo_pd(_mm256_castps_pd(a[2 * i]), _mm256_castps_pd(a[2 * i + 1]));
        const __m256d hi = _mm256_unpackhi_pd(_mm256_castps_pd(a[2 * i]), _mm256_castps_pd(a[2 * i + 1]));
        b[i] = _mm256_add_ps(_mm256_castpd_ps(lo), _mm256_castpd_ps(hi));
    }
    return _mm256_add_ps(_mm256_permute2f128_ps(b[0], b[1], 0x20), _mm256_permute2f128_ps(b[0], b[1], 0x31));
}

}  // namespace wush::cpu::simd256
