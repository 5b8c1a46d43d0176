#include "last_error.h"

#include <cstdio>
#include <cstring>
#include <string>

#include "common/utf8.h"

namespace wush::capi {

namespace {

thread_local char g_message[2048] = "";

// Control characters from a quoted path or name would act on the terminal that prints the
// message (an escape sequence, a carriage return): written as \xNN instead. Line breaks and tabs
// stay; some messages list one item per line.
std::string without_control_bytes(const std::string& text) {
    std::string out;
    out.reserve(text.size());
    for (const char ch : text) {
        const auto c = static_cast<unsigned char>(ch);
        if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7F) {
            char hex[8];
            std::snprintf(hex, sizeof hex, "\\x%02x", c);
            out += hex;
        } else {
            out += ch;
        }
    }
    return out;
}

}  // namespace

void set_last_error(const char* function, const char* message) noexcept {
    // Messages quote names and bytes from files: keep them valid UTF-8 (and cut on a character
    // boundary), so that callers decoding strictly can always read them.
    try {
        const std::string text = std::string(function) + ": " + (message ? message : "(no message)");
        const std::string valid = to_valid_utf8(without_control_bytes(text), sizeof g_message - 1);
        std::memcpy(g_message, valid.c_str(), valid.size() + 1);
    } catch (...) {
        std::snprintf(g_message, sizeof g_message, "%s: (out of memory while reporting an error)", function);
    }
}

const char* last_error() noexcept {
    return g_message;
}

}  // namespace wush::capi
