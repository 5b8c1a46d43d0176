// The BF16 prefill GEMM's device code (cuda/gemm/gemm_bf16_prefill.cu), in a header of its own so that
// the CPU emulation test (tests/unit/test_bf16_prefill_emulation.cpp) compiles the same source
// against tests/unit/cuda_host_emulation.h.
//
// Y (m x n) = alpha * A W^T for the E2M1 formats (MXFP4, MXFP4_OCP, NVFP4): A is the activations'
// exact BF16 dequantized values (m x k, from launch_dequantize), W stays packed (4-bit codes) and
// is converted to BF16 in registers, exactly: an E2M1 value (<= 2 significant bits) times an
// E8M0 or E4M3 scale (<= 4) has <= 6 significant bits, exact in BF16 wherever float32 holds it
// (cuda/gemm/dequantize.h). mma.sync m16n8k16 BF16 with float32 accumulation (sm_80+).
//
// Geometry: block tile 128 (m) x 128 (n), 32 elements of k per stage (two k16 MMAs), 3 stages of
// cp.async in static shared memory (under 40 KB: no opt-in attribute), 8 warps as 2 (m) x 4 (n)
// warp tiles of 64 x 32 (4 x 4 MMAs per k16 step).
//  - A rows: 64 bytes + 16 of padding (80: a fragment's 32-bit loads hit 32 distinct banks).
//  - W code rows: 16 bytes (32 codes) unpadded; a thread loads its row's 16 bytes at once (the 8
//    rows of a quad group are 128 consecutive bytes: conflict-free) and takes byte t of each
//    4-byte word: elements 2t, 2t + 1 (low word) and 2t + 8, 2t + 9 (high word) of a k16 step,
//    which are exactly the B fragment's b0 and b1 (PTX ISA, mma.m16n8k16 .bf16 B layout).
//  - W scales: BF16 pairs (the scale in both halves), stage-major ([k/32][n rounded up to 4][32/G])
//    so that a stage's scales of 128 rows are one contiguous run of 16-byte copies; written by
//    w_scales_kernel per forward (a few hundred KB at 4096 x 4096).
// Conversion of 4 codes (two bytes) to two BF16 pairs: two prmt over 8-byte tables give the high
// and the low byte of each magnitude's BF16 bits, two prmt interleave them, the sign bits are
// moved to bit 15 of each half, and one BF16x2 multiply (exact: the product is representable)
// applies the scale.
#pragma once

#include <cstdint>

#if !defined(WUSH_CUDA_HOST_EMULATION)
#  include <cuda_bf16.h>
#endif

#include "common/float_bits.h"
#include "common/host_device.h"
#include "formats/group_quantizer.h"
#include "prefill_tile.cuh"
#include "tile_decode.h"

namespace wush::cuda::bf16_prefill_detail {

constexpr int BM = 128, BN = 128, BK = 32;
constexpr int kStages = 3;
constexpr int kThreads = 256;
constexpr int kARowBytes = BK * 2 + 16;  // 64 bytes of BF16 + 16 padding
constexpr int kWRowBytes = BK / 2;       // 16 bytes of codes
constexpr int kScaleRowPad = 4;          // W scale rows rounded up to 4 (a 16-byte copy's rows at G = 32)

template <int G>
struct Layout {
    static constexpr int kSpr = BK / G;  // scales per row per stage: 1 (G = 32) or 2 (G = 16)
    static constexpr int kA = BM * kARowBytes;
    static constexpr int kW = BN * kWRowBytes;
    static constexpr int kS = BN * kSpr * 4;
    static constexpr int kStage = kA + kW + kS;
    static constexpr int kSmem = kStages * kStage;
};

// BF16 bits of the 8 E2M1 magnitudes, split into high and low bytes as two 8-byte prmt tables.
struct MagnitudeTables {
    std::uint32_t hi0, hi1, lo0, lo1;
};

// The tables of `format` from its element decoder (formats::decode_element, exact in BF16).
WUSH_HD MagnitudeTables magnitude_tables(wush_format format) {
    MagnitudeTables t{0, 0, 0, 0};
    for (int c = 0; c < 8; ++c) {
        const std::uint32_t b = bits::bits_from_float(formats::decode_element(format, std::uint8_t(c))) >> 16;
        const int shift = 8 * (c & 3);
        if (c < 4) t.hi0 |= (b >> 8) << shift, t.lo0 |= (b & 0xFFu) << shift;
        else t.hi1 |= (b >> 8) << shift, t.lo1 |= (b & 0xFFu) << shift;
    }
    return t;
}

// A BF16 pair's product, rounded to nearest even: exact when the product is representable.
WUSH_HD std::uint32_t bf16x2_mul(std::uint32_t a, std::uint32_t b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    std::uint32_t d;
    // fma with -0 addend: x * y exactly where representable, and +0 products stay +0.
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
    return d;
#else
    std::uint32_t d = 0;
    for (int h = 0; h < 2; ++h) {
        const float x = bits::float_from_bits((a >> (16 * h)) << 16);
        const float y = bits::float_from_bits((b >> (16 * h)) << 16);
        std::uint32_t u = bits::bits_from_float(x * y);
        if ((u & 0x7F800000u) != 0x7F800000u) u += 0x7FFFu + ((u >> 16) & 1u);
        d |= (u >> 16) << (16 * h);
    }
    return d;
#endif
}

// Codes of elements (2t, 2t + 1) in `lo` and (2t + 8, 2t + 9) in `hi` (one byte each, element
// 2j in the low nibble) times the group scale (`scale2`: its BF16 bits in both halves): b0 and
// b1 of the B fragment, BF16 pairs with the lower element in the low half.
WUSH_HD void w4_to_bf16_fragment(const MagnitudeTables& t, std::uint32_t lo, std::uint32_t hi, std::uint32_t scale2,
                                 std::uint32_t& b0, std::uint32_t& b1) {
    const std::uint32_t x = (lo & 0xFFu) | ((hi & 0xFFu) << 8);  // 4 nibbles: elements 0, 1, 8, 9 (+ 2t)
    const std::uint32_t sel = x & 0x7777u;                       // magnitudes; bit 3 clear: plain byte copies
    const std::uint32_t hb = tile::prmt(t.hi0, t.hi1, sel);      // byte i: high byte of nibble i's BF16
    const std::uint32_t lb = tile::prmt(t.lo0, t.lo1, sel);
    const std::uint32_t m0 = tile::prmt(lb, hb, 0x5140u);  // nibbles 0, 1 as a BF16 pair
    const std::uint32_t m1 = tile::prmt(lb, hb, 0x7362u);  // nibbles 2, 3
    const std::uint32_t s0 = ((x << 12) & 0x8000u) | ((x << 24) & 0x80000000u);
    const std::uint32_t s1 = ((x << 4) & 0x8000u) | ((x << 16) & 0x80000000u);
    b0 = bf16x2_mul(m0 | s0, scale2);
    b1 = bf16x2_mul(m1 | s1, scale2);
}

struct Bf16PrefillParams {
    int m, n;
    long long k;
    const std::uint16_t* a;         // m x k BF16 (exact dequantized activations)
    const std::uint8_t* w_codes;    // n x k/2
    const std::uint32_t* w_scales;  // [k / BK][n_pad][kSpr] BF16 pairs
    int n_pad;                      // n rounded up to kScaleRowPad
    MagnitudeTables tables;
    float alpha;
    void* y;
    int y_bf16;
};

// d += A B, m16n8k16, BF16 inputs, float32 accumulators.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                         std::uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#elif defined(WUSH_CUDA_HOST_EMULATION)
    wush_emu::mma_bf16_exact(d, a, b0, b1);
#endif
}

template <int G>
__device__ __forceinline__ void load_stage(const Bf16PrefillParams& p, std::uint8_t* stage, int bm, int bn,
                                           long long kt) {
    using L = Layout<G>;
    const int tid = threadIdx.x;
    // A: 128 rows x 4 copies of 16 bytes (8 BF16).
#pragma unroll
    for (int i = 0; i < (BM * 4) / kThreads; ++i) {
        const int c = tid + i * kThreads, row = c >> 2, q = c & 3;
        const bool valid = bm + row < p.m;
        const std::uint16_t* src = valid ? p.a + (long long)(bm + row) * p.k + kt * BK + 8 * q : p.a;
        cp_async16(stage + row * kARowBytes + 16 * q, src, valid);
    }
    // W codes: 128 rows x one 16-byte copy.
    if (tid < BN) {
        const bool valid = bn + tid < p.n;
        const std::uint8_t* src = valid ? p.w_codes + (long long)(bn + tid) * (p.k / 2) + kt * (BK / 2) : p.w_codes;
        cp_async16(stage + L::kA + tid * kWRowBytes, src, valid);
    }
    // W scales: the stage's run of 128 rows x kSpr pairs (rows past n_pad zero-filled).
    constexpr int kRowsPerCopy = 4 / L::kSpr;
    if (tid < BN / kRowsPerCopy) {
        const int row = tid * kRowsPerCopy;
        const bool valid = bn + row < p.n_pad;
        const std::uint32_t* src = valid ? p.w_scales + (kt * p.n_pad + bn + row) * L::kSpr : p.w_scales;
        cp_async16(stage + L::kA + L::kW + row * L::kSpr * 4, src, valid);
    }
}

// One stage of a warp's 64 x 32 tile: two k16 steps of 4 x 4 MMAs.
template <int G>
__device__ __forceinline__ void stage_step(float (&acc)[4][4][4], const MagnitudeTables& tables,
                                           const std::uint8_t* stage, int wm, int wn, int gid, int t) {
    using L = Layout<G>;
    const std::uint8_t* s_a = stage + (wm * 64) * kARowBytes;
    const std::uint8_t* s_w = stage + L::kA + (wn * 32) * kWRowBytes;
    const std::uint32_t* s_s = reinterpret_cast<const std::uint32_t*>(stage + L::kA + L::kW) + (wn * 32) * L::kSpr;
    uint4 wq[4];
    std::uint32_t sc[4][L::kSpr];
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
        wq[nt] = *reinterpret_cast<const uint4*>(s_w + (nt * 8 + gid) * kWRowBytes);
#pragma unroll
        for (int j = 0; j < L::kSpr; ++j) sc[nt][j] = s_s[(nt * 8 + gid) * L::kSpr + j];
    }
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
        std::uint32_t a[4][4], b[4][2];
#pragma unroll
        for (int mt = 0; mt < 4; ++mt) {
            const std::uint8_t* r0 = s_a + (mt * 16 + gid) * kARowBytes + ks * 32 + 4 * t;
            const std::uint8_t* r8 = r0 + 8 * kARowBytes;
            a[mt][0] = *reinterpret_cast<const std::uint32_t*>(r0);
            a[mt][1] = *reinterpret_cast<const std::uint32_t*>(r8);
            a[mt][2] = *reinterpret_cast<const std::uint32_t*>(r0 + 16);
            a[mt][3] = *reinterpret_cast<const std::uint32_t*>(r8 + 16);
        }
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
            const std::uint32_t lo = ks == 0 ? wq[nt].x : wq[nt].z, hi = ks == 0 ? wq[nt].y : wq[nt].w;
            w4_to_bf16_fragment(tables, lo >> (8 * t), hi >> (8 * t), sc[nt][G == 16 ? ks : 0], b[nt][0], b[nt][1]);
        }
#pragma unroll
        for (int mt = 0; mt < 4; ++mt)
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) mma_bf16(acc[mt][nt], a[mt], b[nt][0], b[nt][1]);
    }
}

template <int G>
__global__ void __launch_bounds__(kThreads, 2) bf16_prefill_kernel(const Bf16PrefillParams p) {
    using L = Layout<G>;
    __shared__ __align__(16) std::uint8_t smem[L::kSmem];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int gid = lane >> 2, t = lane & 3;
    const int wm = warp >> 2, wn = warp & 3;
    const int bm = blockIdx.y * BM, bn = blockIdx.x * BN;
    const long long kt_count = p.k / BK;  // k is a multiple of 32

    float acc[4][4][4];
    zero_warp_tile(acc);

    cp_async_main_loop<kStages, L::kStage>(
        smem, kt_count, [&](std::uint8_t* stage, long long kt) { load_stage<G>(p, stage, bm, bn, kt); },
        [&](const std::uint8_t* stage, long long) { stage_step<G>(acc, p.tables, stage, wm, wn, gid, t); });

    store_warp_tile(acc, p, bm, bn, wm, wn, lane, [&](int, float v) { return p.alpha * v; });
}

// W's group scales as BF16 pairs in the stage-major layout above (rows n..n_pad - 1 zero). The
// scales are exact in BF16 (E8M0: powers of two from 2^-127; E4M3: 4 significant bits).
template <int G>
__global__ void w_scales_kernel(wush_format format, int n, int n_pad, long long k, const std::uint8_t* scales,
                                std::uint32_t* out) {
    constexpr int kSpr = BK / G;
    const long long groups = k / G, total = (k / BK) * n_pad * kSpr;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const long long kt = i / (n_pad * kSpr), rest = i % (n_pad * kSpr);
        const long long row = rest / kSpr, j = rest % kSpr;
        std::uint32_t v = 0;
        if (row < n) {
            const float s = formats::decode_scale(format, scales + row * groups + kt * kSpr + j);
            const std::uint32_t b = bits::bits_from_float(s) >> 16;
            v = b | (b << 16);
        }
        out[i] = v;
    }
}

}  // namespace wush::cuda::bf16_prefill_detail
