// The exact quantized product's AVX2 kernel (quantized_product_kernel.h). Each group's integer dot
// is exact: the activations carry an offset that makes them unsigned (vpmaddubsw multiplies
// unsigned by signed bytes), sums of two products and then of a group's quads stay far inside
// int16 (31 * 15 * 2 * 8 = 7440), and the offset times the row's group sum is subtracted after
// widening. Each row's sum over groups then runs in the same order, with the same exact terms, as
// the portable loop, so both give the same bits.
#include <immintrin.h>

#include "eval/quantized_product_kernel.h"

namespace wush::eval::avx2 {

namespace {

// Tokens per pass over a weight block: each quad of weights loaded once serves them all, and their
// sums are independent chains.
constexpr int kTokens = 2;
// Rows per register: a block's 16 rows are two halves of 8.
constexpr int kHalf = 8;

// kTokens tokens (rows a[u] of activations, scales a_scale[u]) against half `half` of one block
// of weight rows: out[u][row], row < 8.
void tokens_half(const ProductWeights& w, const std::uint8_t* const* a, const double* const* a_scale, std::size_t block,
                 int half, double (*out)[kHalf]) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256d lo[kTokens], hi[kTokens];
    for (int u = 0; u < kTokens; ++u) lo[u] = hi[u] = _mm256_setzero_pd();
    const std::size_t quad_bytes = kProductRows * 4, group_bytes = std::size_t(w.quads) * quad_bytes;
    const std::int8_t* codes = w.codes + block * w.groups * group_bytes + std::size_t(half) * kHalf * 4;
    const std::int32_t* offset_sum = w.offset_sum + block * w.groups * kProductRows + half * kHalf;
    const double* scale = w.scale + block * w.groups * kProductRows + half * kHalf;
    for (std::size_t g = 0; g < w.groups; ++g) {
        __m256i pairs[kTokens];
        for (int u = 0; u < kTokens; ++u) pairs[u] = _mm256_setzero_si256();
        for (int q = 0; q < w.quads; ++q) {
            const __m256i wq = _mm256_loadu_si256(
                reinterpret_cast<const __m256i*>(codes + g * group_bytes + std::size_t(q) * quad_bytes));
            for (int u = 0; u < kTokens; ++u) {
                std::int32_t quad;
                __builtin_memcpy(&quad, a[u] + (g * std::size_t(w.quads) + std::size_t(q)) * 4, 4);
                pairs[u] = _mm256_add_epi16(pairs[u], _mm256_maddubs_epi16(_mm256_set1_epi32(quad), wq));
            }
        }
        const __m256i offset = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(offset_sum + g * kProductRows));
        const __m256d w_lo = _mm256_loadu_pd(scale + g * kProductRows);
        const __m256d w_hi = _mm256_loadu_pd(scale + g * kProductRows + 4);
        for (int u = 0; u < kTokens; ++u) {
            const __m256i dot = _mm256_sub_epi32(_mm256_madd_epi16(pairs[u], ones), offset);
            const __m256d sa = _mm256_set1_pd(a_scale[u][g]);
            // Every product here is exact (quantized_product.h), so a fused multiply-add rounds
            // the same as the portable loop's multiply and add.
            lo[u] = _mm256_fmadd_pd(_mm256_mul_pd(sa, w_lo), _mm256_cvtepi32_pd(_mm256_castsi256_si128(dot)), lo[u]);
            hi[u] =
                _mm256_fmadd_pd(_mm256_mul_pd(sa, w_hi), _mm256_cvtepi32_pd(_mm256_extracti128_si256(dot, 1)), hi[u]);
        }
    }
    for (int u = 0; u < kTokens; ++u) {
        _mm256_storeu_pd(out[u], lo[u]);
        _mm256_storeu_pd(out[u] + 4, hi[u]);
    }
}

}  // namespace

void quantized_product(const ProductWeights& w, const ProductActivations& a, std::size_t b0, std::size_t b1,
                       std::size_t n, double* y, std::size_t ld) {
    const std::size_t groups = w.groups;
    for (std::size_t b = b0; b < b1; ++b) {
        const std::size_t rows = n - b * kProductRows < std::size_t(kProductRows) ? n - b * kProductRows : kProductRows;
        for (int half = 0; half * kHalf < int(rows); ++half)
            for (std::size_t t = 0; t < a.m; t += kTokens) {
                // A last odd token is paired with itself (its second result is dropped).
                const std::size_t t1 = t + 1 < a.m ? t + 1 : t;
                const std::uint8_t* rows_a[kTokens] = {a.a + t * a.k, a.a + t1 * a.k};
                const double* scales[kTokens] = {a.scale + t * groups, a.scale + t1 * groups};
                double out[kTokens][kHalf];
                tokens_half(w, rows_a, scales, b, half, out);
                for (std::size_t u = 0; u < std::size_t(kTokens) && t + u < a.m; ++u)
                    for (std::size_t r = std::size_t(half) * kHalf; r < rows && r < std::size_t(half + 1) * kHalf; ++r)
                        y[(t + u) * ld + b * kProductRows + r] = out[u][r - std::size_t(half) * kHalf];
            }
    }
}

}  // namespace wush::eval::avx2
