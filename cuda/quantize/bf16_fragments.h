// The tensor-core quantize's operands (cuda/quantize/quantize_tc_kernel.cuh): each G x G block matrix T
// split exactly into three BF16 parts, T = T_hi + T_mid + T_lo, stored in the register order of
// the B operand of PTX `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32`, so that a lane loads
// its fragments with 16-byte loads and feeds them to the MMA as they are.
//
// The product the kernel computes is Y (tokens x G) = X (tokens x G) T^T: the MMA's A is a 16 x 16
// tile of X (rows = tokens, columns = inputs j), its B the 16 x 8 tile B[k][n] = T[n][k] (k = input
// j, n = output i), its C / D the 16 x 8 tile of Y.
//
// PTX fragment map (PTX ISA, "Matrix fragments for mma.m16n8k16 with floating point type"; gid =
// lane / 4, tig = lane % 4; register r of a .b32 operand holds two BF16, element h = 0 in its low
// half):
//   A (4 registers): row = gid + 8 (r & 1),      column = 2 tig + h + 8 (r >> 1)
//   B (2 registers): row = 2 tig + h + 8 r,       column = gid
//   C, D (4 floats): row = gid + 8 (i >> 1),      column = 2 tig + (i & 1)
//
// The split. hi = RNE_bf16(t), mid = RNE_bf16(t - hi), lo = RNE_bf16(t - hi - mid): t has 24
// significant bits, hi takes the top 8 and leaves |t - hi| <= 2^-8 |t| on the grid of t's last bit
// (at most 16 bits), mid takes 8 of those and leaves at most 8 bits, which lo holds exactly. Every
// subtraction is exact in float32 (Sterbenz). The one inexact case is underflow: a part below
// BF16's smallest normal (2^-126, |t| < about 2^-110) is dropped (tensor cores may flush BF16
// subnormals) and the dropped amount is kept as the residual, whose row norm the error bound adds
// (cuda/quantize/mma_error_bound.h). Non-finite parts make the residual infinite: never certified.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "common/float_bits.h"
#include "common/host_device.h"
#include "mma_fragments.h"

namespace wush::tc {

// Parts, in the order the kernel accumulates them (smallest first).
constexpr int kPartLo = 0, kPartMid = 1, kPartHi = 2, kParts = 3;

// The PTX map above (one function per operand coordinate). A's row, B's column and C's are the
// same for every m16n8 shape (mma_fragments.h, shared with the GEMM kernels); A's column and B's
// row are BF16's (two elements per register).
using mma::a_row;
using mma::b_col;
using mma::c_col;
using mma::c_row;
WUSH_HD int a_col(int lane, int reg, int half) {
    return 2 * (lane & 3) + half + 8 * (reg >> 1);
}
WUSH_HD int b_row(int lane, int reg, int half) {
    return 2 * (lane & 3) + half + 8 * reg;
}

// Per group size: k-steps of 16 inputs and n-tiles of 8 outputs.
WUSH_HD constexpr int k_steps(int g) {
    return g / 16;
}
WUSH_HD constexpr int n_tiles(int g) {
    return g / 8;
}

// 32-bit words of one matrix's fragments (3 parts x G x G BF16 / 2).
WUSH_HD constexpr std::size_t fragment_words(int g) {
    return std::size_t(kParts) * std::size_t(g) * std::size_t(g) / 2;
}

// Where lane `lane`'s register `reg` of n-tile `nt`, k-step `ks`, part `part` lives in a matrix's
// fragment words: a lane's registers of one (part, k-step) are contiguous (G = 32: 8 words, two
// 16-byte loads; G = 16: 4 words, one).
WUSH_HD std::size_t fragment_index(int g, int part, int ks, int lane, int nt, int reg) {
    return ((std::size_t(part * k_steps(g) + ks) * 32 + std::size_t(lane)) * std::size_t(n_tiles(g)) +
            std::size_t(nt)) *
               2 +
           std::size_t(reg);
}

// RNE of a finite float to BF16 (overflow gives +-Inf), and back.
WUSH_HD std::uint16_t bf16_rne(float v) {
    const std::uint32_t u = bits::bits_from_float(v);
    return std::uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
WUSH_HD float bf16_value(std::uint16_t b) {
    return bits::float_from_bits(std::uint32_t(b) << 16);
}

// A BF16 part kept only when it is a normal number (or zero); a subnormal one goes to the residual.
WUSH_HD std::uint16_t bf16_normal_part(float v) {
    const std::uint16_t b = bf16_rne(v);
    return (b & 0x7F80u) == 0 ? std::uint16_t(b & 0x8000u) : b;
}

struct Split3 {
    std::uint16_t part[kParts];  // kPartLo, kPartMid, kPartHi
    double residual;             // t - (hi + mid + lo), exact in double (0 unless underflow)
};

WUSH_HD Split3 split3(float t) {
    Split3 s{};
    const std::uint16_t hi = bf16_normal_part(t);
    const float r1 = t - bf16_value(hi);
    const std::uint16_t mid = bf16_normal_part(r1);
    const float r2 = r1 - bf16_value(mid);
    const std::uint16_t lo = bf16_normal_part(r2);
    s.part[kPartHi] = hi;
    s.part[kPartMid] = mid;
    s.part[kPartLo] = lo;
    s.residual = double(t) - (double(bf16_value(hi)) + double(bf16_value(mid)) + double(bf16_value(lo)));
    return s;
}

// Per matrix: an upper bound of max_i ||row i|| of each part and of the residual (float64 sums,
// rounded up well beyond their error). Read by the error bound.
struct PartNorms {
    float part[kParts];
    float residual;
};

// Lays out the G x G row-major matrix t (y = t x) as fragment_words(g) words in `out`, and returns
// its part norms (G <= 32). Host only: the CUDA backend runs it at prepare time.
inline PartNorms pack_fragments(const float* t, int g, std::uint32_t* out) {
    double ss[kParts + 1][32] = {};
    for (int i = 0; i < g; ++i)
        for (int j = 0; j < g; ++j) {
            const Split3 s = split3(t[i * g + j]);
            for (int p = 0; p < kParts; ++p) {
                const double v = bf16_value(s.part[p]);
                ss[p][i] += v * v;
            }
            ss[kParts][i] += s.residual * s.residual;
        }
    for (int part = 0; part < kParts; ++part)
        for (int ks = 0; ks < k_steps(g); ++ks)
            for (int lane = 0; lane < 32; ++lane)
                for (int nt = 0; nt < n_tiles(g); ++nt)
                    for (int reg = 0; reg < 2; ++reg) {
                        std::uint32_t w = 0;
                        for (int h = 0; h < 2; ++h) {
                            const int k = ks * 16 + b_row(lane, reg, h), n = nt * 8 + b_col(lane);
                            w |= std::uint32_t(split3(t[n * g + k]).part[part]) << (16 * h);
                        }
                        out[fragment_index(g, part, ks, lane, nt, reg)] = w;
                    }
    PartNorms n{};
    for (int p = 0; p <= kParts; ++p) {
        double best = 0.0;
        for (int i = 0; i < g; ++i) best = ss[p][i] > best || std::isnan(ss[p][i]) ? ss[p][i] : best;  // NaN: +Inf
        const float v = float(std::sqrt(best) * (1.0 + 0x1p-20));
        (p < kParts ? n.part[p] : n.residual) = std::isfinite(v) ? v : INFINITY;
    }
    return n;
}

// The inverse of pack_fragments' layout: part `part` of T as a row-major G x G float matrix.
inline void unpack_part(const std::uint32_t* words, int g, int part, float* t) {
    for (int ks = 0; ks < k_steps(g); ++ks)
        for (int lane = 0; lane < 32; ++lane)
            for (int nt = 0; nt < n_tiles(g); ++nt)
                for (int reg = 0; reg < 2; ++reg) {
                    const std::uint32_t w = words[fragment_index(g, part, ks, lane, nt, reg)];
                    for (int h = 0; h < 2; ++h) {
                        const int k = ks * 16 + b_row(lane, reg, h), n = nt * 8 + b_col(lane);
                        t[n * g + k] = bf16_value(std::uint16_t(w >> (16 * h)));
                    }
                }
}

}  // namespace wush::tc
