// The one exception type of the C++ core. The C API boundary (capi/) turns it into a wush_status
// and a thread-local message; nothing else in the core reports errors.
#pragma once

#include <stdexcept>
#include <string>

#include "wush/wush.h"

namespace wush {

class Error : public std::runtime_error {
public:
    Error(wush_status status, const std::string& message) : std::runtime_error(message), status_(status) {}
    wush_status status() const noexcept { return status_; }

private:
    wush_status status_;
};

[[noreturn]] inline void fail(wush_status status, const std::string& message) {
    throw Error(status, message);
}

inline void require(bool condition, const std::string& message) {
    if (!condition) fail(WUSH_ERR_INVALID_ARGUMENT, message);
}

// The same for a message that is a literal: the string is built only on failure (the hot paths
// check their internal invariants on every call; building a std::string of a long literal there
// costs a heap allocation each time).
inline void require(bool condition, const char* message) {
    if (!condition) fail(WUSH_ERR_INVALID_ARGUMENT, message);
}

}  // namespace wush
