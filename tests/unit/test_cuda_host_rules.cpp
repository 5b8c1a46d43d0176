// Host-only rules of the CUDA backend (cuda/device_rules.h, cuda/gemm_table.h), on the CPU: the
// int range of cuBLAS sizes (issue 41: the reference GEMM cast size_t to int unchecked), when a
// stream switch is ordered after the old stream, and the block-scaled FP4 path being opt-in.
#include <gtest/gtest.h>

#include <climits>
#include <cstddef>
#include <string>

#include "common/error.h"
#include "device_rules.h"
#include "gemm_table.h"

namespace {

using wush::cuda::CaptureState;
using wush::cuda::GemmKernel;

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
// any architecture; WUSH_CUDA_BLOCKSCALED=1 adds it for m > 32 on sm_100 / sm_120.
TEST(CudaHostRules, BlockScaledPathIsOptIn) {
    const auto all = [](GemmKernel) { return true; };
    wush::cuda::GemmTable t;
    ASSERT_TRUE(wush::cuda::gemm_table_from_env(nullptr, &t));
    for (int sm : {80, 90, 100, 103, 120, 121}) {
        EXPECT_FALSE(wush::cuda::table_names_kernel(t, sm, GemmKernel::BlockScaledLt)) << sm;
        for (std::size_t m : {std::size_t(1), std::size_t(33), std::size_t(4096)})
            EXPECT_NE(wush::cuda::table_pick(t, sm, m, WUSH_FORMAT_NVFP4, all), GemmKernel::BlockScaledLt) << sm;
    }
    const wush::cuda::GemmTable lt = wush::cuda::gemm_table_with_blockscaled(t);
    for (int sm : {100, 103, 120, 121}) {
        EXPECT_TRUE(wush::cuda::table_names_kernel(lt, sm, GemmKernel::BlockScaledLt)) << sm;
        EXPECT_EQ(wush::cuda::table_pick(lt, sm, 32, WUSH_FORMAT_NVFP4, all), GemmKernel::Decode) << sm;
        EXPECT_EQ(wush::cuda::table_pick(lt, sm, 33, WUSH_FORMAT_NVFP4, all), GemmKernel::BlockScaledLt) << sm;
    }
    EXPECT_FALSE(wush::cuda::table_names_kernel(lt, 90, GemmKernel::BlockScaledLt));
    EXPECT_EQ(wush::cuda::table_pick(lt, 90, 4096, WUSH_FORMAT_NVFP4, all), GemmKernel::Reference);
}

TEST(CudaHostRules, BlockScaledEnvironmentValues) {
    bool on = true;
    for (const char* off : {static_cast<const char*>(nullptr), "", "0"}) {
        on = true;
        ASSERT_TRUE(wush::cuda::blockscaled_opt_in_from_env(off, &on));
        EXPECT_FALSE(on);
    }
    ASSERT_TRUE(wush::cuda::blockscaled_opt_in_from_env("1", &on));
    EXPECT_TRUE(on);
    for (const char* bad : {"yes", "2", " 1", "true"}) {
        on = true;
        EXPECT_FALSE(wush::cuda::blockscaled_opt_in_from_env(bad, &on)) << bad;
        EXPECT_TRUE(on) << bad;  // unchanged
    }
}

}  // namespace
