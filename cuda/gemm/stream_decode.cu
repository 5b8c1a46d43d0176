// The streaming decode kernel's launch (cuda/gemm/stream_decode.h): persistent blocks, one per resident
// slot of the device (read once per context by configure_stream_decode), over the shape's work
// items (stream_decode_plan.h). The grid size depends on the GPU, the partition and the bits do not.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "common/error.h"
#include "cuda_check.h"
#include "gemm_plan.h"
#include "stream_decode.h"
#include "stream_decode_kernel.cuh"
#include "stream_decode_plan.h"

namespace wush::cuda {

namespace {

using stream_detail::stream_decode_kernel;
using stream_detail::StreamParams;

int log2_of(int mr) {
    int l = 0;
    while ((1 << l) < mr) ++l;
    return l;
}

int occupancy(const void* kernel, int smem) {
    int blocks = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, stream::kThreads, std::size_t(smem)) !=
        cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return blocks;
}

// The instantiation's limit raised to its largest launch (resident activations included where it
// can hold any), then its occupancy at one chunk of activations and at that largest size.
template <int MR, int G>
void configure_one(int* blocks_per_sm, bool* resident_fits) {
    const void* kernel = reinterpret_cast<const void*>(stream_decode_kernel<MR, G>);
    const int most = std::max(1, stream::max_resident_chunks(MR, G));
    *blocks_per_sm = 0;  // 0: this instantiation cannot run here; the existing decode kernel serves
    *resident_fits = false;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, stream::smem_bytes(MR, G, most)) !=
        cudaSuccess) {
        cudaGetLastError();
        return;
    }
    *blocks_per_sm = occupancy(kernel, stream::smem_bytes(MR, G));
    *resident_fits =
        most > 1 && *blocks_per_sm > 0 && occupancy(kernel, stream::smem_bytes(MR, G, most)) == *blocks_per_sm;
}

template <int G>
void configure_group(int (&blocks)[6], bool (&fits)[6]) {
    configure_one<1, G>(&blocks[0], &fits[0]);
    configure_one<2, G>(&blocks[1], &fits[1]);
    configure_one<4, G>(&blocks[2], &fits[2]);
    configure_one<8, G>(&blocks[3], &fits[3]);
    configure_one<16, G>(&blocks[4], &fits[4]);
    configure_one<32, G>(&blocks[5], &fits[5]);
}

// One launch; with `pdl`, as a programmatic dependent launch (sm_90+): the kernel may start while
// the stream's previous kernel (the activations' quantize) finishes, fills its ring with weight
// stages, and waits for that kernel's writes before it reads an activation
// (stream_detail::wait_for_previous_grid). Stream capture records the edge as a programmatic one
// (CUDA 12.3 and later), so a graph keeps it.
template <int MR, int G>
void launch_one(unsigned grid, const StreamParams& p, cudaStream_t s, bool pdl) {
    cudaLaunchAttribute attr[1] = {};
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(grid);
    config.blockDim = dim3(stream::kThreads);
    config.dynamicSmemBytes = std::size_t(stream::smem_bytes(MR, G, p.act_chunks));
    config.stream = s;
    config.attrs = attr;
    config.numAttrs = pdl ? 1 : 0;
    check_cuda(cudaLaunchKernelEx(&config, stream_decode_kernel<MR, G>, p), "stream_decode_kernel");
}

template <int G>
void launch_mr(int mr, unsigned grid, const StreamParams& p, cudaStream_t s, bool pdl) {
    switch (mr) {
        case 1: launch_one<1, G>(grid, p, s, pdl); break;
        case 2: launch_one<2, G>(grid, p, s, pdl); break;
        case 4: launch_one<4, G>(grid, p, s, pdl); break;
        case 8: launch_one<8, G>(grid, p, s, pdl); break;
        case 16: launch_one<16, G>(grid, p, s, pdl); break;
        default: launch_one<32, G>(grid, p, s, pdl); break;
    }
}

}  // namespace

StreamDecodeDevice configure_stream_decode() {
    StreamDecodeDevice d;
    d.sm = current_sm("configure_stream_decode");
    int dev = 0;
    WUSH_CUDA_CHECK(cudaGetDevice(&dev));
    WUSH_CUDA_CHECK(cudaDeviceGetAttribute(&d.sm_count, cudaDevAttrMultiProcessorCount, dev));
    if (d.sm < 80) return d;  // no cp.async: never selected
    configure_group<32>(d.blocks_per_sm[0], d.resident_fits[0]);
    configure_group<16>(d.blocks_per_sm[1], d.resident_fits[1]);
    return d;
}

bool stream_decode_supported(const GemmArgs& a, const StreamDecodeWeights& w, const StreamDecodeDevice& d) {
    if (d.sm < 80 || a.m == 0 || a.m > std::size_t(stream::kMaxRows) || !w.stages) return false;
    if (d.blocks_per_sm[a.group == 16 ? 1 : 0][log2_of(stream::stream_mr(a.m))] <= 0) return false;
    // The decode kernel's shape and alignment rules; its workspace rule is not this kernel's (its
    // own partition of k splits differently).
    if (!gemm_shape_supported(GemmKernel::Decode, a, d.sm) || !a.a_codes || !a.a_scales || !a.y) return false;
    const std::size_t need = stream::workspace_bytes(a.m, a.n, a.k);
    return need == 0 || (a.workspace != nullptr && a.workspace_bytes >= need &&
                         reinterpret_cast<std::uintptr_t>(a.workspace) % 16 == 0);
}

namespace {

unsigned* counters_of(const GemmArgs& a) {
    return reinterpret_cast<unsigned*>(static_cast<std::uint8_t*>(a.workspace) +
                                       stream::counters_offset(a.m, a.n, a.k));
}

}  // namespace

void zero_stream_decode_counters(const GemmArgs& a, cudaStream_t s) {
    const std::size_t need = stream::workspace_bytes(a.m, a.n, a.k);
    if (need == 0) return;
    if (a.workspace == nullptr || a.workspace_bytes < need)
        fail(WUSH_ERR_UNSUPPORTED, "zero_stream_decode_counters: workspace too small");
    WUSH_CUDA_CHECK(cudaMemsetAsync(counters_of(a), 0, stream::counter_bytes(a.n), s));
}

void launch_stream_decode_gemm(const GemmArgs& a, const StreamDecodeWeights& w, cudaStream_t s,
                               const StreamDecodeDevice& d, bool counters_zeroed) {
    if (!stream_decode_supported(a, w, d))
        fail(WUSH_ERR_UNSUPPORTED, "launch_stream_decode_gemm: unsupported device, shape, operands or workspace");
    const stream::Schedule sc = stream::schedule_of(a.m, a.n, a.k);
    if (a.n > 0x7FFFFFFFu || sc.chunks > 0x7FFFFFFFu || sc.splits > 0x7FFFFFFFu)
        fail(WUSH_ERR_UNSUPPORTED, "launch_stream_decode_gemm: shape too large");
    const int g16 = a.group == 16 ? 1 : 0, mr_index = log2_of(sc.mr);
    StreamParams p;
    fill_decode_operands(p, a);
    p.stages = w.stages;
    p.partial = sc.splits > 1 ? static_cast<float*>(a.workspace) : nullptr;
    p.counters = sc.splits > 1 ? counters_of(a) : nullptr;
    if (sc.splits > 1 && !counters_zeroed) zero_stream_decode_counters(a, s);
    p.chunks = int(sc.chunks);
    p.splits = int(sc.splits);
    p.chunks_per_split = int(sc.chunks_per_split);
    p.stage_bytes = stream::stage_bytes(a.format);
    p.act_chunks = d.resident_fits[g16][mr_index] ? stream::resident_chunks(sc, a.group) : 1;
    p.items = (long long)sc.items;
    const unsigned grid = unsigned(stream::grid_blocks(sc, d.sm_count, d.blocks_per_sm[g16][mr_index]));
    // Programmatic dependent launch where the GPU has it and the stream's previous operation is
    // the kernel that wrote the activations (the quantize): not where this call's own zeroing of
    // the counters stands between them, which would gain nothing. (The kernel as a whole is opt-in,
    // WUSH_CONTEXT_CUDA_STREAM_DECODE, until measured.)
    const bool pdl = d.sm >= 90 && (sc.splits == 1 || counters_zeroed);
    if (a.group == 16) launch_mr<16>(sc.mr, grid, p, s, pdl);
    else launch_mr<32>(sc.mr, grid, p, s, pdl);
    check_launch("stream_decode_kernel");
}

}  // namespace wush::cuda
