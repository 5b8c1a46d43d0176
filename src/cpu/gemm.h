// The W4A4 GEMM of the CPU runtime: packed activations (m x k, the layouts of wush_quantize_rows)
// times packed pre-quantized weights (n x k) transposed, Y = A B^T (m x n), in float32 or bf16.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "common/cpu_isa.h"
#include "formats/block_format.h"
#include "formats/packed_matrix.h"
#include "wush/wush.h"

namespace wush::cpu {

// Activations with at most this many rows stream the weights row by row (the split layout, with
// buffers of its own); more rows amortize packing weight panels that the register-blocked kernels
// reuse. gemm_scratch_bytes() can therefore be smaller at kSplitMaxRows + 1 rows than at
// kSplitMaxRows.
constexpr std::size_t kSplitMaxRows = 4;

// Bytes of scratch gemm() needs for m activation rows against n x k weights in `format` when it
// runs with `threads` threads (each packs its own weight panels). The result does not depend on
// the ISA.
std::size_t gemm_scratch_bytes(const formats::FormatSpec& format, std::size_t m, std::size_t n, std::size_t k,
                               std::size_t threads);

// Weight panels packed once, for a prepared layer (wush_linear): the layout the panel kernels
// read (kernels.h, kPanelRows rows per panel), which gemm() otherwise packs on every call, about
// 2.25x the bytes of the packed weights; for the AVX2 kernels also the row-block layout of the
// small-m kernel (kernels.h, kRowBlock rows per block, 1.0x the packed weights, NVFP4 1.1x; k % 32 ==
// 0). Empty for the scalar ISA, whose kernel reads the codes.
class PanelPack {
public:
    PanelPack() = default;
    // Packs on up to `threads` threads of the work pool.
    PanelPack(Isa isa, std::size_t threads, const formats::PackedMatrix& w);
    Isa isa() const noexcept { return isa_; }
    bool empty() const noexcept { return bytes_.empty(); }
    const std::uint8_t* panel(std::size_t index) const noexcept { return bytes_.data() + offset_ + index * stride_; }
    // The row blocks (nullptr if this pack has none) and the bytes of one block.
    const std::uint8_t* row_blocks() const noexcept {
        return blocks_.empty() ? nullptr : blocks_.data() + blocks_offset_;
    }
    std::size_t block_bytes() const noexcept { return block_bytes_; }

private:
    Isa isa_ = Isa::Scalar;
    std::vector<std::uint8_t> bytes_;
    std::size_t offset_ = 0;  // to the first 64-byte aligned panel
    std::size_t stride_ = 0;  // bytes from one panel to the next (a multiple of 64)
    std::vector<std::uint8_t> blocks_;
    std::size_t blocks_offset_ = 0;  // to the first 64-byte aligned block
    std::size_t block_bytes_ = 0;
};

// Throws NON_FINITE naming the first NaN or infinite value of y (m x n, F32 or BF16), for a gemm()
// that returned false; returns if there is none.
void require_finite_product(wush_dtype y_dtype, const void* y, std::size_t m, std::size_t n);

// Throws NON_FINITE if an activation scale is NaN/Inf (nothing is written to y then).
void check_activation_scales(const formats::FormatSpec& format, std::span<const std::uint8_t> scales, std::size_t m,
                             std::size_t k);

// Y (m x n, row-major, `y_dtype` F32 or BF16) = A B^T, with A given by its codes and scales in
// `w.format`. Every group's integer inner product is exact; the group scales and the per-tensor
// factors are applied once per group in float32. Runs on up to `threads` threads (>= 1) of the
// runtime's work pool (threads/work_pool.h), fewer if `scratch` (sized by gemm_scratch_bytes) has
// room for fewer panels; the result does not depend on the count. Activation scales must be
// finite (check_activation_scales). `packed`, if given, holds w's panels packed for `isa` (a
// pack made for another ISA is ignored). `bias`, if given (n floats), is added to every row in
// the store: y = round_y(acc + bias[j]) in float32 (GemmOutput, kernels.h). Returns whether every
// value written to y is finite (valid-by-spec extremes can overflow float32 or bf16): the kernels
// check as they store, so the caller needs no pass over y.
[[nodiscard]] bool gemm(Isa isa, std::size_t threads, const formats::PackedMatrix& w,
                        std::span<const std::uint8_t> a_codes, std::span<const std::uint8_t> a_scales, std::size_t m,
                        wush_dtype y_dtype, void* y, std::span<std::byte> scratch, const PanelPack* packed = nullptr,
                        const float* bias = nullptr);

}  // namespace wush::cpu
