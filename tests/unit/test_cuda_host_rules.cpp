// Host-only rules of the CUDA backend (cuda/device_rules.h, cuda/gemm/gemm_table.h), on the CPU: the
// int range of cuBLAS sizes (issue 41: the reference GEMM cast size_t to int unchecked), when a
// stream switch is ordered after the old stream, the block-scaled FP4 path being opt-in, and the
// kernel table: default choices, options, and a promotion being one row.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <string>

#include "common/error.h"
#include "device_rules.h"
#include "gemm/gemm_table.h"

namespace {

using wush::cuda::CaptureState;
using wush::cuda::GemmKernel;
using wush::cuda::Kernel;
using wush::cuda::KernelTable;
using wush::cuda::Needs;
using wush::cuda::Option;
using wush::cuda::Workspace;

TEST(CudaHostRules, CheckedIntPassesTheIntRange) {
    EXPECT_EQ(wush::cuda::checked_int(0, "m", "test"), 0);
    EXPECT_EQ(wush::cuda::checked_int(4096, "m", "test"), 4096);
    EXPECT_EQ(wush::cuda::checked_int(std::size_t(INT_MAX), "m", "test"), INT_MAX);
}

// Past INT_MAX: UNSUPPORTED naming the size, never a wrapped value (2^32 + 5 would be 5).
TEST(CudaHostRules, CheckedIntRefusesWhatWouldWrap) {
    for (std::size_t v : {std::size_t(INT_MAX) + 1, (std::size_t(1) << 32) + 5, ~std::size_t(0)}) {
        try {
            wush::cuda::checked_int(v, "n (d_out)", "reference GEMM");
            ADD_FAILURE() << v << " was accepted";
        } catch (const wush::Error& e) {
            EXPECT_EQ(e.status(), WUSH_ERR_UNSUPPORTED);
            const std::string what = e.what();
            EXPECT_NE(what.find("reference GEMM: n (d_out) = " + std::to_string(v)), std::string::npos) << what;
            EXPECT_NE(what.find("int range"), std::string::npos) << what;
        }
    }
}

// set_stream orders the new stream after the old one exactly when both are eager and distinct.
TEST(CudaHostRules, StreamSwitchOrderedOnlyBetweenEagerStreams) {
    const CaptureState states[] = {CaptureState::None, CaptureState::Capturing, CaptureState::Unknown};
    for (CaptureState from : states)
        for (CaptureState to : states) {
            const bool eager = from == CaptureState::None && to == CaptureState::None;
            EXPECT_EQ(wush::cuda::order_stream_switch(false, from, to), eager) << int(from) << " " << int(to);
            EXPECT_FALSE(wush::cuda::order_stream_switch(true, from, to)) << int(from) << " " << int(to);
        }
}

// Blackwell's cuBLASLt FP4 path has never run on hardware: the default table never names it, on
// any architecture; WUSH_CONTEXT_CUDA_BLOCKSCALED adds it for m > 32 on sm_100 / sm_120.
TEST(CudaHostRules, BlockScaledPathIsOptIn) {
    const auto all = [](GemmKernel) { return true; };
    const KernelTable t = wush::cuda::active_table({});
    for (int sm : {80, 90, 100, 103, 120, 121}) {
        EXPECT_FALSE(wush::cuda::table_names_kernel(t, sm, GemmKernel::BlockScaledLt)) << sm;
        EXPECT_FALSE(wush::cuda::table_needs(t, sm, Needs::SwizzledScales)) << sm;
        for (std::size_t m : {std::size_t(1), std::size_t(33), std::size_t(4096)})
            EXPECT_NE(wush::cuda::table_pick(t, sm, m, WUSH_FORMAT_NVFP4, all), GemmKernel::BlockScaledLt) << sm;
    }
    const KernelTable lt = wush::cuda::active_table({.blockscaled = true});
    for (int sm : {100, 103, 120, 121}) {
        EXPECT_TRUE(wush::cuda::table_names_kernel(lt, sm, GemmKernel::BlockScaledLt)) << sm;
        EXPECT_TRUE(wush::cuda::table_needs(lt, sm, Needs::SwizzledScales)) << sm;
        EXPECT_EQ(wush::cuda::table_pick(lt, sm, 32, WUSH_FORMAT_NVFP4, all), GemmKernel::Decode) << sm;
        EXPECT_EQ(wush::cuda::table_pick(lt, sm, 33, WUSH_FORMAT_NVFP4, all), GemmKernel::BlockScaledLt) << sm;
    }
    EXPECT_FALSE(wush::cuda::table_names_kernel(lt, 90, GemmKernel::BlockScaledLt));
    EXPECT_EQ(wush::cuda::table_pick(lt, 90, 4096, WUSH_FORMAT_NVFP4, all), GemmKernel::Reference);
}

// ---- the one kernel table (cuda/gemm/gemm_table.h) ----------------------------------------------------

const auto kAll = [](Kernel) { return true; };

// Stand-in scratch formulas, distinct per kind, so that a test sees which row sized a workspace.
struct FakeSizes {
    std::size_t decode() const { return 1; }
    std::size_t stream_decode() const { return 5; }
    std::size_t prefill() const { return 2; }
    std::size_t reference() const { return 30; }
    std::size_t blockscaled() const { return 40; }
};

std::size_t gemm_workspace(const KernelTable& t, int sm, std::size_t m, wush_format f) {
    const wush::cuda::KernelRow* row = wush::cuda::table_row(t, false, sm, m, f, kAll);
    return wush::cuda::row_workspace_bytes(row ? row->workspace : Workspace::Reference, FakeSizes{});
}

// The default choices, quantize and GEMM, for the token counts where they change; with every
// option off, no opt-in kernel is chosen and nothing opt-in is prepared.
TEST(KernelTable, DefaultChoices) {
    const KernelTable t = wush::cuda::active_table({});
    for (int sm : {61, 75, 80, 90, 100, 120}) {
        for (std::size_t m : {1, 2, 16, 17, 32, 33, 127, 128, 4096}) {
            for (wush_format f : {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4, WUSH_FORMAT_INT4}) {
                EXPECT_EQ(wush::cuda::quantize_pick(t, sm, m, f, kAll),
                          m <= 16 ? Kernel::QuantizeSmallM : Kernel::QuantizeTile)
                    << sm << " " << m;
                const Kernel want = m <= 32                                         ? Kernel::Decode
                                    : f == WUSH_FORMAT_INT4 && sm >= 80 && m >= 128 ? Kernel::Prefill
                                                                                    : Kernel::Reference;
                EXPECT_EQ(wush::cuda::table_pick(t, sm, m, f, kAll), want) << sm << " " << m << " " << f;
            }
        }
        for (Needs n : {Needs::TcFragments, Needs::StagedWeights, Needs::SwizzledScales})
            EXPECT_FALSE(wush::cuda::table_needs(t, sm, n)) << sm << " " << int(n);
    }
}

// Each option switches on its row, and only its: the tensor-core quantize from 17 tokens on
// (never below: the small-m kernel keeps m <= 16), sm_80+ only, and only where its fragments were
// prepared (usable); the streaming decode up to 32 tokens; the BF16 prefill above 32.
TEST(KernelTable, OptionsSwitchOnTheirRows) {
    const KernelTable tc = wush::cuda::active_table({.tc_quantize = true});
    for (std::size_t m : {1, 16})
        EXPECT_EQ(wush::cuda::quantize_pick(tc, 90, m, WUSH_FORMAT_MXFP4, kAll), Kernel::QuantizeSmallM) << m;
    for (std::size_t m : {17, 4096})
        EXPECT_EQ(wush::cuda::quantize_pick(tc, 90, m, WUSH_FORMAT_MXFP4, kAll), Kernel::QuantizeTensorCore) << m;
    EXPECT_EQ(wush::cuda::quantize_pick(tc, 75, 4096, WUSH_FORMAT_MXFP4, kAll), Kernel::QuantizeTile);
    EXPECT_EQ(wush::cuda::quantize_pick(tc, 90, 4096, WUSH_FORMAT_MXFP4,
                                        [](Kernel k) { return k != Kernel::QuantizeTensorCore; }),
              Kernel::QuantizeTile);
    EXPECT_TRUE(wush::cuda::table_needs(tc, 80, Needs::TcFragments));
    EXPECT_FALSE(wush::cuda::table_needs(tc, 75, Needs::TcFragments));

    const KernelTable sd = wush::cuda::active_table({.stream_decode = true});
    EXPECT_EQ(wush::cuda::table_pick(sd, 90, 1, WUSH_FORMAT_MXFP4, kAll), Kernel::StreamDecode);
    EXPECT_EQ(wush::cuda::table_pick(sd, 90, 32, WUSH_FORMAT_MXFP4, kAll), Kernel::StreamDecode);
    EXPECT_EQ(wush::cuda::table_pick(sd, 75, 32, WUSH_FORMAT_MXFP4, kAll), Kernel::Decode);
    EXPECT_EQ(wush::cuda::table_pick(sd, 90, 8, WUSH_FORMAT_MXFP4, [](Kernel k) { return k != Kernel::StreamDecode; }),
              Kernel::Decode);  // no staged weight: the decode kernel
    EXPECT_TRUE(wush::cuda::table_needs(sd, 90, Needs::StagedWeights));
    // Its workspace is its own (partials and the split-K counters), not the decode kernel's.
    EXPECT_EQ(gemm_workspace(sd, 90, 1, WUSH_FORMAT_MXFP4), 5u);
    EXPECT_EQ(gemm_workspace(wush::cuda::active_table({}), 90, 1, WUSH_FORMAT_MXFP4), 1u);

    const KernelTable bf = wush::cuda::active_table({.bf16_prefill = true});
    EXPECT_EQ(wush::cuda::table_pick(bf, 90, 32, WUSH_FORMAT_MXFP4, kAll), Kernel::Decode);
    EXPECT_EQ(wush::cuda::table_pick(bf, 90, 33, WUSH_FORMAT_MXFP4, kAll), Kernel::Bf16Prefill);
    EXPECT_EQ(wush::cuda::table_pick(bf, 90, 4096, WUSH_FORMAT_INT4, kAll), Kernel::Prefill);  // INT4's row first
}

// The row named `name` in `t` (a copy of the table: the test hook for a promotion).
wush::cuda::KernelRow& row_named(KernelTable& t, const std::string& name) {
    for (wush::cuda::KernelRow& r : t.rows)
        if (name == r.name) return r;
    ADD_FAILURE() << "no row " << name;
    return t.rows.front();
}

// Promoting a kernel after a GPU run is a one-row change: with the row's opt_in set to
// Option::None in a copy of the table, the default options choose it where its rule holds, its
// workspace sizes the product, and prepare builds what it needs; nothing else changes.
TEST(KernelTable, PromotionIsOneRow) {
    const KernelTable before = wush::cuda::active_table({});

    KernelTable all = wush::cuda::kernel_table();
    row_named(all, "quantize.tensor_core").opt_in = Option::None;
    KernelTable after = wush::cuda::active_table({}, all);
    EXPECT_EQ(wush::cuda::quantize_pick(after, 90, 17, WUSH_FORMAT_NVFP4, kAll), Kernel::QuantizeTensorCore);
    EXPECT_EQ(wush::cuda::quantize_pick(after, 90, 16, WUSH_FORMAT_NVFP4, kAll), Kernel::QuantizeSmallM);
    EXPECT_TRUE(wush::cuda::table_needs(after, 90, Needs::TcFragments));
    EXPECT_FALSE(wush::cuda::table_needs(before, 90, Needs::TcFragments));

    all = wush::cuda::kernel_table();
    row_named(all, "gemm.bf16_prefill").opt_in = Option::None;
    after = wush::cuda::active_table({}, all);
    EXPECT_EQ(wush::cuda::table_pick(after, 90, 33, WUSH_FORMAT_MXFP4, kAll), Kernel::Bf16Prefill);
    EXPECT_EQ(wush::cuda::table_pick(before, 90, 33, WUSH_FORMAT_MXFP4, kAll), Kernel::Reference);

    // The prefill kernel for every format, from 64 tokens: choice and workspace follow the row.
    all = wush::cuda::kernel_table();
    wush::cuda::KernelRow& prefill = row_named(all, "gemm.prefill");
    prefill.opt_in = Option::None;
    prefill.m_min = 64;
    after = wush::cuda::active_table({}, all);
    EXPECT_EQ(wush::cuda::table_pick(after, 90, 63, WUSH_FORMAT_MXFP4, kAll), Kernel::Reference);
    EXPECT_EQ(wush::cuda::table_pick(after, 90, 64, WUSH_FORMAT_MXFP4, kAll), Kernel::Prefill);
    EXPECT_EQ(gemm_workspace(after, 90, 64, WUSH_FORMAT_MXFP4), 2u);
    EXPECT_EQ(gemm_workspace(before, 90, 64, WUSH_FORMAT_MXFP4), 30u);
    // The largest workspace for up to n tokens reads the rows' ranges: the reference path's at 63.
    const auto at = [&](std::size_t m) { return gemm_workspace(after, 90, m, WUSH_FORMAT_MXFP4) * 1000 + m; };
    EXPECT_EQ(wush::cuda::max_bytes_up_to(after, 4096, at), 30u * 1000 + 63);

    // Block-scaled, promoted: the swizzled scales are prepared, its workspace covers the fallback.
    all = wush::cuda::kernel_table();
    row_named(all, "gemm.blockscaled_sm100").opt_in = Option::None;
    after = wush::cuda::active_table({}, all);
    EXPECT_TRUE(wush::cuda::table_needs(after, 100, Needs::SwizzledScales));
    EXPECT_FALSE(wush::cuda::table_needs(after, 120, Needs::SwizzledScales));
    EXPECT_EQ(gemm_workspace(after, 100, 33, WUSH_FORMAT_NVFP4), 40u);
    EXPECT_EQ(gemm_workspace(before, 100, 33, WUSH_FORMAT_NVFP4), 30u);
}

// Every kernel variant is a named row; names are unique; each opt-in row is off by default.
TEST(KernelTable, EveryKernelIsANamedRow) {
    const KernelTable all = wush::cuda::kernel_table();
    for (Kernel k : {Kernel::QuantizeSmallM, Kernel::QuantizeTile, Kernel::QuantizeTensorCore, Kernel::Reference,
                     Kernel::Decode, Kernel::StreamDecode, Kernel::Prefill, Kernel::Bf16Prefill, Kernel::BlockScaledLt})
        EXPECT_TRUE(std::any_of(all.rows.begin(), all.rows.end(), [&](const wush::cuda::KernelRow& r) {
            return r.kernel == k;
        })) << int(k);
    for (std::size_t i = 0; i < all.rows.size(); ++i)
        for (std::size_t j = i + 1; j < all.rows.size(); ++j)
            EXPECT_NE(std::string(all.rows[i].name), all.rows[j].name);
    const KernelTable on = wush::cuda::active_table({});
    for (const wush::cuda::KernelRow& r : on.rows) EXPECT_EQ(r.opt_in, Option::None) << r.name;
}

}  // namespace
