// The interface between the transform search's round-trip driver (round_trip_errors.cpp) and its
// AVX2 kernel (round_trip_avx2.cpp), which is compiled with AVX2 target flags. The same rule as the
// CPU runtime's kernels (src/cpu/kernels/kernels.h) holds for the same reason: this header defines no
// function, inline or implicit (an inline copy emitted with AVX2 flags could be the one the linker
// keeps for callers on CPUs without AVX2), so plain aggregates and declarations only.
#pragma once

#include <cstddef>
#include <cstdint>

namespace wush {

// ---------------------------------------------------------------------------------------------
// RTN round-trip errors of the transform search (round_trip_errors.h)
// ---------------------------------------------------------------------------------------------

// One E2M1 format's scales as tables (built by round_trip_errors.cpp from formats/round_trip.h):
// a group's scale index comes from its amax's float bits a (sign cleared), either as
// max((a >> 23) - exponent_offset, 0) (cell == nullptr: MXFP4's E8M0 exponent + 127) or as
// k = cell[a >> 19], k + (amax >= bound[k]) (NVFP4's E4M3 code); entries[16 * index ...] holds
// the 7 element thresholds (a magnitude passing k of them has magnitude code k; the 8th is +Inf)
// and then the 8 decoded magnitudes.
struct RoundTripTable {
    int exponent_offset;
    const std::uint8_t* cell;
    const float* bound;
    const float* entries;
};

namespace avx2 {
// For each of the n groups (G = 16 or 32 floats) at v + r * stride: e[r * stride + j] becomes
// round_trip(v)[j] - v[j]. Returns 1 (and stops) at the first group holding a non-finite value,
// else 0.
int round_trip_errors(const RoundTripTable& table, const float* v, float* e, std::size_t n, std::size_t stride,
                      int group);
}  // namespace avx2

}  // namespace wush
