// The BF16 prefill GEMM's launches (cuda/gemm/gemm_bf16_prefill.h): the activations dequantized to BF16
// (exact, cuda/gemm/dequantize.h), W's scales to BF16 pairs, then the tile kernel.
#include "gemm_bf16_prefill.h"

#include <cuda_runtime.h>

#include <cstdint>

#include "common/error.h"
#include "cuda_check.h"
#include "gemm_bf16_prefill_kernel.cuh"
#include "kernels.h"

namespace wush::cuda {

namespace {

using namespace wush::cuda::bf16_prefill_detail;

std::size_t round_up(std::size_t v, std::size_t a) {
    return (v + a - 1) / a * a;
}

bool e2m1_format(wush_format f, int group) {
    return ((f == WUSH_FORMAT_MXFP4 || f == WUSH_FORMAT_MXFP4_OCP) && group == 32) ||
           (f == WUSH_FORMAT_NVFP4 && group == 16);
}

std::size_t scale_bytes_of(std::size_t n, std::size_t k, int group) {
    return round_up(n, kScaleRowPad) * (k / std::size_t(group)) * 4;
}

bool aligned16(const void* p) {
    return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0;
}

template <int G>
void launch_tiles(const GemmArgs& a, std::uint16_t* a_bf16, std::uint32_t* scales, cudaStream_t stream) {
    const int n_pad = int(round_up(a.n, kScaleRowPad));
    const long long total = (long long)(a.k / BK) * n_pad * Layout<G>::kSpr;
    const unsigned blocks = unsigned(std::min<long long>((total + 255) / 256, 4096));
    w_scales_kernel<G><<<blocks, 256, 0, stream>>>(a.format, int(a.n), n_pad, (long long)a.k, a.w_scales, scales);
    check_launch("w_scales_kernel");
    Bf16PrefillParams p;
    p.m = int(a.m);
    p.n = int(a.n);
    p.k = (long long)a.k;
    p.a = a_bf16;
    p.w_codes = a.w_codes;
    p.w_scales = scales;
    p.n_pad = n_pad;
    p.tables = magnitude_tables(a.format);
    p.alpha = a.alpha;
    p.y = a.y;
    p.y_bf16 = a.y_dtype == WUSH_DTYPE_BF16;
    const dim3 grid{unsigned((a.n + BN - 1) / BN), unsigned((a.m + BM - 1) / BM), 1u};
    bf16_prefill_kernel<G><<<grid, kThreads, 0, stream>>>(p);
    check_launch("bf16_prefill_kernel");
}

}  // namespace

std::size_t bf16_prefill_workspace_bytes(wush_format format, std::size_t m, std::size_t n, std::size_t k) {
    const int group = format == WUSH_FORMAT_NVFP4 ? 16 : 32;
    return round_up(m * k * 2, 256) + scale_bytes_of(n, k, group);
}

bool bf16_prefill_supported(const GemmArgs& a, int sm) {
    if (sm < 80 || !e2m1_format(a.format, a.group)) return false;
    if (a.m == 0 || a.n == 0 || a.k == 0 || a.k % BK != 0) return false;
    if (a.y_dtype != WUSH_DTYPE_F32 && a.y_dtype != WUSH_DTYPE_BF16) return false;
    // Grid and int indices: rows in blockIdx.y, sizes in int.
    if ((a.m + BM - 1) / BM > 65535 || a.n > 0x3FFFFFFFu || a.k > 0x3FFFFFFFu) return false;
    if (!a.a_codes || !a.a_scales || !a.w_codes || !a.w_scales || !a.y || !aligned16(a.w_codes)) return false;
    return a.workspace != nullptr && aligned16(a.workspace) &&
           a.workspace_bytes >= bf16_prefill_workspace_bytes(a.format, a.m, a.n, a.k);
}

void launch_bf16_prefill_gemm(const GemmArgs& a, int sm, cudaStream_t stream) {
    if (!bf16_prefill_supported(a, sm))
        fail(WUSH_ERR_UNSUPPORTED, "launch_bf16_prefill_gemm: unsupported format, shape, alignment or workspace");
    auto* ws = static_cast<unsigned char*>(a.workspace);
    auto* a_bf16 = reinterpret_cast<std::uint16_t*>(ws);
    auto* scales = reinterpret_cast<std::uint32_t*>(ws + round_up(a.m * a.k * 2, 256));
    launch_dequantize(a.format, a.group, a.a_codes, a.a_scales, a.m, a.k, a_bf16, stream);
    if (a.group == 16) launch_tiles<16>(a, a_bf16, scales, stream);
    else launch_tiles<32>(a, a_bf16, scales, stream);
}

}  // namespace wush::cuda
