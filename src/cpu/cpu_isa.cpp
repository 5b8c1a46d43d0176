#include "cpu/cpu_isa.h"

#include <string>

#include "common/error.h"

namespace wush::runtime {

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
};

Features detect() {
    // libgcc's __builtin_cpu_supports also checks that the OS saves the wider registers (XCR0).
    __builtin_cpu_init();
    Features f;
    f.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    f.avx512_vnni = f.avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                    __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
                    __builtin_cpu_supports("avx512vnni");
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

Isa best_isa() {
    if (isa_supported(Isa::Avx512Vnni)) return Isa::Avx512Vnni;
    if (isa_supported(Isa::Avx2)) return Isa::Avx2;
    return Isa::Scalar;
}

Isa resolve_isa(std::int64_t setting) {
    if (setting == 0) return best_isa();
    if (setting < 1 || setting > 3)
        fail(WUSH_ERR_INVALID_ARGUMENT, "unknown wush_cpu_isa " + std::to_string(setting));
    const Isa isa = Isa(int(setting));
    if (!isa_supported(isa))
        fail(WUSH_ERR_UNSUPPORTED, std::string("this CPU cannot run the ") + isa_name(isa) + " kernels");
    return isa;
}

}  // namespace wush::runtime
