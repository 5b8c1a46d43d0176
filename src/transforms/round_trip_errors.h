// The transform search's RTN round-trip errors (transforms/transform_search.cpp), by ISA: for the
// n rows of cat = [E V] (n x 2G, each half one group of G), E <- q(V) - V with q the format's RTN
// round trip (formats/round_trip.h: quantize, then decode as the library does). The search runs
// it on every candidate's transformed sample and weight rows; it is the largest part of the
// search's cost, hence an AVX2 kernel (transforms/round_trip_avx2.cpp) besides the portable loop. Every
// ISA gives the same bits: the round trip is comparisons and table look-ups, and the error one
// float subtraction.
#pragma once

#include <cstddef>

#include "common/cpu_isa.h"
#include "formats/block_format.h"

namespace wush {

// False if a value of V is not finite (the quantizers require finite input); E is then partly
// written. `isa` must be supported (isa_supported); AVX-512 runs the AVX2 kernel, and INT4 (no
// kernel) the portable loop on every ISA. Thread-safe.
bool round_trip_errors(const formats::FormatSpec& format, float* cat, std::size_t n, std::size_t g, Isa isa);

}  // namespace wush
