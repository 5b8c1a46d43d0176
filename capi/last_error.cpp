#include "last_error.h"

#include <cstdio>
#include <cstring>
#include <string>

#include "common/utf8.h"

namespace wush::capi {

namespace {
thread_local char g_message[2048] = "";
}

void set_last_error(const char* function, const char* message) noexcept {
    // Messages quote names and bytes from files: keep them valid UTF-8 (and cut on a character
    // boundary), so that callers decoding strictly can always read them.
    try {
        const std::string text = std::string(function) + ": " + (message ? message : "(no message)");
        const std::string valid = to_valid_utf8(text, sizeof g_message - 1);
        std::memcpy(g_message, valid.c_str(), valid.size() + 1);
    } catch (...) {
        std::snprintf(g_message, sizeof g_message, "%s: (out of memory while reporting an error)", function);
    }
}

const char* last_error() noexcept {
    return g_message;
}

}  // namespace wush::capi
