// Which W4A4 GEMM kernel serves a product: a table of rules by architecture and token count, so
// that a measurement on a GPU changes a row here (or the environment switch below), not code.
// Plain C++ (no CUDA headers): the CPU test (tests/unit/test_tile_decode.cpp) checks the table.
//
// The rules are tried in order; the first whose architecture range holds `sm`, whose token range
// holds m, and whose kernel supports the product (shape, format, operand alignment; for
// BlockScaledLt: cuBLASLt offers an algorithm) names the kernel.
//
// Default (docs: docs/record/cuda-gemm-notes.md, "Selection"):
//   m <= 32, sm >= 61        Decode (weight streaming with dp4a)
//   INT4, m >= 128, sm >= 80 Prefill: INT4's reference path multiplies in float32 (exact operands),
//                            and on an H200 the prefill kernel was faster at m = 128 and 3.2x faster
//                            at m = 4096 (docs/record/performance-record.md, "CUDA backend: first hardware run")
//   m > 32 otherwise         Reference (exact dequantization to BF16 + cuBLAS). The prefill kernel
//                            measured 5-7x slower than cuBLAS BF16 for MXFP4/NVFP4 (H200), and
//                            slower than this path; it is chosen there only when asked for (below).
// WUSH_CUDA_PREFILL_MIN_M=<m> (environment, read when a CUDA context is created): m >= that value
// (and above the decode rows) on sm >= 80 takes the prefill kernel, for measurement.
// WUSH_CUDA_BLOCKSCALED=1 (same): sm_100 / sm_120, m > 32 take cuBLASLt's block-scaled FP4 GEMM
// (BlockScaledLt) where cuBLASLt offers an algorithm. Opt-in only: that path has never run on
// hardware (cuda/blockscaled_gemm.cu), and an untested default would decide every Blackwell
// prefill; the reference path is exact and has run.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <string>
#include <vector>

#include "wush/wush.h"

namespace wush::cuda {

// Which kernel serves a product (pick_gemm), so tests and benchmarks can force each one.
enum class GemmKernel { Reference, Decode, Prefill, BlockScaledLt };

constexpr int kAnyFormat = -1;

struct GemmRule {
    int sm_min, sm_max;        // compute capability range (major * 10 + minor), inclusive
    std::size_t m_min, m_max;  // token range, inclusive
    GemmKernel kernel;
    int format = kAnyFormat;  // a wush_format value: the rule applies to that format only
};

struct GemmTable {
    std::vector<GemmRule> rules;
};

constexpr std::size_t kDecodeMaxRows = 32;
constexpr std::size_t kAnyM = ~std::size_t(0);
constexpr std::size_t kInt4PrefillMinM = 128;  // measured at 128 and 4096 only (H200): not below

inline GemmTable default_gemm_table() {
    return {{
        {61, 999, 1, kDecodeMaxRows, GemmKernel::Decode},
        {80, 999, kInt4PrefillMinM, kAnyM, GemmKernel::Prefill, WUSH_FORMAT_INT4},
        {0, 999, 0, kAnyM, GemmKernel::Reference},
    }};
}

// The default table with the prefill kernel for m >= prefill_min_m on sm >= 80, every format
// (after the decode and cuBLASLt rules: those keep their ranges).
inline GemmTable gemm_table_with_prefill(std::size_t prefill_min_m) {
    GemmTable t = default_gemm_table();
    const std::size_t from = prefill_min_m > kDecodeMaxRows ? prefill_min_m : kDecodeMaxRows + 1;
    t.rules.insert(t.rules.end() - 1, GemmRule{80, 999, from, kAnyM, GemmKernel::Prefill});
    return t;
}

// `t` with cuBLASLt's block-scaled FP4 GEMM for m > 32 on sm_100 / sm_120, right after the decode
// rule (before the INT4 prefill rule: BlockScaledLt takes no INT4, so INT4 keeps its kernel).
inline GemmTable gemm_table_with_blockscaled(GemmTable t) {
    const auto at = t.rules.begin() + (t.rules.empty() ? 0 : 1);
    t.rules.insert(at, {GemmRule{100, 109, kDecodeMaxRows + 1, kAnyM, GemmKernel::BlockScaledLt},
                        GemmRule{120, 129, kDecodeMaxRows + 1, kAnyM, GemmKernel::BlockScaledLt}});
    return t;
}

// Whether any rule of `t` names `kernel` on architecture `sm` (a prepared layer keeps the
// block-scaled path's swizzled weight scales only where it can be chosen).
inline bool table_names_kernel(const GemmTable& t, int sm, GemmKernel kernel) {
    return std::any_of(t.rules.begin(), t.rules.end(),
                       [&](const GemmRule& r) { return r.kernel == kernel && sm >= r.sm_min && sm <= r.sm_max; });
}

// The first rule that matches (architecture, tokens, and `format` where the rule names one) and
// whose kernel `usable(kernel)` accepts (Reference when none does). `usable` is pick_gemm's check
// of the shape and operands (and, for BlockScaledLt, that cuBLASLt offers an algorithm).
template <class Usable>
GemmKernel table_pick(const GemmTable& t, int sm, std::size_t m, int format, const Usable& usable) {
    for (const GemmRule& r : t.rules) {
        if (sm < r.sm_min || sm > r.sm_max || m < r.m_min || m > r.m_max) continue;
        if (r.format != kAnyFormat && r.format != format) continue;
        if (r.kernel == GemmKernel::Reference || usable(r.kernel)) return r.kernel;
    }
    return GemmKernel::Reference;
}

// The largest of bytes_at(m) over 1 <= m <= n: the workspace "for up to n tokens" that
// wush_linear_workspace_size promises. The kernel chosen changes with m, and one kernel's scratch
// can be smaller at a larger m (the decode kernel splits K less once a second row pass fills the
// GPU; the prefill kernel needs less than the reference path it replaces), so the size at n alone
// does not cover smaller batches. Up to kExactWorkspaceTokens every m is evaluated; above it every
// kernel's scratch grows with m, so within one rule's token range the range's last m (or n) is the
// largest, and only those ends are evaluated.
constexpr std::size_t kExactWorkspaceTokens = 64;

template <class BytesAt>
std::size_t max_bytes_up_to(const GemmTable& t, std::size_t n, const BytesAt& bytes_at) {
    std::size_t most = n > 0 ? bytes_at(n) : 0;
    const auto probe = [&](std::size_t m) {
        if (m >= 1 && m < n) most = std::max(most, bytes_at(m));
    };
    for (std::size_t m = 1; m <= kExactWorkspaceTokens; ++m) probe(m);
    for (const GemmRule& r : t.rules) {
        probe(r.m_max);
        probe(r.m_min - 1);
    }
    return most;
}

// The table a CUDA context uses, from the environment value of WUSH_CUDA_PREFILL_MIN_M (null or
// empty: the default). Returns false (and leaves *out unchanged) for a value that is not a
// positive decimal integer; the caller reports the error.
inline bool gemm_table_from_env(const char* prefill_min_m, GemmTable* out) {
    if (prefill_min_m == nullptr || *prefill_min_m == '\0') {
        *out = default_gemm_table();
        return true;
    }
    std::size_t v = 0;
    for (const char* p = prefill_min_m; *p; ++p) {
        if (*p < '0' || *p > '9' || v > (kAnyM - 9) / 10) return false;
        v = v * 10 + std::size_t(*p - '0');
    }
    if (v == 0) return false;
    *out = gemm_table_with_prefill(v);
    return true;
}

// WUSH_CUDA_BLOCKSCALED's value (null, empty or "0": off; "1": on) into *on; false (and *on
// unchanged) for any other value, which the caller reports.
inline bool blockscaled_opt_in_from_env(const char* value, bool* on) {
    const std::string v = value == nullptr ? "" : value;
    if (v != "" && v != "0" && v != "1") return false;
    *on = v == "1";
    return true;
}

}  // namespace wush::cuda
