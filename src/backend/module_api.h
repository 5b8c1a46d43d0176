// The contract between the core library and a backend built as its own shared object (today the
// CUDA backend, libwush-cuda.so). The core opens the module with dlopen when the first context of
// that backend is created (capi/backend_registry.cpp), so a host that never asks for CUDA never
// maps the CUDA libraries; the module exports one C symbol, kModuleEntrySymbol, returning a
// ModuleApi.
//
// C++ objects cross this boundary (Backend, Calibrator, BlockTransform, PackedMatrix): the module
// is only valid with the core of the same build, which `build_key` and the struct sizes check
// before anything else is used. Exceptions thrown by the module's Backend (wush::Error) reach the
// core's C API firewall: both sides share libstdc++, which matches exception types by name.
// The entry functions themselves never throw: they report failures through the ModuleError.
#pragma once

#include <cstddef>

#include "backend/backend.h"

namespace wush::backend {

// Bumped whenever ModuleApi or the meaning of its fields changes, or the Backend / PreparedLayer
// interface the module implements (backend.h). 2: PreparedLayer::forward takes a Bias.
inline constexpr int kModuleInterfaceVersion = 2;

inline constexpr const char* kModuleEntrySymbol = "wush_backend_module_entry";

// Written by the entry functions on failure; message is NUL-terminated.
struct ModuleError {
    wush_status status = WUSH_OK;
    char message[512] = {};
};

// Sizes of the host objects that cross the boundary, compared field by field (a second guard
// behind build_key against a module from another build).
struct ModuleLayout {
    std::size_t calibrator, block_transform, packed_matrix, format_spec;
};

inline ModuleLayout host_object_layout() {
    return {sizeof(Calibrator), sizeof(BlockTransform), sizeof(formats::PackedMatrix), sizeof(formats::FormatSpec)};
}

struct ModuleApi {
    int interface_version;  // kModuleInterfaceVersion of the module's build
    const char* build_key;  // WUSH_BUILD_KEY of the module's build (see CMakeLists.txt)
    ModuleLayout layout;    // host_object_layout() as the module sees it
    wush_backend kind;      // the backend this module serves
    // Number of usable devices (>= 0); on 0, `error` says why (no driver, no device).
    int (*device_count)(ModuleError* error);
    // A backend on `device` (0 <= device < device_count(), checked by the caller), owned by the
    // caller (delete through Backend's virtual destructor); nullptr with `error` filled on failure.
    Backend* (*make_backend)(int device, ModuleError* error);
};

using ModuleEntry = const ModuleApi* (*)();

}  // namespace wush::backend
