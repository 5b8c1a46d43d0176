// Names the library spells out (checkpoint metadata, the C API's *_name and *_from_name, the
// tools' choices): one table per enumeration, and one rule for reading a name back: ASCII case is
// ignored, and what the library writes is the table's spelling. A name with anything after a NUL
// is not in any table (the comparison covers the whole string_view). A checkpoint file is held to
// the written spelling on top (storage/checkpoint.cpp): it reads only what the writer wrote.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "wush/wush.h"

namespace wush {

template <class E>
struct Named {
    E value;
    std::string_view name;
};

constexpr bool same_name(std::string_view a, std::string_view b) {
    const auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? char(c - 'A' + 'a') : c; };
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
        if (lower(a[i]) != lower(b[i])) return false;
    return true;
}

template <class E>
constexpr std::optional<E> parse_name(std::span<const Named<E>> table, std::string_view name) {
    for (const Named<E>& n : table)
        if (same_name(n.name, name)) return n.value;
    return std::nullopt;
}

// The table's spelling of `value` (empty when it has none).
template <class E>
constexpr std::string_view name_of(std::span<const Named<E>> table, E value) {
    for (const Named<E>& n : table)
        if (n.value == value) return n.name;
    return {};
}

// "a, b, c": the names a message lists as accepted.
template <class E>
std::string name_list(std::span<const Named<E>> table) {
    std::string out;
    for (const Named<E>& n : table) out += (out.empty() ? "" : ", ") + std::string(n.name);
    return out;
}

// The pre-quantization methods (wush_method), as checkpoints and wush_method_name() spell them.
inline constexpr Named<wush_method> kMethodNames[] = {{WUSH_METHOD_RTN, "rtn"}, {WUSH_METHOD_GPTQ, "gptq"}};

}  // namespace wush
