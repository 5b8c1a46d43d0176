// Quantization of one group of G values under each format's scale rule (docs/BLOCK_FORMATS.md, documented
// for users at wush_format in include/wush/wush.h). Shared by the CPU core and the CUDA kernels.
// Inputs must be finite: callers check before quantizing.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/float_bits.h"
#include "common/host_device.h"
#include "formats/certified_constants.h"
#include "formats/element_codecs.h"
#include "wush/wush.h"

namespace wush::formats {

using certified::kInt4ClipRatio;
using certified::kInt4ScalePerRms;

// max |x_i| of a group, in float64 (exact for float and double inputs).
template <class T>
WUSH_HD double group_amax(const T* x, int n) {
    double m = 0.0;
    WUSH_UNROLL
    for (int i = 0; i < n; ++i) {
        const double a = fabs(double(x[i]));
        m = a > m ? a : m;  // fmax's result for every input (m is never NaN), and inlined: no libm call
    }
    return m;
}

// a * b rounded once, never fused into a following addition (nvcc contracts a * b + c into an
// FMA by default; the host compilers do not in ISO C++ mode): the float64 definition must give
// the same bits on the device as on the CPU.
WUSH_HD double mul_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
    return __dmul_rn(a, b);
#else
    return a * b;
#endif
}

// Writes the packed nibble of element i (low nibble for even i).
WUSH_HD void put_nibble(std::uint8_t* codes, int i, std::uint8_t nibble) {
    std::uint8_t& byte = codes[i >> 1];
    byte = (i & 1) ? std::uint8_t((byte & 0x0F) | (nibble << 4)) : std::uint8_t((byte & 0xF0) | nibble);
}

WUSH_HD std::uint8_t get_nibble(const std::uint8_t* codes, int i) {
    return (i & 1) ? std::uint8_t(codes[i >> 1] >> 4) : std::uint8_t(codes[i >> 1] & 0x0F);
}

// MXFP4: the scale exponent is floor(log2(amax)) (minus 2 for the OCP rule), clamped to E8M0.
WUSH_HD int mx_scale_exponent(double amax, bool ocp) {
    int e = amax > 0.0 ? bits::floor_log2(amax) : codec::kE8M0MinExp;
    if (ocp) e -= 2;
    if (e < codec::kE8M0MinExp) e = codec::kE8M0MinExp;
    if (e > codec::kE8M0MaxExp) e = codec::kE8M0MaxExp;
    return e;
}

// Element encoders under a fixed group scale (used by the group quantizers below, and by GPTQ,
// which fixes a group's scale before its error feedback moves the values).
// What an MX value is multiplied by to give its E2M1 element under the scale exponent e: an exact
// power-of-two multiple of 3 (1 for the OCP rule).
WUSH_HD double mx_to_element(int e, bool ocp) {
    return (ocp ? 1.0 : 3.0) * bits::pow2(-e);
}

WUSH_HD std::uint8_t encode_mx(double x, int e, bool ocp) {
    return codec::e2m1_encode(x * mx_to_element(e, ocp));
}

WUSH_HD std::uint8_t encode_nvfp4(double x, double scale) {
    // A zero scale (underflow) multiplies by zero: the code keeps only the input's sign.
    return codec::e2m1_encode(scale > 0.0 ? x * 10.0 / scale : x * 0.0);
}

WUSH_HD std::uint8_t encode_int4(double x, double scale) {
    double q = scale > 0.0 ? floor(x / scale) : 0.0;
    q = fmin(fmax(q, -8.0), 7.0);
    return std::uint8_t(int(q) & 0xF);
}

// An E2M1 group's scale byte, and its element rule: element x is coded as
// e2m1_encode(x * mul / div) (as x * mul where div is 1: MXFP4's factor is an exact power-of-two
// multiple of 3, so no division is needed). The SIMD quantize_rows kernel takes these too.
struct E2m1GroupScale {
    std::uint8_t scale;
    double mul;
    double div;
};

WUSH_HD E2m1GroupScale mx_group_scale(double amax, bool ocp) {
    const int e = mx_scale_exponent(amax, ocp);
    return {codec::e8m0_from_exponent(e), mx_to_element(e, ocp), 1.0};
}

// encode_nvfp4's rule: x * 10 / scale, or x * 0 (the sign alone) under a zero scale.
WUSH_HD E2m1GroupScale nvfp4_group_scale(double amax) {
    const std::uint8_t s = codec::e4m3_encode(amax * 10.0 / 6.0);
    const double sv = codec::e4m3_decode(s);
    return sv > 0.0 ? E2m1GroupScale{s, 10.0, sv} : E2m1GroupScale{s, 0.0, 1.0};
}

// The group quantizers below ARE the float64 definition of the formats (include/wush/wush.h,
// wush_format): every input is widened to double (exactly, for float and double) and every rule
// is evaluated in float64. The float instantiation serves float data (block_format.cpp, GPTQ); the
// double one is the reference of the fused runtime (exact_quantizer.cpp, the CUDA fallback).
template <class T>
WUSH_HD void quantize_group_mx(const T* x, int n, bool ocp, std::uint8_t* codes, std::uint8_t* scale) {
    const E2m1GroupScale s = mx_group_scale(group_amax(x, n), ocp);
    WUSH_UNROLL
    for (int i = 0; i < n; i += 2)
        codes[i / 2] = std::uint8_t(codec::e2m1_encode(double(x[i]) * s.mul) |
                                    (codec::e2m1_encode(double(x[i + 1]) * s.mul) << 4));
    *scale = s.scale;
}

template <class T>
WUSH_HD void quantize_group_nvfp4(const T* x, int n, std::uint8_t* codes, std::uint8_t* scale) {
    const E2m1GroupScale s = nvfp4_group_scale(group_amax(x, n));
    WUSH_UNROLL
    for (int i = 0; i < n; i += 2)
        codes[i / 2] = std::uint8_t(codec::e2m1_encode(double(x[i]) * s.mul / s.div) |
                                    (codec::e2m1_encode(double(x[i + 1]) * s.mul / s.div) << 4));
    *scale = s.scale;
}

template <class T>
WUSH_HD void quantize_group_int4(const T* x, int n, std::uint8_t* codes, std::uint8_t* scale) {
    double sum_sq = 0.0;
    WUSH_UNROLL
    for (int i = 0; i < n; ++i) sum_sq += mul_rn(double(x[i]), double(x[i]));
    const std::uint16_t s = bits::bf16_encode(kInt4ScalePerRms * sqrt(sum_sq / n));
    const double sv = bits::bf16_decode(s);
    WUSH_UNROLL
    for (int i = 0; i < n; i += 2)
        codes[i / 2] = std::uint8_t(encode_int4(double(x[i]), sv) | (encode_int4(double(x[i + 1]), sv) << 4));
    scale[0] = std::uint8_t(s & 0xFF);  // little-endian bf16
    scale[1] = std::uint8_t(s >> 8);
}

// Quantizes n = G values (n even) into n/2 code bytes and one scale (1 or 2 bytes) in `format`.
template <class T>
WUSH_HD void quantize_group(wush_format format, const T* x, int n, std::uint8_t* codes, std::uint8_t* scale) {
    switch (format) {
        case WUSH_FORMAT_MXFP4: quantize_group_mx(x, n, false, codes, scale); break;
        case WUSH_FORMAT_MXFP4_OCP: quantize_group_mx(x, n, true, codes, scale); break;
        case WUSH_FORMAT_NVFP4: quantize_group_nvfp4(x, n, codes, scale); break;
        case WUSH_FORMAT_INT4: quantize_group_int4(x, n, codes, scale); break;
        default: break;  // out-of-range values are handled after the switch
    }
}

// The value a stored group scale stands for (without the per-tensor factor); NaN for NaN codes.
WUSH_HD float decode_scale(wush_format format, const std::uint8_t* scale) {
    switch (format) {
        case WUSH_FORMAT_MXFP4:
        case WUSH_FORMAT_MXFP4_OCP: return codec::e8m0_decode(scale[0]);
        case WUSH_FORMAT_NVFP4: return codec::e4m3_decode(scale[0]);
        case WUSH_FORMAT_INT4: return bits::bf16_decode(std::uint16_t(scale[0] | (scale[1] << 8)));
        default: break;  // out-of-range values are handled after the switch
    }
    return NAN;
}

// The value of one 4-bit code in element units: E2M1, or the INT4 midrise level q + 0.5.
WUSH_HD float decode_element(wush_format format, std::uint8_t nibble) {
    if (format == WUSH_FORMAT_INT4) {
        const int q = (nibble & 0x8) ? int(nibble) - 16 : int(nibble);
        return float(q) + 0.5f;
    }
    return codec::e2m1_decode(nibble);
}

// Encodes one value under the already chosen group scale `scale` (as quantize_group stored it).
// The scale must be finite (as every scale quantize_group writes is).
WUSH_HD std::uint8_t encode_element(wush_format format, double x, const std::uint8_t* scale) {
    switch (format) {
        case WUSH_FORMAT_MXFP4: return encode_mx(x, codec::e8m0_exponent(scale[0]), false);
        case WUSH_FORMAT_MXFP4_OCP: return encode_mx(x, codec::e8m0_exponent(scale[0]), true);
        case WUSH_FORMAT_NVFP4: return encode_nvfp4(x, codec::e4m3_decode(scale[0]));
        case WUSH_FORMAT_INT4: return encode_int4(x, bits::bf16_decode(std::uint16_t(scale[0] | (scale[1] << 8))));
        default: break;  // out-of-range values are handled after the switch
    }
    return 0;
}

}  // namespace wush::formats
