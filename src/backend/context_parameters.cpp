#include "backend/context_parameters.h"

#include <omp.h>

#include <algorithm>
#include <string>

#include "common/error.h"
#include "threads/fork_state.h"

namespace wush::backend {

namespace {

// The 0 / 1 switches, WUSH_CONTEXT_CUDA_BLOCKSCALED ... _TC_QUANTIZE (consecutive ids).
std::size_t cuda_switch_index(wush_context_parameter p) {
    return std::size_t(p - WUSH_CONTEXT_CUDA_BLOCKSCALED);
}
static_assert(WUSH_CONTEXT_CUDA_TC_QUANTIZE - WUSH_CONTEXT_CUDA_BLOCKSCALED + 1 == 4);

const char* cuda_switch_name(wush_context_parameter p) {
    switch (p) {
        case WUSH_CONTEXT_CUDA_BLOCKSCALED: return "WUSH_CONTEXT_CUDA_BLOCKSCALED";
        case WUSH_CONTEXT_CUDA_STREAM_DECODE: return "WUSH_CONTEXT_CUDA_STREAM_DECODE";
        case WUSH_CONTEXT_CUDA_BF16_PREFILL: return "WUSH_CONTEXT_CUDA_BF16_PREFILL";
        default: return "WUSH_CONTEXT_CUDA_TC_QUANTIZE";
    }
}

}  // namespace

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
        case WUSH_CONTEXT_CUDA_PREFILL_MIN_M:
            if (value < 0 || value > 2147483647)
                fail(WUSH_ERR_INVALID_ARGUMENT,
                     "WUSH_CONTEXT_CUDA_PREFILL_MIN_M must be in [0, 2147483647], got " + std::to_string(value));
            cuda_prefill_min_m_ = value;
            return;
        case WUSH_CONTEXT_CUDA_BLOCKSCALED:
        case WUSH_CONTEXT_CUDA_STREAM_DECODE:
        case WUSH_CONTEXT_CUDA_BF16_PREFILL:
        case WUSH_CONTEXT_CUDA_TC_QUANTIZE:
            if (value != 0 && value != 1)
                fail(WUSH_ERR_INVALID_ARGUMENT,
                     std::string(cuda_switch_name(parameter)) + " must be 0 or 1, got " + std::to_string(value));
            cuda_switches_[cuda_switch_index(parameter)] = value;
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
        case WUSH_CONTEXT_CUDA_PREFILL_MIN_M: return cuda_prefill_min_m_;
        case WUSH_CONTEXT_CUDA_BLOCKSCALED:
        case WUSH_CONTEXT_CUDA_STREAM_DECODE:
        case WUSH_CONTEXT_CUDA_BF16_PREFILL:
        case WUSH_CONTEXT_CUDA_TC_QUANTIZE: return cuda_switches_[cuda_switch_index(parameter)];
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
