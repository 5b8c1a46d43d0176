// The BF16 prefill GEMM's device source (cuda/gemm/gemm_bf16_prefill_kernel.cuh) on the CPU, through
// tests/unit/cuda_host_emulation.h (threads, barriers, deferred cp.async) and a BF16 mma.sync
// m16n8k16 written below from the PTX ISA's fragment layouts (independently of the kernel's
// indexing), against float64:
//  - the in-register W4 -> BF16 conversion: every E2M1 code times every scale of each format
//    gives the BF16 that equals the float64 product (exact) wherever float32 holds the product;
//  - the W scales' stage-major re-layout: every (row, group) found where the kernel reads it,
//    padding rows zero;
//  - whole products (ragged m, n; several stages; F32 and BF16 output) against float64.
#include "cuda_host_emulation.h"  // first: defines the CUDA spellings

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace wush_emu {

// d += A B for mma.sync.m16n8k16.row.col.f32.bf16.bf16.f32. PTX ISA fragment layouts (g = lane / 4,
// t = lane % 4; each register holds two BF16, the lower column / k index in the low half):
//   A 16 x 16: a0 (g, 2t..2t+1), a1 (g+8, 2t..2t+1), a2 (g, 2t+8..2t+9), a3 (g+8, 2t+8..2t+9)
//   B 16 x 8:  b0 (k 2t..2t+1, n g), b1 (k 2t+8..2t+9, n g)
//   C 16 x 8:  c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1)
// The products are exact in float64 and summed there, then added to the accumulator once (an
// exact model: the hardware's float32 accumulation differs by rounding only, which the float64
// comparison's tolerance covers). Named apart from any BF16 MMA of the shared emulation header.
inline double bf16_value(std::uint32_t reg, int half) {
    const std::uint32_t u = ((reg >> (16 * half)) & 0xFFFFu) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return double(f);
}

inline void mma_bf16_exact(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
    const int t = int(t_idx.x), w = t / 32, l = t % 32;
    for (int i = 0; i < 4; ++i) g.mslots[w][l][i] = a[i];
    g.mslots[w][l][4] = b0;
    g.mslots[w][l][5] = b1;
    g.warps[w]->arrive_and_wait();
    double A[16][16] = {}, B[16][8] = {};
    for (int lane = 0; lane < 32; ++lane) {
        const int gq = lane / 4, tq = lane % 4;
        for (int h = 0; h < 2; ++h) {
            A[gq][2 * tq + h] = bf16_value(g.mslots[w][lane][0], h);
            A[gq + 8][2 * tq + h] = bf16_value(g.mslots[w][lane][1], h);
            A[gq][2 * tq + 8 + h] = bf16_value(g.mslots[w][lane][2], h);
            A[gq + 8][2 * tq + 8 + h] = bf16_value(g.mslots[w][lane][3], h);
            B[2 * tq + h][gq] = bf16_value(g.mslots[w][lane][4], h);
            B[2 * tq + 8 + h][gq] = bf16_value(g.mslots[w][lane][5], h);
        }
    }
    g.warps[w]->arrive_and_wait();
    const int gq = l / 4, tq = l % 4;
    for (int e = 0; e < 4; ++e) {
        const int r = gq + 8 * (e >> 1), c = 2 * tq + (e & 1);
        double s = 0;
        for (int k = 0; k < 16; ++k) s += A[r][k] * B[k][c];
        d[e] = float(double(d[e]) + s);
    }
}

}  // namespace wush_emu

#include "gemm/gemm_bf16_prefill_kernel.cuh"

namespace {

using namespace wush;
namespace bp = wush::cuda::bf16_prefill_detail;

const wush_format kFormats[] = {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4, WUSH_FORMAT_MXFP4_OCP};
int group_of(wush_format f) {
    return f == WUSH_FORMAT_NVFP4 ? 16 : 32;
}
double tensor_factor(wush_format f) {
    return f == WUSH_FORMAT_MXFP4 ? 1.0 / 3.0 : f == WUSH_FORMAT_NVFP4 ? 0.1 : 1.0;
}

// Independent decoders (the OCP definitions): E2M1 with the sign in bit 3, E8M0 = 2^(b - 127)
// (255 is NaN), E4M3 with bias 7 (0x7F / 0xFF are NaN).
double e2m1(unsigned nib) {
    static const double kMag[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
    return (nib & 8) ? -kMag[nib & 7] : kMag[nib & 7];
}
double scale_of(wush_format f, unsigned b) {
    if (f != WUSH_FORMAT_NVFP4) return std::ldexp(1.0, int(b) - 127);
    const int e = (b >> 3) & 0xF, m = b & 7;
    const double v = e == 0 ? std::ldexp(double(m), -9) : std::ldexp(8.0 + m, e - 10);
    return (b & 0x80) ? -v : v;
}
bool scale_byte_valid(wush_format f, unsigned b) {
    return f == WUSH_FORMAT_NVFP4 ? (b & 0x7F) != 0x7F : b != 255;
}

double bf16_to_double(std::uint16_t h) {
    const std::uint32_t u = std::uint32_t(h) << 16;
    float v;
    std::memcpy(&v, &u, 4);
    return double(v);
}

// The BF16 bits of a float64 known to be exact in BF16 (asserted by the caller).
std::uint16_t bf16_bits_exact(double v) {
    const float f = float(v);
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    return std::uint16_t(u >> 16);
}

// Every code at every nibble position times every valid scale: the BF16 equals the float64
// product where that is below float32's overflow (2^128); past it, an infinity of its sign, as
// the reference path's float32 dequantization gives.
TEST(Bf16PrefillEmulation, EveryCodeTimesEveryScaleIsExact) {
    for (wush_format f : kFormats) {
        const bp::MagnitudeTables tables = bp::magnitude_tables(f);
        long long checked = 0;
        for (unsigned sb = 0; sb < 256; ++sb) {
            if (!scale_byte_valid(f, sb)) continue;
            const double s = scale_of(f, sb);
            ASSERT_EQ(bf16_to_double(bf16_bits_exact(s)), s) << "scale byte " << sb << " not exact in BF16";
            const std::uint32_t s2 = bf16_bits_exact(s) * 0x10001u;
            for (unsigned v = 0; v < 65536; v += (sb % 17 == 0 ? 1 : 97)) {  // every pair of bytes for some scales
                const std::uint32_t lo = v & 0xFF, hi = v >> 8;
                std::uint32_t b0 = 0, b1 = 0;
                bp::w4_to_bf16_fragment(tables, lo | 0xABCD0000u, hi | 0x12345600u, s2, b0, b1);  // high bytes ignored
                const unsigned nib[4] = {lo & 15, lo >> 4, hi & 15, hi >> 4};
                const std::uint16_t got[4] = {std::uint16_t(b0), std::uint16_t(b0 >> 16), std::uint16_t(b1),
                                              std::uint16_t(b1 >> 16)};
                for (int i = 0; i < 4; ++i) {
                    const double want = e2m1(nib[i]) * s;
                    const double g = bf16_to_double(got[i]);
                    if (std::fabs(want) >= 0x1p128) {
                        ASSERT_TRUE(std::isinf(g) && std::signbit(g) == std::signbit(want))
                            << "format " << int(f) << " scale " << sb << " code " << nib[i];
                    } else {
                        ASSERT_EQ(g, want) << "format " << int(f) << " scale " << sb << " code " << nib[i];
                        ASSERT_EQ(std::signbit(g), std::signbit(want)) << "sign of zero, code " << nib[i];
                    }
                    ++checked;
                }
            }
        }
        EXPECT_GT(checked, 1000000);
    }
}

struct Operand {
    std::vector<std::uint8_t> codes, scales;
    std::vector<double> values;  // code x scale (no per-tensor factor)
};

Operand random_operand(wush_format f, std::size_t rows, std::size_t k, std::mt19937& rng) {
    const int G = group_of(f);
    Operand o;
    o.codes.resize(rows * k / 2);
    o.scales.resize(rows * k / G);
    for (auto& c : o.codes) c = std::uint8_t(rng());
    for (auto& s : o.scales) s = std::uint8_t(f == WUSH_FORMAT_NVFP4 ? 0x20 + rng() % 0x40 : 120 + rng() % 14);
    o.values.resize(rows * k);
    for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t i = 0; i < k; ++i) {
            const std::uint8_t byte = o.codes[r * k / 2 + i / 2];
            o.values[r * k + i] = e2m1(i % 2 ? byte >> 4 : byte & 15) * scale_of(f, o.scales[(r * k + i) / G]);
        }
    return o;
}

template <int G>
std::vector<std::uint32_t> relaid_scales(wush_format f, const Operand& w, std::size_t n, std::size_t k, int n_pad) {
    std::vector<std::uint32_t> out((k / bp::BK) * n_pad * bp::Layout<G>::kSpr, 0xDEADBEEFu);
    wush_emu::launch(wush_emu::Dim{3, 1, 1}, 64, 0,
                     [&] { bp::w_scales_kernel<G>(f, int(n), n_pad, (long long)k, w.scales.data(), out.data()); });
    return out;
}

// The stage-major layout: pair j of row r in stage kt is group kt * kSpr + j of row r.
template <int G>
void check_relayout(wush_format f, std::mt19937& rng) {
    const std::size_t n = 6, k = 96;
    const int n_pad = 8, spr = bp::Layout<G>::kSpr;
    const Operand w = random_operand(f, n, k, rng);
    const std::vector<std::uint32_t> out = relaid_scales<G>(f, w, n, k, n_pad);
    for (std::size_t kt = 0; kt < k / bp::BK; ++kt)
        for (int r = 0; r < n_pad; ++r)
            for (int j = 0; j < spr; ++j) {
                const std::uint32_t v = out[(kt * n_pad + r) * spr + j];
                if (r >= int(n)) {
                    EXPECT_EQ(v, 0u);
                    continue;
                }
                const double s = scale_of(f, w.scales[r * (k / G) + kt * spr + j]);
                EXPECT_EQ(v & 0xFFFFu, bf16_bits_exact(s));
                EXPECT_EQ(v >> 16, bf16_bits_exact(s));
            }
}

TEST(Bf16PrefillEmulation, ScaleRelayout) {
    std::mt19937 rng(7);
    check_relayout<32>(WUSH_FORMAT_MXFP4, rng);
    check_relayout<16>(WUSH_FORMAT_NVFP4, rng);
}

template <int G>
void check_product(wush_format f, std::size_t m, std::size_t n, std::size_t k, bool y_bf16, std::mt19937& rng) {
    SCOPED_TRACE(::testing::Message() << "format " << int(f) << " m " << m << " n " << n << " k " << k << " bf16 "
                                      << y_bf16);
    const Operand a = random_operand(f, m, k, rng), w = random_operand(f, n, k, rng);
    std::vector<std::uint16_t> a_bf16(m * k);
    for (std::size_t i = 0; i < m * k; ++i) a_bf16[i] = bf16_bits_exact(a.values[i]);
    std::vector<std::uint8_t> wc(w.codes.size() + 16);
    std::uint8_t* wcp = wc.data() + (16 - reinterpret_cast<std::uintptr_t>(wc.data()) % 16) % 16;
    std::memcpy(wcp, w.codes.data(), w.codes.size());
    const int n_pad = int((n + bp::kScaleRowPad - 1) / bp::kScaleRowPad * bp::kScaleRowPad);
    const std::vector<std::uint32_t> scales = relaid_scales<G>(f, w, n, k, n_pad);
    std::vector<float> y32(m * n, NAN);
    std::vector<std::uint16_t> y16(m * n, 0xFFFF);
    bp::Bf16PrefillParams p;
    p.m = int(m);
    p.n = int(n);
    p.k = (long long)k;
    p.a = a_bf16.data();
    p.w_codes = wcp;
    p.w_scales = scales.data();
    p.n_pad = n_pad;
    p.tables = bp::magnitude_tables(f);
    const double alpha = tensor_factor(f) * tensor_factor(f);
    p.alpha = float(alpha);
    p.y = y_bf16 ? static_cast<void*>(y16.data()) : static_cast<void*>(y32.data());
    p.y_bf16 = y_bf16;
    const wush_emu::Dim grid{unsigned((n + bp::BN - 1) / bp::BN), unsigned((m + bp::BM - 1) / bp::BM), 1};
    wush_emu::launch(grid, bp::kThreads, 0, [&] { bp::bf16_prefill_kernel<G>(p); });
    int bad = 0;
    for (std::size_t i = 0; i < m; ++i)
        for (std::size_t j = 0; j < n; ++j) {
            double ref = 0, abs_sum = 0;
            for (std::size_t e = 0; e < k; ++e) {
                ref += a.values[i * k + e] * w.values[j * k + e];
                abs_sum += std::fabs(a.values[i * k + e] * w.values[j * k + e]);
            }
            ref *= double(p.alpha);
            abs_sum *= double(p.alpha);
            const double got = y_bf16 ? bf16_to_double(y16[i * n + j]) : double(y32[i * n + j]);
            const double tol = 1e-6 * abs_sum + (y_bf16 ? 0x1p-8 * std::fabs(ref) : 0.0) + 1e-30;
            if (!(std::fabs(got - ref) <= tol) && bad++ < 5)
                ADD_FAILURE() << "y[" << i << "][" << j << "] = " << got << ", float64 " << ref;
        }
    EXPECT_EQ(bad, 0);
}

TEST(Bf16PrefillEmulation, ProductsAgainstFloat64) {
    std::mt19937 rng(23);
    check_product<32>(WUSH_FORMAT_MXFP4, 130, 24, 96, false, rng);    // 2 row tiles, 3 stages
    check_product<32>(WUSH_FORMAT_MXFP4, 20, 136, 224, true, rng);    // 2 column tiles, 7 stages (wrap-around)
    check_product<16>(WUSH_FORMAT_NVFP4, 33, 13, 160, false, rng);    // NVFP4: two scales per stage
    check_product<32>(WUSH_FORMAT_MXFP4_OCP, 40, 9, 32, false, rng);  // one stage
}

}  // namespace
