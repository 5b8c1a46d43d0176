// Paths and names quoted in messages come from callers and files and may hold any byte. Written
// raw, an escape sequence acts on the terminal that prints the message and a line break forges a
// line of its own (wush_last_error() keeps line breaks: some messages list one item per line).
#pragma once

#include <string>
#include <string_view>

namespace wush {

// `text` with every C0 control character (line breaks and tabs included) and DEL written as
// "\xNN"; every other byte as it is.
inline std::string escape_controls(std::string_view text) {
    static constexpr char kHex[] = "0123456789abcdef";
    std::string out;
    out.reserve(text.size());
    for (const char ch : text) {
        const auto c = static_cast<unsigned char>(ch);
        if (c < 0x20 || c == 0x7F) {
            out += "\\x";
            out += kHex[c >> 4];
            out += kHex[c & 15];
        } else {
            out += ch;
        }
    }
    return out;
}

}  // namespace wush
