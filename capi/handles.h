// Type-tagged opaque handles. Every object the library hands out is recorded in a table of live
// objects with its type and a generation number, never reused. The handle a caller gets is the
// object's address with the low 16 bits of that generation in its top 16 bits (user-space
// addresses of x86-64 and AArch64 Linux stay below 2^48; an address that does not is handed out
// as it is). So a NULL, wrong-type or destroyed handle is reported without being dereferenced,
// also when a new object has been created at the destroyed one's address: its handle carries
// another generation (the same one only after 65,536 registrations at that very address).
// Objects that keep another object for later (a checkpoint being written keeps its layers'
// transforms and qweights, a prepared layer its context) record its generation too.
#pragma once

#include <cstdint>
#include <string>

#include "common/error.h"

namespace wush::capi {

enum class HandleType : std::uint32_t {
    Context = 1,
    Calibrator,
    Transform,
    QWeight,
    Checkpoint,
    TensorFile,
    Options,
    Linear
};

const char* handle_type_name(HandleType type);

// Registers `object` and returns the handle to give the caller.
void* hand_out_object(void* object, HandleType type);
// The object of a live handle of `type`, or nullptr.
void* live_object(const void* handle, HandleType type);
// Unregisters the object of a live handle of `type` and returns it (the caller deletes it), or
// returns nullptr if the handle is not live with this type.
void* take_back_object(const void* handle, HandleType type);
// Unregisters `object` (an address, not a handle): undoes hand_out_object.
void forget_object(const void* object, HandleType type);
// The generation of a live object (an address, not a handle) of `type`, or 0 (never a generation).
std::uint64_t generation(const void* object, HandleType type);

template <class T>
T* hand_out(T* object, HandleType type) {
    return static_cast<T*>(hand_out_object(const_cast<void*>(static_cast<const void*>(object)), type));
}

template <class T>
T* live(T* handle, HandleType type) {
    return static_cast<T*>(live_object(handle, type));
}

template <class T>
T* take_back(T* handle, HandleType type) {
    return static_cast<T*>(take_back_object(handle, type));
}

// The object of `handle`; throws INVALID_ARGUMENT unless it is a live handle of `type`.
template <class T>
[[nodiscard]] T* require_handle(T* handle, HandleType type, const char* arg) {
    if (handle == nullptr) fail(WUSH_ERR_INVALID_ARGUMENT, std::string(arg) + " is NULL");
    T* object = live(handle, type);
    if (object == nullptr)
        fail(WUSH_ERR_INVALID_ARGUMENT, std::string(arg) + " is not a live " + handle_type_name(type) +
                                            " (wrong handle type, or already destroyed)");
    return object;
}

}  // namespace wush::capi
