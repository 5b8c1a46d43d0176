// The error bound of the tensor-core quantize's product (cuda/quantize/quantize_tc_kernel.cuh): y = T x by
// BF16 `mma.sync.m16n8k16` with FP32 accumulation, T = T_hi + T_mid + T_lo exactly
// (bf16_fragments.h), x BF16 as given (F16: x = x_hi + x_lo exactly in BF16), the passes
// accumulated into one FP32 accumulator smallest first (x_lo before x_hi; within each, T_lo, T_mid,
// T_hi; within a pass, the k-steps of 16 inputs in order).
//
// The accumulator model (what we assume of Ampere / Hopper BF16 MMA with FP32 accumulation; NVIDIA
// does not document it). Measured behaviour in the literature (Fasi, Higham, Mikaitis, Pranesh,
// "Numerical behavior of NVIDIA tensor cores", PeerJ CS 2021, on V100 / T4 / A100; Khattak and
// Mikaitis, "Accurate models of NVIDIA tensor cores", 2025, on V100 / A100 / H100 / B200): products
// of the 16-bit inputs are exact; a dot product of several products plus the accumulator is
// computed as a fused block: every term is aligned to the largest exponent among them and the
// bits below the kept width are dropped (truncation), the aligned terms are added exactly, and the
// sum is normalized to FP32 with truncation (round toward zero); blocks hold 4 (V100), 8 (A100)
// or 16 (H100) products. It is not IEEE FP32 summation: the result can differ from any ordering of
// IEEE additions. We assume, conservatively:
//   (M1) the 16 products of one m16n8k16 output are exact;
//   (M2) they are added to the accumulator c in fused blocks of at least kMmaMinBlock products;
//   (M3) in each block every term (its products and the running value) loses less than one unit
//        of the 24th significant bit of the block's largest term, 2^-23 max|term|;
//   (M4) each block's sum is normalized to FP32 with an error below 2^-23 of its magnitude (RZ or
//        RN both qualify).
// With M >= |c| + sum |p_k| (every term and every running value is at most M, plus the tiny
// errors made so far), one instruction is then off by less than
//     (K + 2 K / kMmaMinBlock) 2^-23 M = 24 x 2^-23 M          (K = 16: K products and K/B
// running values truncated, K/B normalizations): mma_instruction_error(M). The GPU probe
// (tests/gpu/test_quantize_tc.cpp, TcAccumulatorProbe) measures the real error against exactly
// this, and the selection keeps the CUDA-core quantize unless a probe passed
// (docs/record/cuda-gemm-notes.md).
//
// The product's bound, per output i. For a pass (T part P, x part Q), sum_k |P_ik x_Qk| <=
// ||P_i|| ||x_Q|| (Cauchy-Schwarz) <= N_P X_Q, with N_P the part's max row norm (PartNorms) and
// X_Q the norm of the x part. An instruction of pass p sees M <= (N X)_1 + ... + (N X)_p (all
// passes so far, the current one whole), times 1.01 for the errors already made. Summing the
// instruction errors:
//     |y_i - (T x)_i| <= 24 x 2^-23 x 1.01 x KS x sum_p prefix_p + N_res X + slack
// (KS = G / 16 instructions per pass; N_res: the split's residual, bf16_fragments.h).
// For BF16 x and G = 32 that is about 2 x 24 x 2^-23 ||T|| ||x|| (the hi pass dominates), about
// 2.7 times the CUDA-core chain's (G + 2) 2^-24 ||T|| ||x||. Per element, not per group: the kernel
// recomputes in float64 only the elements within the bound of a boundary.
#pragma once

#include <cmath>

#include "bf16_fragments.h"
#include "common/host_device.h"
#include "formats/certified_constants.h"

namespace wush::tc {

constexpr int kMmaK = 16;            // products per output of one m16n8k16 instruction
constexpr int kMmaMinBlock = 4;      // (M2): the smallest fused block assumed
constexpr float kMmaUlp = 0x1p-23f;  // (M3), (M4): one unit of the 24th bit, relative
// Units of kMmaUlp x M one instruction may be off (K products + K/B running values + K/B sums).
constexpr int kMmaErrorUnits = kMmaK + 2 * (kMmaK / kMmaMinBlock);

// The model's error of one instruction whose terms and running values are at most m.
WUSH_HD float mma_instruction_error(float m) {
    return float(kMmaErrorUnits) * kMmaUlp * m;
}

// Below FP32's normal range the relative model says nothing: an instruction may flush a subnormal
// BF16 input, a product or a running value under 2^-126 to zero. The bound's absolute allowance
// (formats::certified::kAbsSlack) covers that while every part norm of T is at most kMaxPartNorm:
// a flushed x element (|x| < 2^-126) meets matrix elements of at most kMaxPartNorm, so one
// instruction loses at most kMmaK x 2^-126 x kMaxPartNorm, and an output sums at most
// kMaxInstructionsPerOutput instructions (2 k-steps x 3 T parts x 2 x parts). The accumulator
// probe checks real MMA results against the per-instruction allowance; prepare keeps the CUDA-core
// quantize for a transform outside it (norms_within_model).
constexpr float kMaxPartNorm = 0x1p8f;
constexpr int kMaxInstructionsPerOutput = 2 * kParts * 2;
constexpr float kMmaAbsPerInstruction = float(kMmaK) * 0x1p-126f * kMaxPartNorm;
static_assert(kMaxInstructionsPerOutput * kMmaAbsPerInstruction <= formats::certified::kAbsSlack,
              "the absolute allowance must cover every flushed term of an output");

// Whether a block's part norms are inside the model (kMaxPartNorm); NaN is not.
WUSH_HD bool norms_within_model(const PartNorms& n) {
    for (int p = 0; p < kParts; ++p)
        if (!(n.part[p] <= kMaxPartNorm)) return false;
    return n.residual <= kMaxPartNorm;
}

// The bound of one output of the split product, given the matrix's part norms, the norm of x
// (float32, from a sum of squares: its error is in the 1.01), whether x was split in two (F16),
// and G. +Inf when x_norm is not finite.
WUSH_HD float split_product_error_bound(const PartNorms& n, float x_norm, bool split_x, int g, float scale = 1.0f) {
    if (!(x_norm < INFINITY)) return INFINITY;
    // x parts, smallest first: F16's x_lo <= 2^-8 |x| per element (RNE to BF16), x_hi <= (1 + 2^-8) |x|.
    const float xq[2] = {split_x ? x_norm * 0x1p-8f : 0.0f, split_x ? x_norm * (1.0f + 0x1p-8f) : x_norm};
    float prefix = 0.0f, total = 0.0f;
    WUSH_UNROLL
    for (int q = 0; q < 2; ++q) {
        WUSH_UNROLL
        for (int p = 0; p < kParts; ++p) {  // kPartLo, kPartMid, kPartHi
            prefix = fmaf(n.part[p], xq[q], prefix);
            total += prefix;
        }
    }
    const float per_unit = float(kMmaErrorUnits) * kMmaUlp * 1.01f * float(k_steps(g));
    return scale * fmaf(total, per_unit, fmaf(n.residual, x_norm * 1.01f, formats::certified::kAbsSlack));
}

}  // namespace wush::tc
