// Certified float32 quantization of one group: the scalar (host + device) port of the
// certification in cpu/kernels/quantize_avx512.cpp (read its header comment). The CUDA quantize kernel
// runs it per (token, block) group; the unit test checks it against the float64 definition.
//
// Contract. y[i] are float32 values with |y_i - y_exact_i| <= bound, where y_exact is the float64
// definition (transform_group_f64). certify_group() quantizes y in float32 and returns true only
// if the codes and scale it wrote are exactly those formats::quantize_group<double>(y_exact)
// writes: every value it rounds, and its scale, lies farther than the bound (plus the float32
// roundings of the scaling itself) from a rounding boundary, and the group is neither tiny, huge
// nor non-finite. On false the outputs are garbage and the caller recomputes in float64.
//
// Contraction: every product-plus-sum here is written as an explicit fmaf or as separate
// statements whose rounding the tolerances already cover; nvcc's FMA contraction cannot change
// a result that is certified, but the float64 fallback must not be contracted (see mul_rn in
// group_quantizer.h).
#pragma once

#include <cmath>
#include <cstdint>

#include "common/float_bits.h"
#include "common/host_device.h"
#include "formats/group_quantizer.h"
#include "wush/wush.h"

namespace wush::formats {

namespace certify_detail {

using std::signbit;

using namespace certified;

// floor(log2(a)) for finite a > 0: the exponent bits for normal a, frexpf below.
WUSH_HD int floor_log2f(float a) {
    if (a >= 0x1p-126f) return int((bits::bits_from_float(a) >> 23) & 0xFFu) - 127;
    int e = 0;
    frexpf(a, &e);
    return e - 1;
}

using bits::pow2f;

// Nearest integer of t (|t| < 2^22); which neighbour wins at a tie does not matter to the
// distance checks below, and floorf keeps it independent of the host's rounding mode.
WUSH_HD float nearest_int(float t) {
    return floorf(t + 0.5f);
}

// E2M1 RNE of v (the comparisons of codec::e2m1_encode), and whether |v| lies within tol of a
// threshold (or of 0, where only the sign would change). Branch-free: on the device every lane
// holds another value, and an if-chain would split the warp.
WUSH_HD std::uint8_t e2m1_encode_checked(float v, float tol, bool& near) {
    const float a = fabsf(v);
    // The code counts the thresholds below a (ties: 0.25, 1.25, 2.5 and 5 round down to even).
    const int m = int(a > 0.25f) + int(a >= 0.75f) + int(a > 1.25f) + int(a >= 1.75f) + int(a > 2.5f) + int(a >= 3.5f) +
                  int(a > 5.0f);
    // The nearest threshold is one of the interval's bounds, so the distance to all of them is
    // the interval's test (|a - t| is the same float as a - t or t - a).
    const float d = fminf(fminf(fminf(a, fabsf(a - 0.25f)), fminf(fabsf(a - 0.75f), fabsf(a - 1.25f))),
                          fminf(fminf(fabsf(a - 1.75f), fabsf(a - 2.5f)), fminf(fabsf(a - 3.5f), fabsf(a - 5.0f))));
    if (d < tol) near = true;
    return std::uint8_t((signbit(v) ? 0x8 : 0x0) | m);
}

// The same code as e2m1_encode_checked, by E2M1's grid as integers: a piecewise-linear map (x 2
// below 2, x 1 in [2, 4), x 1/2 from 4 on: exact powers of two) puts the grid {0, .5, 1, 1.5, 2 |
// 2, 3, 4 | 4, 6} on consecutive integers and every threshold on a half-integer, and ties to the
// even code are ties to the even integer: one FADD of 1.5 x 2^23 rounds (RNE), its low bits are the
// integer, one distance test |w - n| against the half-integer. The distance is measured within
// the value's segment only, so it is exact up to a quarter of a code unit (the segments' ends are
// grid points at least 0.25 from every threshold); larger tolerances are flagged near outright
// (no group with such a tolerance certifies anyway). tests/unit/test_e2m1_grid.cpp checks codes and
// flags against e2m1_encode_checked on every float of a window of exponents.
WUSH_HD std::uint8_t e2m1_encode_grid(float v, float tol, bool& near) {
    const float a = fminf(fabsf(v), 6.0f);  // from 5 up the code is 7: clamped, w stays <= 3
    const bool mid = a >= 2.0f, top = a >= 4.0f;
    const float scale = top ? 0.5f : mid ? 1.0f : 2.0f;
    const float w = a * scale;      // grid spacing 1
    const float f = w + 0x1.8p23f;  // RNE to an integer: the one rounding
    const float n = f - 0x1.8p23f;  // exact
    const int code = int(bits::bits_from_float(f) - 0x4B400000u) + (top ? 4 : mid ? 2 : 0);
    // Distance to the nearest threshold in grid units (0.5 - |w - n|: exact near a threshold, by
    // Sterbenz), against tol in grid units; and the sign's boundary at 0.
    if (0.5f - fabsf(w - n) < tol * scale || a < tol || tol > 0.25f) near = true;
    return std::uint8_t((signbit(v) ? 0x8 : 0x0) | code);
}

WUSH_HD float group_amax_f(const float* y, int n) {
    float m = 0.0f;
    WUSH_UNROLL
    for (int i = 0; i < n; ++i) m = fmaxf(m, fabsf(y[i]));
    return m;
}

WUSH_HD bool in_certified_range(float amax) {
    return amax >= kTiny && amax <= kHuge;
}  // false for NaN

// What a group's certification decides before its elements (from its amax and, for INT4, its
// sum of squares): an element y is v = (y * pre) * post in code units, its tolerance
// |v| * rel + base, and the stored scale bytes.
struct GroupScaling {
    float pre = 0.0f, post = 1.0f, rel = 0.0f, base = 0.0f;
    std::uint8_t scale[2] = {0, 0};
};

// MX: the shared exponent e = floor(log2 amax) (OCP: e - 2) must not change within the bound.
WUSH_HD bool scaling_mx(float amax, float bound, bool ocp, GroupScaling& s) {
    const int e = floor_log2f(amax);
    const float p = pow2f(e);  // |e| <= 60: amax is in the certified range
    // The exponent changes if amax_exact may lie on the other side of 2^e or 2^(e+1).
    if (amax - p < bound || (p + p) - amax < bound) return false;
    const int es = ocp ? e - 2 : e;
    s.post = ocp ? 1.0f : 3.0f;
    s.pre = pow2f(-es);  // y * 2^-es is ldexpf(y, -es): exact, or the same rounding
    s.base = (bound * s.post) * s.pre;
    s.rel = 2.0f * kU;                           // one rounding (x3)
    s.scale[0] = codec::e8m0_from_exponent(es);  // |es| <= 62: inside E8M0's range
    return true;
}

// The E4M3 byte of a positive value sv that is exactly representable (normal: float32's top
// exponent / mantissa bits rebiased from 127 to 7; subnormal: sv / 2^-9).
WUSH_HD std::uint8_t e4m3_byte_of_exact(float sv) {
    if (sv < 0x1p-6f) return std::uint8_t(sv * 512.0f);
    return std::uint8_t((bits::bits_from_float(sv) >> 20) - (120u << 3));
}

// NVFP4: s = RNE_e4m3(amax * 10 / 6) must not change within the bound.
WUSH_HD bool scaling_nvfp4(float amax, float bound, GroupScaling& s) {
    // Round w to 3 mantissa bits, exponent at least -6, saturate.
    const float w = (amax * 10.0f) * (1.0f / 6.0f);
    const float tol_w = fmaf(w, 4.0f * kU, bound * (10.0f / 6.0f * 1.01f));
    const int ew = floor_log2f(w) > -6 ? floor_log2f(w) : -6;
    const float t = w * pow2f(3 - ew);  // w in units of the step, in [8, 16) (or below 8: subnormal)
    const float rt = nearest_int(t);
    const float step = pow2f(ew - 3);
    const float margin = (0.5f - fabsf(t - rt)) * step;
    if (margin < tol_w) return false;
    const float sv = fminf(rt * step, 448.0f);
    // A zero scale keeps only the signs (y * 0): certified only when y is exact.
    if (sv == 0.0f && bound > 0.0f) return false;
    s.pre = sv > 0.0f ? 10.0f / sv : 0.0f;
    s.base = bound * (s.pre * 1.01f);
    s.rel = 3.0f * kU;
    s.scale[0] = e4m3_byte_of_exact(sv);
    return true;
}

// INT4: the bf16 scale from the group's rms must not change within the bound. `ss` is the sum
// of squares in float32, summed in any order (its error, at most n u relative, is covered).
WUSH_HD bool scaling_int4(float ss, int n, float bound, GroupScaling& s) {
    const float w = sqrtf(ss * (1.0f / float(n))) * kInt4ScalePerRmsF;
    // |rms - rms_exact| <= bound (from y) + the float32 sum of squares (<= G u relative).
    const float tol_w = fmaf(w, float(n + 8) * kU, bound * (kInt4ScalePerRmsF * 1.01f));
    // bf16 RNE on the bits; the boundary is the midpoint between the two bf16 neighbours of w.
    const std::uint32_t wb = bits::bits_from_float(w);
    const std::uint32_t rb = (wb + 0x7FFFu + ((wb >> 16) & 1u)) & 0xFFFF0000u;
    const float mid = bits::float_from_bits((wb & 0xFFFF0000u) | 0x8000u);
    if (fabsf(w - mid) < tol_w) return false;
    const float sv = bits::float_from_bits(rb);
    s.pre = 1.0f / sv;  // 2 roundings vs y / s: in the tolerance
    s.base = bound * (s.pre * 1.01f);
    s.rel = 3.0f * kU;
    s.scale[0] = std::uint8_t((rb >> 16) & 0xFF);  // little-endian bf16
    s.scale[1] = std::uint8_t(rb >> 24);
    return true;
}

// INT4's code of t = y / s, and whether t lies within tol of a rounding boundary.
WUSH_HD std::uint8_t int4_encode_checked(float t, float y, float tol, bool& near) {
    const float rnd = nearest_int(t);
    // Boundaries are the integers -7..7 (below -7 and from 7 on, the clamp decides).
    if (fabsf(t - rnd) < tol && fabsf(rnd) <= 7.0f) near = true;
    // y / s underflowing to -0 in float32 would floor to 0; float64 floors it to -1.
    const float fl = (t == 0.0f && y < 0.0f) ? -1.0f : floorf(t);
    const float q = fminf(fmaxf(fl, -8.0f), 7.0f);
    return std::uint8_t(int(q) & 0xF);
}

}  // namespace certify_detail

// The group-level step of certify_group: from the group's amax and (INT4) its float32 sum of
// squares, the scaling of its elements; false when the group must be recomputed in float64 (amax
// outside the certified range, a scale within the bound of changing, an unknown format).
WUSH_HD bool certify_scaling(wush_format format, float amax, float ss, int n, float bound,
                             certify_detail::GroupScaling& s) {
    if (!(bound < INFINITY) || !certify_detail::in_certified_range(amax)) return false;
    switch (format) {
        case WUSH_FORMAT_MXFP4: return certify_detail::scaling_mx(amax, bound, false, s);
        case WUSH_FORMAT_MXFP4_OCP: return certify_detail::scaling_mx(amax, bound, true, s);
        case WUSH_FORMAT_NVFP4: return certify_detail::scaling_nvfp4(amax, bound, s);
        case WUSH_FORMAT_INT4: return certify_detail::scaling_int4(ss, n, bound, s);
        default: break;  // formats are validated by the callers
    }
    return false;
}

// The element-level step: y's 4-bit code under the scaling; sets `near` when y lies within its
// tolerance of a rounding boundary (the group is then not certified).
WUSH_HD std::uint8_t certify_element(wush_format format, float y, const certify_detail::GroupScaling& s, bool& near) {
    const float v = (y * s.pre) * s.post;
    const float tol = fmaf(fabsf(v), s.rel, s.base);
    if (format == WUSH_FORMAT_INT4) return certify_detail::int4_encode_checked(v, y, tol, near);
    return certify_detail::e2m1_encode_checked(v, tol, near);
}

// certify_element with E2M1's grid encoder (e2m1_encode_grid): the same codes and, for every
// tolerance a certified group can have, the same near flags. The tensor-core kernel's.
WUSH_HD std::uint8_t certify_element_grid(wush_format format, float y, const certify_detail::GroupScaling& s,
                                          bool& near) {
    const float v = (y * s.pre) * s.post;
    const float tol = fmaf(fabsf(v), s.rel, s.base);
    if (format == WUSH_FORMAT_INT4) return certify_detail::int4_encode_checked(v, y, tol, near);
    return certify_detail::e2m1_encode_grid(v, tol, near);
}

// y = T x in float64, j ascending (t == nullptr: the identity). Products of two floats are exact
// in double, so a fused multiply-add gives the same sum: this is the definition on every device.
WUSH_HD void transform_group_f64(const float* t, const float* x, int g, double* y) {
    WUSH_UNROLL
    for (int i = 0; i < g; ++i) {
        if (t == nullptr) {
            y[i] = x[i];
            continue;
        }
        double s = 0.0;
        WUSH_UNROLL
        for (int j = 0; j < g; ++j) s += double(t[i * g + j]) * double(x[j]);
        y[i] = s;
    }
}

// y = T x in float32: the FMA chain, j ascending (the order and rounding the bound assumes).
WUSH_HD void transform_group_f32(const float* t, const float* x, int g, float* y) {
    WUSH_UNROLL
    for (int i = 0; i < g; ++i) {
        if (t == nullptr) {
            y[i] = x[i];
            continue;
        }
        float acc = 0.0f;
        WUSH_UNROLL
        for (int j = 0; j < g; ++j) acc = fmaf(t[i * g + j], x[j], acc);
        y[i] = acc;
    }
}

// An upper bound of max_i ||row i of T||_2, rounded up well beyond the float32 error of the sum
// and the square root (the rule of the CPU kernels' max_row_norm).
WUSH_HD float max_row_norm_bound(const float* t, int g) {
    float best = 0.0f;
    WUSH_UNROLL
    for (int i = 0; i < g; ++i) {
        float s = 0.0f;
        WUSH_UNROLL
        for (int j = 0; j < g; ++j) s = fmaf(t[i * g + j], t[i * g + j], s);
        best = s > best ? s : best;
    }
    return sqrtf(best) * (1.0f + 1e-5f);
}

// The error bound of transform_group_f32(T, x): gamma_G ||T_i|| ||x||, with
// gamma_G = (G + 2) u rounded up by 1.05 (which also covers ||x|| computed in float32), plus an
// absolute slack. 0 for the identity (y = x exactly). +Inf when x is non-finite or so large that
// its sum of squares overflows: the group is never certified then.
WUSH_HD float group_error_bound(const float* x, int g, bool identity, float row_norm) {
    float ss = 0.0f;
    WUSH_UNROLL
    for (int j = 0; j < g; ++j) ss = fmaf(x[j], x[j], ss);
    if (!(ss <= 0x1p126f)) return INFINITY;
    if (identity) return 0.0f;
    const float c = float(g + 2) * certify_detail::kU * certify_detail::kGammaRoundUp;
    return fmaf(sqrtf(ss) * row_norm, c, certify_detail::kAbsSlack);
}

// Quantizes the float32 group y (|y - y_exact| <= bound) in `format`; true when the codes and
// scale written are certified equal to quantize_group<double>(y_exact).
WUSH_HD bool certify_group(wush_format format, const float* y, int n, float bound, std::uint8_t* codes,
                           std::uint8_t* scale) {
    float ss = 0.0f;
    if (format == WUSH_FORMAT_INT4) {
        WUSH_UNROLL
        for (int i = 0; i < n; ++i) ss = fmaf(y[i], y[i], ss);
    }
    certify_detail::GroupScaling s;
    if (!certify_scaling(format, certify_detail::group_amax_f(y, n), ss, n, bound, s)) return false;
    bool near = false;
    WUSH_UNROLL
    for (int i = 0; i < n; ++i) put_nibble(codes, i, certify_element(format, y[i], s, near));
    scale[0] = s.scale[0];
    if (format == WUSH_FORMAT_INT4) scale[1] = s.scale[1];
    return !near;
}

}  // namespace wush::formats
