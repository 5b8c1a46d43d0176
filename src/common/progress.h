// Progress reporting and cancellation for long operations, safe to use inside OpenMP loops: any
// thread may report, but only the thread that created the Progress (the API caller's thread,
// which is OpenMP's master) calls the user's callback. A cancel request is remembered; loops
// skip their remaining work and the operation throws CANCELLED once it is outside the loop.
#pragma once

#include <atomic>
#include <functional>
#include <thread>

#include "common/error.h"

namespace wush {

class Progress {
public:
    // `callback` gets the fraction done in [0, 1] and returns false to cancel. May be empty.
    explicit Progress(std::function<bool(double)> callback = {})
        : callback_(std::move(callback)), owner_(std::this_thread::get_id()) {}

    // Records that `done` of `total` units are finished; returns false once cancelled.
    bool report(double done, double total) {
        if (std::this_thread::get_id() == owner_) deliver(total > 0 ? done / total : 1.0);
        return !cancelled();
    }

    // Called by the owner after a parallel loop: worker threads never call the callback, so the
    // final 1.0 (and the user's last chance to cancel) may not have been delivered yet.
    // Throws CANCELLED if the operation was cancelled.
    void finish() {
        if (last_ < 1.0) deliver(1.0);
        throw_if_cancelled();
    }

    bool cancelled() const noexcept { return cancelled_.load(std::memory_order_relaxed); }

    void throw_if_cancelled() const {
        if (cancelled()) fail(WUSH_ERR_CANCELLED, "cancelled by the progress callback");
    }

private:
    void deliver(double fraction) {
        if (!callback_ || cancelled()) return;
        last_ = fraction;
        if (!callback_(fraction)) cancelled_.store(true, std::memory_order_relaxed);
    }

    std::function<bool(double)> callback_;
    std::thread::id owner_;
    double last_ = -1.0;  // the last fraction delivered (owner thread only)
    std::atomic<bool> cancelled_{false};
};

}  // namespace wush
