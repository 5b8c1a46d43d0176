// The interface between the exact quantized product's driver (quantized_product.cpp) and its AVX2
// and AVX-512 VNNI kernels (quantized_product_avx2.cpp, quantized_product_avx512.cpp), each
// compiled with its ISA's target flags. As for the CPU
// runtime's kernels (src/cpu/kernels/kernels.h): this header defines no function, inline or
// implicit (an inline copy emitted with AVX2 flags could be the one the linker keeps for callers
// on CPUs without AVX2), so plain aggregates and declarations only.
#pragma once

#include <cstddef>
#include <cstdint>

namespace wush::eval {

// Weight rows in blocks of kProductRows, each group's elements in quads of 4 per row:
// codes[((block * groups + g) * quads + q) * kProductRows * 4 + row * 4 + i] is twice the element
// value of row block * kProductRows + row, column g * G + 4q + i (a signed integer, |v| <= 15;
// rows past the matrix are 0). offset_sum[(block * groups + g) * kProductRows + row] is
// kProductOffset times the sum of that row's group, scale[...same index...] its group scale.
inline constexpr int kProductRows = 16;
inline constexpr int kProductOffset = 16;

struct ProductWeights {
    const std::int8_t* codes;
    const std::int32_t* offset_sum;
    const double* scale;
    std::size_t groups;
    int quads;  // G / 4
};

// Activation rows: a[t * k + j] is kProductOffset plus twice the element value (1..31), scale[t *
// groups + g] the group scales.
struct ProductActivations {
    const std::uint8_t* a;
    const double* scale;
    std::size_t m;
    std::size_t k;
};

// y[t * ld + block * kProductRows + row] (t < m, every row of blocks [b0, b1), rows past n
// skipped) = sum over groups g, in order, of (a.scale * w.scale) * (integer dot of the group).
namespace avx2 {
void quantized_product(const ProductWeights& w, const ProductActivations& a, std::size_t b0, std::size_t b1,
                       std::size_t n, double* y, std::size_t ld);
}  // namespace avx2
namespace avx512 {
void quantized_product(const ProductWeights& w, const ProductActivations& a, std::size_t b0, std::size_t b1,
                       std::size_t n, double* y, std::size_t ld);
}  // namespace avx512

}  // namespace wush::eval
