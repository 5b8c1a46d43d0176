// Just enough of CUDA to run the W4A4 GEMM kernels' device source (cuda/gemm_*_kernel.cuh) on the
// CPU: one block at a time, each CUDA thread a std::thread; __syncthreads is a block barrier,
// shuffles and mma.sync are warp-cooperative exchanges through per-warp slots (the MMA computes
// from the PTX fragment layouts of cuda/gemm/tile_decode.h); cp.async copies are queued per
// thread and performed only at cp.async.wait_group, leaving the newest N groups pending, so that a
// missing wait or barrier shows up as wrong data. Shared memory is per kernel instantiation
// (`static`), valid because blocks run one after another.
#pragma once

#define WUSH_CUDA_HOST_EMULATION 1

#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "gemm/tile_decode.h"
#include "quantize/bf16_fragments.h"
#include "quantize/mma_error_bound.h"

namespace wush_emu {

struct Dim {
    unsigned x = 1, y = 1, z = 1;
};

inline thread_local Dim t_idx, b_idx;
inline Dim g_grid, g_block;

struct CopyOp {
    void* dst;
    const void* src;
    bool valid;
};

struct State {
    std::unique_ptr<std::barrier<>> block;
    std::vector<std::unique_ptr<std::barrier<>>> warps;
    float fslots[32][32];
    std::uint32_t mslots[32][32][6];
    std::vector<std::uint8_t> smem;
};
inline State g;

inline thread_local std::vector<std::vector<CopyOp>> t_groups;  // committed groups, oldest first
inline thread_local std::vector<CopyOp> t_open;                 // not yet committed

inline std::uint8_t* dynamic_smem() {
    return g.smem.data();
}

inline void copy16(void* dst, const void* src, bool valid) {
    t_open.push_back({dst, src, valid});
}
inline void commit() {
    t_groups.push_back(t_open);
    t_open.clear();
}
inline void wait_groups(int keep) {
    while (int(t_groups.size()) > keep) {
        for (const CopyOp& op : t_groups.front()) {
            if (op.valid) std::memcpy(op.dst, op.src, 16);
            else std::memset(op.dst, 0, 16);
        }
        t_groups.erase(t_groups.begin());
    }
}

inline void syncthreads() {
    g.block->arrive_and_wait();
}
inline void syncwarp() {
    g.warps[t_idx.x / 32]->arrive_and_wait();
}

inline unsigned long long atomic_min(unsigned long long* p, unsigned long long v) {
    static std::mutex m;
    const std::lock_guard<std::mutex> lock(m);
    const unsigned long long old = *p;
    if (v < old) *p = v;
    return old;
}

inline float shfl_xor(float v, int o) {
    const int t = int(t_idx.x), w = t / 32, l = t % 32;
    g.fslots[w][l] = v;
    g.warps[w]->arrive_and_wait();
    const float r = g.fslots[w][l ^ o];
    g.warps[w]->arrive_and_wait();
    return r;
}

inline unsigned ballot(bool p) {
    const int t = int(t_idx.x), w = t / 32, l = t % 32;
    g.mslots[w][l][0] = p ? 1u : 0u;
    g.warps[w]->arrive_and_wait();
    unsigned r = 0;
    for (int lane = 0; lane < 32; ++lane) r |= g.mslots[w][lane][0] << lane;
    g.warps[w]->arrive_and_wait();
    return r;
}

// d += A B for m16n8k32 (a_regs = 4) or m16n8k16 (a_regs = 2), s8 x s8 -> s32 (wrapping).
inline void mma(int (&d)[4], const std::uint32_t* a, int a_regs, std::uint32_t b0, std::uint32_t b1) {
    const int t = int(t_idx.x), w = t / 32, l = t % 32;
    for (int i = 0; i < a_regs; ++i) g.mslots[w][l][i] = a[i];
    g.mslots[w][l][4] = b0;
    g.mslots[w][l][5] = b1;
    g.warps[w]->arrive_and_wait();
    const int K = a_regs * 8;
    int A[16][32] = {}, B[32][8] = {};
    for (int lane = 0; lane < 32; ++lane) {
        for (int reg = 0; reg < a_regs; ++reg)
            for (int j = 0; j < 4; ++j)
                A[wush::mma::a_row(lane, reg)][wush::tile::mma_a_col(lane, reg, j)] =
                    wush::tile::lane_s8(g.mslots[w][lane][reg], j);
        for (int reg = 0; reg < K / 16; ++reg)
            for (int j = 0; j < 4; ++j)
                B[wush::tile::mma_b_row(lane, reg, j)][wush::mma::b_col(lane)] =
                    wush::tile::lane_s8(g.mslots[w][lane][4 + reg], j);
    }
    g.warps[w]->arrive_and_wait();
    for (int e = 0; e < 4; ++e) {
        const int r = wush::mma::c_row(l, e), c = wush::mma::c_col(l, e);
        std::int64_t s = 0;
        for (int k = 0; k < K; ++k) s += A[r][k] * B[k][c];
        d[e] = int(std::uint32_t(d[e]) + std::uint32_t(s));
    }
}

// The BF16 MMA's two modes. Exact (no direction set): each output is c + sum of the exact
// products, rounded once to FP32. Adversarial: `direction(row, col)` (row, col: where the output
// goes in the kernel's result, from the tile origin the kernel passes) gives +1 / -1, and the output
// is moved that way by as much as the accumulator model allows (tc::mma_instruction_error of
// M = |c| + sum |p_k|): the largest error the certified bound claims to cover, aimed at the
// nearest rounding boundary by the test.
inline std::function<int(std::size_t, std::size_t)> g_mma_direction;

// d += A B for m16n8k16 with BF16 A, B (PTX fragment maps of cuda/quantize/bf16_fragments.h), FP32 d.
inline void mma_bf16(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1, std::size_t row0,
                     std::size_t col0) {
    const int t = int(t_idx.x), w = t / 32, l = t % 32;
    for (int i = 0; i < 4; ++i) g.mslots[w][l][i] = a[i];
    g.mslots[w][l][4] = b0;
    g.mslots[w][l][5] = b1;
    g.warps[w]->arrive_and_wait();
    double A[16][16] = {}, B[16][8] = {};
    for (int lane = 0; lane < 32; ++lane) {
        for (int reg = 0; reg < 4; ++reg)
            for (int h = 0; h < 2; ++h)
                A[wush::tc::a_row(lane, reg)][wush::tc::a_col(lane, reg, h)] =
                    wush::tc::bf16_value(std::uint16_t(g.mslots[w][lane][reg] >> (16 * h)));
        for (int reg = 0; reg < 2; ++reg)
            for (int h = 0; h < 2; ++h)
                B[wush::tc::b_row(lane, reg, h)][wush::tc::b_col(lane)] =
                    wush::tc::bf16_value(std::uint16_t(g.mslots[w][lane][4 + reg] >> (16 * h)));
    }
    g.warps[w]->arrive_and_wait();
    for (int e = 0; e < 4; ++e) {
        const int r = wush::tc::c_row(l, e), c = wush::tc::c_col(l, e);
        long double s = d[e], m = std::fabs(double(d[e]));
        for (int k = 0; k < 16; ++k) {
            const double p = A[r][k] * B[k][c];  // exact: 8 x 8 significant bits
            s += p;
            m += std::fabs(p);
        }
        if (!g_mma_direction) {
            d[e] = float(s);
            continue;
        }
        const long double err = wush::tc::mma_instruction_error(float(m * (1 - 0x1p-20L)));
        const int dir = g_mma_direction(row0 + std::size_t(r), col0 + std::size_t(c));
        float f = float(s + dir * err);
        while (std::fabs((long double)f - s) > err) f = std::nextafter(f, float(s));
        d[e] = f;
    }
}

// Runs body() as every thread of every block of `grid`, block after block.
inline void launch(Dim grid, unsigned threads, std::size_t smem_bytes, const std::function<void()>& body) {
    g_grid = grid;
    g_block = Dim{threads, 1, 1};
    for (unsigned z = 0; z < grid.z; ++z)
        for (unsigned y = 0; y < grid.y; ++y)
            for (unsigned x = 0; x < grid.x; ++x) {
                g.smem.assign(smem_bytes + 16, 0xCD);  // garbage, as on the device
                g.block = std::make_unique<std::barrier<>>(threads);
                g.warps.clear();
                for (unsigned w = 0; w < (threads + 31) / 32; ++w)
                    g.warps.push_back(std::make_unique<std::barrier<>>(32));
                std::vector<std::thread> ts;
                for (unsigned i = 0; i < threads; ++i)
                    ts.emplace_back([&, i] {
                        t_idx = Dim{i, 0, 0};
                        b_idx = Dim{x, y, z};
                        t_groups.clear();
                        t_open.clear();
                        body();
                    });
                for (auto& t : ts) t.join();
            }
}

}  // namespace wush_emu

// The CUDA spellings the kernels use.
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define threadIdx wush_emu::t_idx
#define blockIdx wush_emu::b_idx
#define blockDim wush_emu::g_block
#define gridDim wush_emu::g_grid

struct uint2 {
    unsigned x, y;
};
struct uint4 {
    unsigned x, y, z, w;
};
inline uint2 make_uint2(unsigned x, unsigned y) {
    return uint2{x, y};
}
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
    return uint4{x, y, z, w};
}
template <typename T>
inline T __ldg(const T* p) {
    return *p;
}
inline void __syncthreads() {
    wush_emu::syncthreads();
}
inline void __syncwarp(unsigned = 0xFFFFFFFFu) {
    wush_emu::syncwarp();
}
inline unsigned long long atomicMin(unsigned long long* p, unsigned long long v) {
    return wush_emu::atomic_min(p, v);
}
inline float __shfl_xor_sync(unsigned, float v, int o) {
    return wush_emu::shfl_xor(v, o);
}
inline unsigned __ballot_sync(unsigned, int p) {
    return wush_emu::ballot(p != 0);
}
inline int __ffs(int v) {
    return __builtin_ffs(v);
}
inline long long min(long long a, long long b) {
    return a < b ? a : b;
}

struct __nv_bfloat16 {
    unsigned short x;
};
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return __nv_bfloat16{static_cast<unsigned short>(u >> 16)};
}

// What the streaming decode kernel (cuda/gemm/stream_decode_kernel.cuh) adds: its per-tile counter
// (blocks run one after another here, so a lock is all an atomic needs; its acquire-release order
// is moot: one address space, threads joined between blocks), and L2-only loads.
inline unsigned atomicAdd(unsigned* p, unsigned v) {
    static std::mutex m;
    const std::lock_guard<std::mutex> lock(m);
    const unsigned old = *p;
    *p = old + v;
    return old;
}
template <typename T>
inline T __ldcg(const T* p) {
    return *p;
}
