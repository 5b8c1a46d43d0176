#include "context.h"

#include <memory>
#include <string>

#include <omp.h>

#include "guard.h"
#include "cpu/cpu_isa.h"
#ifdef WUSH_HAVE_CUDA
#include "runtime.h"  // cuda/
#endif

namespace wush::capi {

ContextUse::ContextUse(wush_context* ctx, const char* arg) : ctx_(ctx) {
    require_handle(ctx, HandleType::Context, arg);
    lock_ = std::unique_lock(ctx->mutex);
    saved_threads_ = omp_get_max_threads();
    if (ctx->num_threads > 0) omp_set_num_threads(int(ctx->num_threads));
}

ContextUse::~ContextUse() { omp_set_num_threads(saved_threads_); }

namespace {

void check_device(wush_backend backend, int device) {
    if (backend == WUSH_BACKEND_CPU) {
        if (device != 0) fail(WUSH_ERR_INVALID_ARGUMENT, "a CPU context takes device 0, got " + std::to_string(device));
        return;
    }
    if (backend != WUSH_BACKEND_CUDA) fail(WUSH_ERR_INVALID_ARGUMENT, "unknown wush_backend " + std::to_string(int(backend)));
    if (device < 0) fail(WUSH_ERR_INVALID_ARGUMENT, "CUDA device index " + std::to_string(device) + " is negative");
#ifdef WUSH_HAVE_CUDA
    const cuda::DeviceQuery q = cuda::query_devices();
    if (q.count == 0) fail(WUSH_ERR_UNSUPPORTED, "no usable CUDA device: " + q.error);
    if (device >= q.count)
        fail(WUSH_ERR_INVALID_ARGUMENT, "CUDA device " + std::to_string(device) + " does not exist (" +
                                            std::to_string(q.count) + " present)");
#else
    fail(WUSH_ERR_UNSUPPORTED, "this libwush was built without the CUDA backend (WUSH_CUDA=OFF or no nvcc)");
#endif
}

}  // namespace
}  // namespace wush::capi

using namespace wush::capi;

extern "C" {

WUSH_API wush_status wush_context_create(wush_backend backend, int device, wush_context** ctx) {
    return guarded(__func__, [&] {
        require_pointer(ctx, "ctx");
        check_device(backend, device);
        auto c = std::make_unique<wush_context>();
        c->backend = backend;
        c->device = device;
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
        *backend = ctx->backend;
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

}  // extern "C"
