// The fused transform + quantization kernels' device code (see cuda/quantize/quantize_kernel.cu), in a
// header of its own so that the CPU emulation test (tests/unit/test_quantize_emulation.cpp) runs
// the same source through tests/unit/cuda_host_emulation.h.
//
// The rule that makes the bytes the CPU's: y = T x in float32 as one FMA chain per output with j
// ascending (the order formats::group_error_bound assumes), certified by formats::certify_group,
// else recomputed in float64 (products of floats are exact in double, so fma and mul-then-add
// agree) and quantized by the float64 definition formats::quantize_group<double>.
//
// Built so that nothing goes to local memory (checked by the `ptxas` ctest): the format and G are
// template parameters, every per-group array is indexed by unrolled constants only, and the
// matrices are read from shared memory as 16-byte broadcasts.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/float_bits.h"
#include "common/host_device.h"
#include "formats/certified_group.h"
#include "formats/group_quantizer.h"
#include "quantize_params.h"

namespace wush::cuda::quantize_detail {

constexpr int kWarps = 4;  // warps per block in both kernels
constexpr int kThreads = kWarps * 32;
constexpr int kTileTokens = 32;              // tile kernel: tokens per block (one per lane)
constexpr int kTileGroups = kWarps;          // tile kernel: column groups per block (one per warp)
constexpr std::size_t kSmallMaxTokens = 16;  // at most this many tokens: the small-m kernel

template <wush_format F>
struct Fmt {
    static constexpr int G = F == WUSH_FORMAT_NVFP4 ? 16 : 32;
    static constexpr int SB = F == WUSH_FORMAT_INT4 ? 2 : 1;  // scale bytes
    static constexpr int kCodeBytes = G / 2;                  // one group's codes: 16 or 8 bytes
};

__device__ __forceinline__ bool finite_f(float v) {
    return (bits::bits_from_float(v) & 0x7F800000u) != 0x7F800000u;
}

constexpr unsigned kFullWarp = 0xFFFFFFFFu;

// The maximum / sum over the warp's 32 lanes by an xor butterfly: every lane adds the same pairs
// (in swapped order), so every lane ends with the same bits.
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullWarp, v, o));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullWarp, v, o);
    return v;
}

__device__ __forceinline__ void report_non_finite(unsigned long long* flag, std::size_t token, std::size_t col) {
    // The smallest (row, column) of all NaN/Inf wins: the first in row-major order.
    atomicMin(flag, (static_cast<unsigned long long>(token) << 32) | static_cast<unsigned long long>(col));
}

__device__ __forceinline__ float load_element(wush_dtype dt, const void* x, std::size_t i) {
    if (dt == WUSH_DTYPE_F32) return static_cast<const float*>(x)[i];
    const std::uint16_t h = static_cast<const std::uint16_t*>(x)[i];
    return dt == WUSH_DTYPE_BF16 ? bits::bf16_decode(h) : bits::f16_decode(h);
}

__device__ __forceinline__ float half_word(wush_dtype dt, std::uint32_t w) {
    const std::uint16_t h = std::uint16_t(w & 0xFFFFu);
    return dt == WUSH_DTYPE_BF16 ? bits::bf16_decode(h) : bits::f16_decode(h);
}

// Stages x[tok0 + r][col0 + c] (r < rows, c < cols; cols a multiple of 16) as float32 into
// xs[r * stride + c], zeros for rows past the end; reports NaN/Inf. `vec`: x is 16-byte aligned
// (d_in is a multiple of 16, so every row segment is too): 16-byte loads, a warp reading whole
// row segments; else element loads (still coalesced, narrower).
__device__ __forceinline__ void stage_x(const QuantizeArgs& a, std::size_t tok0, int rows, std::size_t col0, int cols,
                                        float* xs, int stride, bool vec, int tid, int nthreads) {
    const int esize = a.x_dtype == WUSH_DTYPE_F32 ? 4 : 2;
    if (vec) {
        const int per_chunk = 16 / esize;
        const int chunks = cols / per_chunk;
        for (int idx = tid; idx < kTileTokens * chunks; idx += nthreads) {
            const int r = idx / chunks, q = idx % chunks;
            float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            if (r < rows) {
                const std::size_t e0 = (tok0 + std::size_t(r)) * a.d_in + col0 + std::size_t(q * per_chunk);
                const uint4 w =
                    *reinterpret_cast<const uint4*>(static_cast<const char*>(a.x) + e0 * std::size_t(esize));
                const std::uint32_t words[4] = {w.x, w.y, w.z, w.w};
                if (esize == 4) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) v[e] = bits::float_from_bits(words[e]);
                } else {
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        v[2 * e] = half_word(a.x_dtype, words[e]);
                        v[2 * e + 1] = half_word(a.x_dtype, words[e] >> 16);
                    }
                }
#pragma unroll
                for (int e = 0; e < 8; ++e)
                    if (e < per_chunk && !finite_f(v[e]))
                        report_non_finite(a.non_finite, tok0 + std::size_t(r), col0 + std::size_t(q * per_chunk + e));
            }
#pragma unroll
            for (int e = 0; e < 8; ++e)
                if (e < per_chunk) xs[r * stride + q * per_chunk + e] = v[e];
        }
        return;
    }
    for (int idx = tid; idx < kTileTokens * cols; idx += nthreads) {
        const int r = idx / cols, c = idx % cols;
        float v = 0.0f;
        if (r < rows) {
            v = load_element(a.x_dtype, a.x, (tok0 + std::size_t(r)) * a.d_in + col0 + std::size_t(c));
            if (!finite_f(v)) report_non_finite(a.non_finite, tok0 + std::size_t(r), col0 + std::size_t(c));
        }
        xs[r * stride + c] = v;
    }
}

// Certifies y (the float32 transform of x): true when the codes and scale written are the float64
// definition's; false when the group must be recomputed (recompute_group).
template <wush_format F>
__device__ __forceinline__ bool certify(const float (&x)[Fmt<F>::G], const float (&y)[Fmt<F>::G], bool identity,
                                        float norm, std::uint8_t (&codes)[Fmt<F>::kCodeBytes],
                                        std::uint8_t (&scale)[2]) {
    constexpr int G = Fmt<F>::G;
    const float bound = formats::group_error_bound(x, G, identity, norm);
    return formats::certify_group(F, y, G, bound, codes, scale);
}

// The float64 definition of one group, by a whole warp (all 32 lanes call it): lane i < G sums
// output i's products in double, j ascending (products of floats are exact in double, so fma and
// mul-then-add agree), into yd_s[i]; lane 0 then quantizes by formats::quantize_group<double>.
// Spread over the lanes, and kept out of the certified path's registers, because a group that
// fails certification holds up its whole warp. x: the group's inputs; T[i][j] = t[i * ti + j * tj]
// (unused for the identity); yd_s: G doubles of the warp's own shared memory.
template <wush_format F>
__device__ __forceinline__ void recompute_group(const float* x, const float* t, int ti, int tj, bool identity,
                                                double* yd_s, int lane, std::uint8_t (&codes)[Fmt<F>::kCodeBytes],
                                                std::uint8_t (&scale)[2]) {
    constexpr int G = Fmt<F>::G;
    if (lane < G) {
        double s = identity ? double(x[lane]) : 0.0;
        if (!identity) {
#pragma unroll 8
            for (int j = 0; j < G; ++j) s = fma(double(t[lane * ti + j * tj]), double(x[j]), s);
        }
        yd_s[lane] = s;
    }
    __syncwarp();
    if (lane == 0) formats::quantize_group<double>(F, yd_s, G, codes, scale);
    __syncwarp();  // yd_s is free again for the warp's next group
}

// One group's codes as 32-bit words (little-endian bytes), for vector stores.
template <int kBytes>
__device__ __forceinline__ std::uint32_t code_word(const std::uint8_t (&c)[kBytes], int w) {
    return std::uint32_t(c[4 * w]) | (std::uint32_t(c[4 * w + 1]) << 8) | (std::uint32_t(c[4 * w + 2]) << 16) |
           (std::uint32_t(c[4 * w + 3]) << 24);
}

__device__ __forceinline__ void store_scale(std::uint8_t* dst, const std::uint8_t (&scale)[2], int sb) {
    dst[0] = scale[0];
    if (sb == 2) dst[1] = scale[1];
}

// ---------------------------------------------------------------------------------------------
// Tile kernel (n_tokens > kSmallMaxTokens): a block owns 32 tokens x 4 consecutive column groups;
// lane = token, warp = group. x is staged through shared memory (coalesced 16-byte loads), each
// warp's matrix (uploaded transposed) is copied to shared memory so that T[i..i+3][j] is one
// broadcast 16-byte read, and a thread runs its group's G output chains interleaved (j outer, i
// inner: each chain still j ascending), then certifies its group. The groups a warp could not
// certify (a ballot) are recomputed afterwards by the whole warp, token by token. Codes go through
// shared memory so that a warp stores whole row segments of 64 (G = 32) or 32 (NVFP4) bytes as
// 16- (NVFP4: 8-) byte stores.
// grid: (ceil(n / 32), ceil(C / 4)).
// ---------------------------------------------------------------------------------------------
template <wush_format F>
__global__ void __launch_bounds__(kThreads) quantize_tile_kernel(const QuantizeArgs a, int vec_x, int vec_codes) {
    constexpr int G = Fmt<F>::G, SB = Fmt<F>::SB, CB = Fmt<F>::kCodeBytes;
    constexpr int kStride = kTileGroups * G + 4;              // +4 floats: lanes 32 rows apart hit distinct bank quads
    __shared__ __align__(16) float t_s[kTileGroups * G * G];  // per warp: T transposed, t[j * G + i]
    __shared__ __align__(16) float x_s[kTileTokens * kStride];
    __shared__ __align__(16) std::uint8_t c_s[kTileTokens * kTileGroups * CB];
    __shared__ std::uint8_t ok_s[kTileTokens * kTileGroups];
    __shared__ double yd_s[kWarps * G];  // recompute_group's outputs, per warp

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const std::size_t groups_total = a.d_in / std::size_t(G);
    const std::size_t g0 = std::size_t(blockIdx.y) * kTileGroups;
    const int groups = groups_total - g0 < std::size_t(kTileGroups) ? int(groups_total - g0) : kTileGroups;
    const std::size_t tok0 = std::size_t(blockIdx.x) * kTileTokens;
    const int rows = a.n_tokens - tok0 < std::size_t(kTileTokens) ? int(a.n_tokens - tok0) : kTileTokens;
    const bool identity = a.use == MatrixUse::None;
    const bool per_block = a.use == MatrixUse::PerBlock;

    if (!identity) {  // the matrices arrive transposed (QuantizeArgs): a straight 16-byte copy
        const int count = per_block ? groups : 1;
        const uint4* src = reinterpret_cast<const uint4*>(a.matrices + (per_block ? g0 : 0) * G * G);
        for (int idx = tid; idx < count * G * G / 4; idx += kThreads) reinterpret_cast<uint4*>(t_s)[idx] = src[idx];
    }
    stage_x(a, tok0, rows, g0 * G, groups * G, x_s, kStride, vec_x != 0, tid, kThreads);
    __syncthreads();

    // Token r's codes of this warp's group into shared memory (stored below), its scale to a.scales.
    const auto put_group = [&](int r, const std::uint8_t(&codes)[CB], const std::uint8_t(&scale)[2]) {
        std::uint32_t* cw = reinterpret_cast<std::uint32_t*>(c_s + (r * kTileGroups + warp) * CB);
#pragma unroll
        for (int w = 0; w < CB / 4; ++w) cw[w] = code_word<CB>(codes, w);
        store_scale(a.scales + ((tok0 + std::size_t(r)) * groups_total + g0 + std::size_t(warp)) * SB, scale, SB);
    };

    // Certified float32 path, a thread per (token, group); the groups it cannot certify are then
    // recomputed by the whole warp, one token at a time.
    bool ok = false, fallback = false;
    const float* t = t_s + (per_block ? warp : 0) * G * G;
    if (warp < groups && lane < rows) {
        float x[G];
        const float* xr = x_s + lane * kStride + warp * G;
#pragma unroll
        for (int j = 0; j < G; j += 4) {
            const uint4 q = *reinterpret_cast<const uint4*>(xr + j);
            x[j] = bits::float_from_bits(q.x);
            x[j + 1] = bits::float_from_bits(q.y);
            x[j + 2] = bits::float_from_bits(q.z);
            x[j + 3] = bits::float_from_bits(q.w);
        }
        bool finite = true;
#pragma unroll
        for (int j = 0; j < G; ++j) finite = finite && finite_f(x[j]);
        if (finite) {  // else nothing is written for this group (the call reports NON_FINITE)
            float y[G];
#pragma unroll
            for (int i = 0; i < G; ++i) y[i] = identity ? x[i] : 0.0f;
            if (!identity) {
#pragma unroll
                for (int j = 0; j < G; ++j) {
#pragma unroll
                    for (int i = 0; i < G; i += 4) {
                        const uint4 q = *reinterpret_cast<const uint4*>(t + j * G + i);  // broadcast
                        y[i] = fmaf(bits::float_from_bits(q.x), x[j], y[i]);
                        y[i + 1] = fmaf(bits::float_from_bits(q.y), x[j], y[i + 1]);
                        y[i + 2] = fmaf(bits::float_from_bits(q.z), x[j], y[i + 2]);
                        y[i + 3] = fmaf(bits::float_from_bits(q.w), x[j], y[i + 3]);
                    }
                }
            }
            const float norm = identity ? 0.0f : a.row_norms[per_block ? g0 + std::size_t(warp) : 0];
            std::uint8_t codes[CB];
            std::uint8_t scale[2] = {0, 0};
            if (certify<F>(x, y, identity, norm, codes, scale)) {
                put_group(lane, codes, scale);
            } else {
                fallback = true;
            }
            ok = true;
        }
    }
    if (warp < groups) {  // warp-uniform
        unsigned pending = __ballot_sync(kFullWarp, fallback);
        while (pending != 0u) {
            const int r = __ffs(int(pending)) - 1;
            pending &= pending - 1u;
            std::uint8_t codes[CB];
            std::uint8_t scale[2] = {0, 0};
            recompute_group<F>(x_s + r * kStride + warp * G, t, 1, G, identity, yd_s + warp * G, lane, codes, scale);
            if (lane == 0) put_group(r, codes, scale);
        }
    }
    ok_s[lane * kTileGroups + warp] = ok ? 1 : 0;
    __syncthreads();

    // Consecutive threads take consecutive groups of a row: a warp writes 8 whole row segments.
    for (int idx = tid; idx < rows * groups; idx += kThreads) {
        const int r = idx / groups, w = idx % groups;
        if (!ok_s[r * kTileGroups + w]) continue;
        const std::uint8_t* src = c_s + (r * kTileGroups + w) * CB;
        std::uint8_t* dst = a.codes + (tok0 + std::size_t(r)) * (a.d_in / 2) + (g0 + std::size_t(w)) * CB;
        if (vec_codes) {
            if constexpr (CB == 16) *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
            else *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(src);
        } else {
            for (int b = 0; b < CB; ++b) dst[b] = src[b];
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Small-m kernel (n_tokens <= 16): a warp per (token, group), so that a few tokens' groups spread
// over the whole GPU. Lane i computes output i's chain (T transposed in shared memory: lanes read
// consecutive words) and certifies element i (certify_scaling on the warp's amax, certify_element
// per lane, a ballot of the near flags); the codes go out as one byte per even lane. A group that
// is not certified is recomputed by the warp and stored by lane 0.
// A block owns small_groups_per_block(n) consecutive groups and every token of them: each group's
// 4 KB matrix (G = 32) is copied to shared memory once and serves all n tokens (a block per token
// read it n times). Its 4 warps split as kWarps / groups_per_block warps per group, warp w taking
// group w / per_group of the block and tokens w % per_group, + per_group, ...
// grid: ceil(C / groups_per_block).
// ---------------------------------------------------------------------------------------------

// Groups per block for n tokens: 4 for one token (a warp per group, as many warps as groups), 2
// for two, else 1 (the 4 warps share one group's tokens; 3 tokens leave one warp idle).
__host__ __device__ constexpr int small_groups_per_block(std::size_t n_tokens) {
    return n_tokens >= 3 ? 1 : n_tokens == 2 ? 2 : kWarps;
}

// One (token, group) by the whole warp: t is the group's matrix (transposed, shared memory), xs,
// ys and yd_s the warp's own shared scratch, reused token after token.
template <wush_format F>
__device__ __forceinline__ void quantize_small_token(const QuantizeArgs& a, std::size_t token, std::size_t group,
                                                     const float* t, float* xs, float* ys, double* yd_s, int lane,
                                                     int vec_codes) {
    constexpr int G = Fmt<F>::G, SB = Fmt<F>::SB, CB = Fmt<F>::kCodeBytes;
    const std::size_t groups_total = a.d_in / std::size_t(G);
    const bool identity = a.use == MatrixUse::None;
    const std::size_t m = a.use == MatrixUse::PerBlock ? group : 0;
    __syncwarp();  // the previous token's reads of xs / ys are done
    if (lane < G) {
        const float v = load_element(a.x_dtype, a.x, token * a.d_in + group * G + std::size_t(lane));
        if (!finite_f(v)) report_non_finite(a.non_finite, token, group * G + std::size_t(lane));
        xs[lane] = v;
    }
    __syncwarp();
    if (lane < G) {
        float acc = identity ? xs[lane] : 0.0f;
        if (!identity) {
#pragma unroll
            for (int j = 0; j < G; ++j) acc = fmaf(t[j * G + lane], xs[j], acc);
        }
        ys[lane] = acc;
    }
    __syncwarp();
    // Certification by the whole warp (lane i < G holds element i; amax and INT4's sum of squares
    // are reduced over the lanes, the same value in every lane): a few tokens' groups are the whole
    // launch at small m, so no lane walks a group alone.
    const float xv = lane < G ? xs[lane] : 0.0f, yv = lane < G ? ys[lane] : 0.0f;
    if (__ballot_sync(kFullWarp, !finite_f(xv)) != 0u) return;  // writes nothing (NON_FINITE reported)
    const float bound = formats::group_error_bound(xs, G, identity, identity ? 0.0f : a.row_norms[m]);
    const float amax = warp_max(fabsf(yv));
    const float ss = F == WUSH_FORMAT_INT4 ? warp_sum(yv * yv) : 0.0f;  // any order: in the tolerance
    formats::certify_detail::GroupScaling sc;
    const bool scaled = formats::certify_scaling(F, amax, ss, G, bound, sc);
    bool near = false;
    const int code = scaled && lane < G ? int(formats::certify_element(F, yv, sc, near)) : 0;
    std::uint8_t* dst = a.codes + token * (a.d_in / 2) + group * CB;
    std::uint8_t* scale_dst = a.scales + (token * groups_total + group) * SB;
    if (scaled && __ballot_sync(kFullWarp, near) == 0u) {
        // Each even lane writes its code and the next lane's as one byte (one coalesced store).
        const int next = int(__shfl_xor_sync(kFullWarp, float(code), 1));  // 0..15: exact as a float
        if (lane < G && (lane & 1) == 0) dst[lane >> 1] = std::uint8_t(code | (next << 4));
        if (lane == 0) store_scale(scale_dst, sc.scale, SB);
        return;
    }
    std::uint8_t codes[CB];
    std::uint8_t scale[2] = {0, 0};
    recompute_group<F>(xs, t, 1, G, identity, yd_s, lane, codes, scale);
    if (lane != 0) return;
    if (vec_codes) {
        if constexpr (CB == 16)
            *reinterpret_cast<uint4*>(dst) = make_uint4(code_word<CB>(codes, 0), code_word<CB>(codes, 1),
                                                        code_word<CB>(codes, 2), code_word<CB>(codes, 3));
        else *reinterpret_cast<uint2*>(dst) = make_uint2(code_word<CB>(codes, 0), code_word<CB>(codes, 1));
    } else {
#pragma unroll
        for (int b = 0; b < CB; ++b) dst[b] = codes[b];
    }
    store_scale(scale_dst, scale, SB);
}

template <wush_format F>
__global__ void __launch_bounds__(kThreads)
    quantize_small_kernel(const QuantizeArgs a, int groups_per_block, int vec_codes) {
    constexpr int G = Fmt<F>::G;
    __shared__ float t_s[kWarps * G * G];  // per group of the block: T transposed, t[j * G + i]
    __shared__ float x_s[kWarps * G];      // per warp
    __shared__ float y_s[kWarps * G];
    __shared__ double yd_s[kWarps * G];  // recompute_group's outputs, per warp

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int per_group = kWarps / groups_per_block;  // warps per group
    const std::size_t groups_total = a.d_in / std::size_t(G);
    const std::size_t g0 = std::size_t(blockIdx.x) * std::size_t(groups_per_block);
    const bool per_block = a.use == MatrixUse::PerBlock;
    if (a.use != MatrixUse::None) {  // the block's matrices, once for all tokens
        const std::size_t left = groups_total - g0;
        const int count = per_block ? (left < std::size_t(groups_per_block) ? int(left) : groups_per_block) : 1;
        const float* src = a.matrices + (per_block ? g0 : 0) * std::size_t(G * G);
        for (int e = tid; e < count * G * G; e += kThreads) t_s[e] = src[e];
    }
    __syncthreads();
    const int local = warp / per_group;
    const std::size_t group = g0 + std::size_t(local);
    if (group >= groups_total) return;  // whole warps, after the block's only barrier
    const float* t = t_s + (per_block ? local : 0) * G * G;
    for (std::size_t token = std::size_t(warp % per_group); token < a.n_tokens; token += std::size_t(per_group))
        quantize_small_token<F>(a, token, group, t, x_s + warp * G, y_s + warp * G, yd_s + warp * G, lane, vec_codes);
}

}  // namespace wush::cuda::quantize_detail
