// The exact quantized product's AVX-512 VNNI kernel (quantized_product_kernel.h): a block's 16
// weight rows in one register, vpdpbusd adding each quad's four unsigned-by-signed byte products
// straight into int32 (exact: |sum| <= 32 * 31 * 15). Each row's sum over groups runs in the
// same order, with the same exact terms, as the portable loop, so both give the same bits.
// GCC 12 reports its own AVX-512 intrinsics' deliberately undefined operands (__Y) as uninitialized.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "eval/quantized_product_kernel.h"

namespace wush::eval::avx512 {

namespace {

constexpr int kTokens = 2;  // tokens per pass over a weight block (as in the AVX2 kernel)

void tokens_block(const ProductWeights& w, const std::uint8_t* const* a, const double* const* a_scale,
                  std::size_t block, double (*out)[kProductRows]) {
    __m512d lo[kTokens], hi[kTokens];
    for (int u = 0; u < kTokens; ++u) lo[u] = hi[u] = _mm512_setzero_pd();
    const std::size_t quad_bytes = kProductRows * 4, group_bytes = std::size_t(w.quads) * quad_bytes;
    const std::int8_t* codes = w.codes + block * w.groups * group_bytes;
    const std::int32_t* offset_sum = w.offset_sum + block * w.groups * kProductRows;
    const double* scale = w.scale + block * w.groups * kProductRows;
    for (std::size_t g = 0; g < w.groups; ++g) {
        __m512i dot[kTokens];
        for (int u = 0; u < kTokens; ++u) dot[u] = _mm512_setzero_si512();
        for (int q = 0; q < w.quads; ++q) {
            const __m512i wq = _mm512_loadu_si512(codes + g * group_bytes + std::size_t(q) * quad_bytes);
            for (int u = 0; u < kTokens; ++u) {
                std::int32_t quad;
                __builtin_memcpy(&quad, a[u] + (g * std::size_t(w.quads) + std::size_t(q)) * 4, 4);
                dot[u] = _mm512_dpbusd_epi32(dot[u], _mm512_set1_epi32(quad), wq);
            }
        }
        const __m512i offset = _mm512_loadu_si512(offset_sum + g * kProductRows);
        const __m512d w_lo = _mm512_loadu_pd(scale + g * kProductRows);
        const __m512d w_hi = _mm512_loadu_pd(scale + g * kProductRows + 8);
        for (int u = 0; u < kTokens; ++u) {
            const __m512i d = _mm512_sub_epi32(dot[u], offset);
            const __m512d sa = _mm512_set1_pd(a_scale[u][g]);
            lo[u] = _mm512_fmadd_pd(_mm512_mul_pd(sa, w_lo), _mm512_cvtepi32_pd(_mm512_castsi512_si256(d)), lo[u]);
            hi[u] =
                _mm512_fmadd_pd(_mm512_mul_pd(sa, w_hi), _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(d, 1)), hi[u]);
        }
    }
    for (int u = 0; u < kTokens; ++u) {
        _mm512_storeu_pd(out[u], lo[u]);
        _mm512_storeu_pd(out[u] + 8, hi[u]);
    }
}

}  // namespace

void quantized_product(const ProductWeights& w, const ProductActivations& a, std::size_t b0, std::size_t b1,
                       std::size_t n, double* y, std::size_t ld) {
    const std::size_t groups = w.groups;
    for (std::size_t b = b0; b < b1; ++b) {
        const std::size_t rows = n - b * kProductRows < std::size_t(kProductRows) ? n - b * kProductRows : kProductRows;
        for (std::size_t t = 0; t < a.m; t += kTokens) {
            const std::size_t t1 = t + 1 < a.m ? t + 1 : t;  // a last odd token paired with itself
            const std::uint8_t* rows_a[kTokens] = {a.a + t * a.k, a.a + t1 * a.k};
            const double* scales[kTokens] = {a.scale + t * groups, a.scale + t1 * groups};
            double out[kTokens][kProductRows];
            tokens_block(w, rows_a, scales, b, out);
            for (std::size_t u = 0; u < std::size_t(kTokens) && t + u < a.m; ++u)
                for (std::size_t r = 0; r < rows; ++r) y[(t + u) * ld + b * kProductRows + r] = out[u][r];
        }
    }
}

}  // namespace wush::eval::avx512
