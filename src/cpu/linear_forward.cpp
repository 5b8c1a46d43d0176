#include "cpu/linear_forward.h"

#include <string>

#include "common/dtype.h"
#include "common/error.h"
#include "cpu/activation_quantizer.h"
#include "cpu/gemm.h"
#include "cpu/workspace.h"

namespace wush::cpu {

namespace {

struct Pieces {
    std::uint8_t* codes = nullptr;
    std::uint8_t* scales = nullptr;
    float* norms = nullptr;
    float* bias = nullptr;  // d_out: the bias as float32, whatever its dtype
    formats::PackedSizes sizes{};
    std::size_t norm_count = 0;
};

// The quantized activations, the quantizer's scratch and the bias; the GEMM gets what is left.
Pieces carve(Carver& c, const BlockTransform& t, const formats::FormatSpec& f, std::size_t n_tokens,
             std::size_t d_out) {
    Pieces p;
    p.sizes = formats::packed_sizes(f, n_tokens, t.d_in());
    p.norm_count = quantize_scratch_floats(t, MatrixUse::PerBlock);  // the most any call needs
    p.codes = c.take<std::uint8_t>(p.sizes.codes);
    p.scales = c.take<std::uint8_t>(p.sizes.scales);
    p.norms = c.take<float>(p.norm_count);
    p.bias = c.take<float>(d_out);
    return p;
}

// The bias as the GEMM's store reads it (float32, in the workspace), checked before any work;
// nullptr without a bias.
const float* bias_as_float(const backend::Bias& bias, std::size_t d_out, float* out) {
    if (bias.data == nullptr) return nullptr;
    if (const auto bad = find_non_finite(bias.dtype, bias.data, d_out))
        fail(WUSH_ERR_NON_FINITE, "bias holds a NaN or infinite value at column " + std::to_string(*bad));
    to_float(bias.dtype, bias.data, 0, {out, d_out});
    return out;
}

}  // namespace

std::size_t linear_forward_workspace_bytes(const BlockTransform& transform, const formats::PackedMatrix& weights,
                                           std::size_t n_tokens, std::size_t threads) {
    require_layer(transform, weights);
    const formats::FormatSpec& f = formats::spec(weights.format);
    Carver measure;
    carve(measure, transform, f, n_tokens, weights.d_out);
    measure.take<std::byte>(gemm_scratch_bytes(f, n_tokens, weights.d_out, weights.d_in, threads));
    return measure.used();
}

namespace {

// The GEMM over the workspace left after `p`, then the product's finiteness check.
void gemm_rest(Carver& carver, Isa isa, std::size_t threads, const formats::PackedMatrix& weights,
               std::span<const std::uint8_t> codes, std::span<const std::uint8_t> scales, std::size_t n_tokens,
               wush_dtype y_dtype, void* y, const PanelPack* packed, const float* bias) {
    const std::size_t rest = carver.left();
    std::byte* gemm_space = carver.take<std::byte>(rest > 63 ? rest - 63 : 0);
    if (!gemm(isa, threads, weights, codes, scales, n_tokens, y_dtype, y, {gemm_space, rest > 63 ? rest - 63 : 0},
              packed, bias))
        require_finite_product(y_dtype, y, n_tokens, weights.d_out);
}

}  // namespace

void linear_forward(Isa isa, std::size_t threads, const BlockTransform& transform, MatrixUse use,
                    const formats::PackedMatrix& weights, wush_dtype x_dtype, const void* x, std::size_t n_tokens,
                    wush_dtype y_dtype, void* y, std::span<std::byte> workspace, const PanelPack* packed,
                    const backend::Bias& bias, const PreparedMatrices& prepared) {
    require_layer(transform, weights);
    const formats::FormatSpec& f = formats::spec(weights.format);
    Carver carver(workspace.data(), workspace.size());
    const Pieces p = carve(carver, transform, f, n_tokens, weights.d_out);
    const float* bias_f = bias_as_float(bias, weights.d_out, p.bias);
    const std::span<std::uint8_t> codes(p.codes, p.sizes.codes), scales(p.scales, p.sizes.scales);
    // The quantization runs on the work pool like the GEMM (the pool keeps a job small enough
    // to lose to its helpers on the calling thread: threads/team_policy.h).
    quantize_activations(transform, use, f, x_dtype, x, n_tokens, codes, scales, isa, {p.norms, p.norm_count}, threads,
                         prepared);
    gemm_rest(carver, isa, threads, weights, codes, scales, n_tokens, y_dtype, y, packed, bias_f);
}

void linear_gemm(Isa isa, std::size_t threads, const BlockTransform& transform, const formats::PackedMatrix& weights,
                 std::span<const std::uint8_t> codes, std::span<const std::uint8_t> scales, std::size_t n_tokens,
                 wush_dtype y_dtype, void* y, std::span<std::byte> workspace, const PanelPack* packed) {
    require_layer(transform, weights);
    Carver carver(workspace.data(), workspace.size());
    carve(carver, transform, formats::spec(weights.format), n_tokens, weights.d_out);  // forward()'s layout
    gemm_rest(carver, isa, threads, weights, codes, scales, n_tokens, y_dtype, y, packed, nullptr);
}

}  // namespace wush::cpu
