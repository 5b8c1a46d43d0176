// The fused per-block transform (T_wush) + quantization of activations: the CPU implementation
// behind wush_quantize_activations and the first half of wush_linear_forward.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "common/cpu_isa.h"
#include "formats/block_format.h"
#include "transforms/block_transform.h"
#include "transforms/runtime_layer.h"

namespace wush::cpu {

// Scratch floats quantize_activations needs (one row-norm bound per distinct block matrix).
std::size_t quantize_scratch_floats(const BlockTransform& transform, MatrixUse use);

// Transforms each token's block slices x_b -> T_b x_b and quantizes them in `format` (whose G must
// be the transform's) into codes / scales laid out as wush_quantize_rows does. `use` is
// classify_matrices(transform). `x` is n_tokens x d_in of `dtype`; buffers are sized by
// formats::packed_sizes; `scratch` holds at least quantize_scratch_floats() floats. Runs on up to
// `threads` threads of the runtime's work pool (work_pool.h); the result does not depend on them.
//
// The result equals the float64 definition (exact_quantizer.h) on every ISA: the SIMD kernels
// work in float32, bound their rounding error, and recompute in float64 every group whose value
// lies within that bound of a rounding boundary.
//
// Throws NON_FINITE (naming the first row and column) if `x` holds NaN/Inf; the buffers' contents
// are unspecified then.
void quantize_activations(const BlockTransform& transform, MatrixUse use, const formats::FormatSpec& format,
                          wush_dtype dtype, const void* x, std::size_t n_tokens, std::span<std::uint8_t> codes,
                          std::span<std::uint8_t> scales, Isa isa, std::span<float> scratch, std::size_t threads);

}  // namespace wush::cpu
