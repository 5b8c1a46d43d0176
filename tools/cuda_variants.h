// The CUDA kernel switches of `wush bench --device cuda` (--cuda-option, --variants), parsed the
// same way by `wush` (which checks them before it runs wush-bench-cuda, so that a bad command line
// is a usage error on any machine) and by wush-bench-cuda. Plain C++: no CUDA header.
#pragma once

#include <string>
#include <vector>

#include "wush/wush.h"

// One experimental switch (wush.h, WUSH_CONTEXT_CUDA_*) and its value.
struct CudaOption {
    wush_context_parameter parameter;
    long long value;
};

// --cuda-option NAME=VALUE,...: unknown names and malformed values are errors (the library checks
// the bounds). False with *error set on the first bad item.
bool parse_cuda_options(const std::vector<std::string>& items, std::vector<CudaOption>* out, std::string* error);

// One variant of --variants: its name as given and the switches it sets (on top of --cuda-option).
struct BenchVariant {
    std::string name;
    std::vector<CudaOption> options;
};

// --variants ITEM,...: each item is `default` (no switch), `all` (every on/off switch: stream_decode,
// bf16_prefill, tc_quantize, blockscaled), or switches joined by '+' (stream_decode=1+tc_quantize=1).
// Names must not repeat. False with *error set on the first bad item.
bool parse_variants(const std::vector<std::string>& items, std::vector<BenchVariant>* out, std::string* error);

// The on/off switches (WUSH_CONTEXT_CUDA_BLOCKSCALED ... _TC_QUANTIZE) and PREFILL_MIN_M: a context
// is reset to 0 for each of them before a variant's switches are applied.
std::vector<wush_context_parameter> cuda_switch_parameters();
