#include "last_error.h"

#include <cstdio>

namespace wush::capi {

namespace {
thread_local char g_message[2048] = "";
}

void set_last_error(const char* function, const char* message) noexcept {
    std::snprintf(g_message, sizeof g_message, "%s: %s", function, message ? message : "(no message)");
}

const char* last_error() noexcept { return g_message; }

}  // namespace wush::capi
