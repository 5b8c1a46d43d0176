#include "cli.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace cli {

Args::Args(int argc, char** argv, const std::vector<std::string>& flags, const std::vector<std::string>& valued) {
    for (int i = 0; i < argc && error_.empty(); ++i) {
        const std::string a = argv[i];
        const bool flag = std::find(flags.begin(), flags.end(), a) != flags.end();
        if (!flag && std::find(valued.begin(), valued.end(), a) == valued.end()) {
            error_ = "unknown argument '" + printable(a) + "'";
        } else if (has(a)) {
            // Which of two values was meant is a guess; refuse rather than take the last.
            error_ = "option " + a + " is given more than once";
        } else if (flag) {
            values_[a] = "1";
        } else if (i + 1 >= argc) {
            error_ = "option " + a + " needs a value";
        } else if (argv[i + 1][0] == '\0') {
            // An empty value is never meant (an unset shell variable): refused before any work.
            error_ = "option " + a + " needs a value, got ''";
        } else {
            values_[a] = argv[++i];
        }
    }
}

std::string Args::get(const std::string& name, const std::string& fallback) const {
    auto it = values_.find(name);
    return it == values_.end() ? fallback : it->second;
}

bool Args::parse_size(const std::string& name, const std::string& v, std::size_t min, std::size_t max,
                      std::size_t* out) {
    const bool digits = !v.empty() && v.find_first_not_of("0123456789") == std::string::npos;
    std::size_t x = 0;
    bool overflow = false;
    for (std::size_t i = 0; digits && i < v.size() && !overflow; ++i)
        overflow =
            __builtin_mul_overflow(x, std::size_t(10), &x) || __builtin_add_overflow(x, std::size_t(v[i] - '0'), &x);
    const std::string range = max == SIZE_MAX ? "an integer >= " + std::to_string(min)
                                              : "an integer from " + std::to_string(min) + " to " + std::to_string(max);
    if (!digits) set_error("option " + name + " needs " + range + ", got '" + printable(v) + "'");
    else if (overflow) set_error("option " + name + " needs " + range + ", got '" + printable(v) + "' (too large)");
    else if (x < min || x > max) set_error("option " + name + " needs " + range + ", got " + v);
    else {
        *out = x;
        return true;
    }
    return false;
}

std::size_t Args::get_size(const std::string& name, std::size_t fallback, std::size_t min, std::size_t max) {
    std::size_t x = fallback;
    if (has(name)) parse_size(name, get(name), min, max, &x);
    return x;
}

double Args::get_double(const std::string& name, double fallback, double min, double max) {
    if (!has(name)) return fallback;
    const std::string v = get(name);
    char* end = nullptr;
    errno = 0;
    const double x = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(x)) {
        set_error("option " + name + " needs a finite number, got '" + printable(v) + "'");
        return fallback;
    }
    if (x < min || x > max) {
        set_error(
            "option " + name + " needs a number " +
            (max == HUGE_VAL ? ">= " + json_number(min) : "from " + json_number(min) + " to " + json_number(max)) +
            ", got " + v);
        return fallback;
    }
    return x;
}

std::vector<std::string> Args::get_list(const std::string& name, const std::string& fallback) {
    const std::string v = get(name, fallback);
    std::vector<std::string> items;
    std::size_t start = 0;
    while (true) {
        const std::size_t end = std::min(v.find(',', start), v.size());
        if (end == start) {
            set_error("option " + name + " has an empty item in '" + printable(v) + "'");
            return {};
        }
        items.push_back(v.substr(start, end - start));
        if (end == v.size()) return items;
        start = end + 1;
    }
}

std::vector<std::size_t> Args::get_size_list(const std::string& name, const std::string& fallback, std::size_t min,
                                             std::size_t max) {
    std::vector<std::size_t> out;
    for (const std::string& item : get_list(name, fallback)) {
        std::size_t x = 0;
        if (!parse_size(name, item, min, max, &x)) return {};
        out.push_back(x);
    }
    return out;
}

namespace {

std::string joined(const std::vector<std::string>& items) {
    std::string s;
    for (const std::string& i : items) s += (s.empty() ? "" : ", ") + i;
    return s;
}

}  // namespace

std::string Args::get_choice(const std::string& name, const std::string& fallback,
                             const std::vector<std::string>& choices) {
    const std::string v = get(name, fallback);
    if (std::find(choices.begin(), choices.end(), v) != choices.end()) return v;
    set_error("option " + name + " takes one of " + joined(choices) + ", got '" + printable(v) + "'");
    return fallback;
}

std::vector<std::string> Args::get_choice_list(const std::string& name, const std::string& fallback,
                                               const std::vector<std::string>& choices) {
    std::vector<std::string> items = get_list(name, fallback);
    for (const std::string& item : items)
        if (std::find(choices.begin(), choices.end(), item) == choices.end()) {
            set_error("option " + name + " takes items of " + joined(choices) + ", got '" + printable(item) + "'");
            return {};
        }
    return items;
}

int usage_error(const char* command, const Args& a) {
    return usage_error(command, a.error());
}

int usage_error(const char* command, const std::string& message) {
    std::fprintf(stderr, "wush %s: %s\n", command, message.c_str());
    return kUsageError;
}

namespace {

// The directory of `path` and its last component.
std::pair<std::string, std::string> split_path(const std::string& path) {
    const std::size_t slash = path.rfind('/');
    if (slash == std::string::npos) return {".", path};
    return {slash == 0 ? "/" : path.substr(0, slash), path.substr(slash + 1)};
}

bool same_file(const std::string& a, const std::string& b) {
    struct stat sa {
    }, sb{};
    const bool ea = ::stat(a.c_str(), &sa) == 0, eb = ::stat(b.c_str(), &sb) == 0;
    if (ea || eb) return ea && eb && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    const auto [da, na] = split_path(a);
    const auto [db, nb] = split_path(b);
    return na == nb && ::stat(da.c_str(), &sa) == 0 && ::stat(db.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

}  // namespace

bool output_is_not_an_input(const char* command, const std::string& option, const std::string& path,
                            const std::vector<std::pair<std::string, std::string>>& inputs) {
    for (const auto& [other, other_path] : inputs)
        if (same_file(path, other_path)) {
            usage_error(command, option + " " + printable(path) + " is the same file as " + other + " " +
                                     printable(other_path) + "; writing it would destroy it");
            return false;
        }
    return true;
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

std::string printable(const std::string& s, bool escape_backslash) {
    std::string out;
    for (std::size_t i = 0; i < s.size();) {
        const std::size_t n = utf8_length(s, i);
        const auto c = static_cast<unsigned char>(s[i]);
        // C1 controls (U+0080..U+009F) act on terminals too.
        const bool c1 = n == 2 && c == 0xC2 && static_cast<unsigned char>(s[i + 1]) < 0xA0;
        if (n == 0 || c < 0x20 || c == 0x7F || (c == '\\' && escape_backslash)) {
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

namespace {

// The first number in `path` (0 if unreadable or "max").
std::uint64_t read_number(const std::string& path, const char* key = nullptr) {
    std::FILE* f = std::fopen(path.c_str(), "r");
    if (f == nullptr) return 0;
    char line[256];
    std::uint64_t value = 0;
    while (std::fgets(line, sizeof line, f) != nullptr) {
        const char* p = line;
        if (key != nullptr) {
            if (std::strncmp(line, key, std::strlen(key)) != 0) continue;
            p += std::strlen(key);
        }
        value = std::strtoull(p, nullptr, 10);
        break;
    }
    std::fclose(f);
    return value;
}

// This process's cgroup path for `controller` ("" for the unified v2 hierarchy), from /proc/self/cgroup.
std::string cgroup_path(const std::string& controller) {
    std::FILE* f = std::fopen("/proc/self/cgroup", "r");
    if (f == nullptr) return "";
    char line[1024];
    std::string path;
    while (std::fgets(line, sizeof line, f) != nullptr) {
        std::string l(line);
        if (!l.empty() && l.back() == '\n') l.pop_back();
        const std::size_t a = l.find(':'), b = a == std::string::npos ? a : l.find(':', a + 1);
        if (b == std::string::npos) continue;
        const std::string controllers = l.substr(a + 1, b - a - 1);
        if (controller.empty() ? controllers.empty()
                               : ("," + controllers + ",").find("," + controller + ",") != std::string::npos)
            path = l.substr(b + 1);
    }
    std::fclose(f);
    return path;
}

// Room left under this process's cgroup memory limit (v2 memory.max, or v1 limit_in_bytes),
// or SIZE_MAX without a limit. Inside a container the hierarchy's root is the own cgroup.
std::uint64_t cgroup_room() {
    constexpr std::uint64_t kNoLimit = std::uint64_t(1) << 62;
    struct Files {
        std::string limit, usage;
    };
    std::vector<Files> candidates;
    for (const std::string& dir : {"/sys/fs/cgroup" + cgroup_path(""), std::string("/sys/fs/cgroup")})
        candidates.push_back({dir + "/memory.max", dir + "/memory.current"});
    for (const std::string& dir :
         {"/sys/fs/cgroup/memory" + cgroup_path("memory"), std::string("/sys/fs/cgroup/memory")})
        candidates.push_back({dir + "/memory.limit_in_bytes", dir + "/memory.usage_in_bytes"});
    for (const Files& c : candidates) {
        const std::uint64_t limit = read_number(c.limit);
        if (limit == 0) continue;  // no such file, or "max"
        if (limit >= kNoLimit) return SIZE_MAX;
        const std::uint64_t usage = read_number(c.usage);
        return limit > usage ? limit - usage : 0;
    }
    return SIZE_MAX;
}

}  // namespace

AvailableMemory available_memory() {
    constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
    AvailableMemory m;
    char text[96];
    const auto consider = [&](std::uint64_t bytes, const char* name) {
        if (bytes == SIZE_MAX) return;
        std::snprintf(text, sizeof text, "%s%s %.1f GiB", m.detail.empty() ? "" : ", ", name, double(bytes) / kGiB);
        m.detail += text;
        m.bytes = std::min<std::uint64_t>(m.bytes, bytes);
    };
    // MemAvailable: what can be allocated without swapping (free memory plus reclaimable caches).
    const std::uint64_t kib = read_number("/proc/meminfo", "MemAvailable:");
    consider(kib > 0 ? kib * 1024 : SIZE_MAX, "MemAvailable");
    consider(cgroup_room(), "room under the cgroup memory limit");
    struct rlimit as {};
    if (::getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) {
        // The address-space limit counts every mapping of the process, not only the heap.
        const std::uint64_t used = read_number("/proc/self/status", "VmSize:") * 1024;
        consider(as.rlim_cur > used ? as.rlim_cur - used : 0, "room under RLIMIT_AS");
    }
    return m;
}

bool fits_in_memory(const char* command, const std::string& what, std::size_t bytes) {
    const AvailableMemory m = available_memory();
    if (bytes <= m.bytes) return true;
    constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
    if (bytes == SIZE_MAX)
        std::fprintf(stderr, "wush %s: %s needs more memory than can be addressed\n", command, what.c_str());
    else
        std::fprintf(stderr, "wush %s: %s needs about %.1f GiB, more than the %.1f GiB of memory available (%s)\n",
                     command, what.c_str(), double(bytes) / kGiB, double(m.bytes) / kGiB, m.detail.c_str());
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

namespace {

const char* file_kind(mode_t mode) {
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISSOCK(mode)) return "a socket";
    return "not a regular file";
}

// Whether a file can be created in `dir`: an anonymous one where the file system has them, else a
// named one, removed at once.
int can_create_in(const std::string& dir) {
    int fd = ::open(dir.c_str(), O_WRONLY | O_TMPFILE | O_CLOEXEC, 0600);
    if (fd < 0 && errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL) return errno;
    if (fd < 0) {
        std::string name = dir + "/.wush-probe-XXXXXX";
        fd = ::mkstemp(name.data());
        if (fd < 0) return errno;
        ::unlink(name.c_str());
    }
    ::close(fd);
    return 0;
}

}  // namespace

bool writable_destination(const char* command, const std::string& option, const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
        usage_error(command, option + " " + printable(path) + " is " + file_kind(st.st_mode) +
                                 "; wush writes only regular files");
        return false;
    }
    const auto [dir, name] = split_path(path);
    if (const int err = can_create_in(dir); err != 0) {
        usage_error(command, "cannot write into " + printable(dir) + " (" + option + " " + printable(path) +
                                 "): " + std::strerror(err));
        return false;
    }
    return true;
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

std::string printable_message(const std::string& s) {
    std::string out;
    for (std::size_t start = 0; start <= s.size();) {
        const std::size_t end = std::min(s.find('\n', start), s.size());
        out += (start ? "\n" : "") + printable(s.substr(start, end - start), /*escape_backslash=*/false);
        start = end + 1;
    }
    return out;
}

int report(const char* what, wush_status status) {
    std::fprintf(stderr, "wush: %s failed: %s: %s\n", what, wush_status_string(status),
                 printable_message(wush_last_error()).c_str());
    return 1;
}

bool transform_from_name(const char* command, const std::string& name, wush_transform_kind* kind, bool* search) {
    int searched = 0;
    if (wush_transform_spec_from_name(name.c_str(), kind, &searched) == WUSH_OK) {
        *search = searched != 0;
        return true;
    }
    std::fprintf(stderr, "wush %s: %s\n", command, printable(wush_last_error()).c_str());
    return false;
}

std::vector<wush_method> all_methods() {
    std::vector<wush_method> out;
    for (int m = 0; wush_method_name(wush_method(m)) != nullptr; ++m) out.push_back(wush_method(m));
    return out;
}

bool method_from_name(const char* command, const std::string& option, const std::string& name, wush_method* method) {
    if (wush_method_from_name(name.c_str(), method) == WUSH_OK) return true;
    std::vector<std::string> names;
    for (wush_method m : all_methods()) names.push_back(wush_method_name(m));
    usage_error(command, "option " + option + " takes one of " + joined(names) + ", got '" + printable(name) + "'");
    return false;
}

void ProgressBar::step(const std::string& label) {
    done_ = std::min(done_ + 1, total_);
    const int width = 30;
    const int filled = total_ ? int(width * done_ / total_) : width;
    std::fprintf(stderr, "\r[%.*s%*s] %3d%% %-40.40s", filled, "##############################", width - filled, "",
                 total_ ? int(100 * done_ / total_) : 100, printable(label).c_str());  // labels hold layer names
    std::fflush(stderr);
    open_ = true;
}

void ProgressBar::finish() {
    if (open_) std::fprintf(stderr, "\n");
    open_ = false;
}

CalibrationMarks calibration_marks(Args& a) {
    CalibrationMarks m;
    if (a.has("--documents") && a.has("--sequence-length"))
        a.set_error(
            "--documents and --sequence-length: give one (the guard holds out whole documents, or whole "
            "sequences)");
    m.documents = a.has("--documents") ? a.get_size_list("--documents", "", 1, kMaxTokens) : std::vector<std::size_t>{};
    m.sequence_length = a.get_size("--sequence-length", 0, 1, kMaxTokens);
    return m;
}

bool document_lengths(const CalibrationMarks& marks, std::size_t n_tokens, std::vector<std::size_t>* lengths,
                      std::string* error) {
    lengths->clear();
    if (marks.documents.empty()) return true;
    if (marks.documents.size() == 1) {
        const std::size_t len = marks.documents[0];
        if (n_tokens % len != 0) {
            *error = "--documents " + std::to_string(len) + " does not divide the " + std::to_string(n_tokens) +
                     " calibration tokens";
            return false;
        }
        lengths->assign(n_tokens / len, len);
        return true;
    }
    std::size_t sum = 0;
    for (std::size_t len : marks.documents) sum = add_or_max(sum, len);
    if (sum != n_tokens) {
        *error = "--documents adds up to " + std::to_string(sum) + " tokens, not the " + std::to_string(n_tokens) +
                 " calibration tokens";
        return false;
    }
    *lengths = marks.documents;
    return true;
}

wush_status add_calibration(wush_context* ctx, wush_calibrator* cal, wush_dtype dtype, const void* x,
                            std::size_t n_tokens, std::size_t d_in, const CalibrationMarks& marks,
                            const std::vector<std::size_t>& lengths) {
    if (lengths.empty())
        return marks.sequence_length
                   ? wush_calibrator_add_sequences(ctx, cal, dtype, x, n_tokens, marks.sequence_length)
                   : wush_calibrator_add(ctx, cal, dtype, x, n_tokens);
    std::size_t elem = 0;
    wush_status st = wush_dtype_size(dtype, &elem);
    const auto* bytes = static_cast<const unsigned char*>(x);
    std::size_t start = 0;
    for (std::size_t i = 0; st == WUSH_OK && i < lengths.size(); ++i) {
        st = wush_calibrator_add_document(ctx, cal, dtype, bytes + start * d_in * elem, lengths[i], std::uint64_t(i));
        start += lengths[i];
    }
    return st;
}

}  // namespace cli
