// RTN round trip of one group in place, without packing: each value becomes what
// quantize_group followed by the library's decode (dequantize_rows: element x scale / tensor
// divisor, rounded once to float) gives. The per-block transform search (transforms/) runs it on
// thousands of groups per candidate, where packing nibbles only to unpack them again, and a
// switch on the format per element, dominated its cost. The arithmetic is quantize_group's: the
// same float64 rule per element, with the loop-invariant parts (the MX power-of-two multiplier,
// the decoded scale) hoisted and the E2M1 comparisons done as vectorizable selects, which changes no
// result (tests/unit/test_transform_search.cpp checks the bytes). Inputs must be finite.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

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

// x[i] <- value[E2M1 code of x[i]] given the float thresholds above: the magnitude is the value
// of the last threshold passed (they increase, so this is e2m1_encode's comparison chain), the
// sign x's own. Written as a chain of selects rather than a code and a table look-up so that the
// compiler vectorizes it. The sign can be copied because the tables are symmetric: value[8 + m]
// is -value[m] and value[m] >= +0 (so a negative x whose magnitude rounds to zero gives -0, the
// value of code 8, as the packed path does). The local copies keep the values in registers (x
// could alias the table as far as the compiler knows).
inline void e2m1_decode_group(float* x, int n, const float* thresholds, const float* table) {
    float t[7], v[8];
    std::copy_n(thresholds, 7, t);
    std::copy_n(table, 8, v);
    for (int i = 0; i < n; ++i) {
        const float a = std::fabs(x[i]);
        float m = v[0];
        m = a > t[0] ? v[1] : m;
        m = a > t[1] ? v[2] : m;
        m = a > t[2] ? v[3] : m;
        m = a > t[3] ? v[4] : m;
        m = a > t[4] ? v[5] : m;
        m = a > t[5] ? v[6] : m;
        m = a > t[6] ? v[7] : m;
        x[i] = std::copysign(m, x[i]);
    }
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
            decode_table(o ? WUSH_FORMAT_MXFP4_OCP : WUSH_FORMAT_MXFP4,
                         codec::e8m0_decode(codec::e8m0_from_exponent(ek)), d, table[k].value);
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

// NVFP4's scale code e4m3_encode(amax * 10 / 6) (quantize_group_nvfp4's) for a finite float
// amax >= 0, without the float64 rounding helpers per group. The code never decreases as amax
// grows (an exact product, a division and a saturating rounding, all monotone), so it is the
// number of code boundaries at or below amax: the smallest float with each code 1..126, found
// once by bisection over the float bit patterns (whose order is that of non-negative floats).
// Counting them per group by a binary search was a third of the search's round trip (seven
// dependent, unpredictable branches), so a table indexed by amax's exponent and top 4 mantissa
// bits gives the code at the start of amax's cell, and one comparison with the next boundary
// finishes it: a cell spans 1/16 to 1/32 of an octave, less than the gap between two
// boundaries (1/8 of an octave of E4M3 values in the normal range, a fixed step of 2^-9 * 6/10
// in the subnormal one, where cells are narrower still), so no cell holds two of them (the
// table's construction checks it; tests/unit/test_transform_search.cpp compares the codes with
// e4m3_encode over a sweep of the floats).
struct Nvfp4ScaleTable {
    std::array<float, 128> bound{};         // bound[c - 1]: the smallest float with code c; +Inf pads
    std::array<std::uint8_t, 4096> cell{};  // the code of the smallest float of cell bits >> 19
    bool one_boundary_per_cell = true;
};

inline const Nvfp4ScaleTable& nvfp4_scale_table() {
    static const Nvfp4ScaleTable table = [] {
        const auto code_of = [](std::uint32_t bits) {
            return codec::e4m3_encode(double(std::bit_cast<float>(bits)) * 10.0 / 6.0);
        };
        Nvfp4ScaleTable t;
        for (int c = 1; c <= 126; ++c) {
            std::uint32_t lo = 0, hi = 0x7F7FFFFFu;  // code_of(lo) < c <= code_of(hi)
            while (hi - lo > 1) {
                const std::uint32_t mid = lo + (hi - lo) / 2;
                (code_of(mid) >= c ? hi : lo) = mid;
            }
            t.bound[c - 1] = std::bit_cast<float>(hi);
        }
        t.bound[126] = t.bound[127] = std::numeric_limits<float>::infinity();
        // Cells of finite floats only: the last cells (the exponent 255) hold Inf and NaN.
        for (std::uint32_t k = 0; k < 4096 - 16; ++k) {
            const std::uint32_t first = k << 19, last = first + ((1u << 19) - 1);
            t.cell[k] = code_of(first);
            t.one_boundary_per_cell &= code_of(last) <= t.cell[k] + 1;
        }
        for (std::uint32_t k = 4096 - 16; k < 4096; ++k) t.cell[k] = 126;
        return t;
    }();
    return table;
}

inline std::uint8_t nvfp4_scale_code(double amax) {
    const Nvfp4ScaleTable& t = nvfp4_scale_table();
    const float a = float(amax);  // exact: callers pass a float's maximum
    const std::uint8_t k = t.cell[std::bit_cast<std::uint32_t>(a) >> 19];
    return std::uint8_t(k + (a >= t.bound[k] ? 1 : 0));
}

// group_amax for finite floats: for finite floats the order of |x| is the order of their bits
// with the sign cleared, and an integer maximum vectorizes where a float one (with its NaN and
// signed-zero rules) does not. The maximum is exact, so widening it gives group_amax's double.
inline double amax_finite(const float* x, int n) {
    std::uint32_t m = 0;
    for (int i = 0; i < n; ++i) m = std::max(m, std::bit_cast<std::uint32_t>(x[i]) & 0x7FFFFFFFu);
    return double(std::bit_cast<float>(m));
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
            const std::uint8_t code = nvfp4_scale_code(amax_finite(x, n));
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
