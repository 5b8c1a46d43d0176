// The product of quantized activations and quantized weights, Y_q = A_q W_q^T, for the layer loss:
// each group's dot product in integers (exact), the groups summed in float64 in column order with
// exact terms, so the result is the same bits on every ISA and thread count (which OpenBLAS's
// float64 GEMM of the dequantized values is not) and about as exact (docs/EVAL.md, "What it
// computes", defines the loss).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "common/cpu_isa.h"
#include "formats/block_format.h"
#include "formats/packed_matrix.h"

namespace wush::eval {

class QuantizedProduct {
public:
    // Lays out the packed weights (d_out x d_in, any format) for the product. Throws NON_FINITE for
    // a scale that does not decode to a finite value.
    explicit QuantizedProduct(const formats::PackedMatrix& w);

    // y (m x d_out, row-major) = dequantized A (packed like quantize_rows writes, m x d_in) times the
    // dequantized weights transposed, each value element * scale / tensor divisor exactly. `isa`
    // selects the kernel (the bits do not depend on it).
    void multiply(std::span<const std::uint8_t> a_codes, std::span<const std::uint8_t> a_scales, std::size_t m,
                  std::span<double> y, Isa isa = best_isa()) const;

    std::size_t d_out() const { return d_out_; }
    std::size_t d_in() const { return d_in_; }

private:
    const formats::FormatSpec& format_;
    std::size_t d_out_, d_in_, groups_, blocks_;
    std::vector<std::int8_t> codes_;
    std::vector<std::int32_t> offset_sum_;
    std::vector<double> scale_;

    // Twice the element values of a byte's two codes (low nibble first, as quantize_rows packs
    // them): integers (E2M1: 0..12, INT4: odd, -15..15), with their sum.
    struct DoubledPairs {
        std::int8_t value[256][2];
        std::int8_t sum[256];
        explicit DoubledPairs(wush_format f);
    };
    DoubledPairs pairs_;
};

}  // namespace wush::eval
