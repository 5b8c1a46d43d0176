// The exception firewall: every exported function runs its body through guarded(), which turns
// any exception into a wush_status and a thread-local message. Nothing crosses the C boundary.
#pragma once

#include <cstddef>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>

#include "common/dtype.h"
#include "common/error.h"
#include "last_error.h"
#include "threads/fork_state.h"
#include "wush/wush.h"

namespace wush::capi {

template <typename Body>
wush_status guarded(const char* function, Body&& body) noexcept {
    try {
        // On a thread that fork()ed, OpenMP regions must not wait for the parent's workers.
        const wush::threads::InheritedOpenMpLimit openmp_limit;
        body();
        return WUSH_OK;
    } catch (const wush::Error& e) {
        set_last_error(function, e.what());
        return e.status();
    } catch (const std::bad_alloc&) {
        set_last_error(function, "out of memory");
        return WUSH_ERR_OUT_OF_MEMORY;
    } catch (const std::length_error&) {
        // A container asked for more than it can ever hold: sizes that pass every overflow check
        // but no machine could allocate (a calibrator of d_in = 2^31 used to report INTERNAL).
        set_last_error(function, "out of memory: a requested size exceeds what can be allocated");
        return WUSH_ERR_OUT_OF_MEMORY;
    } catch (const std::exception& e) {
        set_last_error(function, e.what());
        return WUSH_ERR_INTERNAL;
    } catch (...) {
        set_last_error(function, "unknown exception");
        return WUSH_ERR_INTERNAL;
    }
}

// Throws INVALID_ARGUMENT naming `name` when a required pointer is NULL.
// Throws BUFFER_TOO_SMALL naming the buffer when `have` < `need` (counted in `unit`s).
inline void require_size(std::size_t have, std::size_t need, const char* name, const char* unit) {
    if (have < need)
        wush::fail(WUSH_ERR_BUFFER_TOO_SMALL, std::string(name) + " holds " + std::to_string(have) + " " + unit + ", " +
                                                  std::to_string(need) + " are needed");
}

using wush::require_output_dtype;  // common/dtype.h: F32 or BF16

inline void require_pointer(const void* p, const char* name) {
    if (p == nullptr) fail(WUSH_ERR_INVALID_ARGUMENT, std::string(name) + " is NULL");
}

}  // namespace wush::capi
