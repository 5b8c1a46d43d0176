// The tensor-core quantize's error bound (cuda/quantize/mma_error_bound.h) against a second
// implementation of the accumulator model it assumes: a block fused multiply-add that aligns every
// term of a block to the block's largest exponent, truncates below the 24th bit, adds exactly and
// truncates the sum to FP32 (the model of the tensor-core literature), for blocks of 4, 8 and 16
// products, over the kernel's three-part (and, for F16 input, six-part) pass order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "common/float_bits.h"
#include "quantize/bf16_fragments.h"
#include "quantize/mma_error_bound.h"

namespace {

using namespace wush;

// Truncation toward zero of a double to float.
float to_float_rz(double v) {
    float f = float(v);
    if (std::fabs(double(f)) > std::fabs(v)) f = std::nextafter(f, 0.0f);
    return f;
}

// One output of one m16n8k16 instruction under the model: c + sum of 16 exact products, in fused
// blocks of nb.
float model_mma(float c, const double* p, int nb) {
    double run = c;
    for (int b = 0; b < tc::kMmaK; b += nb) {
        double terms[17];
        int n = 0;
        terms[n++] = run;
        for (int k = b; k < b + nb; ++k) terms[n++] = p[k];
        double top = 0.0;
        for (int i = 0; i < n; ++i) top = std::max(top, std::fabs(terms[i]));
        if (top == 0.0) continue;
        const double q = std::ldexp(1.0, bits::floor_log2(top) - 23);
        double s = 0.0;
        for (int i = 0; i < n; ++i) s += std::trunc(terms[i] / q) * q;  // exact: multiples of q, < 2^30 q
        run = to_float_rz(s);
    }
    return float(run);
}

struct Case {
    std::vector<float> t;  // G x G
    std::vector<float> x;  // G, as the kernel sees it (BF16 or F16 values)
};

// y_i of the split product in the kernel's pass order under the model; x_split: F16 input.
float model_product(const Case& c, int g, int i, bool x_split, int nb) {
    std::vector<tc::Split3> ts(static_cast<std::size_t>(g));
    for (int j = 0; j < g; ++j) ts[std::size_t(j)] = tc::split3(c.t[std::size_t(i * g + j)]);
    float acc = 0.0f;
    for (int q = x_split ? 0 : 1; q < 2; ++q)
        for (int p = 0; p < tc::kParts; ++p)
            for (int ks = 0; ks < g / 16; ++ks) {
                double prod[16];
                for (int k = 0; k < 16; ++k) {
                    const float xv = c.x[std::size_t(ks * 16 + k)];
                    const float hi = tc::bf16_value(tc::bf16_rne(xv));
                    const float xpart = x_split ? (q == 0 ? xv - hi : hi) : xv;
                    prod[k] = double(tc::bf16_value(ts[std::size_t(ks * 16 + k)].part[p])) * double(xpart);
                }
                acc = model_mma(acc, prod, nb);
            }
    return acc;
}

TEST(MmaErrorBound, CoversTheBlockFmaModel) {
    std::mt19937 rng(17);
    std::normal_distribution<float> gauss;
    std::uniform_int_distribution<int> spread(-12, 12);
    double worst = 0.0;
    for (int g : {16, 32}) {
        for (int trial = 0; trial < 300; ++trial) {
            Case c;
            c.t.resize(std::size_t(g * g));
            for (float& v : c.t) v = gauss(rng) * (trial % 3 == 0 ? std::ldexp(1.0f, spread(rng)) : 1.0f);
            const bool x_split = trial % 2 == 1;
            c.x.resize(std::size_t(g));
            for (float& v : c.x) {
                const float raw = gauss(rng) * std::ldexp(1.0f, trial % 5 == 0 ? spread(rng) : 0);
                // F16 values (11 bits) or BF16 values (8 bits)
                v = x_split ? float(bits::round_to_format(double(raw), 10, -14)) : tc::bf16_value(tc::bf16_rne(raw));
            }
            // Cancellation: one row sums to almost nothing.
            if (trial % 4 == 0)
                for (int j = 1; j < g; j += 2)
                    c.t[std::size_t(j)] = -c.t[std::size_t(j - 1)] * c.x[std::size_t(j - 1)] / c.x[std::size_t(j)];
            std::vector<std::uint32_t> w(tc::fragment_words(g));
            const tc::PartNorms n = tc::pack_fragments(c.t.data(), g, w.data());
            float ss = 0.0f;
            for (float v : c.x) ss = std::fma(v, v, ss);
            const float bound = tc::split_product_error_bound(n, std::sqrt(ss), x_split, g);
            for (int nb : {4, 8, 16})
                for (int i = 0; i < g; ++i) {
                    double exact = 0.0;
                    for (int j = 0; j < g; ++j)
                        exact += double(c.t[std::size_t(i * g + j)]) * double(c.x[std::size_t(j)]);
                    const double err = std::fabs(double(model_product(c, g, i, x_split, nb)) - exact);
                    ASSERT_LE(err, double(bound)) << "g " << g << " trial " << trial << " nb " << nb << " i " << i;
                    worst = std::max(worst, err / double(bound));
                }
        }
    }
    // The bound is not vacuous: the model comes within a factor of it.
    EXPECT_GT(worst, 0.02);
    std::printf("largest error / bound under the model: %.3f\n", worst);
}

TEST(MmaErrorBound, InstructionErrorIsTheModelsWorstCase) {
    // Every product just below a power of two, and c of the same size: the model truncates a whole
    // unit from every term in every block; the per-instruction bound still holds.
    double p[16];
    for (double& v : p) v = -(1.0 - 0x1p-16);
    const float c = 0x1.fffffep-1f;
    for (int nb : {4, 8, 16}) {
        const float got = model_mma(c, p, nb);
        double exact = c;
        for (double v : p) exact += v;
        const double m = std::fabs(double(c)) + 16 * (1.0 - 0x1p-16);
        EXPECT_LE(std::fabs(double(got) - exact), double(tc::mma_instruction_error(float(m)))) << nb;
    }
}

}  // namespace

namespace {

// Prepare keeps the CUDA-core quantize for a transform whose part norms leave the model
// (tc::norms_within_model): the absolute allowance for flushed subnormal terms holds only up to
// kMaxPartNorm. An orthogonal block (row norms 1) is inside; the same block scaled past the limit,
// or holding a NaN, is not.
TEST(MmaErrorBound, PartNormsOutsideTheModelAreRefused) {
    constexpr int g = 32;
    std::vector<float> t(g * g, 0.0f);
    for (int i = 0; i < g; ++i) t[i * g + (i * 7) % g] = (i % 3 == 0) ? -1.0f : 1.0f;  // a signed permutation
    std::vector<std::uint32_t> frags(wush::tc::fragment_words(g));
    EXPECT_TRUE(wush::tc::norms_within_model(wush::tc::pack_fragments(t.data(), g, frags.data())));
    std::vector<float> big = t;
    for (float& v : big) v *= 2.0f * wush::tc::kMaxPartNorm;
    EXPECT_FALSE(wush::tc::norms_within_model(wush::tc::pack_fragments(big.data(), g, frags.data())));
    std::vector<float> nan = t;
    nan[5] = NAN;
    EXPECT_FALSE(wush::tc::norms_within_model(wush::tc::pack_fragments(nan.data(), g, frags.data())));
}

}  // namespace
