// What the CUDA backend accepts before it launches anything: the device's architecture, the
// alignment of typed device tensors, the int range of cuBLAS sizes, and when a stream switch is
// ordered. Plain C++ (no CUDA headers): checked on the CPU by tests/unit/test_cuda_host_rules.cpp.
#pragma once

#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/error.h"
#include "wush/wush.h"

namespace wush::cuda {

// The kernels are built for sm_80, sm_90, sm_100a and sm_120a (with sm_80 PTX that newer parts
// compile at load time); an older part would fail at its first launch with "no kernel image".
constexpr int kMinComputeCapability = 80;

inline bool compute_capability_supported(int sm) {
    return sm >= kMinComputeCapability;
}

// The WUSH_ERR_UNSUPPORTED message of wush_context_create for such a device.
inline std::string unsupported_device_message(int device, const std::string& name, int sm) {
    return "CUDA device " + std::to_string(device) + " (" + name + ") has compute capability " +
           std::to_string(sm / 10) + "." + std::to_string(sm % 10) + " (sm_" + std::to_string(sm) +
           "); libwush's CUDA kernels need compute capability 8.0 (sm_80) or newer";
}

// Bytes a typed device tensor's base must be aligned to: its element size (F32 4, F16/BF16 2).
// The kernels read whole elements; rows are whole elements apart, so the base decides.
inline std::size_t element_alignment(wush_dtype dtype) {
    return dtype == WUSH_DTYPE_F32 ? 4 : 2;
}

inline bool element_aligned(const void* p, wush_dtype dtype) {
    return reinterpret_cast<std::uintptr_t>(p) % element_alignment(dtype) == 0;
}

// "x (BF16) is not 2-byte aligned: ..." for a refused pointer.
inline std::string misaligned_message(const char* what, wush_dtype dtype) {
    const char* name = dtype == WUSH_DTYPE_F32 ? "F32" : dtype == WUSH_DTYPE_F16 ? "F16" : "BF16";
    return std::string(what) + " (" + name + ") is not " + std::to_string(element_alignment(dtype)) +
           "-byte aligned: a CUDA context takes typed tensors aligned to their element size";
}

// cuBLAS takes sizes and leading dimensions as int: `v` as an int, or WUSH_ERR_UNSUPPORTED naming
// the size (a wrapped int would make cuBLAS read the wrong rows, or fail with a vague status).
inline int checked_int(std::size_t v, const char* what, const char* who) {
    if (v > std::size_t(INT_MAX))
        fail(WUSH_ERR_UNSUPPORTED, std::string(who) + ": " + what + " = " + std::to_string(v) +
                                       " exceeds the int range of cuBLAS (" + std::to_string(INT_MAX) + ")");
    return int(v);
}

// A stream's capture state as the backend reads it (cudaStreamIsCapturing): Unknown where the query
// itself failed (e.g. the legacy stream while another thread captures in global mode).
enum class CaptureState { None, Capturing, Unknown };

// Whether set_stream makes the new stream wait for the old one (an event recorded on the old
// stream): the shared cuBLAS workspace and non-finite flag are then never used by both at once.
// Not when either stream is capturing (a captured event cannot order an eager stream, and an
// eager event must not become a graph dependency) or its state is unknown: that is the caller's
// to order, as RUNTIME.md says.
inline bool order_stream_switch(bool same_stream, CaptureState old_stream, CaptureState new_stream) {
    return !same_stream && old_stream == CaptureState::None && new_stream == CaptureState::None;
}

}  // namespace wush::cuda
