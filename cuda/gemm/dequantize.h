// Dequantization of one packed element for the reference GEMM (cuda/gemm/reference_gemm.cu). Plain
// WUSH_HD code without CUDA headers, so that the unit tests check it on the CPU.
//
// Exactness. An E2M1 value has at most 2 significant bits and an E8M0 / E4M3 scale at most 4, so
// their product has at most 6 and is exact in bf16 (8 significant bits, float32's exponent range,
// subnormals included) unless it overflows: that happens only for E8M0 scales 2^126 and 2^127
// times codes of magnitude >= 2 (where float32 overflows as well). INT4 levels q + 0.5 (up to 4
// significant bits) times a bf16 scale (8 bits) need up to 12 bits: not exact in bf16, exact in
// float32, so INT4 is dequantized to float32.
#pragma once

#include <cstdint>

#include "common/float_bits.h"
#include "common/host_device.h"
#include "formats/group_quantizer.h"
#include "wush/wush.h"

namespace wush::cuda {

// code x group scale (without the per-tensor factor), in float32 (exact for every format); the
// scale already decoded (formats::decode_scale), so that a loop over a group decodes it once.
WUSH_HD float dequantize_element(wush_format format, std::uint8_t nibble, float scale) {
    return formats::decode_element(format, nibble) * scale;
}

// The same from the stored scale bytes.
WUSH_HD float dequantize_element(wush_format format, std::uint8_t nibble, const std::uint8_t* scale) {
    return dequantize_element(format, nibble, formats::decode_scale(format, scale));
}

// The bf16 bits of a float32 that bf16 represents exactly (truncation is then exact; NaN/Inf
// keep their class).
WUSH_HD std::uint16_t bf16_bits_of_exact(float v) {
    return std::uint16_t(bits::bits_from_float(v) >> 16);
}

}  // namespace wush::cuda
