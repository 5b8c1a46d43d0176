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
};

namespace wush::capi {

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

private:
    wush_context* ctx_;
    std::unique_lock<std::mutex> lock_;
    int saved_threads_ = 0;
};

}  // namespace wush::capi
