#include "cpu/linear_forward.h"

#include <string>

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
    formats::PackedSizes sizes{};
    std::size_t norm_count = 0;
};

// The quantized activations and the quantizer's scratch; the GEMM gets what is left.
Pieces carve(Carver& c, const BlockTransform& t, const formats::FormatSpec& f, std::size_t n_tokens) {
    Pieces p;
    p.sizes = formats::packed_sizes(f, n_tokens, t.d_in());
    p.norm_count = quantize_scratch_floats(t, MatrixUse::PerBlock);  // the most any call needs
    p.codes = c.take<std::uint8_t>(p.sizes.codes);
    p.scales = c.take<std::uint8_t>(p.sizes.scales);
    p.norms = c.take<float>(p.norm_count);
    return p;
}

}  // namespace

std::size_t linear_forward_workspace_bytes(const BlockTransform& transform, const formats::PackedMatrix& weights,
                                           std::size_t n_tokens, std::size_t threads) {
    require_layer(transform, weights);
    const formats::FormatSpec& f = formats::spec(weights.format);
    Carver measure;
    carve(measure, transform, f, n_tokens);
    measure.take<std::byte>(gemm_scratch_bytes(f, n_tokens, weights.d_out, weights.d_in, threads));
    return measure.used();
}

void linear_forward(Isa isa, std::size_t threads, const BlockTransform& transform, MatrixUse use,
                    const formats::PackedMatrix& weights, wush_dtype x_dtype, const void* x, std::size_t n_tokens,
                    wush_dtype y_dtype, void* y, std::span<std::byte> workspace, const PanelPack* packed) {
    require_layer(transform, weights);
    const formats::FormatSpec& f = formats::spec(weights.format);
    Carver carver(workspace.data(), workspace.size());
    const Pieces p = carve(carver, transform, f, n_tokens);
    const std::span<std::uint8_t> codes(p.codes, p.sizes.codes), scales(p.scales, p.sizes.scales);
    // The quantization runs on the work pool like the GEMM (the pool keeps a job small enough
    // to lose to its helpers on the calling thread: threads/team_policy.h).
    quantize_activations(transform, use, f, x_dtype, x, n_tokens, codes, scales, isa, {p.norms, p.norm_count}, threads);
    const std::size_t rest = carver.left();
    std::byte* gemm_space = carver.take<std::byte>(rest > 63 ? rest - 63 : 0);
    gemm(isa, threads, weights, codes, scales, n_tokens, y_dtype, y, {gemm_space, rest > 63 ? rest - 63 : 0}, packed);
}

}  // namespace wush::cpu
