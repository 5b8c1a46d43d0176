// Bit-exact agreement of libwush's element and scale codecs with NVIDIA's own host-callable
// converters (cuda_fp4.h, cuda_fp8.h, cuda_bf16.h, cuda_fp16.h): an oracle written elsewhere.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp4.h>
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/float_bits.h"
#include "formats/element_codecs.h"
#include "formats/group_quantizer.h"

namespace {

std::uint8_t nv_e2m1(double v) {
    return std::uint8_t(__nv_cvt_double_to_fp4(v, __NV_E2M1, cudaRoundNearest));
}
std::uint8_t nv_e4m3(double v) {
    return std::uint8_t(__nv_cvt_double_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}
std::uint8_t nv_e8m0_floor(double v) {
    return std::uint8_t(__nv_cvt_double_to_e8m0(v, __NV_SATFINITE, cudaRoundZero));
}

float nv_e4m3_value(std::uint8_t code) {
    const __half h(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3));
    return __half2float(h);
}

float as_float(std::uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// Test inputs: a strided walk over every float bit pattern (both signs, all exponents), plus
// every double within a few ulps (of float and of double) of each given boundary.
std::vector<double> sweep(const std::vector<double>& boundaries, std::uint32_t stride) {
    std::vector<double> v;
    for (std::uint64_t u = 0; u <= 0xFFFFFFFFull; u += stride) {
        const float f = as_float(std::uint32_t(u));
        if (std::isfinite(f)) v.push_back(f);
    }
    for (double b : boundaries) {
        for (double s : {b, -b}) {
            float fu = float(s), fd = float(s);
            double du = s, dd = s;
            for (int k = 0; k < 64; ++k) {
                v.insert(v.end(), {double(fu), double(fd), du, dd});
                fu = std::nextafter(fu, INFINITY);
                fd = std::nextafter(fd, -INFINITY);
                du = std::nextafter(du, INFINITY);
                dd = std::nextafter(dd, -INFINITY);
            }
        }
    }
    return v;
}

std::vector<double> e2m1_boundaries() {
    std::vector<double> b = {0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0, 8.0};
    return b;
}

// Every representable E4M3 value and every midpoint between neighbours, from NVIDIA's decoder.
std::vector<double> e4m3_boundaries() {
    std::vector<double> values;
    for (int c = 0; c < 0x7F; ++c) values.push_back(nv_e4m3_value(std::uint8_t(c)));
    std::vector<double> b = values;
    for (std::size_t i = 0; i + 1 < values.size(); ++i) b.push_back(0.5 * (values[i] + values[i + 1]));
    b.push_back(464.0);  // midpoint to the first value beyond the range
    b.push_back(480.0);
    return b;
}

TEST(NvidiaOracle, E2M1EncodeMatchesNvCvtDoubleToFp4) {
    std::size_t n = 0;
    for (double v : sweep(e2m1_boundaries(), 9973)) {
        ASSERT_EQ(wush::codec::e2m1_encode(v), nv_e2m1(v)) << "input " << v;
        ++n;
    }
    EXPECT_GT(n, 400000u);
}

TEST(NvidiaOracle, E2M1DecodeMatchesNvidia) {
    for (int c = 0; c < 16; ++c) {
        const __half h(__nv_cvt_fp4_to_halfraw(__nv_fp4_storage_t(c), __NV_E2M1));
        EXPECT_EQ(wush::codec::e2m1_decode(std::uint8_t(c)), __half2float(h)) << "code " << c;
    }
}

TEST(NvidiaOracle, E4M3EncodeMatchesNvCvtDoubleToFp8Satfinite) {
    for (double v : sweep(e4m3_boundaries(), 9973)) ASSERT_EQ(wush::codec::e4m3_encode(v), nv_e4m3(v)) << "input " << v;
}

TEST(NvidiaOracle, E4M3DecodeMatchesNvidia) {
    for (int c = 0; c < 256; ++c) {
        const float ours = wush::codec::e4m3_decode(std::uint8_t(c));
        const float theirs = nv_e4m3_value(std::uint8_t(c));
        if (std::isnan(theirs)) EXPECT_TRUE(std::isnan(ours)) << "code " << c;
        else EXPECT_EQ(ours, theirs) << "code " << c;
    }
}

TEST(NvidiaOracle, MxScaleExponentIsTheE8M0FloorOfAmax) {
    // The MXFP4 rule takes floor(log2(amax)): NVIDIA's E8M0 conversion with cudaRoundZero.
    std::vector<double> b;
    for (int e = -127; e <= 127; ++e) b.push_back(std::ldexp(1.0, e));
    for (double v : sweep(b, 9973)) {
        const float amax = float(std::fabs(v));
        if (amax == 0.0f) continue;
        const int e = wush::formats::mx_scale_exponent(amax, false);
        ASSERT_EQ(wush::codec::e8m0_from_exponent(e), nv_e8m0_floor(amax)) << "amax " << amax;
    }
}

TEST(NvidiaOracle, E8M0DecodeMatchesNvidia) {
    for (int c = 0; c < 255; ++c) {
        const __nv_bfloat16_raw raw = __nv_cvt_e8m0_to_bf16raw(__nv_fp8_storage_t(c));
        const __nv_bfloat16 b(raw);
        EXPECT_EQ(wush::codec::e8m0_decode(std::uint8_t(c)), __bfloat162float(b)) << "code " << c;
    }
    EXPECT_TRUE(std::isnan(wush::codec::e8m0_decode(0xFF)));
}

TEST(NvidiaOracle, Bf16EncodeFromDoubleMatchesNvidia) {
    std::vector<double> b;
    for (int e = -133; e <= 127; e += 3) b.push_back(std::ldexp(1.0 + 1.0 / 256.0, e));  // ties
    std::vector<double> inputs = sweep(b, 9973);
    for (double v : {HUGE_VAL, -HUGE_VAL, 0x1p128, -0x1p200, 0x1.fffffep127}) inputs.push_back(v);  // overflow
    for (double v : inputs) {
        const __nv_bfloat16 nv = __double2bfloat16(v);
        std::uint16_t theirs;
        std::memcpy(&theirs, &nv, 2);
        ASSERT_EQ(wush::bits::bf16_encode(v), theirs) << "input " << v;
    }
}

TEST(NvidiaOracle, Bf16AndF16DecodeMatchNvidiaExhaustively) {
    for (std::uint32_t u = 0; u < 0x10000; ++u) {
        const std::uint16_t bits = std::uint16_t(u);
        __nv_bfloat16_raw braw;
        __half_raw hraw;
        braw.x = bits;
        hraw.x = bits;
        const __nv_bfloat16 b(braw);
        const __half h(hraw);
        const float bf = __bfloat162float(b), hf = __half2float(h);
        const float our_bf = wush::bits::bf16_decode(bits), our_hf = wush::bits::f16_decode(bits);
        if (std::isnan(bf)) ASSERT_TRUE(std::isnan(our_bf)) << u;
        else ASSERT_EQ(our_bf, bf) << u;
        if (std::isnan(hf)) ASSERT_TRUE(std::isnan(our_hf)) << u;
        else ASSERT_EQ(wush::bits::bits_from_float(our_hf), wush::bits::bits_from_float(hf)) << u;
    }
}

}  // namespace
