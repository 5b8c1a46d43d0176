// Row-level quantization in the block formats: the CPU implementation behind
// wush_quantize_rows / wush_dequantize_rows, and the sizes of packed buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "common/cpu_isa.h"
#include "wush/wush.h"

namespace wush::formats {

struct FormatSpec {
    wush_format id;
    const char* name;
    std::size_t group;        // G
    std::size_t scale_bytes;  // bytes per group scale
    double tensor_divisor;    // the per-tensor factor is 1 / tensor_divisor (3, 10 or 1)
    float tensor_factor() const { return float(1.0 / tensor_divisor); }
};

// The spec of `format`; throws wush::Error(INVALID_ARGUMENT) for an unknown value.
const FormatSpec& spec(wush_format format);
// nullptr for an unknown name (case-insensitive).
const FormatSpec* spec_by_name(const char* name);

struct PackedSizes {
    std::size_t codes;
    std::size_t scales;
};
// The group of a format is the block of the transform it quantizes after: throws
// wush::Error(INVALID_ARGUMENT), naming both sizes, unless format.group == block_size.
void require_group(const FormatSpec& format, std::size_t block_size);

// Checks d_in (positive multiple of G) and overflow; throws wush::Error on violation.
PackedSizes packed_sizes(const FormatSpec& f, std::size_t n_rows, std::size_t d_in);

// Quantizes n_rows x d_in float rows. The input must be finite (see find_non_finite); buffers are
// sized by packed_sizes. The bytes are the float64 definition's (group_quantizer.h) on every
// path; `isa` (best_isa() by default) only picks how: the E2M1 formats take an AVX2 kernel
// unless it is Isa::Scalar or the CPU lacks AVX2.
void quantize_rows(const FormatSpec& f, std::span<const float> x, std::size_t n_rows, std::size_t d_in,
                   std::span<std::uint8_t> codes, std::span<std::uint8_t> scales, Isa isa = best_isa());

// The same from dense rows of any API dtype, converted to float row by row. The input must be
// finite (wush::require_finite).
void quantize_rows(const FormatSpec& f, wush_dtype dtype, const void* x, std::size_t n_rows, std::size_t d_in,
                   std::span<std::uint8_t> codes, std::span<std::uint8_t> scales);

// Throws NON_FINITE (naming row and column) if quantizing `x` in `f` would produce a code that
// decodes beyond the float32 range. Only MXFP4 (the paper's rule) can: an element with
// |x| * 3 > 5 * 2^127 rounds to E2M1 6 under the largest scale 2^127, and 6 * 2^127 / 3 = 2^128
// is not a float. Such inputs are refused like infinities, so that whatever quantize_rows writes,
// dequantize_rows accepts. The input must be finite.
void require_encodable(const FormatSpec& f, wush_dtype dtype, const void* x, std::size_t n_rows, std::size_t d_in,
                       const char* what);

// Throws NON_FINITE unless every group decodes to finite float32 values: its scale is finite and
// no element times scale times tensor factor overflows (an E8M0 scale of 2^127 is valid, but the
// MXFP4 element 6 under it decodes to 2^128). Buffers are sized by packed_sizes.
void require_decodable(const FormatSpec& f, std::span<const std::uint8_t> codes, std::span<const std::uint8_t> scales,
                       std::size_t n_rows, std::size_t d_in);

// Decodes packed rows to floats (element * scale * tensor factor). Throws NON_FINITE, before
// writing anything, where require_decodable does.
void dequantize_rows(const FormatSpec& f, std::span<const std::uint8_t> codes, std::span<const std::uint8_t> scales,
                     std::size_t n_rows, std::size_t d_in, std::span<float> y);

}  // namespace wush::formats
