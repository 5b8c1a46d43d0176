// Per-element arithmetic of the CUDA W4A4 GEMM kernels (cuda/gemm/gemm_decode.cu, cuda/gemm/gemm_prefill.cu),
// written once for host and device (WUSH_HD) so that the CPU unit test (tests/unit/
// test_tile_decode.cpp) checks the very functions the kernels run.
//
// "Doubled" values (as in src/cpu/kernels/kernels.h): every 4-bit code decodes to twice its element value,
// an integer: E2M1 x 2 in {0, 1, 2, 3, 4, 6, 8, 12} with sign, INT4 midrise x 2 = 2q + 1 in
// [-15, 15]. Both fit int8, so a group's inner product is an exact int32 (|dot| <= 32 * 15 * 15)
// computed by dp4a or an INT8 MMA, and its value is
//     dot * scale_a * scale_w * alpha / 4      (alpha = product of the per-tensor factors).
//
// Decoding 4 codes (16 bits, element i in nibble i) into 4 int8 lanes (element i in byte i) uses
// two byte permutes (PTX prmt, default mode) over 8-byte tables: a selector nibble's bit 3 makes
// prmt replicate the sign bit of the selected table byte instead of copying it. The tables hold
// magnitudes 0..15 (sign bit clear), so
//     pos = prmt(P, codes)          = |v| for non-negative codes, 0 for negative ones,
//     neg = prmt(N, codes ^ 0x8888) = |v| for negative codes, 0 for non-negative ones,
// and v = ((pos | 0x80808080) - neg) ^ 0x80808080 subtracts bytewise without borrows
// (0x80 + pos - neg stays in [0x71, 0x8F]). Six integer instructions per 4 elements.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/host_device.h"
#include "mma_fragments.h"
#include "wush/wush.h"

namespace wush::tile {

// The doubled value of one code: 2 x decode_element(format, nibble), exactly.
WUSH_HD int doubled_element(wush_format format, unsigned nibble) {
    nibble &= 0xF;
    if (format == WUSH_FORMAT_INT4) {
        const int q = (nibble & 0x8) ? int(nibble) - 16 : int(nibble);
        return 2 * q + 1;
    }
    constexpr int kMag[8] = {0, 1, 2, 3, 4, 6, 8, 12};
    const int m = kMag[nibble & 0x7];
    return (nibble & 0x8) ? -m : m;
}

// The two permute tables of a format (bytes 0..7 of p0:p1 / n0:n1 indexed by bits 0-2 of a code):
// P[i] = doubled value of code i (sign clear), N[i] = -(doubled value of code 8 + i).
struct DoubledLut {
    std::uint32_t p0, p1, n0, n1;
};

WUSH_HD DoubledLut doubled_lut(wush_format format) {
    if (format == WUSH_FORMAT_INT4) {
        // codes 0..7 -> 1, 3, ..., 15; codes 8..15 (q = -8..-1) -> -15, -13, ..., -1
        return DoubledLut{0x07050301u, 0x0F0D0B09u, 0x090B0D0Fu, 0x01030507u};
    }
    // E2M1 doubled: 0, 1, 2, 3 | 4, 6, 8, 12 for both signs
    return DoubledLut{0x03020100u, 0x0C080604u, 0x03020100u, 0x0C080604u};
}

// PTX prmt.b32 (default mode): result byte i = byte s_i & 7 of {b:a} (a is bytes 0-3), or, when
// bit 3 of s_i is set, that byte's sign bit replicated (0x00 or 0xFF). s_i = nibble i of sel.
WUSH_HD std::uint32_t prmt(std::uint32_t a, std::uint32_t b, std::uint32_t sel) {
#if defined(__CUDA_ARCH__)
    std::uint32_t d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
#else
    const std::uint64_t src = (std::uint64_t(b) << 32) | a;
    std::uint32_t d = 0;
    for (int i = 0; i < 4; ++i) {
        const unsigned s = (sel >> (4 * i)) & 0xF;
        std::uint32_t byte = std::uint32_t(src >> (8 * (s & 7))) & 0xFF;
        if (s & 8) byte = (byte & 0x80) ? 0xFF : 0x00;
        d |= byte << (8 * i);
    }
    return d;
#endif
}

// Four codes (nibble i of the low 16 bits of `codes` = element i) -> four int8 doubled values
// (byte i = element i), packed as dp4a / mma.s8 operands.
WUSH_HD std::uint32_t decode4(const DoubledLut& lut, std::uint32_t codes) {
    const std::uint32_t pos = prmt(lut.p0, lut.p1, codes);
    const std::uint32_t neg = prmt(lut.n0, lut.n1, codes ^ 0x8888u);
    return ((pos | 0x80808080u) - neg) ^ 0x80808080u;
}

// Signed byte i of a packed int8x4 (for tests and host emulation).
WUSH_HD int lane_s8(std::uint32_t v, int i) {
    return int(std::int8_t(std::uint8_t(v >> (8 * i))));
}

// dp4a: c + sum_i a_i * b_i over signed bytes.
WUSH_HD int dp4a(std::uint32_t a, std::uint32_t b, int c) {
#if defined(__CUDA_ARCH__)
    return __dp4a(int(a), int(b), c);
#else
    for (int i = 0; i < 4; ++i) c += lane_s8(a, i) * lane_s8(b, i);
    return c;
#endif
}

// ---------------------------------------------------------------------------------------------
// Group scales, decoded with bit operations (exact; equal to formats::decode_scale)
// ---------------------------------------------------------------------------------------------

WUSH_HD float bits_to_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
#endif
}

// E8M0 byte c: 2^(c - 127); c = 0 is the subnormal 2^-127, c = 255 NaN.
WUSH_HD float e8m0_value(unsigned c) {
    c &= 0xFF;
    const std::uint32_t u = c == 0 ? 0x00400000u : c == 0xFF ? 0x7FC00000u : (c << 23);
    return bits_to_float(u);
}

// E4M3 byte c: the magnitude bits moved into a float's exponent/mantissa, then x 2^120 (exact,
// subnormals included); 0x7F / 0xFF are NaN.
WUSH_HD float e4m3_value(unsigned c) {
    c &= 0xFF;
    if ((c & 0x7F) == 0x7F) return bits_to_float(0x7FC00000u);
    const float mag = bits_to_float((c & 0x7Fu) << 20) * 0x1p120f;
    return (c & 0x80) ? -mag : mag;
}

WUSH_HD float bf16_value(unsigned lo, unsigned hi) {
    return bits_to_float(((hi & 0xFF) << 24) | ((lo & 0xFF) << 16));
}

// The value of the group scale at `p` (format_scale_bytes bytes).
WUSH_HD float scale_value(wush_format format, const std::uint8_t* p) {
    switch (format) {
        case WUSH_FORMAT_NVFP4: return e4m3_value(p[0]);
        case WUSH_FORMAT_INT4: return bf16_value(p[0], p[1]);
        default: return e8m0_value(p[0]);
    }
}

WUSH_HD int scale_bytes(wush_format format) {
    return format == WUSH_FORMAT_INT4 ? 2 : 1;
}

// ---------------------------------------------------------------------------------------------
// Group promotion
// ---------------------------------------------------------------------------------------------

// An int32 accumulator started at kPromoteMagicBits (the bits of 1.5 * 2^23) holds, read as a
// float, 1.5 * 2^23 + dot exactly while |dot| < 2^22: one FADD turns it into float(dot) without
// the slow I2F conversion. The MMA kernels start each group's accumulators there.
constexpr std::int32_t kPromoteMagicBits = 0x4B400000;
constexpr float kPromoteMagic = 12582912.0f;

WUSH_HD float promoted_dot(std::int32_t acc_from_magic) {
    return bits_to_float(std::uint32_t(acc_from_magic)) - kPromoteMagic;
}

// dot * s exactly, from an accumulator started at kPromoteMagicBits, with c = kPromoteMagic * s:
// fma(1.5 * 2^23 + dot, s, -c) = dot * s before its one rounding, and dot * s (|dot| < 2^13, s with
// at most 8 significant bits: E8M0, E4M3, BF16) is a float32, as is c (2 + 8 bits) while
// |s| < kScaledDotMaxScale (no overflow of c); subnormal s included. One FFMA instead of FADD + FMUL.
constexpr float kScaledDotMaxScale = 0x1p100f;

WUSH_HD float scaled_dot(std::int32_t acc_from_magic, float s, float c) {
#if defined(__CUDA_ARCH__)
    return fmaf(bits_to_float(std::uint32_t(acc_from_magic)), s, -c);
#else
    return std::fma(bits_to_float(std::uint32_t(acc_from_magic)), s, -c);
#endif
}

// acc + dot * scale_a * scale_w, with scale_a already multiplied by alpha / 4 (the kernels fold the
// per-tensor factors and the doubling into the activation scale once).
WUSH_HD float promote(float acc, int dot, float scale_a_alpha, float scale_w) {
    return acc + float(dot) * (scale_a_alpha * scale_w);
}

// ---------------------------------------------------------------------------------------------
// Fragment maps of mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 and m16n8k16 (PTX ISA,
// "Matrix Fragments for mma.m16n8k32 / m16n8k16" with .s8), lane = 4 * gid + tid
// ---------------------------------------------------------------------------------------------
// A (16 x K, row-major): register r in {0..K/8-1}, byte j: row = gid + 8 * (r & 1),
//                        col = 4 * tid + j + 16 * (r >> 1).
// B (K x 8, column):     register r in {0..K/16-1}, byte j: row (k) = 4 * tid + j + 16 * r, col = gid.
// C/D (16 x 8, s32):     element i in 0..3: row = gid + 8 * (i >> 1), col = 2 * tid + (i & 1).
// A's row, B's column and C's row and column are the same for every m16n8 shape: mma::a_row,
// mma::b_col, mma::c_row, mma::c_col (mma_fragments.h, shared with the tensor-core quantize). A's
// column and B's row are int8's (four elements per register):
WUSH_HD int mma_a_col(int lane, int reg, int byte) {
    return 4 * (lane & 3) + byte + 16 * (reg >> 1);
}
WUSH_HD int mma_b_row(int lane, int reg, int byte) {
    return 4 * (lane & 3) + byte + 16 * reg;
}

// Which element of a group the kernels put in MMA slot k (the same map for both operands, so the
// group's dot product is unchanged): with G = 32 the thread with tid reads the 32-bit word tid of
// the group's 16 packed bytes (elements 8 tid .. 8 tid + 7) and feeds its low half to slot
// 4 tid + 0..3 and its high half to slot 16 + 4 tid + 0..3; with G = 16 it reads the 16-bit
// half-word tid (elements 4 tid .. 4 tid + 3) for slot 4 tid + 0..3.
WUSH_HD int group_element_of_slot(int group, int k) {
    if (group == 16) return k;
    const int tid = (k & 15) >> 2;
    return 8 * tid + 4 * (k >> 4) + (k & 3);
}

// A 32- or 16-bit little-endian load from shared (device) or any (host) memory.
WUSH_HD std::uint32_t load_u32(const std::uint8_t* p) {
#if defined(__CUDA_ARCH__)
    return *reinterpret_cast<const std::uint32_t*>(p);
#else
    std::uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
#endif
}
WUSH_HD std::uint32_t load_u16(const std::uint8_t* p) {
#if defined(__CUDA_ARCH__)
    return *reinterpret_cast<const unsigned short*>(p);
#else
    return std::uint32_t(p[0]) | (std::uint32_t(p[1]) << 8);
#endif
}

// The fragments the prefill kernel feeds to the MMA, from packed code rows. `row`, `row8` point at
// the group's first code byte of A's rows gid and gid + 8, `col` at W's row gid; t = lane & 3.
// G = 32 (m16n8k32): word t of the group; low half -> slot 4t.., high half -> slot 16 + 4t...
WUSH_HD void a_frag_k32(const DoubledLut& lut, const std::uint8_t* row, const std::uint8_t* row8, int t,
                        std::uint32_t (&a)[4]) {
    const std::uint32_t lo = load_u32(row + 4 * t), hi = load_u32(row8 + 4 * t);
    a[0] = decode4(lut, lo);
    a[1] = decode4(lut, hi);
    a[2] = decode4(lut, lo >> 16);
    a[3] = decode4(lut, hi >> 16);
}
WUSH_HD void b_frag_k32(const DoubledLut& lut, const std::uint8_t* col, int t, std::uint32_t (&b)[2]) {
    const std::uint32_t w = load_u32(col + 4 * t);
    b[0] = decode4(lut, w);
    b[1] = decode4(lut, w >> 16);
}
// G = 16 (m16n8k16): half-word t of the group -> slot 4t...
WUSH_HD void a_frag_k16(const DoubledLut& lut, const std::uint8_t* row, const std::uint8_t* row8, int t,
                        std::uint32_t (&a)[2]) {
    a[0] = decode4(lut, load_u16(row + 2 * t));
    a[1] = decode4(lut, load_u16(row8 + 2 * t));
}
WUSH_HD std::uint32_t b_frag_k16(const DoubledLut& lut, const std::uint8_t* col, int t) {
    return decode4(lut, load_u16(col + 2 * t));
}

}  // namespace wush::tile
