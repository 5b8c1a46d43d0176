// The W4A4 GEMM, the linear forward and the runtime loss (src/cpu) against float64
// references written here: random packed operands are decoded with runtime_reference.h and
// multiplied in float64; the result must agree within 1e-5 relative in Frobenius norm for every
// shape class (m = 1, tails of m, n and k that are not multiples of the kernels' tiles), on every
// ISA the CPU has.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "calibration/calibrator.h"
#include "common/cpu_isa.h"
#include "common/error.h"
#include "cpu/activation_quantizer.h"
#include "cpu/gemm.h"
#include "cpu/linear_forward.h"
#include "eval/layer_loss.h"
#include "eval/runtime_loss.h"
#include "formats/block_format.h"
#include "prequant/rtn.h"
#include "runtime_reference.h"
#include "transforms/block_transform.h"

namespace wush {
namespace {

using test::supported_isas;
using wush::Isa;

struct Packed {
    std::vector<std::uint8_t> codes, scales;
};

// Random codes, and scales that stay in a sane range but cover the encodings (MX exponents around
// 0 and the smallest one, E4M3 normals, subnormals and negatives, arbitrary positive BF16).
Packed random_packed(wush_format f, std::size_t rows, std::size_t k, std::mt19937& rng) {
    const formats::FormatSpec& s = formats::spec(f);
    Packed p;
    p.codes.resize(rows * k / 2);
    for (auto& c : p.codes) c = std::uint8_t(rng());
    const std::size_t groups = rows * k / s.group;
    std::uniform_int_distribution<int> pick(0, 99);
    for (std::size_t i = 0; i < groups; ++i) {
        const int u = pick(rng);
        if (f == WUSH_FORMAT_INT4) {
            const float v = std::ldexp(1.0f + float(u) / 100.0f, u % 9 - 5);
            std::uint32_t bits;
            std::memcpy(&bits, &v, 4);
            p.scales.push_back(std::uint8_t(bits >> 16));
            p.scales.push_back(std::uint8_t(bits >> 24));
        } else if (f == WUSH_FORMAT_NVFP4) {
            std::uint8_t c = std::uint8_t(u < 5 ? u : 0x28 + u % 40);  // a few subnormals
            if (u % 17 == 0) c |= 0x80;                                // and negatives
            p.scales.push_back(c);
        } else {
            p.scales.push_back(std::uint8_t(u == 0 ? 0 : 120 + u % 15));
        }
    }
    return p;
}

// Float64 dequantization of rows x k packed values.
std::vector<double> dequantize(wush_format f, const Packed& p, std::size_t rows, std::size_t k) {
    const formats::FormatSpec& s = formats::spec(f);
    std::vector<double> out(rows * k);
    for (std::size_t e = 0; e < rows * k; ++e) {
        const std::uint8_t nib = (p.codes[e / 2] >> (4 * (e % 2))) & 0xF;
        const std::size_t grp = e / s.group;
        out[e] =
            test::ref_element(f, nib) * test::ref_scale(f, p.scales.data() + grp * s.scale_bytes) * test::ref_factor(f);
    }
    return out;
}

double rel_frobenius(const std::vector<float>& got, const std::vector<double>& ref) {
    double num = 0.0, den = 0.0;
    for (std::size_t i = 0; i < ref.size(); ++i) {
        num += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
        den += ref[i] * ref[i];
    }
    return std::sqrt(num / den);
}

// `pack`: a prepared layer's packed weights (panels, and the AVX2 row blocks for m <= 4). Every
// call also checks gemm()'s report on its output against a scan of what it wrote.
std::vector<float> run_gemm(Isa isa, const formats::PackedMatrix& w, const Packed& a, std::size_t m, wush_dtype y_dtype,
                            std::vector<std::uint16_t>* bf16 = nullptr, const cpu::PanelPack* pack = nullptr,
                            const float* bias = nullptr) {
    const formats::FormatSpec& f = formats::spec(w.format);
    const std::size_t threads = std::size_t(std::max(omp_get_max_threads(), 2));
    std::vector<std::byte> scratch(cpu::gemm_scratch_bytes(f, m, w.d_out, w.d_in, threads));
    std::vector<float> y(m * w.d_out, -1.0f);
    bool reported = false, scanned = true;
    if (y_dtype == WUSH_DTYPE_BF16) {
        bf16->assign(m * w.d_out, 0);
        reported = cpu::gemm(isa, threads, w, a.codes, a.scales, m, y_dtype, bf16->data(), scratch, pack, bias);
        for (std::uint16_t h : *bf16) scanned = scanned && (h & 0x7F80) != 0x7F80;
    } else {
        reported = cpu::gemm(isa, threads, w, a.codes, a.scales, m, y_dtype, y.data(), scratch, pack, bias);
        for (float v : y) scanned = scanned && std::isfinite(v);
    }
    EXPECT_EQ(reported, scanned) << "gemm()'s finiteness report, " << isa_name(isa) << " m=" << m
                                 << (pack ? " prepared" : "");
    return y;
}

struct Shape {
    std::size_t m, n, k;
};

std::vector<Shape> shapes(std::size_t g) {
    // m: the row-streaming sizes (1..4), the panel tile (4) and its tails; n: panel (32) and
    // AVX2 sub-panel (8) tails; k: not multiples of the 64/128-element chunks, and the AVX-512
    // row blocks' 16-group spans: one full span, and last spans of every lane packing (1-2 groups
    // per row: 18, 34; 3-4: 3, 4; 5-8: 6, 7; 9-15: 28 groups).
    std::vector<Shape> out;
    const std::size_t ks[] = {g, 4 * g, 28 * g, 6 * g, 16 * g, 18 * g, 34 * g, 3 * g, 7 * g};
    const std::size_t ms[] = {1, 2, 3, 4, 5, 6, 7, 9, 33};
    const std::size_t ns[] = {1, 7, 8, 31, 32, 33, 70};
    std::size_t i = 0;
    for (std::size_t m : ms)
        for (std::size_t n : ns) out.push_back({m, n, ks[i++ % 9]});
    return out;
}

const wush_format kFormats[] = {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4, WUSH_FORMAT_INT4, WUSH_FORMAT_MXFP4_OCP};

class GemmOnIsa : public ::testing::TestWithParam<Isa> {};

TEST_P(GemmOnIsa, MatchesFloat64ProductOfDequantizedOperands) {
    const Isa isa = GetParam();
    std::mt19937 rng(11);
    for (wush_format format : kFormats) {
        const formats::FormatSpec& f = formats::spec(format);
        for (const Shape& s : shapes(f.group)) {
            const Packed a = random_packed(format, s.m, s.k, rng), b = random_packed(format, s.n, s.k, rng);
            const formats::PackedMatrix w{format, s.n, s.k, formats::ByteView(b.codes), formats::ByteView(b.scales)};
            const std::vector<double> ad = dequantize(format, a, s.m, s.k), bd = dequantize(format, b, s.n, s.k);
            std::vector<double> ref(s.m * s.n, 0.0);
            for (std::size_t r = 0; r < s.m; ++r)
                for (std::size_t c = 0; c < s.n; ++c)
                    for (std::size_t i = 0; i < s.k; ++i) ref[r * s.n + c] += ad[r * s.k + i] * bd[c * s.k + i];
            const std::vector<float> y = run_gemm(isa, w, a, s.m, WUSH_DTYPE_F32);
            EXPECT_LE(rel_frobenius(y, ref), 1e-5) << f.name << " m=" << s.m << " n=" << s.n << " k=" << s.k;
            // The prepared layer's layouts (packed once): the same product.
            const cpu::PanelPack pack(isa, 2, w);
            if (isa != Isa::Scalar && s.k % 32 == 0) {
                EXPECT_NE(pack.row_blocks(), nullptr);
            }
            const std::vector<float> yp = run_gemm(isa, w, a, s.m, WUSH_DTYPE_F32, nullptr, &pack);
            EXPECT_LE(rel_frobenius(yp, ref), 1e-5)
                << "prepared " << f.name << " m=" << s.m << " n=" << s.n << " k=" << s.k;
            std::vector<std::uint16_t> hp;
            run_gemm(isa, w, a, s.m, WUSH_DTYPE_BF16, &hp, &pack);
            for (std::size_t i = 0; i < yp.size(); ++i) {
                const std::uint16_t sign = std::signbit(yp[i]) ? 0x8000 : 0;
                const double mag = std::fabs(double(yp[i]));
                const std::uint16_t expect =
                    std::uint16_t(sign | (mag > 0.0 ? test::bf16_bits(test::ref_bf16(mag)) : 0));
                ASSERT_EQ(hp[i], expect) << "prepared " << f.name << " m=" << s.m << " n=" << s.n << " i=" << i;
            }
            // BF16 output is the RNE of the float32 result.
            std::vector<std::uint16_t> h;
            run_gemm(isa, w, a, s.m, WUSH_DTYPE_BF16, &h);
            for (std::size_t i = 0; i < y.size(); ++i) {
                const std::uint16_t sign = std::signbit(y[i]) ? 0x8000 : 0;
                const double mag = std::fabs(double(y[i]));
                const std::uint16_t expect =
                    std::uint16_t(sign | (mag > 0.0 ? test::bf16_bits(test::ref_bf16(mag)) : 0));
                ASSERT_EQ(h[i], expect) << f.name << " m=" << s.m << " n=" << s.n << " k=" << s.k << " i=" << i
                                        << " y=" << y[i];
            }
        }
    }
}

// E8M0 scales at both ends of their range (2^-127, a float32 subnormal, to 2^127) whose products
// are moderate: the AVX-512 panels apply a group's two scales as one exponent (kernels.h,
// GemmActivations::alpha_rest), so only the product has to be in range. (The other kernels multiply
// by one scale and then the other, and may overflow on the way: the API then reports NON_FINITE.)
TEST(GemmExponents, E8M0ScalesAtTheEndsOfTheirRange) {
    if (!isa_supported(Isa::Avx512Vnni)) GTEST_SKIP() << "the CPU lacks AVX-512 VNNI";
    std::mt19937 rng(5);
    for (wush_format format : {WUSH_FORMAT_MXFP4, WUSH_FORMAT_MXFP4_OCP}) {
        const std::size_t k = 96, n = 40, groups = k / 32;
        for (std::size_t m : {5, 9, 33}) {
            Packed a = random_packed(format, m, k, rng), b = random_packed(format, n, k, rng);
            // Weight row 0: group g's exponent near one end (codes 3-6 or 248-251); the other rows
            // within 3 of it (down to code 0, 2^-127); the activations' near the other end (codes
            // 0-9, 245-254), so that every product of two scales lies within 2^-6 .. 2^6.
            for (std::size_t g = 0; g < groups; ++g)
                b.scales[g] = std::uint8_t(g % 2 == 0 ? 3 + rng() % 4 : 248 + rng() % 4);
            for (std::size_t r = 0; r < m; ++r)
                for (std::size_t g = 0; g < groups; ++g)
                    a.scales[r * groups + g] = std::uint8_t(127 - (int(b.scales[g]) - 127) + int(rng() % 7) - 3);
            for (std::size_t c = 1; c < n; ++c)
                for (std::size_t g = 0; g < groups; ++g)
                    b.scales[c * groups + g] = std::uint8_t(std::clamp(int(b.scales[g]) + int(rng() % 7) - 3, 0, 254));
            const formats::PackedMatrix w{format, n, k, formats::ByteView(b.codes), formats::ByteView(b.scales)};
            const std::vector<double> ad = dequantize(format, a, m, k), bd = dequantize(format, b, n, k);
            std::vector<double> ref(m * n, 0.0);
            for (std::size_t r = 0; r < m; ++r)
                for (std::size_t c = 0; c < n; ++c)
                    for (std::size_t i = 0; i < k; ++i) ref[r * n + c] += ad[r * k + i] * bd[c * k + i];
            const cpu::PanelPack pack(Isa::Avx512Vnni, 2, w);
            for (const cpu::PanelPack* packed : {static_cast<const cpu::PanelPack*>(nullptr), &pack}) {
                const std::vector<float> y = run_gemm(Isa::Avx512Vnni, w, a, m, WUSH_DTYPE_F32, nullptr, packed);
                EXPECT_LE(rel_frobenius(y, ref), 1e-6)
                    << formats::spec(format).name << " m=" << m << (packed ? " prepared" : "");
            }
        }
    }
}

// Finite operands whose product overflows (MXFP4: every element +6, activation scales 2^127), and
// a float32 output that overflows only in its rounding to bf16 (a bias of float32's maximum): on
// every path (row streaming and panels, per call and prepared) gemm() reports what it wrote.
TEST_P(GemmOnIsa, NonFiniteOutputsAreReportedOnEveryPath) {
    const Isa isa = GetParam();
    const std::size_t n = 40, k = 64;
    const wush_format format = WUSH_FORMAT_MXFP4;
    Packed b{std::vector<std::uint8_t>(n * k / 2, 0x77), std::vector<std::uint8_t>(n * k / 32, 127)};
    const formats::PackedMatrix w{format, n, k, formats::ByteView(b.codes), formats::ByteView(b.scales)};
    const cpu::PanelPack pack(isa, 2, w);
    const std::vector<float> huge_bias(n, std::numeric_limits<float>::max());
    for (std::size_t m : {2, 9}) {
        for (const cpu::PanelPack* packed : {static_cast<const cpu::PanelPack*>(nullptr), &pack}) {
            const std::string where =
                std::string(isa_name(isa)) + " m=" + std::to_string(m) + (packed ? " prepared" : "");
            Packed a{std::vector<std::uint8_t>(m * k / 2, 0x77), std::vector<std::uint8_t>(m * k / 32, 254)};
            std::vector<std::uint16_t> h;
            const std::vector<float> y = run_gemm(isa, w, a, m, WUSH_DTYPE_F32, nullptr, packed);
            EXPECT_EQ(y[0], std::numeric_limits<float>::infinity()) << where;
            run_gemm(isa, w, a, m, WUSH_DTYPE_BF16, &h, packed);
            EXPECT_EQ(h[0], 0x7F80) << where;
            // 6 x 6 x 64 / 36 = 64 in every output, plus float32's maximum: finite in float32,
            // infinite in bf16.
            a.scales.assign(a.scales.size(), 127);
            const std::vector<float> y2 = run_gemm(isa, w, a, m, WUSH_DTYPE_F32, nullptr, packed, huge_bias.data());
            EXPECT_EQ(y2[0], std::numeric_limits<float>::max()) << where;
            run_gemm(isa, w, a, m, WUSH_DTYPE_BF16, &h, packed, huge_bias.data());
            EXPECT_EQ(h[0], 0x7F80) << where;
        }
    }
}

TEST_P(GemmOnIsa, LargeShapeAndThreadCountIndependence) {
    const Isa isa = GetParam();
    std::mt19937 rng(12);
    for (wush_format format : {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4}) {
        const std::size_t m = 70, n = 130, k = 1024;
        const Packed a = random_packed(format, m, k, rng), b = random_packed(format, n, k, rng);
        const formats::PackedMatrix w{format, n, k, formats::ByteView(b.codes), formats::ByteView(b.scales)};
        const int saved = omp_get_max_threads();
        omp_set_num_threads(1);
        const std::vector<float> one = run_gemm(isa, w, a, m, WUSH_DTYPE_F32);
        omp_set_num_threads(3);
        const std::vector<float> three = run_gemm(isa, w, a, m, WUSH_DTYPE_F32);
        omp_set_num_threads(saved);
        EXPECT_EQ(one, three) << formats::spec(format).name;
        // The row-streaming kernel too, on weights large enough to be split among threads.
        const std::size_t n_big = 4200;
        const Packed big = random_packed(format, n_big, k, rng);
        const formats::PackedMatrix wb{format, n_big, k, formats::ByteView(big.codes), formats::ByteView(big.scales)};
        const cpu::PanelPack pack(isa, 2, wb);
        for (std::size_t mm : {std::size_t(1), std::size_t(3), std::size_t(6)}) {
            omp_set_num_threads(1);
            const std::vector<float> s1 = run_gemm(isa, wb, a, mm, WUSH_DTYPE_F32);
            const std::vector<float> p1 = run_gemm(isa, wb, a, mm, WUSH_DTYPE_F32, nullptr, &pack);
            omp_set_num_threads(2);
            const std::vector<float> s2 = run_gemm(isa, wb, a, mm, WUSH_DTYPE_F32);
            const std::vector<float> p2 = run_gemm(isa, wb, a, mm, WUSH_DTYPE_F32, nullptr, &pack);
            omp_set_num_threads(saved);
            EXPECT_EQ(s1, s2) << "m=" << mm;
            EXPECT_EQ(p1, p2) << "prepared m=" << mm;
            // Chunks are claimed dynamically: repeated calls must not depend on who ran what.
            omp_set_num_threads(2);
            for (int rep = 0; rep < 5; ++rep) EXPECT_EQ(p1, run_gemm(isa, wb, a, mm, WUSH_DTYPE_F32, nullptr, &pack));
            omp_set_num_threads(saved);
        }
    }
}

// Callers on several threads at once (one context each): the work pool serves one call at a time
// and the others run on their own thread; every result is the single-caller one.
TEST_P(GemmOnIsa, ConcurrentCallersGetTheSameResults) {
    const Isa isa = GetParam();
    std::mt19937 rng(13);
    const std::size_t n = 2100, k = 1024;
    const Packed b = random_packed(WUSH_FORMAT_MXFP4, n, k, rng);
    const formats::PackedMatrix w{WUSH_FORMAT_MXFP4, n, k, formats::ByteView(b.codes), formats::ByteView(b.scales)};
    const cpu::PanelPack pack(isa, 2, w);
    for (std::size_t m : {std::size_t(1), std::size_t(12)}) {
        const Packed a = random_packed(WUSH_FORMAT_MXFP4, m, k, rng);
        const std::vector<float> expect = run_gemm(isa, w, a, m, WUSH_DTYPE_F32);
        const std::vector<double> expect64(expect.begin(), expect.end());
        std::vector<int> bad(3, 0);
        std::vector<std::thread> callers;
        for (std::size_t t = 0; t < bad.size(); ++t)
            callers.emplace_back([&, t] {
                omp_set_num_threads(2);
                for (int rep = 0; rep < 4; ++rep) {
                    // Odd callers use the prepared layout (another summation order for m <= 4).
                    const std::vector<float> y =
                        run_gemm(isa, w, a, m, WUSH_DTYPE_F32, nullptr, t % 2 ? &pack : nullptr);
                    if (t % 2 ? rel_frobenius(y, expect64) > 1e-6 : y != expect) ++bad[t];
                }
            });
        for (std::thread& c : callers) c.join();
        for (std::size_t t = 0; t < bad.size(); ++t) EXPECT_EQ(bad[t], 0) << "caller " << t << " m=" << m;
    }
}

TEST(Gemm, NonFiniteActivationScaleIsRejected) {
    const formats::FormatSpec& f = formats::spec(WUSH_FORMAT_MXFP4);
    std::vector<std::uint8_t> scales(2 * 4, 127);
    scales[5] = 0xFF;  // E8M0 NaN
    try {
        cpu::check_activation_scales(f, scales, 2, 128);
        ADD_FAILURE() << "no error";
    } catch (const Error& e) {
        EXPECT_EQ(e.status(), WUSH_ERR_NON_FINITE);
        EXPECT_NE(std::string(e.what()).find("row 1, group 1"), std::string::npos) << e.what();
    }
}

// ---- the linear forward and the runtime loss -----------------------------------------------------

struct Layer {
    std::size_t d_out, d_in, n;
    std::vector<float> w, x;
};

Layer make_layer(std::size_t d_out, std::size_t d_in, std::size_t n, std::uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> gauss(0.0f, 1.0f);
    Layer l{d_out, d_in, n, std::vector<float>(d_out * d_in), std::vector<float>(n * d_in)};
    for (float& v : l.w) v = gauss(rng) * 0.05f;
    for (std::size_t t = 0; t < n; ++t)
        for (std::size_t j = 0; j < d_in; ++j) l.x[t * d_in + j] = gauss(rng) * (j % 13 == 0 ? 8.0f : 1.0f);
    return l;
}

BlockTransform layer_transform(const Layer& l, TransformKind kind, std::size_t g) {
    Calibrator c(l.d_in, g, MomentMode::BlockDiagonal);
    c.add(WUSH_DTYPE_F32, l.x.data(), l.n);
    return build_transform({kind, 0.01, 3}, c, l.w, l.d_out);
}

TEST_P(GemmOnIsa, LinearForwardIsQuantizeThenGemmInItsWorkspace) {
    const Isa isa = GetParam();
    const Layer l = make_layer(40, 128, 21, 21);
    for (wush_format format : kFormats) {
        const formats::FormatSpec& f = formats::spec(format);
        const BlockTransform t = layer_transform(l, TransformKind::WUSH, f.group);
        const formats::PackedMatrix q = prequantize_rtn(t, f, l.w, l.d_out);
        for (std::size_t n : {std::size_t(1), std::size_t(4), std::size_t(21)}) {
            // A workspace for one thread, used by a multi-threaded call.
            std::vector<std::byte> ws(cpu::linear_forward_workspace_bytes(t, q, n, 1));
            std::vector<float> y(n * l.d_out);
            const MatrixUse use = classify_matrices(t);
            cpu::linear_forward(isa, 4, t, use, q, WUSH_DTYPE_F32, l.x.data(), n, WUSH_DTYPE_F32, y.data(), ws);
            const formats::PackedSizes sz = formats::packed_sizes(f, n, l.d_in);
            Packed a{std::vector<std::uint8_t>(sz.codes), std::vector<std::uint8_t>(sz.scales)};
            std::vector<float> scratch(cpu::quantize_scratch_floats(t, use));
            cpu::quantize_activations(t, use, f, WUSH_DTYPE_F32, l.x.data(), n, a.codes, a.scales, isa, scratch, 2);
            EXPECT_EQ(y, run_gemm(isa, q, a, n, WUSH_DTYPE_F32)) << f.name << " n=" << n;
        }
    }
}

// The runtime loss with Y_q from the CPU runtime on `isa` (what the C API hands it through the
// backend interface).
double cpu_runtime_loss(Isa isa, std::size_t threads, const BlockTransform& t, const formats::PackedMatrix& q,
                        std::span<const float> w, std::span<const float> x, std::size_t n) {
    const std::size_t tile = eval::runtime_loss_tile_tokens(n);
    std::vector<std::byte> workspace(cpu::linear_forward_workspace_bytes(t, q, tile, threads));
    const MatrixUse use = classify_matrices(t);
    const auto forward = [&](const float* xt, std::size_t rows, float* y) {
        cpu::linear_forward(isa, threads, t, use, q, WUSH_DTYPE_F32, xt, rows, WUSH_DTYPE_F32, y, workspace);
    };
    return eval::runtime_layer_loss(forward, w, q.d_out, q.d_in, x, n);
}

TEST_P(GemmOnIsa, RuntimeLossEqualsReferenceLoss) {
    const Isa isa = GetParam();
    const Layer l = make_layer(96, 256, 64, 22);
    for (wush_format format : kFormats) {
        const formats::FormatSpec& f = formats::spec(format);
        for (TransformKind kind : {TransformKind::Identity, TransformKind::Hadamard, TransformKind::WUSH}) {
            const BlockTransform t = layer_transform(l, kind, f.group);
            const formats::PackedMatrix q = prequantize_rtn(t, f, l.w, l.d_out);
            const double ref = eval::layer_loss(t, q, l.w, l.x, l.n);
            const double got = cpu_runtime_loss(isa, 2, t, q, l.w, l.x, l.n);
            EXPECT_NEAR(got, ref, 1e-6 * ref) << f.name << " " << transform_kind_name(kind);
        }
    }
}

// Finite, representable inputs whose product overflows float32: the runtime loss used to return
// infinity with success where the reference loss path reports NON_FINITE.
TEST(RuntimeLoss, OverflowingOutputIsNonFinite) {
    Layer l = make_layer(16, 64, 8, 3);
    for (float& v : l.w) v *= 1e30f;
    for (float& v : l.x) v *= 1e30f;
    const formats::FormatSpec& f = formats::spec(WUSH_FORMAT_MXFP4);
    const BlockTransform t = layer_transform(l, TransformKind::Identity, f.group);
    const formats::PackedMatrix q = prequantize_rtn(t, f, l.w, l.d_out);
    try {
        const double loss = cpu_runtime_loss(Isa::Scalar, 1, t, q, l.w, l.x, l.n);
        ADD_FAILURE() << "returned " << loss;
    } catch (const Error& e) {
        EXPECT_EQ(e.status(), WUSH_ERR_NON_FINITE) << e.what();
    }
}

INSTANTIATE_TEST_SUITE_P(Isas, GemmOnIsa, ::testing::ValuesIn(supported_isas()),
                         [](const auto& info) { return std::string(isa_name(info.param)); });

}  // namespace
}  // namespace wush
