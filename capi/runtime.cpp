// The runtime's C API: fused transform + quantization, the W4A4 GEMM, the linear forward and its
// workspace on the context's backend; the runtime loss and ISA queries (CPU). Argument checks
// only; no numerics, and no backend named: the work goes through backend::Backend.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/checked_math.h"
#include "common/cpu_isa.h"
#include "common/dtype.h"
#include "context.h"
#include "dense_input.h"
#include "enum_mirrors.h"
#include "eval/runtime_loss.h"
#include "guard.h"
#include "objects.h"
#include "packed_output.h"

using namespace wush::capi;
namespace fmt = wush::formats;

namespace {

wush::backend::TransformRef ref(const wush_transform* t) {
    return {t->core, t->runtime_use};
}

}  // namespace

extern "C" {

WUSH_API const char* wush_cpu_isa_name(wush_cpu_isa isa) {
    switch (isa) {
        case WUSH_CPU_ISA_AUTO: return "auto";
        case WUSH_CPU_ISA_SCALAR: return "scalar";
        case WUSH_CPU_ISA_AVX2: return "avx2";
        case WUSH_CPU_ISA_AVX512_VNNI: return "avx512_vnni";
        default: break;  // out-of-range values are handled after the switch
    }
    return nullptr;
}

WUSH_API int wush_cpu_isa_supported(wush_cpu_isa isa) {
    switch (isa) {
        case WUSH_CPU_ISA_AUTO: return 1;
        case WUSH_CPU_ISA_SCALAR:
        case WUSH_CPU_ISA_AVX2:
        case WUSH_CPU_ISA_AVX512_VNNI: return wush::isa_supported(mirror<wush::Isa>(isa)) ? 1 : 0;
        default: break;  // out-of-range values are handled after the switch
    }
    return 0;
}

WUSH_API wush_status wush_context_cpu_isa(const wush_context* ctx, wush_cpu_isa* isa) {
    return guarded(__func__, [&] {
        ContextUse use(const_cast<wush_context*>(ctx), "ctx");
        require_pointer(isa, "isa");
        *isa = mirror<wush_cpu_isa>(use.host_isa());
    });
}

WUSH_API wush_status wush_quantize_activations(wush_context* ctx, const wush_transform* transform, wush_format format,
                                               wush_dtype dtype, const void* x, size_t n_tokens, size_t d_in,
                                               void* codes, size_t codes_bytes, void* scales, size_t scales_bytes) {
    return guarded(__func__, [&] {
        ContextUse use(ctx, "ctx");
        transform = require_handle(transform, HandleType::Transform, "transform");
        const fmt::FormatSpec& f = fmt::spec(format);
        wush::dtype_size(dtype);  // validates
        const wush::BlockTransform& t = transform->core;
        if (d_in != t.d_in())
            wush::fail(WUSH_ERR_INVALID_ARGUMENT,
                       "d_in = " + std::to_string(d_in) + " but the transform has d_in = " + std::to_string(t.d_in()));
        fmt::require_group(f, t.group());
        const fmt::PackedSizes need = fmt::packed_sizes(f, n_tokens, d_in);
        if (n_tokens == 0) return;
        require_pointer(x, "x");
        const PackedOutput out = packed_output(codes, codes_bytes, scales, scales_bytes, need);
        use.backend().quantize_activations(ref(transform), f, dtype, x, n_tokens, out.codes, out.scales);
    });
}

WUSH_API wush_status wush_gemm(wush_context* ctx, const wush_qweight* qweight, const void* a_codes,
                               size_t a_codes_bytes, const void* a_scales, size_t a_scales_bytes, size_t m,
                               wush_dtype y_dtype, void* y, size_t y_count) {
    return guarded(__func__, [&] {
        ContextUse use(ctx, "ctx");
        qweight = require_handle(qweight, HandleType::QWeight, "qweight");
        require_output_dtype(y_dtype);
        const fmt::PackedMatrix& w = qweight->core;
        const fmt::FormatSpec& f = fmt::spec(w.format);
        const fmt::PackedSizes need = fmt::packed_sizes(f, m, w.d_in);
        if (m == 0) return;
        require_pointer(y, "y");
        const PackedInput a =
            packed_input(a_codes, a_codes_bytes, a_scales, a_scales_bytes, need, "a_codes", "a_scales");
        require_size(y_count, wush::checked_mul(m, w.d_out, "m * d_out"), "y", "elements");
        use.backend().gemm(w, a.codes, a.scales, m, y_dtype, y);
    });
}

WUSH_API wush_status wush_linear_forward_workspace_size(wush_context* ctx, const wush_transform* transform,
                                                        const wush_qweight* qweight, size_t n_tokens, size_t* bytes) {
    return guarded(__func__, [&] {
        ContextUse use(ctx, "ctx");
        transform = require_handle(transform, HandleType::Transform, "transform");
        qweight = require_handle(qweight, HandleType::QWeight, "qweight");
        require_pointer(bytes, "bytes");
        *bytes = use.backend().linear_forward_workspace_bytes(ref(transform), qweight->core, n_tokens);
    });
}

WUSH_API wush_status wush_linear_forward(wush_context* ctx, const wush_transform* transform,
                                         const wush_qweight* qweight, wush_dtype x_dtype, const void* x,
                                         size_t n_tokens, wush_dtype y_dtype, void* y, size_t y_count, void* workspace,
                                         size_t workspace_bytes) {
    return guarded(__func__, [&] {
        ContextUse use(ctx, "ctx");
        transform = require_handle(transform, HandleType::Transform, "transform");
        qweight = require_handle(qweight, HandleType::QWeight, "qweight");
        wush::dtype_size(x_dtype);  // validates
        require_output_dtype(y_dtype);
        const wush::BlockTransform& t = transform->core;
        const fmt::PackedMatrix& w = qweight->core;
        wush::require_layer(t, w);
        if (n_tokens == 0) return;
        require_pointer(x, "x");
        require_pointer(y, "y");
        require_size(y_count, wush::checked_mul(n_tokens, w.d_out, "n_tokens * d_out"), "y", "elements");
        // The smallest workspace that works is the one for a single thread.
        require_size(workspace_bytes, use.backend().linear_forward_minimum_workspace_bytes(ref(transform), w, n_tokens),
                     "workspace", "bytes");
        require_pointer(workspace, "workspace");
        use.backend().linear_forward(ref(transform), w, x_dtype, x, n_tokens, y_dtype, y,
                                     {static_cast<std::byte*>(workspace), workspace_bytes});
    });
}

WUSH_API wush_status wush_layer_loss_runtime(wush_context* ctx, const wush_transform* transform,
                                             const wush_qweight* qweight, wush_dtype w_dtype, const void* weight,
                                             wush_dtype x_dtype, const void* x, size_t n_tokens, double* loss) {
    return guarded(__func__, [&] {
        ContextUse use(ctx, "ctx");
        transform = require_handle(transform, HandleType::Transform, "transform");
        qweight = require_handle(qweight, HandleType::QWeight, "qweight");
        require_pointer(loss, "loss");
        const fmt::PackedMatrix& q = qweight->core;
        wush::require_layer(transform->core, q);
        if (n_tokens == 0) wush::fail(WUSH_ERR_INVALID_ARGUMENT, "n_tokens is 0");
        const FloatMatrix w(w_dtype, weight, q.d_out, q.d_in, "weight");
        const FloatMatrix xs(x_dtype, x, n_tokens, q.d_in, "x");
        // Host memory and the CPU runtime on any context (this measures, it does not launch): a
        // CPU backend with this context's ISA and threads, through the backend interface.
        const std::unique_ptr<wush::backend::Backend> host = wush::backend::make_backend(WUSH_BACKEND_CPU, 0);
        host->set_parameter(WUSH_CONTEXT_CPU_ISA, std::int64_t(use.host_isa()));
        host->set_parameter(WUSH_CONTEXT_NUM_THREADS, std::int64_t(use.host_threads()));
        const std::size_t tile = wush::eval::runtime_loss_tile_tokens(n_tokens);
        std::vector<std::byte> workspace(host->linear_forward_workspace_bytes(ref(transform), q, tile));
        const auto forward = [&](const float* xt, std::size_t rows, float* y) {
            host->linear_forward(ref(transform), q, WUSH_DTYPE_F32, xt, rows, WUSH_DTYPE_F32, y, workspace);
        };
        *loss = wush::eval::runtime_layer_loss(forward, w.span(), q.d_out, q.d_in, xs.span(), n_tokens);
    });
}

}  // extern "C"
