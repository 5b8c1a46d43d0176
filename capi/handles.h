// Type-tagged opaque handles. Every handle the library hands out is recorded in a table of live
// handles with its type, so a NULL, wrong-type or destroyed handle is reported without being
// dereferenced. Each registration also gets a generation number, never reused: an object that
// keeps a handle for later (a checkpoint being written keeps its layers' transforms and
// qweights) records the generation too, so a handle destroyed meanwhile is detected even when a
// new object has been created at the same address.
#pragma once

#include <cstdint>
#include <string>

#include "common/error.h"

namespace wush::capi {

enum class HandleType : std::uint32_t { Context = 1, Calibrator, Transform, QWeight, Checkpoint, TensorFile, Options, Linear };

const char* handle_type_name(HandleType type);

void register_handle(const void* handle, HandleType type);
// Removes `handle` if it is live with this type; returns whether it was.
bool unregister_handle(const void* handle, HandleType type);
bool is_live(const void* handle, HandleType type);
// The generation of a live handle of `type`, or 0 (never a generation) if it is not live.
std::uint64_t generation(const void* handle, HandleType type);

// Throws INVALID_ARGUMENT unless `handle` is a live handle of `type`.
inline void require_handle(const void* handle, HandleType type, const char* arg) {
    if (handle == nullptr) fail(WUSH_ERR_INVALID_ARGUMENT, std::string(arg) + " is NULL");
    if (!is_live(handle, type))
        fail(WUSH_ERR_INVALID_ARGUMENT, std::string(arg) + " is not a live " + handle_type_name(type) +
                                            " (wrong handle type, or already destroyed)");
}

}  // namespace wush::capi
