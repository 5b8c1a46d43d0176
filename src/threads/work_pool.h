// The CPU runtime's threads: a process-wide pool that runs one job at a time as a counter of
// small chunks, claimed one at a time by its helper threads and by the calling thread.
#pragma once

#include <cstddef>

namespace wush::threads {

// body(ctx, slot, begin, end) for [begin, end) pieces of [0, count); `slot` < threads is the
// running thread's index in this call (for per-thread scratch).
using ChunkBody = void (*)(void* ctx, std::size_t slot, std::size_t begin, std::size_t end);

// Runs body over [0, count) in chunks of at least `grain` on up to `threads` threads, the calling
// thread included; returns when every chunk has run. Which thread runs which chunk varies, never
// what a chunk computes. A call made while another thread's job holds the pool runs alone; so does
// a small job while helpers have recently stalled the caller (team_policy.h). `work` estimates the
// job's cost in a unit proportional to time for this body (e.g. multiply-adds).
void run_chunks(std::size_t count, std::size_t grain, std::size_t threads, double work, ChunkBody body, void* ctx);

// While one of these lives on a thread, that thread's parallel calls run their chunks on the
// process's OpenMP threads (the caller and the members of an OpenMP team it starts) instead of
// libwush's own helpers, where the process has an OpenMP runtime: a host that runs OpenMP itself
// (PyTorch) keeps its workers spinning for a while after each of its operations, on the very
// cores the library's helpers would want; on its team they run the library's chunks instead.
// Falls back to the own pool inside an OpenMP region, in a fork()ed child, and where no OpenMP
// runtime is found. The scope sets the thread's setting to `on` and restores the previous one.
class OpenMpTeamScope {
public:
    explicit OpenMpTeamScope(bool on);
    ~OpenMpTeamScope();
    OpenMpTeamScope(const OpenMpTeamScope&) = delete;
    OpenMpTeamScope& operator=(const OpenMpTeamScope&) = delete;

private:
    bool previous_;
};

// Whether a call on this thread now would run on an OpenMP team (an OpenMpTeamScope is active and
// an OpenMP runtime is usable here); for tests and diagnostics.
bool on_openmp_team();

// Runs fn(slot, begin, end) over [0, count) in chunks of `grain` on up to `threads` threads.
template <typename Fn>
void parallel_chunks(std::size_t count, std::size_t grain, std::size_t threads, double work, Fn&& fn) {
    run_chunks(
        count, grain, threads, work,
        [](void* ctx, std::size_t slot, std::size_t b, std::size_t e) { (*static_cast<Fn*>(ctx))(slot, b, e); }, &fn);
}

}  // namespace wush::threads
