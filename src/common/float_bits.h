// Bit-level conversions of the narrow float types used at the API (f16, bf16), shared by host and
// device code. Decoding is exact; encoding rounds to nearest, ties to even, from float64.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/host_device.h"

namespace wush::bits {

using std::fabs;
using std::isinf;
using std::isnan;
using std::signbit;

WUSH_HD float float_from_bits(std::uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

WUSH_HD std::uint32_t bits_from_float(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
}

WUSH_HD double double_from_bits(std::uint64_t u) {
    double d;
    std::memcpy(&d, &u, sizeof d);
    return d;
}

WUSH_HD std::uint64_t bits_from_double(double d) {
    std::uint64_t u;
    std::memcpy(&u, &d, sizeof u);
    return u;
}

// 2^e for -126 <= e <= 127, exactly (a multiplication by it is then ldexpf's scaling).
WUSH_HD float pow2f(int e) {
    return float_from_bits(std::uint32_t(e + 127) << 23);
}

// 2^e exactly: built from the exponent bits in the normal range (the group quantizers call this
// per group, where ldexp was a libm call), ldexp outside it.
WUSH_HD double pow2(int e) {
    if (e >= -1022 && e <= 1023) return double_from_bits(std::uint64_t(e + 1023) << 52);
    return ldexp(1.0, e);
}

// Round-half-to-even of t >= 0 to an integer, independent of the FPU rounding mode (a host
// application may have changed it). Exact for t < 2^52 (the integer part is converted exactly).
WUSH_HD double round_half_even(double t) {
    const std::int64_t i = std::int64_t(t);  // floor, for t >= 0
    double r = double(i);
    const double d = t - r;
    if (d > 0.5 || (d == 0.5 && (i & 1) != 0)) r += 1.0;
    return r;
}

// floor(log2(a)) for finite a > 0, taken from the exponent bits (frexp for subnormals), never
// from log2.
WUSH_HD int floor_log2(double a) {
    const int biased = int((bits_from_double(a) >> 52) & 0x7FF);
    if (biased != 0) return biased - 1023;
    int e = 0;
    frexp(a, &e);
    return e - 1;
}

// Rounds a >= 0 (finite) to the nearest value of a binary float format with `mant_bits` stored
// mantissa bits and minimum normal exponent `emin` (subnormals below it), ties to even. The
// exponent range is unbounded above: callers saturate or overflow as their format requires.
WUSH_HD double round_to_format(double a, int mant_bits, int emin) {
    if (a == 0.0) return 0.0;
    int e = floor_log2(a);
    if (e < emin) e = emin;
    const double quantum = pow2(e - mant_bits);
    return round_half_even(a / quantum) * quantum;
}

WUSH_HD float bf16_decode(std::uint16_t b) {
    return float_from_bits(std::uint32_t(b) << 16);
}

// RNE from float64 straight to bf16 (no double rounding through float); overflow gives +-Inf.
// NaN gives the canonical quiet NaN 0x7FC0.
WUSH_HD std::uint16_t bf16_encode(double v) {
    if (isnan(v)) return 0x7FC0;
    const std::uint16_t sign = signbit(v) ? 0x8000 : 0;
    if (isinf(v)) return sign | 0x7F80;  // (round_to_format has no exponent for infinity)
    const double r = round_to_format(fabs(v), 7, -126);
    if (r >= 0x1p128) return sign | 0x7F80;
    return sign | std::uint16_t(bits_from_float(float(r)) >> 16);
}

WUSH_HD float f16_decode(std::uint16_t h) {
    const std::uint32_t sign = std::uint32_t(h & 0x8000) << 16;
    const int exp = (h >> 10) & 0x1F;
    const int man = h & 0x3FF;
    float mag;
    if (exp == 0) {
        mag = ldexpf(float(man), -24);
    } else if (exp == 31) {
        mag = man == 0 ? INFINITY : NAN;
    } else {
        mag = ldexpf(float(1024 + man), exp - 25);
    }
    return float_from_bits(bits_from_float(mag) | sign);
}

}  // namespace wush::bits
