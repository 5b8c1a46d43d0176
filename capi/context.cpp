#include "context.h"

#include <algorithm>
#include <memory>
#include <string>

#include <omp.h>

#include "guard.h"
#include "common/cpu_isa.h"

namespace wush::capi {

ContextUse::ContextUse(wush_context* ctx, const char* arg) : ctx_(ctx) {
    require_handle(ctx, HandleType::Context, arg);
    lock_ = std::unique_lock(ctx->mutex);
    saved_threads_ = omp_get_max_threads();
    // More threads than processors never helps these kernels, and asking libgomp for thousands
    // can fail to create them (which ends the process): the setting is clamped here.
    if (ctx->num_threads > 0) omp_set_num_threads(int(std::min<std::int64_t>(ctx->num_threads, omp_get_num_procs())));
}

ContextUse::~ContextUse() { omp_set_num_threads(saved_threads_); }

backend::HostSettings ContextUse::host() const {
    return {wush::runtime::resolve_isa(ctx_->cpu_isa), std::size_t(std::max(omp_get_max_threads(), 1))};
}

}  // namespace wush::capi

using namespace wush::capi;

extern "C" {

WUSH_API wush_status wush_context_create(wush_backend backend, int device, wush_context** ctx) {
    return guarded(__func__, [&] {
        require_pointer(ctx, "ctx");
        auto c = std::make_unique<wush_context>();
        c->backend = wush::backend::make_backend(backend, device);
        register_handle(c.get(), HandleType::Context);
        *ctx = c.release();
    });
}

WUSH_API void wush_context_destroy(wush_context* ctx) {
    if (ctx != nullptr && unregister_handle(ctx, HandleType::Context)) delete ctx;
}

WUSH_API wush_status wush_context_backend(const wush_context* ctx, wush_backend* backend) {
    return guarded(__func__, [&] {
        require_handle(ctx, HandleType::Context, "ctx");
        require_pointer(backend, "backend");
        *backend = ctx->backend->kind();
    });
}

WUSH_API wush_status wush_context_set_parameter(wush_context* ctx, wush_context_parameter param, int64_t value) {
    return guarded(__func__, [&] {
        ContextUse use(ctx, "ctx");
        switch (param) {
            case WUSH_CONTEXT_NUM_THREADS:
                if (value < 0 || value > 4096)
                    wush::fail(WUSH_ERR_INVALID_ARGUMENT, "WUSH_CONTEXT_NUM_THREADS must be in [0, 4096], got " + std::to_string(value));
                use->num_threads = value;
                return;
            case WUSH_CONTEXT_CPU_ISA:
                wush::runtime::resolve_isa(value);  // INVALID_ARGUMENT / UNSUPPORTED before any change
                use->cpu_isa = value;
                return;
            default: break;  // out-of-range values are handled after the switch
        }
        wush::fail(WUSH_ERR_INVALID_ARGUMENT, "unknown wush_context_parameter " + std::to_string(int(param)));
    });
}

WUSH_API wush_status wush_context_get_parameter(const wush_context* ctx, wush_context_parameter param, int64_t* value) {
    return guarded(__func__, [&] {
        ContextUse use(const_cast<wush_context*>(ctx), "ctx");
        require_pointer(value, "value");
        switch (param) {
            case WUSH_CONTEXT_NUM_THREADS: *value = use->num_threads; return;
            case WUSH_CONTEXT_CPU_ISA: *value = use->cpu_isa; return;
            default: break;  // out-of-range values are handled after the switch
        }
        wush::fail(WUSH_ERR_INVALID_ARGUMENT, "unknown wush_context_parameter " + std::to_string(int(param)));
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
