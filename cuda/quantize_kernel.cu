// The fused transform + quantization on CUDA cores: one thread per (token, block) group, one
// thread block per tile of kTileTokens tokens and one column block. The block's G x G matrix is
// loaded into shared memory once per tile (every thread then reads the same element: a
// broadcast), and the tile's x is staged through shared memory so that global reads are whole
// rows (coalesced) whatever d_in is.
//
// Per group: y = T x in float32 (FMA chain, j ascending), the error bound of the CPU kernels
// (formats::group_error_bound), the certified float32 quantizer (formats/certified_group.h); a
// group it cannot certify is recomputed in float64 with the shared definition
// (transform_group_f64 + quantize_group<double>), so the codes and scales are bit for bit those
// of the CPU backend. Not yet done: the 32x32 product on tensor cores (3xTF32 / bf16x3 with an
// error bound that covers it); this kernel is the FP32 CUDA-core version.
//
// This file is compiled with --fmad=false (cuda/CMakeLists.txt): the float64 fallback must not be
// contracted into FMAs; the float32 FMAs it needs are explicit fmaf calls.
#include "kernels.h"

#include "common/float_bits.h"
#include "cuda_check.h"
#include "formats/certified_group.h"
#include "formats/group_quantizer.h"

namespace wush::cuda {

namespace {

constexpr int kTileTokens = 128;  // threads per block

__device__ float load_x(wush_dtype dtype, const void* x, std::size_t i) {
    switch (dtype) {
        case WUSH_DTYPE_F16: return bits::f16_decode(static_cast<const std::uint16_t*>(x)[i]);
        case WUSH_DTYPE_BF16: return bits::bf16_decode(static_cast<const std::uint16_t*>(x)[i]);
        default: return static_cast<const float*>(x)[i];
    }
}

template <int G>
__global__ void __launch_bounds__(kTileTokens) quantize_kernel(QuantizeArgs a) {
    __shared__ float t_s[G * G];
    // The tile's x, staged so that a warp reads whole rows (coalesced); padded by one column so
    // that thread r reading row r is free of bank conflicts.
    __shared__ float x_s[kTileTokens][G + 1];
    const std::size_t block = blockIdx.y;
    const std::size_t tile0 = std::size_t(blockIdx.x) * kTileTokens;
    const std::size_t col0 = block * G;
    const float* t = nullptr;
    float norm = 0.0f;
    if (a.use != Matrices::Identity) {
        const std::size_t m = a.use == Matrices::PerBlock ? block : 0;
        for (int i = threadIdx.x; i < G * G; i += blockDim.x) t_s[i] = a.matrices[m * G * G + i];
        norm = a.row_norms[m];
        t = t_s;
    }
    for (int i = threadIdx.x; i < kTileTokens * G; i += blockDim.x) {
        const int r = i / G, c = i % G;
        const std::size_t token = tile0 + std::size_t(r);
        float v = 0.0f;
        if (token < a.n_tokens) {
            v = load_x(a.x_dtype, a.x, token * a.d_in + col0 + std::size_t(c));
            // The smallest (row, column) of all NaN/Inf wins: the first in row-major order.
            if (!isfinite(v)) atomicMin(a.non_finite, (static_cast<unsigned long long>(token) << 32) | (col0 + c));
        }
        x_s[r][c] = v;
    }
    __syncthreads();
    const std::size_t token = tile0 + threadIdx.x;
    if (token >= a.n_tokens) return;
    const float* x = x_s[threadIdx.x];  // read in place (conflict-free), not copied to local memory
    bool finite = true;
    for (int j = 0; j < G; ++j) finite = finite && isfinite(x[j]);
    if (!finite) return;  // nothing written for this group (the call reports NON_FINITE)
    std::uint8_t codes[G / 2];
    std::uint8_t scale[2];
    float y[G];
    formats::transform_group_f32(t, x, G, y);
    const float bound = formats::group_error_bound(x, G, t == nullptr, norm);
    if (!formats::certify_group(a.format, y, G, bound, codes, scale)) {
        double yd[G];
        formats::transform_group_f64(t, x, G, yd);
        formats::quantize_group<double>(a.format, yd, G, codes, scale);
    }
    std::uint8_t* dst = a.codes + token * (a.d_in / 2) + col0 / 2;
    for (int i = 0; i < G / 2; ++i) dst[i] = codes[i];
    const int sb = a.format == WUSH_FORMAT_INT4 ? 2 : 1;
    std::uint8_t* sdst = a.scales + (token * (a.d_in / G) + block) * sb;
    for (int i = 0; i < sb; ++i) sdst[i] = scale[i];
}

}  // namespace

void launch_quantize(const QuantizeArgs& a, cudaStream_t stream) {
    if (a.n_tokens == 0) return;
    const dim3 grid(unsigned((a.n_tokens + kTileTokens - 1) / kTileTokens), unsigned(a.d_in / std::size_t(a.group)));
    if (a.group == 16) quantize_kernel<16><<<grid, kTileTokens, 0, stream>>>(a);
    else quantize_kernel<32><<<grid, kTileTokens, 0, stream>>>(a);
    check_launch("quantize_kernel");
}

}  // namespace wush::cuda
