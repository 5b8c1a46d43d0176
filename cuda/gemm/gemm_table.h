// Which kernel serves a launch: one table of named rows, for the activation quantize and for the
// W4A4 GEMM, so that a measurement on a GPU changes a row here, not code. Plain C++ (no CUDA
// headers): the CPU tests (tests/unit/test_tile_decode.cpp, test_cuda_host_rules.cpp) check it.
//
// A row names a kernel and the rule under which it serves: architecture range, format, token
// range (m), the experimental context parameter that switches it on (none: on by default), what a
// prepared layer must hold for it, and the workspace it needs. The rows of one operation are
// tried in order; the first that is switched on, whose ranges hold (sm, m, format) and whose
// kernel accepts the launch (shape, operands, what was prepared; for BlockScaledLt: cuBLASLt
// offers an algorithm) serves. The backend's quantize launch, run_gemm and gemm_bytes each read
// the chosen row in one switch; nothing else overrides it.
//
// Promoting an opt-in kernel after a GPU run is one row: its `opt_in` set to Option::None (and
// its m range as measured). Everything else follows from the row: the choice, the workspace
// sizes, and what prepare builds for it (`needs`).
//
// Default choices (docs: docs/RUNTIME.md "Kernels and dispatch"; evidence:
// docs/record/cuda-gemm-notes.md, "Selection"):
//   quantize m <= 16        the small-m CUDA-core kernel (a warp per token and group)
//   quantize m >= 17        the tile CUDA-core kernel; the tensor-core kernel only when asked for
//                           (WUSH_CONTEXT_CUDA_TC_QUANTIZE), and never below 17 tokens, where the
//                           small-m kernel spreads one token over the GPU and the MMA tile would
//                           be mostly empty
//   GEMM m <= 32, sm >= 61  decode (weight streaming with dp4a)
//   INT4, m >= 128, sm >= 80 prefill: INT4's reference path multiplies in float32 (exact
//                           operands), and on an H200 the prefill kernel was faster at m = 128 and
//                           3.2x faster at m = 4096 (docs/record/performance-record.md, "CUDA
//                           backend: first hardware run")
//   m > 32 otherwise        reference (exact dequantization to BF16 + cuBLAS). The prefill kernel
//                           measured 5-7x slower than cuBLAS BF16 for MXFP4/NVFP4 (H200); it
//                           serves them only when asked for (WUSH_CONTEXT_CUDA_PREFILL_MIN_M).
// Opt-in rows: the streaming decode, the BF16 prefill, cuBLASLt's block-scaled FP4 GEMM (sm_100 /
// sm_120; an untested default would decide every Blackwell prefill, and the reference path is
// exact and has run), the prefill kernel for every format, the tensor-core quantize.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "wush/wush.h"

namespace wush::cuda {

// Every kernel variant a row can name. The first three quantize activations; the rest multiply.
enum class Kernel {
    QuantizeSmallM,      // CUDA cores, a warp per token and group (quantize_kernel.cuh)
    QuantizeTile,        // CUDA cores, 32 tokens x 4 groups per block (quantize_kernel.cuh)
    QuantizeTensorCore,  // the G x G product on BF16 tensor cores (quantize_tc.cu)
    Reference,           // exact dequantization to BF16 / float32 + cuBLAS (reference_gemm.cu)
    Decode,              // weight streaming with dp4a (gemm_decode.cu)
    StreamDecode,        // the streaming decode kernel (stream_decode.cu)
    Prefill,             // INT8 mma.sync tiles (gemm_prefill.cu)
    Bf16Prefill,         // W's codes to BF16 in registers, BF16 tensor cores (gemm_bf16_prefill.cu)
    BlockScaledLt,       // cuBLASLt's block-scaled FP4 GEMM (blockscaled_gemm.cu)
};
using GemmKernel = Kernel;  // the GEMM rows' kernels (pick_gemm, gemm_supported)

// A kernel's name, as wush_linear_last_kernels reports it ("quantize.small_m", "gemm.decode", ...).
inline const char* kernel_name(Kernel k) {
    switch (k) {
        case Kernel::QuantizeSmallM: return "quantize.small_m";
        case Kernel::QuantizeTile: return "quantize.tile";
        case Kernel::QuantizeTensorCore: return "quantize.tensor_core";
        case Kernel::Reference: return "gemm.reference";
        case Kernel::Decode: return "gemm.decode";
        case Kernel::StreamDecode: return "gemm.stream_decode";
        case Kernel::Prefill: return "gemm.prefill";
        case Kernel::Bf16Prefill: return "gemm.bf16_prefill";
        case Kernel::BlockScaledLt: return "gemm.blockscaled";
    }
    return "unknown";
}

inline bool is_quantize(Kernel k) {
    return k == Kernel::QuantizeSmallM || k == Kernel::QuantizeTile || k == Kernel::QuantizeTensorCore;
}

// The experimental context parameter that switches a row on (wush.h, WUSH_CONTEXT_CUDA_*).
enum class Option { None, PrefillMinM, BlockScaled, StreamDecode, Bf16Prefill, TcQuantize };

// What a prepared layer must hold for the row's kernel (prepare builds it where a switched-on row
// of the layer's architecture needs it).
enum class Needs {
    Nothing,
    TcFragments,     // the transform's exact BF16 split in fragment order (and a passed probe)
    StagedWeights,   // W restaged for the streaming decode kernel
    SwizzledScales,  // W's scales in cuBLASLt's 128x4-tiled layout
};

// The device scratch of a launch through the row (the GEMM's part of a forward's workspace).
enum class Workspace {
    None,
    Decode,         // plan::decode_workspace_bytes (split-K partials)
    StreamDecode,   // stream::workspace_bytes (its partials and split-K counters), at least the
                    // decode kernel's (the fallback where the device cannot run it)
    Prefill,        // plan::prefill_workspace_bytes
    Reference,      // reference_gemm_workspace_bytes; also the BF16 prefill's (its scratch is
                    // smaller, and a launch with a bias falls back to the reference path)
    BlockScaledLt,  // the larger of cuBLASLt's and the reference path's (the fallback when
                    // cuBLASLt offers no algorithm)
};

constexpr int kAnyFormat = -1;
constexpr std::size_t kAnyM = ~std::size_t(0);
constexpr std::size_t kDecodeMaxRows = 32;
constexpr std::size_t kQuantizeSmallMaxTokens = 16;  // = quantize_detail::kSmallMaxTokens
constexpr std::size_t kInt4PrefillMinM = 128;        // measured at 128 and 4096 only (H200): not below
// A row's m_min taken from WUSH_CONTEXT_CUDA_PREFILL_MIN_M (at least kDecodeMaxRows + 1).
constexpr std::size_t kMinFromOption = kAnyM;

struct KernelRow {
    const char* name;
    Kernel kernel;
    int sm_min, sm_max;        // compute capability range (major * 10 + minor), inclusive
    int format;                // a wush_format value, or kAnyFormat
    std::size_t m_min, m_max;  // token range, inclusive
    Option opt_in;             // Option::None: on by default
    Needs needs;
    Workspace workspace;
};

struct KernelTable {
    std::vector<KernelRow> rows;
};

// Every row, opt-in ones included, in the order they are tried.
inline KernelTable kernel_table() {
    using K = Kernel;
    return {{
        // ---- quantize -----------------------------------------------------------------------
        {"quantize.tensor_core", K::QuantizeTensorCore, 80, 999, kAnyFormat, kQuantizeSmallMaxTokens + 1, kAnyM,
         Option::TcQuantize, Needs::TcFragments, Workspace::None},
        {"quantize.small_m", K::QuantizeSmallM, 0, 999, kAnyFormat, 1, kQuantizeSmallMaxTokens, Option::None,
         Needs::Nothing, Workspace::None},
        {"quantize.tile", K::QuantizeTile, 0, 999, kAnyFormat, kQuantizeSmallMaxTokens + 1, kAnyM, Option::None,
         Needs::Nothing, Workspace::None},
        // ---- GEMM ---------------------------------------------------------------------------
        {"gemm.stream_decode", K::StreamDecode, 80, 999, kAnyFormat, 1, kDecodeMaxRows, Option::StreamDecode,
         Needs::StagedWeights, Workspace::StreamDecode},
        {"gemm.decode", K::Decode, 61, 999, kAnyFormat, 1, kDecodeMaxRows, Option::None, Needs::Nothing,
         Workspace::Decode},
        // Before the INT4 prefill row: BlockScaledLt takes no INT4, so INT4 keeps its kernel.
        {"gemm.blockscaled_sm100", K::BlockScaledLt, 100, 109, kAnyFormat, kDecodeMaxRows + 1, kAnyM,
         Option::BlockScaled, Needs::SwizzledScales, Workspace::BlockScaledLt},
        {"gemm.blockscaled_sm120", K::BlockScaledLt, 120, 129, kAnyFormat, kDecodeMaxRows + 1, kAnyM,
         Option::BlockScaled, Needs::SwizzledScales, Workspace::BlockScaledLt},
        {"gemm.prefill_int4", K::Prefill, 80, 999, WUSH_FORMAT_INT4, kInt4PrefillMinM, kAnyM, Option::None,
         Needs::Nothing, Workspace::Prefill},
        {"gemm.prefill", K::Prefill, 80, 999, kAnyFormat, kMinFromOption, kAnyM, Option::PrefillMinM, Needs::Nothing,
         Workspace::Prefill},
        {"gemm.bf16_prefill", K::Bf16Prefill, 80, 999, kAnyFormat, kDecodeMaxRows + 1, kAnyM, Option::Bf16Prefill,
         Needs::Nothing, Workspace::Reference},
        {"gemm.reference", K::Reference, 0, 999, kAnyFormat, 0, kAnyM, Option::None, Needs::Nothing,
         Workspace::Reference},
    }};
}

// The experimental switches of a context (WUSH_CONTEXT_CUDA_*), as a layer is prepared with them.
struct KernelOptions {
    std::size_t prefill_min_m = 0;  // 0: off
    bool blockscaled = false;
    bool stream_decode = false;
    bool bf16_prefill = false;
    bool tc_quantize = false;
};

// The rows of `all` that `o` switches on, with m ranges taken from the options where a row says so.
inline KernelTable active_table(const KernelOptions& o, const KernelTable& all = kernel_table()) {
    KernelTable t;
    for (KernelRow r : all.rows) {
        bool on = true;
        switch (r.opt_in) {
            case Option::None: break;
            case Option::PrefillMinM: on = o.prefill_min_m > 0; break;
            case Option::BlockScaled: on = o.blockscaled; break;
            case Option::StreamDecode: on = o.stream_decode; break;
            case Option::Bf16Prefill: on = o.bf16_prefill; break;
            case Option::TcQuantize: on = o.tc_quantize; break;
        }
        if (!on) continue;
        // A value at or below the decode rows starts right above them: decode keeps m <= 32.
        if (r.m_min == kMinFromOption) r.m_min = std::max(o.prefill_min_m, kDecodeMaxRows + 1);
        t.rows.push_back(r);
    }
    return t;
}

// Whether a row of `t` on architecture `sm` needs `what` of a prepared layer.
inline bool table_needs(const KernelTable& t, int sm, Needs what) {
    return std::any_of(t.rows.begin(), t.rows.end(),
                       [&](const KernelRow& r) { return r.needs == what && sm >= r.sm_min && sm <= r.sm_max; });
}

// Whether any row of `t` names `kernel` on architecture `sm`.
inline bool table_names_kernel(const KernelTable& t, int sm, Kernel kernel) {
    return std::any_of(t.rows.begin(), t.rows.end(),
                       [&](const KernelRow& r) { return r.kernel == kernel && sm >= r.sm_min && sm <= r.sm_max; });
}

// The first row of the operation (`quantize`: the quantize rows, else the GEMM rows) that matches
// (architecture, tokens, `format` where the row names one) and whose kernel `usable(kernel)`
// accepts; null when none does (the backend's rows end in ones that always accept).
template <class Usable>
const KernelRow* table_row(const KernelTable& t, bool quantize, int sm, std::size_t m, int format,
                           const Usable& usable) {
    for (const KernelRow& r : t.rows) {
        if (is_quantize(r.kernel) != quantize) continue;
        if (sm < r.sm_min || sm > r.sm_max || m < r.m_min || m > r.m_max) continue;
        if (r.format != kAnyFormat && r.format != format) continue;
        if (usable(r.kernel)) return &r;
    }
    return nullptr;
}

// The GEMM kernel of the first matching row, Reference when none matches.
template <class Usable>
Kernel table_pick(const KernelTable& t, int sm, std::size_t m, int format, const Usable& usable) {
    const KernelRow* r =
        table_row(t, false, sm, m, format, [&](Kernel k) { return k == Kernel::Reference || usable(k); });
    return r ? r->kernel : Kernel::Reference;
}

// The quantize kernel of the first matching row (the CUDA-core kernels when none matches).
template <class Usable>
Kernel quantize_pick(const KernelTable& t, int sm, std::size_t m, int format, const Usable& usable) {
    const KernelRow* r = table_row(t, true, sm, m, format, usable);
    if (r) return r->kernel;
    return m <= kQuantizeSmallMaxTokens ? Kernel::QuantizeSmallM : Kernel::QuantizeTile;
}

// A row's workspace in bytes, from the kernels' size functions (`sizes` has decode(),
// stream_decode(), prefill(), reference() and blockscaled(); the last two live in .cu files, hence
// passed in).
template <class Sizes>
std::size_t row_workspace_bytes(Workspace w, const Sizes& sizes) {
    switch (w) {
        case Workspace::None: return 0;
        case Workspace::Decode: return sizes.decode();
        case Workspace::StreamDecode: return sizes.stream_decode();
        case Workspace::Prefill: return sizes.prefill();
        case Workspace::Reference: return sizes.reference();
        case Workspace::BlockScaledLt: return std::max(sizes.blockscaled(), sizes.reference());
    }
    return 0;
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
std::size_t max_bytes_up_to(const KernelTable& t, std::size_t n, const BytesAt& bytes_at) {
    std::size_t most = n > 0 ? bytes_at(n) : 0;
    const auto probe = [&](std::size_t m) {
        if (m >= 1 && m < n) most = std::max(most, bytes_at(m));
    };
    for (std::size_t m = 1; m <= kExactWorkspaceTokens; ++m) probe(m);
    for (const KernelRow& r : t.rows) {
        probe(r.m_max);
        probe(r.m_min - 1);
    }
    return most;
}

}  // namespace wush::cuda
