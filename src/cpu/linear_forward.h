// One quantized linear layer on the CPU: Y = q(T_wush X) q(T_xvsh W)^T, i.e. the fused activation
// transform + quantization followed by the W4A4 GEMM, in a caller-provided workspace (nothing is
// allocated once the workspace is given).
#pragma once

#include <cstddef>
#include <span>

#include "backend/backend.h"
#include "common/cpu_isa.h"
#include "cpu/activation_quantizer.h"
#include "cpu/gemm.h"
#include "formats/packed_matrix.h"
#include "transforms/block_transform.h"
#include "wush/wush.h"

namespace wush::cpu {

// Workspace bytes of linear_forward for n_tokens with up to `threads` threads.
std::size_t linear_forward_workspace_bytes(const BlockTransform& transform, const formats::PackedMatrix& weights,
                                           std::size_t n_tokens, std::size_t threads);

// y (n_tokens x d_out, `y_dtype` F32 or BF16) for the activations x (n_tokens x d_in, `x_dtype`);
// `use` is classify_matrices(transform); `packed`, if given, holds the weights' GEMM panels (a
// prepared layer). The GEMM runs on up to `threads` threads, as many as `workspace` has room for.
// `bias`, if given, is added in the GEMM's store (gemm()). `prepared` is what a prepared layer
// derived from the transform (quantize_activations). Throws NON_FINITE (y untouched) for
// NaN/Inf in the bias or in x, and NON_FINITE after the product when a value of y is NaN or
// infinite (finite inputs at the ends of the formats' ranges can overflow float32 or bf16).
void linear_forward(Isa isa, std::size_t threads, const BlockTransform& transform, MatrixUse use,
                    const formats::PackedMatrix& weights, wush_dtype x_dtype, const void* x, std::size_t n_tokens,
                    wush_dtype y_dtype, void* y, std::span<std::byte> workspace, const PanelPack* packed = nullptr,
                    const backend::Bias& bias = {}, const PreparedMatrices& prepared = {});

// The GEMM half of linear_forward: y from the activations' codes and scales (quantize_activations'
// output for this transform and format, n_tokens rows), in linear_forward's workspace layout (the
// same sizes serve). Throws NON_FINITE after the product as linear_forward does.
void linear_gemm(Isa isa, std::size_t threads, const BlockTransform& transform, const formats::PackedMatrix& weights,
                 std::span<const std::uint8_t> codes, std::span<const std::uint8_t> scales, std::size_t n_tokens,
                 wush_dtype y_dtype, void* y, std::span<std::byte> workspace, const PanelPack* packed = nullptr);

}  // namespace wush::cpu
