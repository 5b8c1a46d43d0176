// The parameters of a context (wush_context_set_parameter) as its backend keeps them: the backend
// owns them, as ggml's CPU backend owns its thread count; the C API only forwards the calls.
//   WUSH_CONTEXT_NUM_THREADS  threads of the context's host-side work (0 = OpenMP's default);
//   WUSH_CONTEXT_CPU_ISA      the SIMD kernels of its CPU runtime calls (0 = the best the CPU has);
//   WUSH_CONTEXT_OPENMP_TEAM  whether its CPU runtime calls run on the process's OpenMP team (1)
//                             or on libwush's own pool (0).
//   WUSH_CONTEXT_CUDA_*       the CUDA backend's experimental kernel switches, read when its layers
//                             are prepared (cuda/cuda_backend.cpp, table_of). A CPU context keeps
//                             them with the same bounds and ignores them (wush.h), so a program
//                             sets them whatever its backend.
// Every backend keeps both: a CUDA context still calibrates, builds transforms and evaluates on
// the host, with these settings.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/cpu_isa.h"
#include "wush/wush.h"

namespace wush::backend {

// OpenMP threads for a WUSH_CONTEXT_NUM_THREADS setting, >= 1: the setting clamped to the
// processors, or OpenMP's current default for 0.
std::size_t openmp_threads(std::int64_t num_threads);

class ContextParameters {
public:
    // Throws INVALID_ARGUMENT for an unknown parameter or a value out of range, UNSUPPORTED for an
    // ISA this CPU lacks; nothing changes then.
    void set(wush_context_parameter parameter, std::int64_t value);
    // Throws INVALID_ARGUMENT for an unknown parameter.
    std::int64_t get(wush_context_parameter parameter) const;

    // The ISA the CPU kernels run with (the setting resolved).
    Isa isa() const { return resolve_isa(cpu_isa_); }
    // Threads of this context's host-side work: openmp_threads(the setting), the clamp to the
    // processors taken when the setting was made (asking OpenMP for the processor count is a
    // system call, of the order of a microsecond: too much for every call of a small layer).
    std::size_t threads() const;
    // Whether the CPU runtime's parallel work runs on the process's OpenMP team.
    bool openmp_team() const { return openmp_team_ != 0; }

private:
    std::int64_t num_threads_ = 0;
    std::size_t clamped_threads_ = 0;  // openmp_threads(num_threads_) when that is > 0, else 0
    std::int64_t cpu_isa_ = 0;
    std::int64_t openmp_team_ = 0;
    std::int64_t cuda_prefill_min_m_ = 0;
    std::int64_t cuda_switches_[4] = {};  // BLOCKSCALED, STREAM_DECODE, BF16_PREFILL, TC_QUANTIZE
};

}  // namespace wush::backend
