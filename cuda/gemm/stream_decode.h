// The streaming decode kernel (m <= 32; cuda/gemm/stream_decode.cu, stream_decode_kernel.cuh): opt-in
// with WUSH_CONTEXT_CUDA_STREAM_DECODE = 1 until a GPU run measures it; the existing decode kernel stays the
// default. Same bits as the existing decode kernel (same terms, same order), one launch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "w4a4_gemm.h"

namespace wush::cuda {

// A layer's staged weight (stream::stage_weights, uploaded at prepare). It holds nothing a launch
// writes: the split-K counters are in the call's workspace (stream::workspace_bytes).
struct StreamDecodeWeights {
    const std::uint8_t* stages = nullptr;
};

// What the launch needs of the device, queried once per context: SMs, and per instantiation
// (index: log2 of the activation rows, 0..5) the resident blocks per SM (0 where it cannot run) and
// whether holding a work item's activations (stream::max_resident_chunks of them) keeps that
// occupancy.
struct StreamDecodeDevice {
    int sm = 0;
    int sm_count = 0;
    int blocks_per_sm[2][6] = {};   // [G == 16][log2 MR]
    bool resident_fits[2][6] = {};  // [G == 16][log2 MR]
};

// Raises the instantiations' dynamic shared-memory limit and reads their occupancy on the current
// device; throws wush::Error(CUDA) if refused.
StreamDecodeDevice configure_stream_decode();

// Whether the streaming kernel can run this product (sm >= 80, m <= 32, the decode kernel's
// operand rules, staged weights present, a workspace of stream::workspace_bytes).
bool stream_decode_supported(const GemmArgs& args, const StreamDecodeWeights& w, const StreamDecodeDevice& device);

// Zeroes the split-K counters in `args.workspace` on `stream` (nothing without split-K). A forward
// enqueues it before the activations' quantize and then launches with `counters_zeroed`, so that
// the kernel's programmatic dependent launch follows the quantize directly.
void zero_stream_decode_counters(const GemmArgs& args, cudaStream_t stream);

// Enqueues the product on `stream` (no host synchronization, no allocation: graph-capturable): the
// counters' zeroing unless `counters_zeroed` (zero_stream_decode_counters was enqueued earlier on
// `stream`, and nothing since wrote the workspace's counters), then the kernel; on sm_90 and later
// the kernel is a programmatic dependent launch of the stream's previous kernel wherever no
// zeroing stands between them. One workspace serves one launch in flight at a time.
// Throws wush::Error(UNSUPPORTED) where !stream_decode_supported, wush::Error(CUDA) if the launch fails.
void launch_stream_decode_gemm(const GemmArgs& args, const StreamDecodeWeights& w, cudaStream_t stream,
                               const StreamDecodeDevice& device, bool counters_zeroed = false);

}  // namespace wush::cuda
