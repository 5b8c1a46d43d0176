#include "threads/work_pool.h"

#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>

#include "threads/team_policy.h"

namespace wush::threads {

namespace {

// The thread's OpenMpTeamScope setting (set and restored by the scope; read by the pool).
thread_local bool t_openmp_team = false;

// The process's OpenMP runtime, looked up by name in the global scope first (dlsym RTLD_DEFAULT),
// so that in a process where a host (PyTorch) loaded its own copy of libgomp the library runs on
// the host's threads, not on a second pool of its own copy (a wheel bundles one). GOMP_parallel is
// GNU libgomp's entry point for `#pragma omp parallel`; LLVM's and Intel's runtimes export it too.
struct OpenMpRuntime {
    using Parallel = void (*)(void (*)(void*), void*, unsigned, unsigned);
    using Level = int (*)();
    Parallel parallel = nullptr;
    Level level = nullptr;
    pid_t pid = 0;  // the process that looked it up: a fork()ed child must not start teams

    static const OpenMpRuntime& get() {
        static const OpenMpRuntime runtime = [] {
            OpenMpRuntime r;
            r.parallel = reinterpret_cast<Parallel>(dlsym(RTLD_DEFAULT, "GOMP_parallel"));
            r.level = reinterpret_cast<Level>(dlsym(RTLD_DEFAULT, "omp_get_level"));
            r.pid = getpid();
            return r;
        }();
        return runtime;
    }

    // Outside any OpenMP region (a nested region would get one thread), in the process that
    // looked the runtime up (libgomp's pool does not survive fork(): a child must not start teams).
    bool usable() const { return parallel != nullptr && level != nullptr && level() == 0 && getpid() == pid; }
};

// Why not OpenMP for the GEMM: a `parallel` region splits the work before it knows which threads
// will run, and its join waits (spinning first) for every member. On a machine where another
// process keeps a core busy, a worker that is not scheduled holds its static share for a
// scheduler tick or more while the caller spins, which costs small calls many times their work.
// Here work is a counter of small chunks that the threads claim one at a time, the calling thread
// included, so whatever a late thread has not claimed the caller does itself; the caller only
// ever waits for chunks already being run (each a few microseconds to a millisecond), and it
// waits yielding its core and then blocked (futex), not spinning, so a straggler that shares its
// core runs, and the scheduler can move one from a busy core onto the core it frees. Idle helpers
// sleep on a futex; one job runs at a time, and a call that finds the pool busy (another thread of
// the process in its own GEMM) runs alone. A helper preempted in the middle of a chunk still holds
// the caller until it runs again: TeamPolicy (team_policy.h) notices such waits and keeps small
// jobs on the calling thread while they recur. Which thread runs which chunk varies, never what a
// chunk computes: results stay independent of the thread count. The exception, by request
// (OpenMpTeamScope, a context's WUSH_CONTEXT_OPENMP_TEAM): in a process whose host already runs
// OpenMP on every core (PyTorch), the chunks run on the host's OpenMP team, the same counter
// claimed by its members, because a second pool beside the host's spinning workers loses.
//
// fork(): the child has only the thread that forked. The pool takes its job lock around fork()
// (so no job is half-posted), and the child starts with no helpers, spawning new ones on its
// first parallel call.
class WorkPool {
public:
    using Body = ChunkBody;

    static WorkPool& instance() {
        static WorkPool* pool = make();  // never destroyed: helpers may outlive static destructors
        return *pool;
    }

    void run(std::size_t count, std::size_t grain, std::size_t threads, double work, Body body, void* ctx) {
        if (count == 0) return;
        grain = std::max<std::size_t>(grain, 1);
        grain = std::max(grain, (count + kMaxChunks - 1) / kMaxChunks);
        const std::size_t chunks = (count + grain - 1) / grain;
        std::unique_lock<std::mutex> lock(busy_, std::defer_lock);
        if (threads <= 1 || chunks <= 1 || !lock.try_lock()) {
            body(ctx, 0, 0, count);
            return;
        }
        const auto kind = reinterpret_cast<std::uintptr_t>(body);
        const double start = seconds();
        if (!policy_.use_team(kind, work, start)) {
            body(ctx, 0, 0, count);
            policy_.ran_alone(kind, work, seconds() - start);
            return;
        }
        const bool openmp_asked = t_openmp_team && OpenMpRuntime::get().usable();
        if (openmp_asked && choice_.use_openmp(kind, work)) {
            double own_end = start;
            const std::size_t own = run_on_openmp(chunks, threads, body, ctx, count, grain, own_end);
            const double end = seconds();
            policy_.ran_on_team(kind, work, end - start, own_end - start, own, chunks, end - own_end, end);
            choice_.ran(kind, work, true, end - start);
            return;
        }
        start_helpers(threads);
        if (policy_.trying_team() && helpers_asleep(threads)) {
            // Woken for a trial less than a poll window ago, a helper asleep has not woken yet.
            const bool waking = start - trial_wake_ < kYieldMicros * 1e-6;
            if (policy_.postpone_trial(kind, work, waking)) {
                if (!waking) {
                    wake();  // TeamPolicy's fair trial: a later call finds them awake
                    trial_wake_ = start;
                }
                body(ctx, 0, 0, count);
                policy_.ran_alone(kind, work, seconds() - start);
                return;
            }
        }
        const std::size_t own = run_on_team(chunks, threads, body, ctx, count, grain);
        const double own_end = seconds();
        // Wait for chunks still running on helpers (they are short), then block.
        auto finished = [&] { return done_.load(std::memory_order_acquire) == chunks; };
        while (!poll(finished)) {
            const std::uint32_t d = done_.load(std::memory_order_acquire);
            if (d != chunks) done_.wait(d, std::memory_order_acquire);
        }
        const double end = seconds();
        policy_.ran_on_team(kind, work, end - start, own_end - start, own, chunks, end - own_end, end);
        if (openmp_asked) choice_.ran(kind, work, false, end - start);
    }

private:
    static WorkPool* make() {
        auto* pool = new WorkPool;
        pthread_atfork([] { instance().busy_.lock(); }, [] { instance().busy_.unlock(); },
                       [] { instance().reset_in_child(); });
        return pool;
    }

    // In a fork()ed child: the helpers do not exist there, and the job lock, taken by the thread
    // that forked (the child's one thread), is made anew rather than unlocked by another thread id.
    void reset_in_child() {
        new (&busy_) std::mutex;
        helpers_ = 0;
        ready_.store(0, std::memory_order_relaxed);
        sleeping_.store(0, std::memory_order_relaxed);
        state_.store(0, std::memory_order_relaxed);
        done_.store(0, std::memory_order_relaxed);
        policy_ = TeamPolicy{};
        choice_ = PoolChoice{};
        trial_wake_ = -1.0;
    }

    static double seconds() {
        return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    }

    // The job on an OpenMP team of up to `threads` (the caller included), chunks claimed from a
    // counter as on the own pool; returns how many the caller ran, and when it ran out of chunks
    // in `own_end`. The team's end is OpenMP's barrier.
    std::size_t run_on_openmp(std::size_t chunks, std::size_t threads, Body body, void* ctx, std::size_t count,
                              std::size_t grain, double& own_end) {
        struct Job {
            Body body;
            void* ctx;
            std::size_t count, grain, chunks, own = 0;
            std::thread::id caller = std::this_thread::get_id();
            std::atomic<std::size_t> next{0}, slots{1};
            double own_end = 0.0;
        } job{body, ctx, count, grain, chunks};
        auto member = [](void* p) {
            Job& j = *static_cast<Job*>(p);
            const bool caller = std::this_thread::get_id() == j.caller;
            const std::size_t slot = caller ? 0 : j.slots.fetch_add(1, std::memory_order_relaxed);
            std::size_t ran = 0;
            for (std::size_t c; (c = j.next.fetch_add(1, std::memory_order_relaxed)) < j.chunks; ++ran) {
                const std::size_t begin = c * j.grain;
                j.body(j.ctx, slot, begin, std::min(j.count, begin + j.grain));
            }
            if (caller) {
                j.own = ran;
                j.own_end = seconds();
            }
        };
        OpenMpRuntime::get().parallel(member, &job, unsigned(std::min<std::size_t>(threads, kHelperMask + 1)), 0);
        own_end = job.own_end;
        return job.own;
    }

    void start_helpers(std::size_t threads) {
        try {
            for (; helpers_ < threads - 1; ++helpers_)
                std::thread([this, index = helpers_, seen = wake_.load()] { helper(index, seen); }).detach();
        } catch (const std::system_error&) {
            // No more threads to be had: the job runs on those that exist (the caller at least).
        }
    }

    // Whether a helper that a job of `threads` would use sleeps on its futex (or has only just
    // been started), so that it would arrive late.
    bool helpers_asleep(std::size_t threads) const {
        return sleeping_.load(std::memory_order_relaxed) != 0 ||
               ready_.load(std::memory_order_relaxed) < std::min(threads - 1, helpers_);
    }

    // Wakes the helpers without a job: they find nothing to claim (the last job's state says so)
    // and poll again, awake for the next job.
    void wake() {
        wake_.fetch_add(1, std::memory_order_release);
        wake_.notify_all();
    }

    // Posts the job, runs chunks on the calling thread until none is left to claim; returns how
    // many it ran.
    std::size_t run_on_team(std::size_t chunks, std::size_t threads, Body body, void* ctx, std::size_t count,
                            std::size_t grain) {
        body_ = body;
        ctx_ = ctx;
        count_ = count;
        grain_ = grain;
        done_.store(0, std::memory_order_relaxed);
        gen_ = (gen_ + 1) & kGenMask;
        const std::uint64_t allowed = std::min<std::uint64_t>(std::min(threads - 1, helpers_), kHelperMask);
        state_.store((gen_ << 52) | (allowed << 40) | (std::uint64_t(chunks) << 20), std::memory_order_release);
        wake();
        return participate(0);
    }

    static constexpr std::uint64_t kMask = (1u << 20) - 1, kHelperMask = (1u << 12) - 1, kGenMask = (1u << 12) - 1;
    static constexpr std::size_t kMaxChunks = kMask;
    // Waiting: kPauses pause-spins (most waits end within microseconds), then yielding the core for
    // up to kYieldMicros (a spinning wait would take the core from the very thread it waits for,
    // or from the caller, when they share it), then a futex sleep.
    static constexpr int kPauses = 256;
    static constexpr int kYieldMicros = 50;

    template <typename Ready>
    static bool poll(Ready&& ready) {
        for (int i = 0; i < kPauses; ++i) {
            if (ready()) return true;
            pause();
        }
        const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(kYieldMicros);
        while (std::chrono::steady_clock::now() < until) {
            if (ready()) return true;
            std::this_thread::yield();
        }
        return ready();
    }

    static void pause() {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }

    // Claims and runs chunks until none is left. A claim is a compare-exchange on the whole state
    // (generation, helpers allowed, chunk count, next chunk): it succeeds only on the job that the
    // state describes, whose descriptor then stays valid until the caller has counted this chunk
    // done; a helper beyond the job's thread count (slot > allowed) never claims. Returns how
    // many chunks this thread ran.
    std::size_t participate(std::size_t slot) {
        std::size_t ran = 0;
        std::uint64_t s = state_.load(std::memory_order_acquire);
        for (;;) {
            const std::uint64_t allowed = (s >> 40) & kHelperMask, chunks = (s >> 20) & kMask, next = s & kMask;
            if (next >= chunks || slot > allowed) return ran;
            if (!state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
            const std::size_t begin = std::size_t(next) * grain_;
            body_(ctx_, slot, begin, std::min(count_, begin + grain_));
            if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == chunks) done_.notify_all();
            ++ran;
            s = state_.load(std::memory_order_acquire);
        }
    }

    void helper(std::size_t index, std::uint32_t seen) {
        ready_.fetch_add(1, std::memory_order_relaxed);
        for (;;) {
            auto woken = [&] { return wake_.load(std::memory_order_acquire) != seen; };
            while (!poll(woken)) {
                sleeping_.fetch_add(1, std::memory_order_relaxed);
                wake_.wait(seen, std::memory_order_acquire);
                sleeping_.fetch_sub(1, std::memory_order_relaxed);
            }
            seen = wake_.load(std::memory_order_acquire);
            participate(index + 1);
        }
    }

    std::mutex busy_;
    std::size_t helpers_ = 0;              // started (detached; they live as long as the process)
    std::atomic<std::uint64_t> state_{0};  // generation << 52 | helpers << 40 | chunks << 20 | next
    std::atomic<std::uint32_t> done_{0};
    std::atomic<std::uint32_t> wake_{0};
    std::atomic<std::size_t> ready_{0};     // helpers that have started running
    std::atomic<std::size_t> sleeping_{0};  // helpers blocked on wake_ (their futex)
    std::uint64_t gen_ = 0;
    double trial_wake_ = -1.0;  // when the helpers were last woken for a moved team trial
    Body body_ = nullptr;
    void* ctx_ = nullptr;
    std::size_t count_ = 0, grain_ = 1;
    TeamPolicy policy_;
    PoolChoice choice_;
};

}  // namespace

OpenMpTeamScope::OpenMpTeamScope(bool on) : previous_(t_openmp_team) {
    t_openmp_team = on;
}

OpenMpTeamScope::~OpenMpTeamScope() {
    t_openmp_team = previous_;
}

bool on_openmp_team() {
    return t_openmp_team && OpenMpRuntime::get().usable();
}

void run_chunks(std::size_t count, std::size_t grain, std::size_t threads, double work, ChunkBody body, void* ctx) {
    WorkPool::instance().run(count, grain, threads, work, body, ctx);
}

}  // namespace wush::threads
