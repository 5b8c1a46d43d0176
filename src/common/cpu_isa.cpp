#include "common/cpu_isa.h"

#include <cpuid.h>

#include <string>

#include "common/error.h"

namespace wush {

const char* isa_name(Isa isa) {
    switch (isa) {
        case Isa::Scalar: return "scalar";
        case Isa::Avx2: return "avx2";
        case Isa::Avx512Vnni: return "avx512_vnni";
    }
    return "unknown";
}

namespace {

struct Features {
    bool avx2;
    bool avx512_vnni;
    bool avx512_bf16;
};

// F16C from CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports does not know "f16c",
// and the search's round-trip kernel brings this file into the clang-built fuzzer. (The OS
// support for the wider registers is the AVX2 check's.)
bool has_f16c() {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
}

// AVX512_BF16 from CPUID leaf 7, sub-leaf 1 (EAX bit 5), for the same reason (clang 14).
bool has_avx512_bf16() {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid_count(7, 1, &a, &b, &c, &d) != 0 && (a & (1u << 5)) != 0;
}

Features detect() {
    // libgcc's __builtin_cpu_supports also checks that the OS saves the wider registers (XCR0).
    __builtin_cpu_init();
    Features f;
    f.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
    f.avx512_vnni = f.avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                    __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
                    __builtin_cpu_supports("avx512vnni");
    f.avx512_bf16 = f.avx512_vnni && has_avx512_bf16();
    return f;
}

// The CPU does not change under a running process: detected once (thread-safe static init).
const Features& features() {
    static const Features f = detect();
    return f;
}

}  // namespace

bool isa_supported(Isa isa) {
    switch (isa) {
        case Isa::Scalar: return true;
        case Isa::Avx2: return features().avx2;
        case Isa::Avx512Vnni: return features().avx512_vnni;
    }
    return false;
}

bool cpu_has_avx512_bf16() {
    return features().avx512_bf16;
}

Isa best_isa() {
    if (isa_supported(Isa::Avx512Vnni)) return Isa::Avx512Vnni;
    if (isa_supported(Isa::Avx2)) return Isa::Avx2;
    return Isa::Scalar;
}

Isa resolve_isa(std::int64_t setting) {
    if (setting == 0) return best_isa();
    if (setting < 1 || setting > 3) fail(WUSH_ERR_INVALID_ARGUMENT, "unknown wush_cpu_isa " + std::to_string(setting));
    const Isa isa = Isa(int(setting));
    if (!isa_supported(isa))
        fail(WUSH_ERR_UNSUPPORTED, std::string("this CPU cannot run the ") + isa_name(isa) + " kernels");
    return isa;
}

}  // namespace wush
