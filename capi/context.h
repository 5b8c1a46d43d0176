// The wush_context object: the backend it owns (which owns the context's parameters) and the lock
// that serializes calls on one context.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>

#include "backend/backend.h"
#include "common/cpu_isa.h"
#include "handles.h"
#include "wush/wush.h"

struct wush_context {
    std::unique_ptr<wush::backend::Backend> backend;
    std::mutex mutex;
    // Set in a fork()ed child when the context was inside a call at the fork (mutex held): its
    // backend may be half-updated and its lock stays held by a thread the child does not have,
    // so the child refuses it rather than wait forever. Written only by the fork child handler,
    // while the child has one thread.
    bool in_call_at_fork = false;
};

namespace wush::capi {

// In a fork()ed child (the handle table's child handler, capi/handles.cpp, for each live
// context): marks a context whose lock was held at the fork.
void mark_context_after_fork(wush_context& ctx) noexcept;

// Holds a context for the duration of one API call: checks the handle, takes its lock, and
// applies the backend's thread setting to this thread's OpenMP regions (restored afterwards), so
// the host-side numerics of the call (calibration, transform builds, losses) follow it too.
class ContextUse {
public:
    ContextUse(wush_context* ctx, const char* arg);
    ~ContextUse();
    ContextUse(const ContextUse&) = delete;
    ContextUse& operator=(const ContextUse&) = delete;
    wush_context& operator*() const { return *ctx_; }
    wush_context* operator->() const { return ctx_; }
    backend::Backend& backend() const { return *ctx_->backend; }
    // The ISA of the CPU kernels this call may run on the host (the backend's setting, resolved).
    Isa host_isa() const;
    // Threads of the host-side work of this call (the backend's WUSH_CONTEXT_NUM_THREADS setting,
    // resolved): the count the constructor gave OpenMP, passed explicitly to the CPU kernels.
    std::size_t host_threads() const;

private:
    wush_context* ctx_;
    std::unique_lock<std::mutex> lock_;
    int saved_threads_ = 0;
};

}  // namespace wush::capi
