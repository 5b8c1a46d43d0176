#include "cuda_variants.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <iterator>
#include <utility>

#include "cli.h"

namespace {

const std::pair<const char*, wush_context_parameter> kNames[] = {{"prefill_min_m", WUSH_CONTEXT_CUDA_PREFILL_MIN_M},
                                                                 {"blockscaled", WUSH_CONTEXT_CUDA_BLOCKSCALED},
                                                                 {"stream_decode", WUSH_CONTEXT_CUDA_STREAM_DECODE},
                                                                 {"bf16_prefill", WUSH_CONTEXT_CUDA_BF16_PREFILL},
                                                                 {"tc_quantize", WUSH_CONTEXT_CUDA_TC_QUANTIZE}};

}  // namespace

bool parse_cuda_options(const std::vector<std::string>& items, std::vector<CudaOption>* out, std::string* error) {
    for (const std::string& item : items) {
        const std::size_t eq = item.find('=');
        const std::string name = item.substr(0, eq);
        const auto* known =
            std::find_if(std::begin(kNames), std::end(kNames), [&](const auto& n) { return name == n.first; });
        const std::string value = eq == std::string::npos ? "" : item.substr(eq + 1);
        if (known == std::end(kNames)) {
            *error = "--cuda-option: unknown switch '" + cli::printable(name) +
                     "' (prefill_min_m, blockscaled, stream_decode, bf16_prefill, tc_quantize)";
            return false;
        }
        char* end = nullptr;
        errno = 0;
        const long long v = value.empty() ? 0 : std::strtoll(value.c_str(), &end, 10);
        if (value.empty() || *end != '\0' || errno != 0 || value[0] == ' ') {
            *error =
                "--cuda-option: " + name + " needs an integer value (NAME=VALUE), got '" + cli::printable(item) + "'";
            return false;
        }
        out->push_back({known->second, v});
    }
    return true;
}

bool parse_variants(const std::vector<std::string>& items, std::vector<BenchVariant>* out, std::string* error) {
    for (const std::string& item : items) {
        BenchVariant v{item, {}};
        if (item == "all") {
            v.options = {{WUSH_CONTEXT_CUDA_STREAM_DECODE, 1},
                         {WUSH_CONTEXT_CUDA_BF16_PREFILL, 1},
                         {WUSH_CONTEXT_CUDA_TC_QUANTIZE, 1},
                         {WUSH_CONTEXT_CUDA_BLOCKSCALED, 1}};
        } else if (item != "default") {
            std::vector<std::string> parts;
            for (std::size_t start = 0;;) {
                const std::size_t plus = item.find('+', start);
                parts.push_back(item.substr(start, plus - start));
                if (plus == std::string::npos) break;
                start = plus + 1;
            }
            std::string option_error;
            if (item.empty() || !parse_cuda_options(parts, &v.options, &option_error)) {
                *error = "--variants: '" + cli::printable(item) +
                         "' is not default, all or NAME=VALUE[+NAME=VALUE...]" +
                         (option_error.empty() ? "" : " (" + option_error + ")");
                return false;
            }
        }
        if (std::any_of(out->begin(), out->end(), [&](const BenchVariant& o) { return o.name == item; })) {
            *error = "--variants: '" + cli::printable(item) + "' is named twice";
            return false;
        }
        out->push_back(std::move(v));
    }
    return true;
}

std::vector<wush_context_parameter> cuda_switch_parameters() {
    std::vector<wush_context_parameter> p;
    for (const auto& n : kNames) p.push_back(n.second);
    return p;
}
