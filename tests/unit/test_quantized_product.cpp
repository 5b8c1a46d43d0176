// The layer loss's quantized product (src/eval/quantized_product.h): against a direct sum in long
// double of the dequantized values (element * scale / divisor, each exact), the same bits from the
// portable, AVX2 and AVX-512 VNNI kernels and for any thread count, and a non-finite scale refused.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/cpu_isa.h"
#include "common/error.h"
#include "eval/quantized_product.h"
#include "formats/block_format.h"
#include "formats/group_quantizer.h"

namespace wush {
namespace {

const wush_format kFormats[] = {WUSH_FORMAT_MXFP4, WUSH_FORMAT_MXFP4_OCP, WUSH_FORMAT_NVFP4, WUSH_FORMAT_INT4};

struct Packed {
    std::vector<std::uint8_t> codes, scales;
};

// Rows whose groups span many orders of magnitude (so the groups' scales differ widely), with the
// odd exact zero and a few rows of zeros.
std::vector<float> spread_rows(std::size_t rows, std::size_t d, std::size_t g, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> gauss(0.0f, 1.0f);
    std::uniform_int_distribution<int> exponent(-30, 30);
    std::vector<float> x(rows * d);
    for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t k = 0; k < d / g; ++k) {
            const float level = std::ldexp(1.0f, exponent(rng));
            for (std::size_t j = 0; j < g; ++j) x[r * d + k * g + j] = r % 7 == 3 ? 0.0f : level * gauss(rng);
        }
    return x;
}

Packed quantize(const formats::FormatSpec& f, const std::vector<float>& x, std::size_t rows, std::size_t d) {
    const formats::PackedSizes s = formats::packed_sizes(f, rows, d);
    Packed p{std::vector<std::uint8_t>(s.codes), std::vector<std::uint8_t>(s.scales)};
    formats::quantize_rows(f, x, rows, d, p.codes, p.scales);
    return p;
}

// Value of element j of a packed row, exactly (long double holds element * scale / divisor's
// product terms exactly enough: the comparison below allows for the division's rounding).
long double value(const formats::FormatSpec& f, const Packed& p, std::size_t row, std::size_t d, std::size_t j) {
    const std::size_t groups = d / f.group, k = j / f.group;
    const double scale = formats::decode_scale(f.id, p.scales.data() + (row * groups + k) * f.scale_bytes);
    const float element = formats::decode_element(f.id, formats::get_nibble(p.codes.data() + row * d / 2, int(j)));
    return (long double)element * scale / f.tensor_divisor;
}

// Packed activations (m x d) and weights (n x d) of spread rows, and the weights' product.
struct Case {
    Packed a, w;
    eval::QuantizedProduct product;
};

Case make_case(const formats::FormatSpec& f, std::size_t m, std::size_t n, std::size_t d, unsigned seed) {
    Packed a = quantize(f, spread_rows(m, d, f.group, seed), m, d);
    Packed w = quantize(f, spread_rows(n, d, f.group, seed + 1), n, d);
    eval::QuantizedProduct product({f.id, n, d, formats::ByteView(w.codes), formats::ByteView(w.scales)});
    return {std::move(a), std::move(w), std::move(product)};
}

TEST(QuantizedProduct, EqualsTheDirectSumOfDequantizedValues) {
    const std::size_t m = 37, n = 21, d = 96;  // n: a block of 16 rows and a partial one
    for (wush_format id : kFormats) {
        const formats::FormatSpec& f = formats::spec(id);
        const Case c = make_case(f, m, n, d, 1);
        const Packed &a = c.a, &w = c.w;
        const eval::QuantizedProduct& product = c.product;
        std::vector<double> y(m * n, -1.0);
        product.multiply(a.codes, a.scales, m, y);
        std::size_t nonzero = 0;
        for (std::size_t t = 0; t < m; ++t)
            for (std::size_t o = 0; o < n; ++o) {
                long double sum = 0.0L, magnitude = 0.0L;
                for (std::size_t j = 0; j < d; ++j) {
                    const long double term = value(f, a, t, d, j) * value(f, w, o, d, j);
                    sum += term;
                    magnitude += std::fabs(term);
                }
                nonzero += sum != 0.0L;
                EXPECT_LE(std::fabs((long double)y[t * n + o] - sum), 1e-14L * magnitude)
                    << f.name << " y[" << t << "][" << o << "] = " << y[t * n + o] << ", direct " << (double)sum;
            }
        EXPECT_GT(nonzero, m * n / 2) << f.name;
    }
}

TEST(QuantizedProduct, SameBitsOnEveryKernelAndThreadCount) {
    if (!isa_supported(Isa::Avx2)) GTEST_SKIP() << "no AVX2 on this CPU: only the portable kernel runs";
    const std::size_t m = 19, n = 45, d = 512;  // n: two blocks of 16 rows and a partial one
    for (wush_format id : kFormats) {
        const formats::FormatSpec& f = formats::spec(id);
        const Case c = make_case(f, m, n, d, 3);
        const Packed& a = c.a;
        const eval::QuantizedProduct& product = c.product;
        std::vector<double> portable(m * n), simd(m * n), one_thread(m * n), vnni(m * n);
        product.multiply(a.codes, a.scales, m, portable, Isa::Scalar);
        product.multiply(a.codes, a.scales, m, simd, Isa::Avx2);
        if (isa_supported(Isa::Avx512Vnni)) {
            product.multiply(a.codes, a.scales, m, vnni, Isa::Avx512Vnni);
            EXPECT_EQ(std::memcmp(portable.data(), vnni.data(), sizeof(double) * m * n), 0) << f.name << " AVX-512";
        }
        const int threads = omp_get_max_threads();
        omp_set_num_threads(1);
        product.multiply(a.codes, a.scales, m, one_thread, Isa::Avx2);
        omp_set_num_threads(threads);
        EXPECT_EQ(std::memcmp(portable.data(), simd.data(), sizeof(double) * m * n), 0) << f.name;
        EXPECT_EQ(std::memcmp(one_thread.data(), simd.data(), sizeof(double) * m * n), 0) << f.name;
    }
}

TEST(QuantizedProduct, NonFiniteScaleIsRefused) {
    const formats::FormatSpec& f = formats::spec(WUSH_FORMAT_NVFP4);
    const std::size_t n = 8, d = 32;
    Packed w = quantize(f, spread_rows(n, d, f.group, 5), n, d);
    w.scales[3] = 0x7F;  // E4M3 NaN
    try {
        const eval::QuantizedProduct product({f.id, n, d, formats::ByteView(w.codes), formats::ByteView(w.scales)});
        ADD_FAILURE() << "a NaN scale was accepted";
    } catch (const Error& e) {
        EXPECT_EQ(e.status(), WUSH_ERR_NON_FINITE);
    }
}

}  // namespace
}  // namespace wush
