// The constants of the certified float32 quantizer, defined once for its three implementations:
// the AVX-512 and AVX2 kernels (src/cpu/kernels/quantize_avx512.cpp, quantize_avx2.cpp) and the scalar
// host + device port (formats/certified_group.h). Variables only, no functions: the per-ISA
// kernel files, compiled with their own target flags, may include it (src/cpu/kernels/kernels.h says why
// they include no header that defines a function).
#pragma once

namespace wush::formats::certified {

// Gaussian MSE-optimal clipping of a 4-bit uniform quantizer, in units of the RMS (the paper's
// "INT4 with Gaussian MSE clipping"); 2/15 maps the clip range [-c, c] onto 15 steps.
constexpr double kInt4ClipRatio = 2.5139305785684;
constexpr double kInt4ScalePerRms = kInt4ClipRatio * 2.0 / 15.0;
constexpr float kInt4ScalePerRmsF = float(kInt4ScalePerRms);

constexpr float kU = 0x1p-24f;     // unit roundoff of float32
constexpr float kTiny = 0x1p-60f;  // groups with amax outside [kTiny, kHuge] go to float64
constexpr float kHuge = 0x1p60f;
constexpr float kAbsSlack = 0x1p-110f;  // absolute error allowance (subnormal / flushed terms)
// The transform's error bound is gamma_G ||T_i|| ||x|| with gamma_G = (G + 2) u, rounded up by
// this factor, which also covers ||x|| computed in float32.
constexpr float kGammaRoundUp = 1.05f;
// E2M1 kernels: the per-group tolerances cover the scaling's rounding for scaled values up to
// this; a larger one rounds to the top code, and its distance to the top threshold (5) is counted
// as kMaxScaled - 5, which keeps it certified (quantize_avx512.cpp, near_boundary, says why).
constexpr float kMaxScaled = 8.0f;

}  // namespace wush::formats::certified
