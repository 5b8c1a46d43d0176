// Prepared layers (wush_linear): a transform and a qweight bound once to a context's backend,
// then run many times. Argument checks only; the backend does the work.
#include <cstdint>
#include <cstring>
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
    layer = require_handle(layer, HandleType::Linear, "layer");
    if (layer->context != &*use)
        wush::fail(WUSH_ERR_INVALID_ARGUMENT, "layer was prepared on another wush_context; use that one");
    // A new context at the address of the layer's destroyed one is another context: the layer's
    // backend objects died with the old one.
    if (generation(&*use, HandleType::Context) != layer->context_generation)
        wush::fail(WUSH_ERR_INVALID_ARGUMENT, "layer was prepared on a wush_context that has been destroyed");
    return *layer->layer;
}

// wush_linear_run and wush_linear_run_bias: the argument checks, then the backend's forward.
struct BiasArgument {
    wush_dtype dtype = WUSH_DTYPE_F32;
    const void* data = nullptr;  // nullptr: no bias (dtype and count are not read)
    size_t count = 0;
};

void run_layer(wush_context* ctx, wush_linear* layer, wush_dtype x_dtype, const void* x, size_t n_tokens,
               const BiasArgument& bias, wush_dtype y_dtype, void* y, size_t y_count, void* workspace,
               size_t workspace_bytes) {
    ContextUse use(ctx, "ctx");
    wush::backend::PreparedLayer& l = layer_of(use, layer);
    wush::dtype_size(x_dtype);  // validates
    require_output_dtype(y_dtype);
    if (bias.data != nullptr) {
        wush::dtype_size(bias.dtype);  // validates
        if (bias.count != l.d_out())
            wush::fail(WUSH_ERR_INVALID_ARGUMENT, "bias has " + std::to_string(bias.count) +
                                                      " elements; the layer's d_out is " + std::to_string(l.d_out()));
    }
    if (n_tokens == 0) return;
    require_pointer(x, "x");
    require_pointer(y, "y");
    require_size(y_count, wush::checked_mul(n_tokens, l.d_out(), "n_tokens * d_out"), "y", "elements");
    // The smallest workspace that works is the one for a single thread.
    require_size(workspace_bytes, l.minimum_workspace_bytes(n_tokens), "workspace", "bytes");
    require_pointer(workspace, "workspace");
    l.forward(x_dtype, x, n_tokens, {bias.dtype, bias.data}, y_dtype, y,
              {static_cast<std::byte*>(workspace), workspace_bytes});
}

}  // namespace

extern "C" {

WUSH_API wush_status wush_linear_create(wush_context* ctx, const wush_transform* transform, const wush_qweight* qweight,
                                        wush_linear** layer) {
    return guarded(__func__, [&] {
        ContextUse use(ctx, "ctx");
        transform = require_handle(transform, HandleType::Transform, "transform");
        qweight = require_handle(qweight, HandleType::QWeight, "qweight");
        require_pointer(layer, "layer");
        wush::require_layer(transform->core, qweight->core);
        auto l = std::make_unique<wush_linear>();
        l->context = &*use;
        l->context_generation = generation(&*use, HandleType::Context);
        l->layer = use.backend().prepare({transform->core, transform->runtime_use}, qweight->core);
        *layer = hand_out(l.get(), HandleType::Linear);
        l.release();
    });
}

WUSH_API void wush_linear_destroy(wush_linear* layer) {
    delete take_back(layer, HandleType::Linear);
}

WUSH_API wush_status wush_linear_info(const wush_linear* layer, size_t* d_out, size_t* d_in, wush_format* format) {
    return guarded(__func__, [&] {
        layer = require_handle(layer, HandleType::Linear, "layer");
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
        run_layer(ctx, layer, x_dtype, x, n_tokens, {}, y_dtype, y, y_count, workspace, workspace_bytes);
    });
}

WUSH_API wush_status wush_linear_run_bias(wush_context* ctx, wush_linear* layer, wush_dtype x_dtype, const void* x,
                                          size_t n_tokens, wush_dtype bias_dtype, const void* bias, size_t bias_count,
                                          wush_dtype y_dtype, void* y, size_t y_count, void* workspace,
                                          size_t workspace_bytes) {
    return guarded(__func__, [&] {
        run_layer(ctx, layer, x_dtype, x, n_tokens, {bias_dtype, bias, bias_count}, y_dtype, y, y_count, workspace,
                  workspace_bytes);
    });
}

WUSH_API wush_status wush_linear_run_quantized(wush_context* ctx, wush_linear* layer, const void* codes,
                                               size_t codes_bytes, const void* scales, size_t scales_bytes,
                                               size_t n_tokens, wush_dtype y_dtype, void* y, size_t y_count,
                                               void* workspace, size_t workspace_bytes) {
    return guarded(__func__, [&] {
        ContextUse use(ctx, "ctx");
        wush::backend::PreparedLayer& l = layer_of(use, layer);
        require_output_dtype(y_dtype);
        if (n_tokens == 0) return;
        const fmt::PackedSizes need = fmt::packed_sizes(fmt::spec(l.format()), n_tokens, l.d_in());
        require_pointer(codes, "codes");
        require_pointer(scales, "scales");
        require_size(codes_bytes, need.codes, "codes", "bytes");
        require_size(scales_bytes, need.scales, "scales", "bytes");
        require_pointer(y, "y");
        require_size(y_count, wush::checked_mul(n_tokens, l.d_out(), "n_tokens * d_out"), "y", "elements");
        require_size(workspace_bytes, l.minimum_workspace_bytes(n_tokens), "workspace", "bytes");
        require_pointer(workspace, "workspace");
        l.forward_quantized(static_cast<const std::uint8_t*>(codes), static_cast<const std::uint8_t*>(scales), n_tokens,
                            y_dtype, y, {static_cast<std::byte*>(workspace), workspace_bytes});
    });
}

WUSH_API wush_status wush_linear_last_kernels(const wush_linear* layer, char* text, size_t text_bytes) {
    return guarded(__func__, [&] {
        layer = require_handle(layer, HandleType::Linear, "layer");
        require_pointer(text, "text");
        const std::string names = layer->layer->last_kernels();
        require_size(text_bytes, names.size() + 1, "text", "bytes");
        std::memcpy(text, names.c_str(), names.size() + 1);
    });
}

}  // extern "C"
