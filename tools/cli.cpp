#include "cli.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>

namespace cli {

Args::Args(int argc, char** argv, const std::vector<std::string>& flags, const std::vector<std::string>& valued) {
    for (int i = 0; i < argc && error_.empty(); ++i) {
        const std::string a = argv[i];
        if (std::find(flags.begin(), flags.end(), a) != flags.end()) {
            values_[a] = "1";
        } else if (std::find(valued.begin(), valued.end(), a) != valued.end()) {
            if (i + 1 >= argc) error_ = "option " + a + " needs a value";
            else values_[a] = argv[++i];
        } else {
            error_ = "unknown argument '" + a + "'";
        }
    }
}

std::string Args::get(const std::string& name, const std::string& fallback) const {
    auto it = values_.find(name);
    return it == values_.end() ? fallback : it->second;
}

std::size_t Args::get_size(const std::string& name, std::size_t fallback) {
    if (!has(name)) return fallback;
    const std::string v = get(name);
    char* end = nullptr;
    const unsigned long long x = std::strtoull(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || x == 0 || v[0] == '-') {
        error_ = "option " + name + " needs a positive integer, got '" + v + "'";
        return fallback;
    }
    return std::size_t(x);
}

double Args::get_double(const std::string& name, double fallback) {
    if (!has(name)) return fallback;
    const std::string v = get(name);
    char* end = nullptr;
    errno = 0;
    const double x = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(x)) {
        error_ = "option " + name + " needs a finite number, got '" + v + "'";
        return fallback;
    }
    return x;
}

namespace {

// Length of the well-formed UTF-8 sequence at s[i], 0 if there is none.
std::size_t utf8_length(const std::string& s, std::size_t i) {
    const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
    const unsigned char c = b(i);
    if (c < 0x80) return 1;
    std::size_t n;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c >= 0xE0 && c <= 0xEF) n = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4) n = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    else return 0;
    if (i + n > s.size() || b(i + 1) < lo || b(i + 1) > hi) return 0;
    for (std::size_t k = 2; k < n; ++k)
        if (b(i + k) < 0x80 || b(i + k) > 0xBF) return 0;
    return n;
}

std::string hex_escape(unsigned char c, const char* prefix) {
    static constexpr char kHex[] = "0123456789abcdef";
    return std::string(prefix) + kHex[c >> 4] + kHex[c & 15];
}

}  // namespace

std::string json_string(const std::string& s) {
    std::string out = "\"";
    for (std::size_t i = 0; i < s.size();) {
        const std::size_t n = utf8_length(s, i);
        const auto c = static_cast<unsigned char>(s[i]);
        if (n == 0) {
            out += "\\ufffd";
            ++i;
            continue;
        }
        if (c == '"' || c == '\\') out += '\\', out += char(c);
        else if (c < 0x20 || c == 0x7F) out += hex_escape(c, "\\u00");
        else out.append(s, i, n);
        i += n;
    }
    return out + "\"";
}

std::string json_number(double v) {
    if (!std::isfinite(v)) return "null";
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    return buf;
}

std::string printable(const std::string& s) {
    std::string out;
    for (std::size_t i = 0; i < s.size();) {
        const std::size_t n = utf8_length(s, i);
        const auto c = static_cast<unsigned char>(s[i]);
        // C1 controls (U+0080..U+009F) act on terminals too.
        const bool c1 = n == 2 && c == 0xC2 && static_cast<unsigned char>(s[i + 1]) < 0xA0;
        if (n == 0 || c < 0x20 || c == 0x7F || c == '\\') {
            out += c == '\\' ? std::string("\\\\") : hex_escape(c, "\\x");
            ++i;
        } else if (c1) {
            out += hex_escape(c, "\\x") + hex_escape(static_cast<unsigned char>(s[i + 1]), "\\x");
            i += 2;
        } else {
            out.append(s, i, n);
            i += n;
        }
    }
    return out;
}

std::size_t physical_memory() {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? mul_or_max(std::size_t(pages), std::size_t(page)) : 0;
}

bool fits_in_memory(const char* command, const std::string& what, std::size_t bytes) {
    const std::size_t total = physical_memory();
    if (total == 0 || bytes <= total) return true;
    constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
    if (bytes == SIZE_MAX)
        std::fprintf(stderr, "wush %s: %s needs more memory than can be addressed\n", command, what.c_str());
    else
        std::fprintf(stderr, "wush %s: %s needs at least %.1f GiB, more than the %.1f GiB of memory of this machine\n",
                     command, what.c_str(), double(bytes) / kGiB, double(total) / kGiB);
    return false;
}

std::size_t mul_or_max(std::size_t a, std::size_t b) {
    std::size_t r;
    return __builtin_mul_overflow(a, b, &r) ? SIZE_MAX : r;
}

std::size_t add_or_max(std::size_t a, std::size_t b) {
    std::size_t r;
    return __builtin_add_overflow(a, b, &r) ? SIZE_MAX : r;
}

std::vector<std::string> split(const std::string& s, char sep) {
    std::vector<std::string> out;
    std::size_t start = 0;
    while (start <= s.size()) {
        const std::size_t end = std::min(s.find(sep, start), s.size());
        if (end > start) out.push_back(s.substr(start, end - start));
        start = end + 1;
    }
    return out;
}

int report(const char* what, wush_status status) {
    std::fprintf(stderr, "wush: %s failed: %s: %s\n", what, wush_status_string(status), wush_last_error());
    return 1;
}

const char* method_name(wush_method method) {
    return method == WUSH_METHOD_RTN ? "rtn" : method == WUSH_METHOD_GPTQ ? "gptq" : "?";
}

bool method_from_name(const std::string& name, wush_method* method) {
    if (name == "rtn") *method = WUSH_METHOD_RTN;
    else if (name == "gptq") *method = WUSH_METHOD_GPTQ;
    else return false;
    return true;
}

bool transform_from_name(const char* command, const std::string& name, wush_transform_kind* kind, bool* search) {
    *search = name.size() > 2 && name.compare(name.size() - 2, 2, "+s") == 0;
    const std::string base = *search ? name.substr(0, name.size() - 2) : name;
    // I, H and R have nothing to search: `h+s` would silently be `h`.
    if (wush_transform_kind_from_name(base.c_str(), kind) == WUSH_OK &&
        (!*search || *kind == WUSH_TRANSFORM_WUS || *kind == WUSH_TRANSFORM_WUSH))
        return true;
    std::fprintf(stderr, "wush %s: unknown transform '%s' (i, r, h, wus, wush; wus+s, wush+s: with the search)\n",
                 command, printable(name).c_str());
    return false;
}

void ProgressBar::step(const std::string& label) {
    done_ = std::min(done_ + 1, total_);
    const int width = 30;
    const int filled = total_ ? int(width * done_ / total_) : width;
    std::fprintf(stderr, "\r[%.*s%*s] %3d%% %-40.40s", filled, "##############################", width - filled, "",
                 total_ ? int(100 * done_ / total_) : 100, label.c_str());
    std::fflush(stderr);
    open_ = true;
}

void ProgressBar::finish() {
    if (open_) std::fprintf(stderr, "\n");
    open_ = false;
}

}  // namespace cli
