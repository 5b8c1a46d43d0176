// OpenMP across fork(): libgomp keeps the worker threads of a thread's OpenMP teams in that
// thread's own state. In a child of fork() only the thread that forked exists, with a copy of its
// state that still lists the parent's workers, and its next multi-threaded OpenMP region (a
// libwush loop, or an OpenMP-built OpenBLAS call) waits for them forever. Threads the child
// creates start with fresh OpenMP state and are not affected. (libwush's own locks and its work
// pool handle fork() where they live: capi/handles.cpp, capi/backend_registry.cpp, work_pool.cpp.)
#pragma once

namespace wush::threads {

// Whether the calling thread is a thread that fork()ed, now running in the child: its OpenMP
// state came from the parent.
bool openmp_state_inherited() noexcept;

// While one lives on a thread whose OpenMP state was inherited, that thread's OpenMP regions run
// on one thread (omp_set_num_threads(1), restored afterwards), which libgomp runs without its
// worker threads; on every other thread it does nothing. Every C API call holds one (capi/guard.h).
class InheritedOpenMpLimit {
public:
    InheritedOpenMpLimit() noexcept;
    ~InheritedOpenMpLimit();
    InheritedOpenMpLimit(const InheritedOpenMpLimit&) = delete;
    InheritedOpenMpLimit& operator=(const InheritedOpenMpLimit&) = delete;

private:
    bool active_ = false;
};

// omp_get_max_threads() as the caller set it, also while an InheritedOpenMpLimit holds the
// thread at one: the default thread count of work that does not run on OpenMP (the work pool).
int openmp_max_threads() noexcept;

}  // namespace wush::threads
