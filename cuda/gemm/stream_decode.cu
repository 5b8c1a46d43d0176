// The streaming decode kernel's launch (cuda/gemm/stream_decode.h): persistent blocks, one per resident
// slot of the device (read once per context by configure_stream_decode), over the shape's work
// items (stream_decode_plan.h). The grid size depends on the GPU, the partition and the bits do not.
#include <cuda_runtime.h>

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

template <int MR, int G>
void configure_one(int* blocks_per_sm) {
    const int smem = stream::smem_bytes(MR, G);
    cudaError_t e =
        cudaFuncSetAttribute(stream_decode_kernel<MR, G>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e == cudaSuccess)
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks_per_sm, stream_decode_kernel<MR, G>, stream::kThreads,
                                                          std::size_t(smem));
    if (e != cudaSuccess) {
        cudaGetLastError();
        *blocks_per_sm = 0;  // this instantiation cannot run here: the existing decode kernel serves
    }
}

template <int G>
void configure_group(int (&blocks)[6]) {
    configure_one<1, G>(&blocks[0]);
    configure_one<2, G>(&blocks[1]);
    configure_one<4, G>(&blocks[2]);
    configure_one<8, G>(&blocks[3]);
    configure_one<16, G>(&blocks[4]);
    configure_one<32, G>(&blocks[5]);
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
    config.dynamicSmemBytes = std::size_t(stream::smem_bytes(MR, G));
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
    configure_group<32>(d.blocks_per_sm[0]);
    configure_group<16>(d.blocks_per_sm[1]);
    return d;
}

bool stream_decode_supported(const GemmArgs& a, const StreamDecodeWeights& w, const StreamDecodeDevice& d) {
    if (d.sm < 80 || a.m == 0 || a.m > std::size_t(stream::kMaxRows) || !w.stages) return false;
    if (d.blocks_per_sm[a.group == 16 ? 1 : 0][log2_of(stream::stream_mr(a.m))] <= 0) return false;
    const std::size_t need = stream::workspace_bytes(a.m, a.n, a.k);
    if (need > 0 && (a.workspace == nullptr || a.workspace_bytes < need)) return false;
    return gemm_supported(GemmKernel::Decode, a, d.sm);  // the decode kernel's operand rules
}

void launch_stream_decode_gemm(const GemmArgs& a, const StreamDecodeWeights& w, cudaStream_t s,
                               const StreamDecodeDevice& d) {
    if (!stream_decode_supported(a, w, d))
        fail(WUSH_ERR_UNSUPPORTED, "launch_stream_decode_gemm: unsupported device, shape, operands or workspace");
    const stream::Schedule sc = stream::schedule_of(a.m, a.n, a.k);
    if (a.n > 0x7FFFFFFFu || sc.chunks > 0x7FFFFFFFu || sc.splits > 0x7FFFFFFFu)
        fail(WUSH_ERR_UNSUPPORTED, "launch_stream_decode_gemm: shape too large");
    StreamParams p;
    fill_decode_operands(p, a);
    p.stages = w.stages;
    p.partial = sc.splits > 1 ? static_cast<float*>(a.workspace) : nullptr;
    p.counters = nullptr;
    if (sc.splits > 1) {
        p.counters = reinterpret_cast<unsigned*>(static_cast<std::uint8_t*>(a.workspace) +
                                                 stream::counters_offset(a.m, a.n, a.k));
        WUSH_CUDA_CHECK(cudaMemsetAsync(p.counters, 0, stream::counter_bytes(a.n), s));
    }
    p.chunks = int(sc.chunks);
    p.splits = int(sc.splits);
    p.chunks_per_split = int(sc.chunks_per_split);
    p.stage_bytes = stream::stage_bytes(a.format);
    p.items = (long long)sc.items;
    const int per_sm = d.blocks_per_sm[a.group == 16 ? 1 : 0][log2_of(sc.mr)];
    const unsigned grid = unsigned(stream::grid_blocks(sc, d.sm_count, per_sm));
    // Programmatic dependent launch where the GPU has it and the previous operation on the stream
    // is the quantize: with split-K the counters' memset stands between them, and the edge would
    // gain nothing. (The kernel is opt-in as a whole, WUSH_CONTEXT_CUDA_STREAM_DECODE, until
    // measured.)
    const bool pdl = d.sm >= 90 && sc.splits == 1;
    if (a.group == 16) launch_mr<16>(sc.mr, grid, p, s, pdl);
    else launch_mr<32>(sc.mr, grid, p, s, pdl);
    check_launch("stream_decode_kernel");
}

}  // namespace wush::cuda
