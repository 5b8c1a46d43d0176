#include "cli.h"

#include <algorithm>
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
