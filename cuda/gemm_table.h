// Which W4A4 GEMM kernel serves a product: a table of rules by architecture and token count, so
// that a measurement on a GPU changes a row here (or the environment switch below), not code.
// Plain C++ (no CUDA headers): the CPU test (tests/unit/test_tile_decode.cpp) checks the table.
//
// The rules are tried in order; the first whose architecture range holds `sm`, whose token range
// holds m, and whose kernel supports the product (shape, format, operand alignment; for
// BlockScaledLt: cuBLASLt offers an algorithm) names the kernel.
//
// Default (docs: cuda/GEMM_NOTES.md, "Selection"):
//   m <= 32, sm >= 61        Decode (weight streaming with dp4a)
//   sm_100 / sm_120, m > 32  BlockScaledLt (cuBLASLt FP4), where cuBLASLt offers an algorithm
//   m > 32 otherwise         Reference (exact dequantization to BF16 + cuBLAS). The prefill kernel
//                            is predicted 2-3x slower than cuBLAS BF16 at 4096^3 and leaves SMs
//                            idle at m <= 128; it is chosen only when asked for (below) until a
//                            measurement shows it faster.
// WUSH_CUDA_PREFILL_MIN_M=<m> (environment, read when a CUDA context is created): m >= that value
// (and above the decode rows) on sm >= 80 takes the prefill kernel, for measurement.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <string>
#include <vector>

namespace wush::cuda {

// Which kernel serves a product (pick_gemm), so tests and benchmarks can force each one.
enum class GemmKernel { Reference, Decode, Prefill, BlockScaledLt };

struct GemmRule {
    int sm_min, sm_max;        // compute capability range (major * 10 + minor), inclusive
    std::size_t m_min, m_max;  // token range, inclusive
    GemmKernel kernel;
};

struct GemmTable {
    std::vector<GemmRule> rules;
};

constexpr std::size_t kDecodeMaxRows = 32;
constexpr std::size_t kAnyM = ~std::size_t(0);

inline GemmTable default_gemm_table() {
    return {{
        {61, 999, 1, kDecodeMaxRows, GemmKernel::Decode},
        {100, 109, kDecodeMaxRows + 1, kAnyM, GemmKernel::BlockScaledLt},
        {120, 129, kDecodeMaxRows + 1, kAnyM, GemmKernel::BlockScaledLt},
        {0, 999, 0, kAnyM, GemmKernel::Reference},
    }};
}

// The default table with the prefill kernel for m >= prefill_min_m on sm >= 80 (after the decode
// and cuBLASLt rules: those keep their ranges).
inline GemmTable gemm_table_with_prefill(std::size_t prefill_min_m) {
    GemmTable t = default_gemm_table();
    const std::size_t from = prefill_min_m > kDecodeMaxRows ? prefill_min_m : kDecodeMaxRows + 1;
    t.rules.insert(t.rules.end() - 1, GemmRule{80, 999, from, kAnyM, GemmKernel::Prefill});
    return t;
}

// The first rule that matches and whose kernel `usable(kernel)` accepts (Reference when none
// does). `usable` is pick_gemm's check of the shape and operands (and, for BlockScaledLt, that
// cuBLASLt offers an algorithm).
template <class Usable>
GemmKernel table_pick(const GemmTable& t, int sm, std::size_t m, const Usable& usable) {
    for (const GemmRule& r : t.rules) {
        if (sm < r.sm_min || sm > r.sm_max || m < r.m_min || m > r.m_max) continue;
        if (r.kernel == GemmKernel::Reference || usable(r.kernel)) return r.kernel;
    }
    return GemmKernel::Reference;
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

}  // namespace wush::cuda
