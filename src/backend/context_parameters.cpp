#include "backend/context_parameters.h"

#include <omp.h>

#include <algorithm>
#include <string>

#include "common/error.h"
#include "threads/fork_state.h"

namespace wush::backend {

void ContextParameters::set(wush_context_parameter parameter, std::int64_t value) {
    switch (parameter) {
        case WUSH_CONTEXT_NUM_THREADS:
            if (value < 0 || value > 4096)
                fail(WUSH_ERR_INVALID_ARGUMENT,
                     "WUSH_CONTEXT_NUM_THREADS must be in [0, 4096], got " + std::to_string(value));
            num_threads_ = value;
            clamped_threads_ = value > 0 ? openmp_threads(value) : 0;
            return;
        case WUSH_CONTEXT_OPENMP_TEAM:
            if (value != 0 && value != 1)
                fail(WUSH_ERR_INVALID_ARGUMENT,
                     "WUSH_CONTEXT_OPENMP_TEAM must be 0 or 1, got " + std::to_string(value));
            openmp_team_ = value;
            return;
        case WUSH_CONTEXT_CPU_ISA:
            resolve_isa(value);  // INVALID_ARGUMENT / UNSUPPORTED before any change
            cpu_isa_ = value;
            return;
        default: break;  // out-of-range values are handled after the switch
    }
    fail(WUSH_ERR_INVALID_ARGUMENT, "unknown wush_context_parameter " + std::to_string(int(parameter)));
}

std::int64_t ContextParameters::get(wush_context_parameter parameter) const {
    switch (parameter) {
        case WUSH_CONTEXT_NUM_THREADS: return num_threads_;
        case WUSH_CONTEXT_CPU_ISA: return cpu_isa_;
        case WUSH_CONTEXT_OPENMP_TEAM: return openmp_team_;
        default: break;
    }
    fail(WUSH_ERR_INVALID_ARGUMENT, "unknown wush_context_parameter " + std::to_string(int(parameter)));
}

std::size_t ContextParameters::threads() const {
    return clamped_threads_ > 0 ? clamped_threads_ : openmp_threads(0);
}

std::size_t openmp_threads(std::int64_t num_threads) {
    // More threads than processors never helps these kernels, and asking libgomp for thousands
    // can fail to create them (which ends the process): the setting is clamped here.
    if (num_threads > 0) return std::size_t(std::min<std::int64_t>(num_threads, omp_get_num_procs()));
    // OpenMP's default as the caller has it, also on a forked thread held at one (fork_state.h).
    return std::size_t(std::max(threads::openmp_max_threads(), 1));
}

}  // namespace wush::backend
