// The decode W4A4 GEMM (small m): streams the weight's packed codes once with 16-byte loads and
// multiplies them with up to 16 activation rows per pass, exactly per group in int32 (dp4a on the
// doubled int8 values of src/formats/tile_decode.h), promoted to float32 once per group.
//
// Geometry (cuda/gemm_plan.h): a block of 8 warps owns 16 weight rows (2 per warp) and one split of
// k; it walks its split in chunks of 1024 elements. Per chunk, each lane issues one 16-byte load of
// codes per weight row (32 elements = one G = 32 group or two NVFP4 groups) before the block
// decodes the chunk's activations (m x 1024 int8 plus float scales) into shared
// memory; then each lane decodes its weight words (6 integer ops per 4 elements), and per
// activation row does 2 conflict-free LDS.128 and 8 dp4a started from the promotion magic, then one
// FADD + FMUL + FFMA. A warp reduction by shuffles ends the block. Where one wave of blocks is not
// enough (n / 16 * passes < 528), k is split: partials go to the workspace and a second kernel sums
// them in split order (deterministic, no atomics).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>

#include "common/error.h"
#include "formats/tile_decode.h"
#include "gemm_plan.h"
#include "w4a4_gemm.h"

namespace wush::cuda {

namespace {

using namespace wush::tile;

constexpr int kThreads = plan::kDecodeWarps * 32;
constexpr int kChunk = int(plan::kDecodeChunk);
constexpr int kUnitsPerChunk = kChunk / 32;                      // one per lane
constexpr int kARowBytes = kChunk + (kUnitsPerChunk / 4) * 16;   // 16 bytes of padding per 4 units

// Byte offset of unit u's 32 int8 values inside a staged activation row: 16 bytes of padding after
// every 4 units make a quarter-warp's 16-byte reads (8 lanes, 32 bytes apart) hit 32 distinct banks.
__device__ __forceinline__ int a_unit_offset(int u) { return u * 32 + (u >> 2) * 16; }

struct DecodeParams {
    wush_format format;
    int m, n;
    long long k;
    const std::uint8_t* a_codes;
    const std::uint8_t* a_scales;
    const std::uint8_t* w_codes;
    const std::uint8_t* w_scales;
    float alpha_q;  // alpha / 4 (doubled values on both sides)
    void* y;
    int y_bf16;
    float* partial;  // splits x m x n, or null when the block writes y
    long long split_len;  // elements per split (a multiple of kChunk)
};

__device__ __forceinline__ void store_out(void* y, int bf16, std::size_t idx, float v) {
    if (bf16)
        static_cast<__nv_bfloat16*>(y)[idx] = __float2bfloat16_rn(v);
    else
        static_cast<float*>(y)[idx] = v;
}

template <int MR, int G>
__global__ void __launch_bounds__(kThreads) decode_gemm_kernel(const DecodeParams p) {
    constexpr int kGroupsPerUnit = 32 / G;
    constexpr int kGroupsPerChunk = kChunk / G;
    constexpr int R = plan::kDecodeRowsPerWarp;
    __shared__ __align__(16) std::uint8_t s_a[MR * kARowBytes];
    __shared__ float s_sa[MR * kGroupsPerChunk];

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const long long row_a0 = (long long)blockIdx.z * plan::kDecodeMaxM;
    const int rows_a = int(min((long long)MR, (long long)p.m - row_a0));
    const int n0 = blockIdx.x * plan::kDecodeRowsPerBlock + warp * R;
    const long long k0 = (long long)blockIdx.y * p.split_len;
    const long long k1 = min(p.k, k0 + p.split_len);
    const long long kbytes = p.k / 2, groups = p.k / G;
    const int sb = scale_bytes(p.format);
    const DoubledLut lut = doubled_lut(p.format);

    float acc[R][MR];
#pragma unroll
    for (int j = 0; j < R; ++j)
#pragma unroll
        for (int r = 0; r < MR; ++r) acc[j][r] = 0.0f;

    for (long long kc = k0; kc < k1; kc += kChunk) {
        // 1. The weight codes and scales (times alpha / 4, as in the prefill kernel) of this lane's
        // unit, issued before the staging below.
        const long long ue = kc + 32 * lane;
        const bool uvalid = ue < k1;
        uint4 wv[R];
        float sw[R][kGroupsPerUnit];
#pragma unroll
        for (int j = 0; j < R; ++j) {
            const int row = n0 + j;
            const bool valid = uvalid && row < p.n;
            wv[j] = valid ? __ldg(reinterpret_cast<const uint4*>(p.w_codes + (long long)row * kbytes + ue / 2))
                          : make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int h = 0; h < kGroupsPerUnit; ++h)
                sw[j][h] = valid ? scale_value(p.format, p.w_scales + ((long long)row * groups + ue / G + h) * sb) * p.alpha_q : 0.0f;
        }

        // 2. Stage the chunk's activations: doubled int8 codes and scales (zeros past
        // k1 and past the last row, so that padded lanes and rows add exact zeros).
        __syncthreads();
        const int len = int(min((long long)kChunk, k1 - kc));
        for (int idx = tid; idx < MR * (kChunk / 8); idx += kThreads) {
            const int r = idx / (kChunk / 8), w = idx % (kChunk / 8), e = 8 * w;
            uint2 v = make_uint2(0, 0);
            if (r < rows_a && e < len) {
                const std::uint32_t c = __ldg(reinterpret_cast<const unsigned*>(p.a_codes + (row_a0 + r) * kbytes + (kc + e) / 2));
                v.x = decode4(lut, c);
                v.y = decode4(lut, c >> 16);
            }
            *reinterpret_cast<uint2*>(s_a + r * kARowBytes + a_unit_offset(w >> 2) + (w & 3) * 8) = v;
        }
        for (int idx = tid; idx < MR * kGroupsPerChunk; idx += kThreads) {
            const int r = idx / kGroupsPerChunk, g = idx % kGroupsPerChunk;
            float s = 0.0f;
            if (r < rows_a && g * G < len)
                s = scale_value(p.format, p.a_scales + ((row_a0 + r) * groups + kc / G + g) * sb);
            s_sa[idx] = s;
        }
        __syncthreads();

        // 3. Decode the weight words once, then one exact group dot per activation row.
        std::uint32_t wd[R][8];
#pragma unroll
        for (int j = 0; j < R; ++j) {
            const std::uint32_t words[4] = {wv[j].x, wv[j].y, wv[j].z, wv[j].w};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                wd[j][2 * i] = decode4(lut, words[i]);
                wd[j][2 * i + 1] = decode4(lut, words[i] >> 16);
            }
        }
#pragma unroll
        for (int r = 0; r < MR; ++r) {
            const uint4* ap = reinterpret_cast<const uint4*>(s_a + r * kARowBytes + a_unit_offset(lane));
            const uint4 a0 = ap[0], a1 = ap[1];
            const std::uint32_t av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
#pragma unroll
            for (int h = 0; h < kGroupsPerUnit; ++h) {
                const float sa = s_sa[r * kGroupsPerChunk + lane * kGroupsPerUnit + h];
#pragma unroll
                for (int j = 0; j < R; ++j) {
                    int d = kPromoteMagicBits;
#pragma unroll
                    for (int i = 0; i < 8 / kGroupsPerUnit; ++i)
                        d = dp4a(av[h * (8 / kGroupsPerUnit) + i], wd[j][h * (8 / kGroupsPerUnit) + i], d);
                    acc[j][r] = fmaf(promoted_dot(d), sa * sw[j][h], acc[j][r]);
                }
            }
        }
    }

    // 4. Warp reduction; lane 0 writes (y, or this split's partial).
#pragma unroll
    for (int j = 0; j < R; ++j) {
#pragma unroll
        for (int r = 0; r < MR; ++r) {
            float v = acc[j][r];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
            const int col = n0 + j;
            if (lane == 0 && r < rows_a && col < p.n) {
                const std::size_t idx = std::size_t(row_a0 + r) * p.n + col;
                if (p.partial)
                    p.partial[std::size_t(blockIdx.y) * std::size_t(p.m) * p.n + idx] = v;
                else
                    store_out(p.y, p.y_bf16, idx, v);
            }
        }
    }
}

// y = sum over splits of the partials, in split order.
__global__ void splitk_reduce_kernel(const float* partial, int splits, std::size_t mn, void* y, int bf16) {
    for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < mn; i += std::size_t(gridDim.x) * blockDim.x) {
        float s = 0.0f;
        for (int sp = 0; sp < splits; ++sp) s += partial[std::size_t(sp) * mn + i];
        store_out(y, bf16, i, s);
    }
}

void check_launch(const char* what) {
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) fail(WUSH_ERR_CUDA, std::string(what) + ": " + cudaGetErrorString(e));
}

template <int G>
void launch_mr(int mr, dim3 grid, const DecodeParams& p, cudaStream_t stream) {
    switch (mr) {
        case 1: decode_gemm_kernel<1, G><<<grid, kThreads, 0, stream>>>(p); break;
        case 2: decode_gemm_kernel<2, G><<<grid, kThreads, 0, stream>>>(p); break;
        case 4: decode_gemm_kernel<4, G><<<grid, kThreads, 0, stream>>>(p); break;
        case 8: decode_gemm_kernel<8, G><<<grid, kThreads, 0, stream>>>(p); break;
        default: decode_gemm_kernel<16, G><<<grid, kThreads, 0, stream>>>(p); break;
    }
}

int current_sm() {
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
        fail(WUSH_ERR_CUDA, "launch_decode_gemm: no current CUDA device");
    return major * 10 + minor;
}

}  // namespace

void launch_decode_gemm(const GemmArgs& a, cudaStream_t stream) {
    if (!gemm_supported(GemmKernel::Decode, a, current_sm()))
        fail(WUSH_ERR_UNSUPPORTED, "launch_decode_gemm: unsupported format, shape, alignment or workspace");
    const plan::DecodePlan pl = plan::plan_decode(a.m, a.n, a.k);
    if (pl.blocks_n > 0x7FFFFFFFu || pl.splits > 65535 || pl.row_passes > 65535 || a.m > 0x7FFFFFFFu || a.n > 0x7FFFFFFFu)
        fail(WUSH_ERR_UNSUPPORTED, "launch_decode_gemm: shape too large for the grid");
    DecodeParams p;
    p.format = a.format;
    p.m = int(a.m);
    p.n = int(a.n);
    p.k = (long long)a.k;
    p.a_codes = a.a_codes;
    p.a_scales = a.a_scales;
    p.w_codes = a.w_codes;
    p.w_scales = a.w_scales;
    p.alpha_q = a.alpha * 0.25f;
    p.y = a.y;
    p.y_bf16 = a.y_dtype == WUSH_DTYPE_BF16;
    p.partial = pl.splits > 1 ? static_cast<float*>(a.workspace) : nullptr;
    p.split_len = (long long)(pl.chunks_per_split * plan::kDecodeChunk);
    const dim3 grid(unsigned(pl.blocks_n), unsigned(pl.splits), unsigned(pl.row_passes));
    if (a.group == 16)
        launch_mr<16>(pl.mr, grid, p, stream);
    else
        launch_mr<32>(pl.mr, grid, p, stream);
    check_launch("decode_gemm_kernel");
    if (pl.splits > 1) {
        const std::size_t mn = a.m * a.n;
        const unsigned blocks = unsigned(std::min<std::size_t>(plan::ceil_div(mn, 256), 4096));
        splitk_reduce_kernel<<<blocks, 256, 0, stream>>>(p.partial, int(pl.splits), mn, a.y, p.y_bf16);
        check_launch("splitk_reduce_kernel");
    }
}

}  // namespace wush::cuda
