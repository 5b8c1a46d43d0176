// The wush_context object: the backend it owns, the host execution settings, and the lock that
// serializes calls on one context.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>

#include "backend/backend.h"
#include "handles.h"
#include "wush/wush.h"

struct wush_context {
    std::unique_ptr<wush::backend::Backend> backend;
    std::int64_t num_threads = 0;  // 0 = OpenMP default
    std::int64_t cpu_isa = 0;      // a wush_cpu_isa value; 0 = the fastest the CPU supports
    std::mutex mutex;
};

namespace wush::capi {

// Holds a context for the duration of one API call: checks the handle, takes its lock, and
// applies its thread count to this thread's OpenMP regions (restored afterwards).
class ContextUse {
public:
    ContextUse(wush_context* ctx, const char* arg);
    ~ContextUse();
    ContextUse(const ContextUse&) = delete;
    ContextUse& operator=(const ContextUse&) = delete;
    wush_context& operator*() const { return *ctx_; }
    wush_context* operator->() const { return ctx_; }
    backend::Backend& backend() const { return *ctx_->backend; }
    // The settings host-side work of this call runs with (ISA resolved, threads >= 1).
    backend::HostSettings host() const;

private:
    wush_context* ctx_;
    std::unique_lock<std::mutex> lock_;
    int saved_threads_ = 0;
};

}  // namespace wush::capi
