// Which SIMD kernels the CPU runtime uses. The choice is made per call from the context's
// WUSH_CONTEXT_CPU_ISA setting and the running CPU, never from global state, so tests can force
// every path on one machine.
#pragma once

#include <cstdint>

namespace wush {

// Ordered from the most portable to the fastest; the values are the public wush_cpu_isa values.
enum class Isa : int { Scalar = 1, Avx2 = 2, Avx512Vnni = 3 };

const char* isa_name(Isa isa);  // "scalar", "avx2", "avx512_vnni"

// Whether this CPU (and the OS, which must save the wider registers) can run `isa`'s kernels:
//  - Avx2: AVX2, FMA and F16C;
//  - Avx512Vnni: AVX-512 F, BW, DQ, VL and VNNI (Ice Lake / Zen 4 and later).
bool isa_supported(Isa isa);

// Whether the CPU also has AVX512_BF16 (Cooper Lake, Sapphire Rapids, Zen 4 and later): the
// AVX-512 quantize kernel then multiplies bf16 activations by bf16-exact transforms with the bf16
// dot product. Not an ISA setting of its own: the result is the same bytes either way.
bool cpu_has_avx512_bf16();

// The fastest supported ISA.
Isa best_isa();

// Resolves a context setting: 0 (automatic) is best_isa(); 1..3 name an ISA, which must be
// supported (wush::Error UNSUPPORTED otherwise); other values are INVALID_ARGUMENT.
Isa resolve_isa(std::int64_t setting);

}  // namespace wush
