// The fused per-block transform (T_wush) + quantization of activations: the CPU implementation
// behind wush_quantize_activations and the first half of wush_linear_forward.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "common/cpu_isa.h"
#include "formats/block_format.h"
#include "transforms/block_transform.h"
#include "transforms/runtime_layer.h"

namespace wush::cpu {

// Scratch floats quantize_activations needs (one row-norm bound per distinct block matrix).
std::size_t quantize_scratch_floats(const BlockTransform& transform, MatrixUse use);

// The transform's distinct matrices (one when `use` is Shared, every block's when PerBlock) as
// bf16 pairs (kernels.h, QuantTile::pairs: what one token's quantization reads, and the AVX-512
// bf16 dot products'), or empty when
// `use` is None or an entry is not exactly a bf16 value that is zero or normal (such as a
// transform stored as F32): those run the float path. Built once per prepared layer.
std::vector<std::uint32_t> bf16_matrix_pairs(const BlockTransform& transform, MatrixUse use);

// Upper bounds of each distinct matrix's largest row norm (max_i ||row i of T_b||_2), as many as
// quantize_scratch_floats: what the SIMD kernels' error bound needs. Computed in float64 and
// rounded up, so they hold for every ISA's kernels. Empty when `use` is None.
std::vector<float> matrix_norm_bounds(const BlockTransform& transform, MatrixUse use);

// What a prepared layer derives from its transform once, for every call (empty: none).
struct PreparedMatrices {
    std::span<const std::uint32_t> bf16_pairs;  // bf16_matrix_pairs(transform, use)
    std::span<const float> norm_bounds;         // matrix_norm_bounds(transform, use)
};

// Transforms each token's block slices x_b -> T_b x_b and quantizes them in `format` (whose G must
// be the transform's) into codes / scales laid out as wush_quantize_rows does. `use` is
// classify_matrices(transform). `x` is n_tokens x d_in of `dtype`; buffers are sized by
// formats::packed_sizes; `scratch` holds at least quantize_scratch_floats() floats (none needed
// with prepared norm bounds). Runs on up to `threads` threads of the runtime's work pool
// (work_pool.h); the result does not depend on them.
//
// The result equals the float64 definition (exact_quantizer.h) on every ISA: the SIMD kernels
// work in float32, bound their rounding error, and recompute in float64 every group whose value
// lies within that bound of a rounding boundary.
//
// `prepared` holds what a prepared layer computed from the transform, for the same bytes faster:
// with `bf16_pairs` (and `norm_bounds`), a few tokens' tiles read the matrices as pairs, half the
// bytes of the float matrices, on either SIMD ISA, and bf16 `x` on an AVX-512 CPU with
// AVX512_BF16 takes the bf16 dot-product kernel for many tokens; with `norm_bounds`, no call
// recomputes the matrices' row norms (for one token that was as much arithmetic as the transform
// itself).
//
// Throws NON_FINITE (naming the first row and column) if `x` holds NaN/Inf; the buffers' contents
// are unspecified then.
void quantize_activations(const BlockTransform& transform, MatrixUse use, const formats::FormatSpec& format,
                          wush_dtype dtype, const void* x, std::size_t n_tokens, std::span<std::uint8_t> codes,
                          std::span<std::uint8_t> scales, Isa isa, std::span<float> scratch, std::size_t threads,
                          const PreparedMatrices& prepared = {});

}  // namespace wush::cpu
