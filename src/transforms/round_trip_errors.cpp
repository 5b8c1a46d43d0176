#include "transforms/round_trip_errors.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>
#include <vector>

#include "formats/round_trip.h"
#include "transforms/round_trip_kernel.h"

namespace wush {

namespace {

// Scale indices: MXFP4 by E8M0 exponent + 127 (0..254), NVFP4 by E4M3 code (0..126).
constexpr std::size_t kMxScales = 255, kNvfp4Scales = 127;

struct Tables {
    std::vector<float> entries;  // 16 per scale index, as kernels.h's RoundTripTable describes
    RoundTripTable view{};
};

void put_entry(const formats::round_trip_detail::ScaleEntry& s, float* out) {
    std::copy_n(s.t, 7, out);
    out[7] = std::numeric_limits<float>::infinity();
    std::copy_n(s.value, 8, out + 8);
}

Tables mx_tables(const formats::FormatSpec& f) {
    const bool ocp = f.id == WUSH_FORMAT_MXFP4_OCP;
    Tables t;
    t.entries.resize(16 * kMxScales);
    for (std::size_t i = 0; i < kMxScales; ++i)
        put_entry(formats::round_trip_detail::mx_entry(int(i) + codec::kE8M0MinExp, ocp, f.tensor_divisor),
                  t.entries.data() + 16 * i);
    // mx_scale_exponent: floor(log2 amax) (the float's exponent field - 127; 0 and subnormals
    // clamp to the smallest exponent, like an exponent field of 0), minus 2 for OCP, clamped.
    t.view = {ocp ? 2 : 0, nullptr, nullptr, t.entries.data()};
    return t;
}

Tables nvfp4_tables(const formats::FormatSpec& f) {
    const formats::round_trip_detail::Nvfp4ScaleTable& code = formats::round_trip_detail::nvfp4_scale_table();
    Tables t;
    t.entries.assign(16 * kNvfp4Scales, 0.0f);
    // Code 0 (a zero scale) keeps only the sign: no threshold is ever passed, magnitude 0.
    std::fill_n(t.entries.begin(), 8, std::numeric_limits<float>::infinity());
    std::fill_n(t.entries.begin() + 8, 8, float(0.0 * 0.0 / f.tensor_divisor));
    for (std::size_t c = 1; c < kNvfp4Scales; ++c)
        put_entry(formats::round_trip_detail::nvfp4_entry(std::uint8_t(c), f.tensor_divisor),
                  t.entries.data() + 16 * c);
    t.view = {0, code.cell.data(), code.bound.data(), t.entries.data()};
    return t;
}

// The kernel's tables for a format it handles, else nullptr. Built once per format, on first
// use (thread-safe static initialization), and never changed.
const RoundTripTable* kernel_table(const formats::FormatSpec& f) {
    switch (f.id) {
        case WUSH_FORMAT_MXFP4: {
            static const Tables t = mx_tables(f);
            return &t.view;
        }
        case WUSH_FORMAT_MXFP4_OCP: {
            static const Tables t = mx_tables(f);
            return &t.view;
        }
        case WUSH_FORMAT_NVFP4: {
            static const Tables t = nvfp4_tables(f);
            return &t.view;
        }
        default: return nullptr;
    }
}

bool portable(const formats::FormatSpec& format, float* cat, std::size_t n, std::size_t g) {
    for (std::size_t r = 0; r < n; ++r) {
        float* e = cat + 2 * r * g;
        const float* v = e + g;
        std::uint32_t non_finite = 0;  // an all-ones exponent, accumulated without a branch
        for (std::size_t j = 0; j < g; ++j) non_finite |= (~std::bit_cast<std::uint32_t>(v[j]) & 0x7F800000u) == 0;
        if (non_finite) return false;
        std::copy_n(v, g, e);
        formats::round_trip_group(format, e, int(g));
        for (std::size_t j = 0; j < g; ++j) e[j] -= v[j];
    }
    return true;
}

}  // namespace

bool round_trip_errors(const formats::FormatSpec& format, float* cat, std::size_t n, std::size_t g, Isa isa) {
    const RoundTripTable* table = isa == Isa::Scalar || (g != 16 && g != 32) ? nullptr : kernel_table(format);
    if (table == nullptr) return portable(format, cat, n, g);
    return avx2::round_trip_errors(*table, cat + g, cat, n, 2 * g, int(g)) == 0;
}

}  // namespace wush
