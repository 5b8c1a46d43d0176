// Float64 references for the CPU runtime tests, written from the format rules of docs/BLOCK_FORMATS.md /
// include/wush/wush.h (not from the library's code): the E2M1 / E4M3 / BF16 roundings by nearest
// search over the representable values, the scale rules, the decoded values, and a classifier
// that says whether a value lies within a relative 1e-6 of a rounding boundary.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/cpu_isa.h"
#include "wush/wush.h"

namespace wush::test {

// The kernel sets this CPU can run (the scalar path always).
inline std::vector<Isa> supported_isas() {
    std::vector<Isa> out;
    for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512Vnni})
        if (isa_supported(isa)) out.push_back(isa);
    return out;
}

constexpr double kE2M1[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
// Midpoints between neighbouring E2M1 magnitudes: the rounding boundaries.
constexpr double kE2M1Bounds[7] = {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0};

// Nearest of `values` (ascending, non-negative) to a >= 0; ties to the even index.
inline int nearest_index(const double* values, int count, double a) {
    int best = 0;
    for (int i = 1; i < count; ++i) {
        const double d = std::fabs(a - values[i]), db = std::fabs(a - values[best]);
        if (d < db || (d == db && i % 2 == 0)) best = i;
    }
    return best;
}

inline std::uint8_t ref_e2m1(double v) {
    const int m = std::fabs(v) >= 6.0 ? 7 : nearest_index(kE2M1, 8, std::fabs(v));
    return std::uint8_t((std::signbit(v) ? 8 : 0) | m);
}

// All non-negative finite E4M3 values, by code (0..126).
inline std::vector<double> e4m3_values() {
    std::vector<double> v;
    for (int c = 0; c < 127; ++c) {
        const int e = c >> 3, m = c & 7;
        v.push_back(e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10));
    }
    return v;
}

// RNE to E4M3 (ties to the even code), saturating at 448; returns the code (a >= 0).
inline std::uint8_t ref_e4m3(double a) {
    static const std::vector<double> values = e4m3_values();
    if (a >= 448.0) return 126;
    return std::uint8_t(nearest_index(values.data(), int(values.size()), a));
}

// RNE of a > 0 to bf16: 8 significant bits, subnormals below 2^-126 (quantum 2^-133).
inline double ref_bf16(double a) {
    int e = 0;
    std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1): floor(log2 a) = e - 1
    const double quantum = std::ldexp(1.0, std::max(e - 1, -126) - 7);
    const double scaled = a / quantum;
    double r = std::floor(scaled);
    const double d = scaled - r;
    if (d > 0.5 || (d == 0.5 && std::fmod(r, 2.0) != 0.0)) r += 1.0;
    return r * quantum;
}

inline std::uint16_t bf16_bits(double v) {
    const float f = float(v);  // v is a bf16 value: exact
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    return std::uint16_t(u >> 16);
}

// Relative distance test: |x - b| <= 1e-6 |b|.
inline bool near(double x, double b) {
    return std::fabs(x - b) <= 1e-6 * std::fabs(b);
}

// Whether a > 0 lies within 1e-6 relative of a midpoint between two neighbours of `grid`.
inline bool near_midpoint(double a, const std::vector<double>& grid) {
    for (std::size_t i = 0; i + 1 < grid.size(); ++i)
        if (near(a, 0.5 * (grid[i] + grid[i + 1]))) return true;
    return false;
}

// The reference quantization of one group, with its boundary flags.
struct RefGroup {
    std::vector<std::uint8_t> codes;  // one nibble per element
    std::vector<double> scaled;       // the value each code rounds (E2M1 units / INT4 steps)
    std::uint16_t scale = 0;          // the scale byte(s)
    bool scale_near = false;          // the scale's input lies near a rounding boundary
};

inline RefGroup ref_group(wush_format f, const double* y, int n) {
    RefGroup r;
    double amax = 0.0;
    for (int i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(y[i]));
    double mult = 0.0;
    if (f == WUSH_FORMAT_MXFP4 || f == WUSH_FORMAT_MXFP4_OCP) {
        int e = -127;
        if (amax > 0.0) {
            int fe = 0;
            std::frexp(amax, &fe);
            e = fe - 1;
            r.scale_near = near(amax, std::ldexp(1.0, e)) || near(amax, std::ldexp(1.0, e + 1));
        }
        if (f == WUSH_FORMAT_MXFP4_OCP) e -= 2;
        e = std::max(-127, std::min(127, e));
        r.scale = std::uint16_t(e + 127);
        mult = std::ldexp(f == WUSH_FORMAT_MXFP4_OCP ? 1.0 : 3.0, -e);
    } else if (f == WUSH_FORMAT_NVFP4) {
        static const std::vector<double> values = e4m3_values();
        const double w = amax * 10.0 / 6.0;
        const std::uint8_t s = ref_e4m3(w);
        r.scale = s;
        r.scale_near = near_midpoint(w, values);
        mult = values[s] > 0.0 ? 10.0 / values[s] : 0.0;
    } else {
        double ss = 0.0;
        for (int i = 0; i < n; ++i) ss += y[i] * y[i];
        const double w = 2.5139305785684 * 2.0 / 15.0 * std::sqrt(ss / n);
        const double s = w > 0.0 ? ref_bf16(w) : 0.0;
        r.scale = bf16_bits(s);
        if (w > 0.0) {
            // bf16 neighbours of w and their midpoint.
            int e = 0;
            std::frexp(w, &e);
            const double ulp = std::ldexp(1.0, std::max(e - 1, -126) - 7);
            const double lo = std::floor(w / ulp) * ulp;
            r.scale_near = near(w, lo + 0.5 * ulp);
        }
        mult = s > 0.0 ? 1.0 / s : 0.0;
    }
    for (int i = 0; i < n; ++i) {
        if (f == WUSH_FORMAT_INT4) {
            const double t = y[i] * mult;
            const double q = mult > 0.0 ? std::fmin(std::fmax(std::floor(t), -8.0), 7.0) : 0.0;
            r.codes.push_back(std::uint8_t(int(q) & 0xF));
            r.scaled.push_back(t);
        } else {
            const double v = mult > 0.0 ? y[i] * mult : y[i] * 0.0;
            r.codes.push_back(ref_e2m1(v));
            r.scaled.push_back(v);
        }
    }
    return r;
}

// Whether a code mismatch at `scaled` (the reference's value before rounding) is a boundary case.
inline bool code_boundary(wush_format f, double scaled) {
    if (f == WUSH_FORMAT_INT4) {
        const double j = std::round(scaled);
        return std::fabs(scaled - j) <= 1e-6 * std::fmax(std::fabs(j), 1.0);  // floor steps; 0 is a boundary
    }
    const double a = std::fabs(scaled);
    if (a <= 1e-6) return true;  // +0 vs -0: only the sign of a vanishing value differs
    for (double b : kE2M1Bounds)
        if (near(a, b)) return true;
    return false;
}

// Decoded element and scale values (without the per-tensor factor).
inline double ref_element(wush_format f, std::uint8_t nibble) {
    if (f == WUSH_FORMAT_INT4) return double((nibble & 8) ? int(nibble) - 16 : int(nibble)) + 0.5;
    const double m = kE2M1[nibble & 7];
    return (nibble & 8) ? -m : m;
}

inline double ref_scale(wush_format f, const std::uint8_t* s) {
    switch (f) {
        case WUSH_FORMAT_NVFP4: {
            static const std::vector<double> values = e4m3_values();
            return (s[0] & 0x80 ? -1.0 : 1.0) * values[s[0] & 0x7F];
        }
        case WUSH_FORMAT_INT4: {
            const std::uint32_t u = std::uint32_t(s[0] | (s[1] << 8)) << 16;
            float v;
            std::memcpy(&v, &u, 4);
            return v;
        }
        default: return std::ldexp(1.0, int(s[0]) - 127);
    }
}

inline double ref_factor(wush_format f) {
    return f == WUSH_FORMAT_MXFP4 ? 1.0 / 3.0 : f == WUSH_FORMAT_NVFP4 ? 0.1 : 1.0;
}

}  // namespace wush::test
