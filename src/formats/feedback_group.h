// GPTQ's pass over one group of G weights with error feedback (the intra-block step of
// src/prequant/gptq.cpp, also run by the transform search to score candidates by the error GPTQ leaves).
// The group's scale is fixed first by RTN of the float values (quantize_group); then column by
// column each value is encoded under that scale and its error is fed forward to the later
// columns through the upper-triangular factor u (G x G row-major, U^T U = the inverse Hessian):
// w_k -= (w_j - q_j) / u_jj * u_jk. Inputs must be finite.
#pragma once

#include <cstdint>

#include "formats/block_format.h"
#include "formats/group_quantizer.h"

namespace wush::formats {

// Consumes w (G values); writes the codes (G/2 bytes), the scale and q, the dequantized values
// (element x scale / tensor divisor, float64). G <= 128.
inline void quantize_group_feedback(const FormatSpec& f, double* w, int g, const double* u, std::uint8_t* codes,
                                    std::uint8_t* scale, double* q) {
    float group[128] = {};  // (initialized: the compiler cannot see g <= 128)
    for (int j = 0; j < g; ++j) group[j] = float(w[j]);
    quantize_group(f.id, group, g, codes, scale);  // fixes the scale
    const double unit = double(decode_scale(f.id, scale)) / f.tensor_divisor;
    for (int j = 0; j < g; ++j) {
        const std::uint8_t nibble = encode_element(f.id, w[j], scale);
        put_nibble(codes, j, nibble);
        q[j] = double(decode_element(f.id, nibble)) * unit;
        const double err = (w[j] - q[j]) / u[j * g + j];
        for (int k = j + 1; k < g; ++k) w[k] -= err * u[j * g + k];
    }
}

}  // namespace wush::formats
