// RTN round trip of one group in place, without packing: each value becomes what
// quantize_group followed by the library's decode (dequantize_rows: element x scale / tensor
// divisor, rounded once to float) gives. The per-block transform search (transforms/) runs it on
// thousands of groups per candidate, where packing nibbles only to unpack them again, and a
// switch on the format per element, dominated its cost. The arithmetic is quantize_group's: the
// same float64 rule per element, with the loop-invariant parts (the MX power-of-two multiplier,
// the decoded scale) hoisted and the E2M1 comparisons done without branches, which changes no
// result (tests/unit/test_transform_search.cpp checks the bytes). Inputs must be finite.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>

#include "formats/block_format.h"
#include "formats/group_quantizer.h"

namespace wush::formats {

namespace round_trip_detail {

// value(code) = element(code) * scale / divisor, in float64 rounded once (dequantize_rows).
inline void decode_table(wush_format id, double scale, double divisor, float* table) {
    static const auto elements = [] {
        std::array<float, 16> e{};
        for (int c = 0; c < 16; ++c) e[c] = codec::e2m1_decode(std::uint8_t(c));
        return e;
    }();
    for (int c = 0; c < 16; ++c)
        table[c] = float(double(id == WUSH_FORMAT_INT4 ? decode_element(id, std::uint8_t(c)) : elements[c]) * scale / divisor);
}

// The thresholds of codec::e2m1_encode (magnitude code m when the magnitude passes m of them;
// passing means > for the even codes' upper ends 0.25, 1.25, 2.5, 5 and >= for the others).
constexpr double kE2M1Thresholds[7] = {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0};

// codec::e2m1_encode(v / s) given t = the thresholds times s (s > 0), without its branch chain:
// the magnitude code is the number of thresholds passed (they increase, so this is the same
// comparison chain), which the compiler evaluates without the mispredicted branches that
// dominated the search's profile on random-looking data.
inline std::uint8_t e2m1_code_scaled(double v, const double* t) {
    const double a = std::fabs(v);
    const int m = int(a > t[0]) + int(a >= t[1]) + int(a > t[2]) + int(a >= t[3]) + int(a > t[4]) + int(a >= t[5]) +
                  int(a > t[6]);
    return std::uint8_t((std::signbit(v) ? 0x8 : 0x0) | m);
}

}  // namespace round_trip_detail

inline void round_trip_group(const FormatSpec& f, float* x, int n) {
    using namespace round_trip_detail;
    float value[16];
    switch (f.id) {
        case WUSH_FORMAT_MXFP4:
        case WUSH_FORMAT_MXFP4_OCP: {
            const bool ocp = f.id == WUSH_FORMAT_MXFP4_OCP;
            const int e = mx_scale_exponent(group_amax(x, n), ocp);
            const double mul = ldexp(ocp ? 1.0 : 3.0, -e);  // encode_mx's exact multiplier
            decode_table(f.id, codec::e8m0_decode(codec::e8m0_from_exponent(e)), f.tensor_divisor, value);
            for (int i = 0; i < n; ++i) x[i] = value[e2m1_code_scaled(double(x[i]) * mul, kE2M1Thresholds)];
            return;
        }
        case WUSH_FORMAT_NVFP4: {
            const double sv = codec::e4m3_decode(codec::e4m3_encode(group_amax(x, n) * 10.0 / 6.0));
            decode_table(f.id, sv, f.tensor_divisor, value);
            if (!(sv > 0.0)) {  // encode_nvfp4 under a zero scale keeps only the sign
                for (int i = 0; i < n; ++i) x[i] = value[std::signbit(x[i]) ? 0x8 : 0x0];
                return;
            }
            // encode_nvfp4 compares RN(10 |x| / sv) with the E2M1 thresholds t. 10 |x| and t sv are
            // exact in float64 (24 + 4 and 3 + 4 significant bits), and RN(10 |x| / sv) equals a
            // representable t only if 10 |x| / sv does (a nonzero difference is >= 2^-28 relative,
            // far above half an ulp), so comparing 10 |x| with t sv decides the same without
            // a division per element.
            double t[7];
            for (int k = 0; k < 7; ++k) t[k] = kE2M1Thresholds[k] * sv;
            for (int i = 0; i < n; ++i) x[i] = value[e2m1_code_scaled(double(x[i]) * 10.0, t)];
            return;
        }
        default: {  // INT4 (and any later format): the packed path
            std::uint8_t codes[128], scale[4];
            quantize_group(f.id, x, n, codes, scale);
            decode_table(f.id, decode_scale(f.id, scale), f.tensor_divisor, value);
            for (int i = 0; i < n; ++i) x[i] = value[get_nibble(codes, i)];
            return;
        }
    }
}

}  // namespace wush::formats
