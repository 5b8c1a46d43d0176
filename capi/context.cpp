#include "context.h"

#include <algorithm>
#include <memory>
#include <string>

#include <omp.h>

#include "backend/context_parameters.h"
#include "guard.h"
#include "threads/fork_state.h"

namespace wush::capi {

void mark_context_after_fork(wush_context& ctx) noexcept {
    // The child has one thread, so nothing else takes the lock between these two steps.
    if (ctx.mutex.try_lock()) ctx.mutex.unlock();
    else ctx.in_call_at_fork = true;
}

ContextUse::ContextUse(wush_context* ctx, const char* arg) : ctx_(require_handle(ctx, HandleType::Context, arg)) {
    if (ctx_->in_call_at_fork)
        fail(WUSH_ERR_INVALID_ARGUMENT,
             std::string(arg) +
                 " was inside a call on another thread when this process fork()ed: in this child its state may be "
                 "half-updated and its lock is held by a thread that does not exist here; create a new context in "
                 "the child (wush_context_destroy releases this one's handle only)");
    lock_ = std::unique_lock(ctx_->mutex);
    saved_threads_ = omp_get_max_threads();
    // 0 keeps OpenMP's default, which host_threads() then reads back. A thread that forked keeps
    // OpenMP at one thread (threads/fork_state.h); the context's count is for the work pool there.
    if (ctx_->backend->parameter(WUSH_CONTEXT_NUM_THREADS) > 0 && !wush::threads::openmp_state_inherited())
        omp_set_num_threads(int(host_threads()));
}

ContextUse::~ContextUse() {
    omp_set_num_threads(saved_threads_);
}

wush::Isa ContextUse::host_isa() const {
    return wush::resolve_isa(ctx_->backend->parameter(WUSH_CONTEXT_CPU_ISA));
}

std::size_t ContextUse::host_threads() const {
    return ctx_->backend->host_threads();
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
    wush_context* c = take_back(ctx, HandleType::Context);
    // A context caught inside a call by fork() (mark_context_after_fork) is left as it is in the
    // child: freeing a half-updated backend could crash, and its memory is the parent's copy.
    if (c != nullptr && c->in_call_at_fork) return;
    delete c;
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
