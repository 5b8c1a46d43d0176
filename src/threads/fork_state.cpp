#include "threads/fork_state.h"

#include <omp.h>
#include <pthread.h>

namespace wush::threads {

namespace {

// Per-thread state only: the flag is written by the fork() child handler on the child's one
// thread, and the saved count by the InheritedOpenMpLimit of the same thread.
thread_local bool t_inherited = false;
thread_local int t_depth = 0;  // live InheritedOpenMpLimit objects on this thread (nested calls)
thread_local int t_saved = 1;  // the thread's omp_get_max_threads() before the outermost one

// Registered when libwush is loaded, not at its first call: OpenMP state from before that call
// (the host's own regions) is just as stale in a child.
[[maybe_unused]] const int kRegistered = pthread_atfork(nullptr, nullptr, [] { t_inherited = true; });

}  // namespace

bool openmp_state_inherited() noexcept {
    return t_inherited;
}

InheritedOpenMpLimit::InheritedOpenMpLimit() noexcept : active_(t_inherited) {
    if (!active_ || t_depth++ > 0) return;
    t_saved = omp_get_max_threads();
    omp_set_num_threads(1);
}

InheritedOpenMpLimit::~InheritedOpenMpLimit() {
    if (active_ && --t_depth == 0) omp_set_num_threads(t_saved);
}

int openmp_max_threads() noexcept {
    return t_depth > 0 ? t_saved : omp_get_max_threads();
}

}  // namespace wush::threads
