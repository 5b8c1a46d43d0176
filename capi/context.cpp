#include "context.h"

#include <algorithm>
#include <memory>
#include <string>

#include <omp.h>

#include "backend/context_parameters.h"
#include "guard.h"

namespace wush::capi {

ContextUse::ContextUse(wush_context* ctx, const char* arg) : ctx_(require_handle(ctx, HandleType::Context, arg)) {
    lock_ = std::unique_lock(ctx_->mutex);
    saved_threads_ = omp_get_max_threads();
    // 0 keeps OpenMP's default, which host_threads() then reads back.
    if (ctx_->backend->parameter(WUSH_CONTEXT_NUM_THREADS) > 0) omp_set_num_threads(int(host_threads()));
}

ContextUse::~ContextUse() {
    omp_set_num_threads(saved_threads_);
}

wush::Isa ContextUse::host_isa() const {
    return wush::resolve_isa(ctx_->backend->parameter(WUSH_CONTEXT_CPU_ISA));
}

std::size_t ContextUse::host_threads() const {
    return backend::openmp_threads(ctx_->backend->parameter(WUSH_CONTEXT_NUM_THREADS));
}

}  // namespace wush::capi

using namespace wush::capi;

extern "C" {

WUSH_API wush_status wush_context_create(wush_backend backend, int device, wush_context** ctx) {
    return guarded(__func__, [&] {
        require_pointer(ctx, "ctx");
        auto c = std::make_unique<wush_context>();
        c->backend = wush::backend::make_backend(backend, device);
        *ctx = hand_out(c.get(), HandleType::Context);
        c.release();
    });
}

WUSH_API void wush_context_destroy(wush_context* ctx) {
    delete take_back(ctx, HandleType::Context);
}

WUSH_API wush_status wush_context_backend(const wush_context* ctx, wush_backend* backend) {
    return guarded(__func__, [&] {
        ctx = require_handle(ctx, HandleType::Context, "ctx");
        require_pointer(backend, "backend");
        *backend = ctx->backend->kind();
    });
}

WUSH_API wush_status wush_context_set_parameter(wush_context* ctx, wush_context_parameter param, int64_t value) {
    return guarded(__func__, [&] {
        ContextUse use(ctx, "ctx");
        use.backend().set_parameter(param, value);
    });
}

WUSH_API wush_status wush_context_get_parameter(const wush_context* ctx, wush_context_parameter param, int64_t* value) {
    return guarded(__func__, [&] {
        ContextUse use(const_cast<wush_context*>(ctx), "ctx");
        require_pointer(value, "value");
        *value = use.backend().parameter(param);
    });
}

WUSH_API wush_status wush_context_set_stream(wush_context* ctx, void* stream) {
    return guarded(__func__, [&] {
        ContextUse use(ctx, "ctx");
        use.backend().set_stream(stream);
    });
}

WUSH_API wush_status wush_context_get_stream(const wush_context* ctx, void** stream) {
    return guarded(__func__, [&] {
        ContextUse use(const_cast<wush_context*>(ctx), "ctx");
        require_pointer(stream, "stream");
        *stream = use.backend().stream();
    });
}

WUSH_API wush_status wush_context_synchronize(wush_context* ctx) {
    return guarded(__func__, [&] {
        ContextUse use(ctx, "ctx");
        use.backend().synchronize();
    });
}

WUSH_API wush_status wush_context_describe(const wush_context* ctx, char* text, size_t text_bytes) {
    return guarded(__func__, [&] {
        ContextUse use(const_cast<wush_context*>(ctx), "ctx");
        require_pointer(text, "text");
        const std::string d = use.backend().describe();
        require_size(text_bytes, d.size() + 1, "text", "bytes");
        d.copy(text, d.size());
        text[d.size()] = '\0';
    });
}

}  // extern "C"
