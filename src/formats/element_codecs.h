// The element and scale encodings of the block formats (docs/ARCHITECTURE.md, "Block formats"):
// E2M1, E4M3 (saturating), E8M0. Shared by the CPU core and the CUDA kernels. Encoders take float64 so that the scaled
// value is rounded once, exactly as the float64 reference defines it.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/float_bits.h"
#include "common/host_device.h"

namespace wush::codec {

using std::fabs;
using std::isnan;
using std::signbit;

// RNE to E2M1 {0, .5, 1, 1.5, 2, 3, 4, 6}, saturating at 6; the sign (also of -0.0) goes to bit 3.
// The thresholds are the midpoints between neighbours; at a midpoint the even code wins.
WUSH_HD std::uint8_t e2m1_encode(double v) {
    const std::uint8_t sign = signbit(v) ? 0x8 : 0x0;
    const double a = fabs(v);
    // The midpoints between neighbouring magnitudes, ties to the even code; counted without
    // branches (the loops over a group vectorize). A NaN fails every test: code 7, as a chain of
    // ifs ending in "else 7" gives.
    const int below = (a <= 0.25) + (a < 0.75) + (a <= 1.25) + (a < 1.75) + (a <= 2.5) + (a < 3.5) + (a <= 5.0);
    return std::uint8_t(sign | (7 - below));
}

WUSH_HD float e2m1_decode(std::uint8_t code) {
    const int m = code & 0x7;
    const int e = m >> 1;
    // (1 + 0.5 (m & 1)) 2^(e - 1) built from its bits (no ldexpf: this runs per element on the GPU).
    const float normal = bits::float_from_bits((std::uint32_t(e + 126) << 23) | (std::uint32_t(m & 1) << 22));
    const float mag = e == 0 ? 0.5f * float(m & 1) : normal;
    return (code & 0x8) ? -mag : mag;
}

constexpr double kE4M3Max = 448.0;

// RNE to E4M3 (bias 7, no infinities), saturating at +-448 like __NV_SATFINITE. NaN -> 0x7F.
WUSH_HD std::uint8_t e4m3_encode(double v) {
    if (isnan(v)) return 0x7F;
    const std::uint8_t sign = signbit(v) ? 0x80 : 0x00;
    double r = bits::round_to_format(fabs(v), 3, -6);
    if (r > kE4M3Max) r = kE4M3Max;
    if (r < 0x1p-6) return sign | std::uint8_t(r * 512.0);  // subnormal: r = m * 2^-9
    const int e = bits::floor_log2(r);
    const int m = int((r / bits::pow2(e) - 1.0) * 8.0);
    return sign | std::uint8_t(((e + 7) << 3) | m);
}

WUSH_HD float e4m3_decode(std::uint8_t code) {
    if ((code & 0x7F) == 0x7F) return NAN;
    const int exp = (code >> 3) & 0xF;
    const int man = code & 0x7;
    // m 2^-9 or (8 + m) 2^(exp - 10): exact products by powers of two built from their bits.
    const float mag = exp == 0 ? float(man) * 0x1p-9f : float(8 + man) * bits::pow2f(exp - 10);
    return (code & 0x80) ? -mag : mag;
}

// E8M0: the byte e + 127 stands for 2^e; 0xFF is NaN.
constexpr int kE8M0MinExp = -127;
constexpr int kE8M0MaxExp = 127;

WUSH_HD std::uint8_t e8m0_from_exponent(int e) {
    return std::uint8_t(e + 127);
}
WUSH_HD int e8m0_exponent(std::uint8_t code) {
    return int(code) - 127;
}

WUSH_HD float e8m0_decode(std::uint8_t code) {
    // 2^(code - 127) from its bits: a normal float from code 1 up, 2^-127 (subnormal) at 0.
    if (code == 0xFF) return NAN;
    return code == 0 ? 0x1p-127f : bits::pow2f(int(code) - 127);
}

}  // namespace wush::codec
