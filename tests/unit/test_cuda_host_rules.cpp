// Host-only rules of the CUDA backend (cuda/device_rules.h, cuda/gemm_table.h), on the CPU: the
// int range of cuBLAS sizes (issue 41: the reference GEMM cast size_t to int unchecked).
#include <gtest/gtest.h>

#include <climits>
#include <cstddef>
#include <string>

#include "common/error.h"
#include "device_rules.h"

namespace {

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

}  // namespace
