// Prepared layers (wush_linear): a transform and a qweight bound once to a context's backend,
// then run many times. Argument checks only; the backend does the work.
#include <memory>
#include <string>

#include "common/checked_math.h"
#include "common/dtype.h"
#include "context.h"
#include "guard.h"
#include "objects.h"
#include "packed_output.h"

using namespace wush::capi;
namespace fmt = wush::formats;

namespace {

// The layer's backend lives in its context: using it through another context would mix devices
// and streams.
wush::backend::PreparedLayer& layer_of(const ContextUse& use, const wush_linear* layer) {
    require_handle(layer, HandleType::Linear, "layer");
    if (layer->context != &*use)
        wush::fail(WUSH_ERR_INVALID_ARGUMENT, "layer was prepared on another wush_context; use that one");
    return *layer->layer;
}

}  // namespace

extern "C" {

WUSH_API wush_status wush_linear_create(wush_context* ctx, const wush_transform* transform, const wush_qweight* qweight,
                                        wush_linear** layer) {
    return guarded(__func__, [&] {
        ContextUse use(ctx, "ctx");
        require_handle(transform, HandleType::Transform, "transform");
        require_handle(qweight, HandleType::QWeight, "qweight");
        require_pointer(layer, "layer");
        wush::require_layer(transform->core, qweight->core);
        auto l = std::make_unique<wush_linear>();
        l->context = ctx;
        l->layer = use.backend().prepare({transform->core, transform->runtime_use}, qweight->core);
        register_handle(l.get(), HandleType::Linear);
        *layer = l.release();
    });
}

WUSH_API void wush_linear_destroy(wush_linear* layer) {
    if (layer != nullptr && unregister_handle(layer, HandleType::Linear)) delete layer;
}

WUSH_API wush_status wush_linear_info(const wush_linear* layer, size_t* d_out, size_t* d_in, wush_format* format) {
    return guarded(__func__, [&] {
        require_handle(layer, HandleType::Linear, "layer");
        if (d_out != nullptr) *d_out = layer->layer->d_out();
        if (d_in != nullptr) *d_in = layer->layer->d_in();
        if (format != nullptr) *format = layer->layer->format();
    });
}

WUSH_API wush_status wush_linear_workspace_size(wush_context* ctx, const wush_linear* layer, size_t n_tokens,
                                                size_t* bytes) {
    return guarded(__func__, [&] {
        ContextUse use(ctx, "ctx");
        const wush::backend::PreparedLayer& l = layer_of(use, layer);
        require_pointer(bytes, "bytes");
        *bytes = l.workspace_bytes(n_tokens);
    });
}

WUSH_API wush_status wush_linear_quantize(wush_context* ctx, wush_linear* layer, wush_dtype x_dtype, const void* x,
                                          size_t n_tokens, void* codes, size_t codes_bytes, void* scales,
                                          size_t scales_bytes) {
    return guarded(__func__, [&] {
        ContextUse use(ctx, "ctx");
        wush::backend::PreparedLayer& l = layer_of(use, layer);
        wush::dtype_size(x_dtype);  // validates
        const fmt::PackedSizes need = fmt::packed_sizes(fmt::spec(l.format()), n_tokens, l.d_in());
        if (n_tokens == 0) return;
        require_pointer(x, "x");
        const PackedOutput out = packed_output(codes, codes_bytes, scales, scales_bytes, need);
        l.quantize(x_dtype, x, n_tokens, out.codes, out.scales);
    });
}

WUSH_API wush_status wush_linear_run(wush_context* ctx, wush_linear* layer, wush_dtype x_dtype, const void* x,
                                     size_t n_tokens, wush_dtype y_dtype, void* y, size_t y_count, void* workspace,
                                     size_t workspace_bytes) {
    return guarded(__func__, [&] {
        ContextUse use(ctx, "ctx");
        wush::backend::PreparedLayer& l = layer_of(use, layer);
        wush::dtype_size(x_dtype);  // validates
        require_output_dtype(y_dtype);
        if (n_tokens == 0) return;
        require_pointer(x, "x");
        require_pointer(y, "y");
        require_size(y_count, wush::checked_mul(n_tokens, l.d_out(), "n_tokens * d_out"), "y", "elements");
        // The smallest workspace that works is the one for a single thread.
        require_size(workspace_bytes, l.minimum_workspace_bytes(n_tokens), "workspace", "bytes");
        require_pointer(workspace, "workspace");
        l.forward(x_dtype, x, n_tokens, y_dtype, y, {static_cast<std::byte*>(workspace), workspace_bytes});
    });
}

}  // extern "C"
