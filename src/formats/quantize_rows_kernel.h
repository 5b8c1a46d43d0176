// The interface between quantize_rows (block_format.cpp) and its AVX2 kernel
// (quantize_rows_avx2.cpp), which is compiled with AVX2 target flags. The rule of the CPU
// runtime's kernels (src/cpu/kernels/kernels.h) holds for the same reason: this header defines no
// function, inline or implicit (an inline copy emitted with AVX2 flags could be the one the linker
// keeps for callers on CPUs without AVX2), so declarations only. The kernel holds no format rule:
// block_format.cpp chooses each group's scale with the float64 definition (group_quantizer.h) and
// hands the kernel what an element is multiplied and divided by.
#pragma once

#include <cstddef>
#include <cstdint>

namespace wush::formats::avx2 {

// amax[k] = max |x[k g + i]| over i < g, for each of `groups` groups of g (8, 16 or 32) finite
// floats. Exact: the largest magnitude is one of the inputs.
void group_amax(const float* x, std::size_t groups, int g, float* amax);

// The E2M1 codes of `groups` groups of g (16 or 32) finite floats, two per byte (element 2i in the
// low nibble): element x of group k is encoded as v = (double(x) * mul[k]) / div[k], or as
// double(x) * mul[k] where `divide` is false, in float64 and rounded to E2M1 as
// codec::e2m1_encode does (the nearest magnitude, ties to the even code, the sign of v).
void encode_e2m1(const float* x, std::size_t groups, int g, const double* mul, const double* div, bool divide,
                 std::uint8_t* codes);

}  // namespace wush::formats::avx2
