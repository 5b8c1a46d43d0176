// cuBLASLt's tiled scale layout (cuda/gemm/blockscaled_layout.h) against the documented construction,
// written here as PyTorch's to_blocked does it: pad to 128 x 4 multiples, take 128 x 4 tiles row-
// tile major, view each tile as (4, 32, 4), swap the first two axes, flatten.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "../../cuda/gemm/blockscaled_layout.h"

namespace {

std::vector<int> to_blocked(const std::vector<int>& m, std::size_t rows, std::size_t cols) {
    const std::size_t nrb = (rows + 127) / 128, ncb = (cols + 3) / 4;
    const auto at = [&](std::size_t r, std::size_t c) { return r < rows && c < cols ? m[r * cols + c] : -1; };
    std::vector<int> out;
    for (std::size_t rb = 0; rb < nrb; ++rb)
        for (std::size_t cb = 0; cb < ncb; ++cb)
            for (std::size_t j = 0; j < 32; ++j)  // after the transpose: (32, 4, 4)
                for (std::size_t i = 0; i < 4; ++i)
                    for (std::size_t c = 0; c < 4; ++c) out.push_back(at(rb * 128 + i * 32 + j, cb * 4 + c));
    return out;
}

TEST(CublasLtScaleLayout, MatchesTheDocumentedConstruction) {
    for (std::size_t rows : {1, 7, 128, 129, 300}) {
        for (std::size_t cols : {1, 3, 4, 5, 8, 64}) {
            std::vector<int> m(rows * cols);
            for (std::size_t i = 0; i < m.size(); ++i) m[i] = int(i);
            const std::vector<int> want = to_blocked(m, rows, cols);
            std::vector<int> got(((rows + 127) / 128) * 128 * ((cols + 3) / 4) * 4, -1);
            ASSERT_EQ(got.size(), want.size());
            for (std::size_t r = 0; r < rows; ++r)
                for (std::size_t c = 0; c < cols; ++c)
                    got[wush::cuda::tiled_scale_offset(r, c, cols)] = m[r * cols + c];
            EXPECT_EQ(got, want) << rows << " x " << cols;
        }
    }
}

}  // namespace
