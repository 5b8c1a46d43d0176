// RTN round trip of one group in place, without packing: each value becomes what
// quantize_group followed by the library's decode (dequantize_rows: element x scale / tensor
// divisor, rounded once to float) gives. The per-block transform search (transforms/) runs it on
// thousands of groups per candidate, where packing nibbles only to unpack them again, and a
// switch on the format per element, dominated its cost. The arithmetic is quantize_group's: the
// same float64 rule per element, with the loop-invariant parts (the MX power-of-two multiplier,
// the decoded scale) hoisted and the E2M1 comparisons done without branches, which changes no
// result (tests/unit/test_transform_search.cpp checks the bytes). Inputs must be finite.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>

#include "formats/block_format.h"
#include "formats/group_quantizer.h"

namespace wush::formats {

namespace round_trip_detail {

// value(code) = element(code) * scale / divisor, in float64 rounded once (dequantize_rows). The
// E2M1 codes 8..15 are the negatives of 0..7 and rounding is symmetric, so 8 quotients suffice.
inline void decode_table(wush_format id, double scale, double divisor, float* table) {
    if (id == WUSH_FORMAT_INT4) {
        for (int c = 0; c < 16; ++c) table[c] = float(double(decode_element(id, std::uint8_t(c))) * scale / divisor);
        return;
    }
    static const auto elements = [] {
        std::array<float, 8> e{};
        for (int c = 0; c < 8; ++c) e[c] = codec::e2m1_decode(std::uint8_t(c));
        return e;
    }();
    for (int c = 0; c < 8; ++c) {
        table[c] = float(double(elements[c]) * scale / divisor);
        table[c + 8] = -table[c];
    }
}

// The thresholds of codec::e2m1_encode (magnitude code m when the magnitude passes m of them;
// passing means > for 0.25, 1.25, 2.5, 5 (ties go to the even code below) and >= for the others).
constexpr double kE2M1Thresholds[7] = {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0};

// The largest float <= q for q > 0 given as its float64 rounding qd = RN(q). Callers' q are
// ratios k / 3 or k / 5 times a power of two: if q is not a float, no float lies between q and
// qd (q's binary expansion is periodic, at least 2^-27 relative away from any 24-bit value),
// so rounding qd is as good as rounding q.
inline float float_floor(double qd) {
    float f = float(qd);  // may round up (also to +Inf)
    if (double(f) > qd) f = std::bit_cast<float>(std::bit_cast<std::uint32_t>(f) - 1u);
    return f;
}

// Float thresholds T_k with (a > T_k) == (a compared with q_k = t_k * num / den) for every
// finite float a >= 0, t_k * num exact, the comparison > for even k and >= for odd k (as
// codec::e2m1_encode compares the scaled magnitude a * den / num with t_k). a >= q for a float q
// is a > the float below q.
inline void e2m1_float_thresholds(double num, double den, float* t) {
    for (int k = 0; k < 7; ++k) {
        const double tn = kE2M1Thresholds[k] * num, qd = tn / den;
        float f = float_floor(qd);
        const bool q_is_float = double(f) * den == tn;  // exact: f has 24 bits, den <= 4
        if (q_is_float && (k & 1)) f = std::bit_cast<float>(std::bit_cast<std::uint32_t>(f) - 1u);
        t[k] = f;
    }
}

// x[i] <- value[E2M1 code of x[i]] given the float thresholds above: the magnitude code is the
// number of thresholds passed (they increase, so this is e2m1_encode's comparison chain). Two
// passes over local copies: the codes without branches (the compiler can vectorize the
// comparisons), then the table look-ups; in place, x could alias the table, so the table and
// thresholds are copied first.
inline void e2m1_decode_group(float* x, int n, const float* thresholds, const float* table) {
    float t[7], value[16];
    std::copy_n(thresholds, 7, t);
    std::copy_n(table, 16, value);
    std::uint8_t code[128];
    for (int i = 0; i < n; ++i) {
        const float a = std::fabs(x[i]);
        code[i] = std::uint8_t((std::signbit(x[i]) ? 8 : 0) + (a > t[0]) + (a > t[1]) + (a > t[2]) + (a > t[3]) +
                               (a > t[4]) + (a > t[5]) + (a > t[6]));
    }
    for (int i = 0; i < n; ++i) x[i] = value[code[i]];
}

// Everything a group's elements need once its scale is known: the 16 decoded values and the 7
// float thresholds. Scales take few values (E8M0: 255, positive E4M3: 126), so each format's
// table is built once, on first use (thread-safe static initialization), not per group.
struct ScaleEntry {
    float value[16];
    float t[7];
};

// MXFP4 (ocp false) or OCP MXFP4: by e + 127. encode_mx compares the exact product
// |x| * 3 * 2^-e (OCP: |x| * 2^-e) with t, i.e. |x| with t 2^e / 3 (t 2^e).
inline const ScaleEntry& mx_entry(int e, bool ocp, double divisor) {
    static const auto build = [](bool o, double d) {
        std::array<ScaleEntry, 255> table{};
        for (int k = 0; k < 255; ++k) {
            const int ek = k + codec::kE8M0MinExp;
            decode_table(o ? WUSH_FORMAT_MXFP4_OCP : WUSH_FORMAT_MXFP4, codec::e8m0_decode(codec::e8m0_from_exponent(ek)),
                         d, table[k].value);
            e2m1_float_thresholds(std::ldexp(1.0, ek), o ? 1.0 : 3.0, table[k].t);
        }
        return table;
    };
    // One table per format, each built on its own first use with that format's divisor.
    if (ocp) {
        static const std::array<ScaleEntry, 255> ocp_table = build(true, divisor);
        return ocp_table[e - codec::kE8M0MinExp];
    }
    static const std::array<ScaleEntry, 255> plain = build(false, divisor);
    return plain[e - codec::kE8M0MinExp];
}

// NVFP4 by positive E4M3 scale code (1..126). encode_nvfp4 compares RN(10 |x| / sv) with t;
// 10 |x| and t sv are exact in float64 (24 + 4 and 3 + 4 significant bits), and RN(10 |x| / sv)
// equals a representable t only if 10 |x| / sv does (a nonzero difference is >= 2^-28 relative,
// far above half an ulp), so this is comparing |x| with t sv / 10.
inline const ScaleEntry& nvfp4_entry(std::uint8_t code, double divisor) {
    static const std::array<ScaleEntry, 127> table = [](double d) {
        std::array<ScaleEntry, 127> tb{};
        for (int c = 1; c < 127; ++c) {
            const double sv = codec::e4m3_decode(std::uint8_t(c));
            decode_table(WUSH_FORMAT_NVFP4, sv, d, tb[c].value);
            e2m1_float_thresholds(sv, 10.0, tb[c].t);
        }
        return tb;
    }(divisor);
    return table[code];
}

// group_amax for finite floats: the float maximum of |x_i| is exact, so widening it after the
// loop gives the same double, without group_amax's call to fmax per element.
inline double amax_finite(const float* x, int n) {
    float m = 0.0f;
    for (int i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
    return double(m);
}

}  // namespace round_trip_detail

inline void round_trip_group(const FormatSpec& f, float* x, int n) {
    using namespace round_trip_detail;
    switch (f.id) {
        case WUSH_FORMAT_MXFP4:
        case WUSH_FORMAT_MXFP4_OCP: {
            const bool ocp = f.id == WUSH_FORMAT_MXFP4_OCP;
            const ScaleEntry& s = mx_entry(mx_scale_exponent(amax_finite(x, n), ocp), ocp, f.tensor_divisor);
            e2m1_decode_group(x, n, s.t, s.value);
            return;
        }
        case WUSH_FORMAT_NVFP4: {
            // amax >= 0: the code is positive (sign bit clear); 0x7F (NaN) needs a NaN amax.
            const std::uint8_t code = codec::e4m3_encode(amax_finite(x, n) * 10.0 / 6.0);
            if (code == 0) {  // a zero scale: encode_nvfp4 keeps only the sign, which decodes to +-0
                const float zero = float(0.0 * 0.0 / f.tensor_divisor);
                for (int i = 0; i < n; ++i) x[i] = std::signbit(x[i]) ? -zero : zero;
                return;
            }
            const ScaleEntry& s = nvfp4_entry(code, f.tensor_divisor);
            e2m1_decode_group(x, n, s.t, s.value);
            return;
        }
        default: {  // INT4 (and any later format): the packed path
            std::uint8_t codes[128], scale[4];
            float value[16];
            quantize_group(f.id, x, n, codes, scale);
            decode_table(f.id, decode_scale(f.id, scale), f.tensor_divisor, value);
            for (int i = 0; i < n; ++i) x[i] = value[get_nibble(codes, i)];
            return;
        }
    }
}

}  // namespace wush::formats
