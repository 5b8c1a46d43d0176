// The CUDA backend: backend::Backend on one device, one stream, one cuBLAS / cuBLASLt handle pair.
//
// Two kinds of entry points:
//  - PreparedLayer::quantize() / forward() enqueue on the backend's stream with no host
//    synchronization and no allocation (workspace from the caller), so they can be captured in a
//    CUDA graph. Everything they read was copied to the device by prepare().
//  - The per-call functions (quantize_activations, gemm, linear_forward, calibrate) are
//    convenience paths: they upload the host objects they need into temporary device buffers,
//    run, and synchronize the stream before returning.
//
// Non-finite activations (the contract for include/wush/wush.h):
//   The quantize kernels check x for NaN/Inf on the device; a group holding one is not written,
//   and the smallest (row, column) is recorded in a per-backend device flag. The convenience
//   paths synchronize and report WUSH_ERR_NON_FINITE ("x holds a NaN or infinite value at row r,
//   column c") from the same call. The enqueue-only paths (a wush_linear's quantize / forward)
//   cannot know before the kernel runs: their call returns WUSH_OK, and the error is reported
//   (and the flag cleared) by the next synchronizing call on the context: wush_synchronize
//   (Backend::synchronize) or any convenience-path call. The outputs of the launch that saw the
//   NaN/Inf, and of launches enqueued after it until that report, are unspecified. A NaN/Inf in a
//   forward's bias is found by the GEMM's store and reported the same way ("bias holds ... at
//   column c"; output_bias.h).
#include "cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/context_parameters.h"
#include "common/checked_math.h"
#include "common/dtype.h"
#include "cuda_check.h"
#include "device_rules.h"
#include "formats/certified_group.h"
#include "gemm/gemm_bf16_prefill.h"
#include "gemm/stream_decode.h"
#include "gemm/stream_decode_plan.h"
#include "kernels.h"
#include "quantize/mma_error_bound.h"
#include "transforms/runtime_layer.h"

namespace wush::cuda {

namespace {

// cuBLAS's workspace, owned by the backend so that captured GEMMs never allocate (32 MiB is what
// cuBLAS recommends for Hopper and Blackwell).
constexpr std::size_t kCublasWorkspaceBytes = std::size_t(32) << 20;
constexpr std::size_t kCalibrationTileDoubles = std::size_t(1) << 24;  // 128 MiB of float64 tiles

std::size_t round_up(std::size_t v, std::size_t a) {
    return (v + a - 1) / a * a;
}

// Rejects host memory, and another GPU's memory, where cudaPointerGetAttributes can tell (cheap,
// no synchronization): a kernel would otherwise fault with a sticky error that ends the context.
// Managed memory is accessible from every device and passes.
void require_device_pointer(const void* p, const char* what, int device) {
    if (p == nullptr) return;  // size checks of the callers decide about null
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
        cudaGetLastError();
        return;
    }
    if (attr.type == cudaMemoryTypeUnregistered || attr.type == cudaMemoryTypeHost)
        fail(WUSH_ERR_INVALID_ARGUMENT, std::string(what) + " is a host pointer; a CUDA context takes device pointers");
    if (attr.type == cudaMemoryTypeDevice && attr.device != device)
        fail(WUSH_ERR_INVALID_ARGUMENT, std::string(what) + " is memory of CUDA device " + std::to_string(attr.device) +
                                            "; this context is on device " + std::to_string(device));
}

// A typed device tensor: on this context's device and aligned to its element size.
void require_device_tensor(const void* p, wush_dtype dtype, const char* what, int device) {
    require_device_pointer(p, what, device);
    if (p != nullptr && !element_aligned(p, dtype)) fail(WUSH_ERR_INVALID_ARGUMENT, misaligned_message(what, dtype));
}

// A transform's matrices and row-norm bounds on the device (as the quantize kernel reads them);
// with `tc`, also their exact BF16 split in fragment order for the tensor-core quantize.
struct DeviceTransform {
    MatrixUse use = MatrixUse::None;
    DeviceBuffer matrices, row_norms, tc_fragments, tc_norms;

    DeviceTransform(const backend::TransformRef& t, cudaStream_t stream, bool tc) : use(t.use) {
        if (use == MatrixUse::None) return;
        const int g = int(t.core.group());
        const std::size_t count = use == MatrixUse::Shared ? 1 : t.core.blocks();
        const float* m = t.core.activation_matrices().data();
        std::vector<float> norms(count);
        for (std::size_t b = 0; b < count; ++b) norms[b] = formats::max_row_norm_bound(m + b * g * g, g);
        const std::vector<float> transposed = kernel_matrices(m, count, g);
        matrices = DeviceBuffer::upload(transposed.data(), transposed.size() * sizeof(float), stream);
        row_norms = DeviceBuffer::upload(norms.data(), count * sizeof(float), stream);
        if (!tc) return;
        std::vector<std::uint32_t> frags(count * tc::fragment_words(g));
        std::vector<tc::PartNorms> parts(count);
        for (std::size_t b = 0; b < count; ++b) {
            parts[b] = tc::pack_fragments(m + b * g * g, g, frags.data() + b * tc::fragment_words(g));
            // A block outside the bound's model: the CUDA-core quantize (no fragments) for the layer.
            if (!tc::norms_within_model(parts[b])) return;
        }
        tc_fragments = DeviceBuffer::upload(frags.data(), frags.size() * sizeof(std::uint32_t), stream);
        tc_norms = DeviceBuffer::upload(parts.data(), parts.size() * sizeof(tc::PartNorms), stream);
    }
};

float tensor_alpha(wush_format format) {
    const double d = formats::spec(format).tensor_divisor;
    return float(1.0 / (d * d));
}

// The kernel rows a context's parameters switch on (WUSH_CONTEXT_CUDA_*, validated by
// ContextParameters::set): read when a layer is prepared, and by each convenience-path call.
KernelTable table_of(const backend::ContextParameters& p) {
    KernelOptions o;
    o.prefill_min_m = std::size_t(p.get(WUSH_CONTEXT_CUDA_PREFILL_MIN_M));
    o.blockscaled = p.get(WUSH_CONTEXT_CUDA_BLOCKSCALED) != 0;
    o.stream_decode = p.get(WUSH_CONTEXT_CUDA_STREAM_DECODE) != 0;
    o.bf16_prefill = p.get(WUSH_CONTEXT_CUDA_BF16_PREFILL) != 0;
    o.tc_quantize = p.get(WUSH_CONTEXT_CUDA_TC_QUANTIZE) != 0;
    return active_table(o);
}

// A stream's capture state for order_stream_switch; a failed query (the legacy stream while
// another thread captures in global mode) is Unknown and leaves no error behind.
CaptureState capture_state(cudaStream_t s) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s, &status) != cudaSuccess) {
        cudaGetLastError();
        return CaptureState::Unknown;
    }
    return status == cudaStreamCaptureStatusNone ? CaptureState::None : CaptureState::Capturing;
}

// The state every launch needs: device, stream, handles, the non-finite flag.
// Every entry point holds a DeviceGuard for `index` (the caller's current device is restored).
// Created under a RelaxedCaptureMode (make_device).
struct Device {
    int index = 0;
    std::string name;
    GemmDevice gemm;                // compute capability, prefill attribute set: queried once, here
    int sm = 0;                     // = gemm.sm
    cudaStream_t stream = nullptr;  // the legacy default stream until set_stream
    // prepare()'s own non-blocking stream: its uploads never touch the legacy stream, which would
    // wait on (and so invalidate) another thread's capture of a blocking stream. Its work is
    // synchronized before prepare returns, so it needs no order with `stream`.
    cudaStream_t setup = nullptr;
    cudaEvent_t stream_switch = nullptr;  // set_stream: the new stream waits for the old one here
    cublasHandle_t blas = nullptr;
    cublasLtHandle_t lt = nullptr;
    DeviceBuffer blas_workspace;
    DeviceBuffer non_finite;                         // one unsigned long long (kNoNonFinite when clear)
    PinnedHost<unsigned long long> non_finite_host;  // its stream-ordered copy at synchronize
    // Set up at the first prepare whose rows need them (a context that never asks pays nothing):
    StreamDecodeDevice stream_info;  // the streaming decode's occupancy (sm = 0: not configured)
    int tc_probe = -1;               // the tensor-core quantize's accumulator probe: -1 not run, 0 / 1

    explicit Device(int dev) : index(dev) {
        cudaDeviceProp prop{};
        WUSH_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
        sm = prop.major * 10 + prop.minor;
        name = prop.name;
        if (!compute_capability_supported(sm)) fail(WUSH_ERR_UNSUPPORTED, unsupported_device_message(dev, name, sm));
        configure_prefill_gemm();  // once per context, not per launch
        gemm = GemmDevice{sm, true};
        WUSH_CUDA_CHECK(cudaStreamCreateWithFlags(&setup, cudaStreamNonBlocking));
        WUSH_CUDA_CHECK(cudaEventCreateWithFlags(&stream_switch, cudaEventDisableTiming));
        WUSH_CUBLAS_CHECK(cublasCreate(&blas));
        // The reference path writes BF16 output: without this mode cuBLAS may reduce split-K
        // partial sums in BF16 and lose the float32 accumulation the results are stated to.
        WUSH_CUBLAS_CHECK(cublasSetMathMode(blas, CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
        WUSH_CUBLAS_CHECK(cublasLtCreate(&lt));
        blas_workspace = DeviceBuffer(kCublasWorkspaceBytes);
        non_finite = DeviceBuffer(sizeof(unsigned long long));
        WUSH_CUDA_CHECK(cudaMemsetAsync(non_finite.get(), 0xFF, sizeof(unsigned long long), setup));
        WUSH_CUDA_CHECK(cudaStreamSynchronize(setup));
    }
    ~Device() {
        const DeviceGuard guard(index);  // the handles belong to this device whatever the caller selected
        if (blas) cublasDestroy(blas);
        if (lt) cublasLtDestroy(lt);
        if (stream_switch) cudaEventDestroy(stream_switch);
        if (setup) cudaStreamDestroy(setup);
    }
    Device(const Device&) = delete;
    Device& operator=(const Device&) = delete;

    // The cuBLAS handle bound to the current stream, with the backend's own workspace: cublasSetStream
    // resets the handle's workspace to cuBLAS's default pool, from which a captured GEMM would
    // allocate, so the workspace is set again after every stream binding (both host-only calls).
    cublasHandle_t bound_blas() const {
        WUSH_CUBLAS_CHECK(cublasSetStream(blas, stream));
        WUSH_CUBLAS_CHECK(cublasSetWorkspace(blas, blas_workspace.get(), blas_workspace.bytes()));
        return blas;
    }
    unsigned long long* flag() const { return non_finite.get<unsigned long long>(); }

    // The streaming decode kernel's occupancy on this device, read once (sm_80+; the caller holds
    // the DeviceGuard).
    void configure_streaming() {
        if (stream_info.sm == 0 && sm >= 80) stream_info = configure_stream_decode();
    }
    // Whether the tensor-core quantize's accumulator probe passed on this device (run once, on the
    // setup stream; sm_80+ only).
    bool tc_quantize_usable() {
        if (tc_probe < 0) tc_probe = sm >= 80 && run_tc_accumulator_probe(setup).passed ? 1 : 0;
        return tc_probe == 1;
    }

    // Makes `next` the stream, ordered after the current one where order_stream_switch says so:
    // work still running on the old stream uses the same cuBLAS workspace and non-finite flag.
    void switch_stream(cudaStream_t next) {
        if (order_stream_switch(next == stream, capture_state(stream), capture_state(next))) {
            WUSH_CUDA_CHECK(cudaEventRecord(stream_switch, stream));
            WUSH_CUDA_CHECK(cudaStreamWaitEvent(next, stream_switch, 0));
        }
        stream = next;
    }

    // Waits for the stream, then reports (and clears) a NaN/Inf the quantize kernels saw. Only
    // operations on the context's stream (an async copy into pinned memory, an async reset): no
    // legacy-stream synchronization, which would wait on every blocking stream and invalidate
    // another thread's graph capture in global mode.
    void synchronize_and_report(const char* what) const {
        unsigned long long* host = non_finite_host.get();
        *host = kNoNonFinite;
        WUSH_CUDA_CHECK(cudaMemcpyAsync(host, flag(), sizeof *host, cudaMemcpyDeviceToHost, stream));
        WUSH_CUDA_CHECK(cudaStreamSynchronize(stream));
        const unsigned long long v = *host;
        if (v == kNoNonFinite) return;
        WUSH_CUDA_CHECK(cudaMemsetAsync(flag(), 0xFF, sizeof v, stream));
        if ((v >> 32) == kBiasReportRow)
            fail(WUSH_ERR_NON_FINITE,
                 "bias holds a NaN or infinite value at column " + std::to_string(v & 0xFFFFFFFFull));
        fail(WUSH_ERR_NON_FINITE, std::string(what) + " holds a NaN or infinite value at row " +
                                      std::to_string(v >> 32) + ", column " + std::to_string(v & 0xFFFFFFFFull));
    }
};

QuantizeArgs quantize_args(const DeviceTransform& t, const formats::FormatSpec& f, std::size_t d_in, wush_dtype x_dtype,
                           const void* x, std::size_t n, std::uint8_t* codes, std::uint8_t* scales, const Device& dev) {
    QuantizeArgs a;
    a.format = f.id;
    a.group = int(f.group);
    a.x_dtype = x_dtype;
    a.x = x;
    a.n_tokens = n;
    a.d_in = d_in;
    a.use = t.use;
    a.matrices = t.matrices.get<float>();
    a.row_norms = t.row_norms.get<float>();
    a.tc_fragments = t.tc_fragments.get<std::uint32_t>();
    a.tc_norms = t.tc_norms.get<tc::PartNorms>();
    a.codes = codes;
    a.scales = scales;
    a.non_finite = dev.flag();
    return a;
}

void require_dtype(wush_dtype dtype, const char* what = "x") {
    require(dtype == WUSH_DTYPE_F32 || dtype == WUSH_DTYPE_F16 || dtype == WUSH_DTYPE_BF16,
            std::string(what) + " dtype must be F32, F16 or BF16");
}

// What a prepared layer precomputed for its weight (null / false where not).
struct WeightExtras {
    const void* dequantized = nullptr;       // the reference path's W (else dequantized into the workspace)
    const std::uint8_t* swizzled = nullptr;  // the block-scaled path's W scales
    bool lt_possible = false;                // sm_100/120 FP4: cuBLASLt is tried first for m > 32
    BlockScaledCache* lt_cache = nullptr;    // its descriptors and algorithms per m
    StreamDecodeWeights stream;              // the streaming decode kernel's staged W (opt-in)
};

void run_reference(const GemmArgs& g, const WeightExtras& w, const Device& dev) {
    launch_reference_gemm(g, w.dequantized, dev.bound_blas(), dev.stream);
}

// The GEMM row of the kernel table that serves this launch: the first whose kernel admits the
// shape and has what it needs (the streaming decode: W staged at prepare; the BF16 prefill: its
// workspace and no bias, which it has no epilogue for; cuBLASLt: the swizzled W scales).
const KernelRow* gemm_row(const GemmArgs& g, const WeightExtras& w, const KernelTable& table, const Device& dev) {
    return table_row(table, false, dev.sm, g.m, int(g.format), [&](Kernel k) {
        if (!gemm_shape_supported(k, g, dev.sm)) return false;
        switch (k) {
            case Kernel::StreamDecode: return stream_decode_supported(g, w.stream, dev.stream_info);
            case Kernel::Bf16Prefill: return g.bias.data == nullptr && bf16_prefill_supported(g, dev.sm);
            case Kernel::BlockScaledLt: return w.lt_possible;
            default: return true;
        }
    });
}

// The product through `row` (gemm_row's choice for g); returns the kernel that ran.
// `counters_zeroed`: a streaming decode's split-K counters were zeroed on the stream before the
// activations' quantize (forward does so).
Kernel run_gemm(const GemmArgs& g, const KernelRow* row, const WeightExtras& w, const Device& dev,
                bool counters_zeroed = false) {
    const Kernel k = row ? row->kernel : Kernel::Reference;
    switch (k) {
        case Kernel::StreamDecode:
            launch_stream_decode_gemm(g, w.stream, dev.stream, dev.stream_info, counters_zeroed);
            return k;
        case Kernel::Decode: launch_decode_gemm(g, dev.stream, dev.gemm); return k;
        case Kernel::Prefill: launch_prefill_gemm(g, dev.stream, dev.gemm); return k;
        case Kernel::Bf16Prefill: launch_bf16_prefill_gemm(g, dev.sm, dev.stream); return k;
        case Kernel::BlockScaledLt:
            // cuBLASLt may offer no algorithm for this m or refuse the launch: the reference path
            // then (its workspace is part of the row's, see gemm_bytes). A bias takes the
            // reference path too (this opt-in path has no bias epilogue).
            if (g.bias.data == nullptr && w.lt_cache != nullptr &&
                w.lt_cache->launch(g, w.swizzled, dev.lt, dev.stream))
                return k;
            run_reference(g, w, dev);
            return Kernel::Reference;
        default: run_reference(g, w, dev); return Kernel::Reference;
    }
}

// The kernels' scratch formulas for one product, as the table's Workspace kinds name them.
struct GemmSizes {
    const GemmArgs& g;
    bool w_dequantized_given;
    std::size_t decode() const { return gemm_workspace_bytes(Kernel::Decode, g.format, g.m, g.n, g.k); }
    // Its own scratch, and the decode kernel's, which serves where this device cannot run the
    // instantiation (stream_decode_supported): the two partition k differently.
    std::size_t stream_decode() const { return std::max(stream::workspace_bytes(g.m, g.n, g.k), decode()); }
    std::size_t prefill() const { return gemm_workspace_bytes(Kernel::Prefill, g.format, g.m, g.n, g.k); }
    // y BF16 with a bias: the larger case.
    std::size_t reference() const {
        return reference_gemm_workspace_bytes(g.format, g.m, g.n, g.k, w_dequantized_given, WUSH_DTYPE_BF16, true);
    }
    std::size_t blockscaled() const { return blockscaled_gemm_workspace_bytes(g.format, g.m, g.n, g.k); }
};

// Workspace of one product: the row run_gemm will choose, by shape (no operands yet), says which.
std::size_t gemm_bytes(const GemmArgs& g, bool w_dequantized_given, bool lt_possible, const KernelTable& table,
                       const Device& dev) {
    const KernelRow* row = table_row(table, false, dev.sm, g.m, int(g.format), [&](Kernel k) {
        return (k != Kernel::BlockScaledLt || lt_possible) && gemm_shape_supported(k, g, dev.sm);
    });
    return row_workspace_bytes(row ? row->workspace : Workspace::Reference, GemmSizes{g, w_dequantized_given});
}

// A product's shape alone (for the kernel choice and workspace sizes).
GemmArgs shape_args(const formats::FormatSpec& f, std::size_t m, std::size_t d_out, std::size_t d_in) {
    GemmArgs g;
    g.format = f.id;
    g.group = int(f.group);
    g.m = m;
    g.n = d_out;
    g.k = d_in;
    g.alpha = tensor_alpha(f.id);
    return g;
}

// The block-scaled path can serve this product: the architecture and shape allow it, and a row of
// the table needs its swizzled scales (opt-in: WUSH_CONTEXT_CUDA_BLOCKSCALED).
bool blockscaled_possible(const GemmArgs& g, const KernelTable& table, const Device& dev) {
    return blockscaled_gemm_supported(g, dev.sm) && table_needs(table, dev.sm, Needs::SwizzledScales);
}

// Which precomputed forms of a layer's weight its products read: decided by host-only rules, so
// that workspace sizes can be computed without building the layer.
struct WeightPlan {
    bool lt_possible = false;  // the architecture has cuBLASLt block-scaled FP4 (swizzled W scales kept)
    bool dequantized = false;  // even one token takes the reference path: W kept dequantized. Where
                               // only larger m do, W is dequantized into the workspace per forward
                               // (BF16 W would be 4x the packed weight's memory for every layer).
};

WeightPlan plan_weight(const formats::FormatSpec& f, std::size_t d_in, std::size_t d_out, const KernelTable& table,
                       const Device& dev) {
    const GemmArgs probe = shape_args(f, 1, d_out, d_in);
    WeightPlan p;
    p.lt_possible = blockscaled_possible(probe, table, dev);
    p.dequantized = pick_gemm(probe, dev.sm, p.lt_possible, &table) == GemmKernel::Reference;
    return p;
}

// forward()'s workspace layout at m tokens: the activations' codes at 0, their scales, then the
// GEMM's scratch, each at a 256-byte offset.
struct WorkspaceParts {
    std::size_t scales_at, gemm_at;
};
WorkspaceParts workspace_parts(const formats::FormatSpec& f, std::size_t d_in, std::size_t m) {
    const formats::PackedSizes s = formats::packed_sizes(f, m, d_in);
    return {round_up(s.codes, 256), round_up(s.codes, 256) + round_up(s.scales, 256)};
}

// forward()'s workspace at exactly m tokens: the activations' codes and scales, then the GEMM's
// scratch.
std::size_t layer_workspace_bytes_at(const formats::FormatSpec& f, std::size_t d_in, std::size_t d_out, std::size_t m,
                                     const WeightPlan& plan, const KernelTable& table, const Device& dev) {
    return workspace_parts(f, d_in, m).gemm_at +
           gemm_bytes(shape_args(f, m, d_out, d_in), plan.dequantized, plan.lt_possible, table, dev);
}

// ... and for up to n tokens, what the workspace queries answer: the m <= n that needs the most
// (max_bytes_up_to: the kernel changes with m).
std::size_t layer_workspace_bytes(const formats::FormatSpec& f, std::size_t d_in, std::size_t d_out, std::size_t n,
                                  const WeightPlan& plan, const KernelTable& table, const Device& dev) {
    return max_bytes_up_to(
        table, n, [&](std::size_t m) { return layer_workspace_bytes_at(f, d_in, d_out, m, plan, table, dev); });
}

// The quantize launch through the table's first quantize row that can take it (the tensor-core
// kernel only where the transform's fragments were uploaded: quantize_tc_applies).
// Returns the kernel launched.
Kernel launch_quantize(const QuantizeArgs& a, const KernelTable& table, const Device& dev) {
    const Kernel k = quantize_pick(table, dev.sm, a.n_tokens, int(a.format),
                                   [&](Kernel k) { return k != Kernel::QuantizeTensorCore || quantize_tc_applies(a); });
    launch_quantize(a, k, dev.stream);
    return k;
}

// ---- the prepared layer ------------------------------------------------------------------------

class CudaLayer final : public backend::PreparedLayer {
public:
    // The caller holds a DeviceGuard for the layer's device (members allocate before this body;
    // prepare() also holds a RelaxedCaptureMode). Everything is enqueued on the device's setup
    // stream and waited for.
    // `table`: the kernel rows the context's parameters switch on now; the layer keeps them.
    CudaLayer(std::shared_ptr<Device> dev, backend::TransformRef t, const formats::PackedMatrix& w, KernelTable table)
        : dev_(std::move(dev)), spec_(formats::spec(w.format)), d_in_(w.d_in), d_out_(w.d_out),
          table_(std::move(table)),
          t_(t, dev_->setup, table_needs(table_, dev_->sm, Needs::TcFragments) && dev_->tc_quantize_usable()) {
        w_codes_ = DeviceBuffer::upload(w.codes.data(), w.codes.size(), dev_->setup);
        w_scales_ = DeviceBuffer::upload(w.scales.data(), w.scales.size(), dev_->setup);
        const int g = int(spec_.group);
        plan_ = plan_weight(spec_, d_in_, d_out_, table_, *dev_);
        if (plan_.lt_possible) {
            extras_.lt_possible = true;
            extras_.lt_cache = &lt_cache_;
            w_swizzled_ = DeviceBuffer(blockscaled_scale_bytes(d_out_, d_in_, g));
            launch_swizzle_scales(w_scales_.get<std::uint8_t>(), d_out_, d_in_, g, w_swizzled_.get<std::uint8_t>(),
                                  dev_->setup);
            extras_.swizzled = w_swizzled_.get<std::uint8_t>();
        }
        if (table_needs(table_, dev_->sm, Needs::StagedWeights) && (d_in_ % 32) == 0) {
            dev_->configure_streaming();
            stage_for_streaming(w);
        }
        if (plan_.dequantized) {
            w_deq_ = DeviceBuffer(d_out_ * d_in_ * dequantized_element_bytes(spec_.id));
            launch_dequantize(spec_.id, g, w_codes_.get<std::uint8_t>(), w_scales_.get<std::uint8_t>(), d_out_, d_in_,
                              w_deq_.get(), dev_->setup);
            extras_.dequantized = w_deq_.get();
        }
        WUSH_CUDA_CHECK(cudaStreamSynchronize(dev_->setup));
    }

    std::size_t d_in() const override { return d_in_; }
    std::size_t d_out() const override { return d_out_; }
    wush_format format() const override { return spec_.id; }

    std::size_t workspace_bytes(std::size_t n) const override {
        return layer_workspace_bytes(spec_, d_in_, d_out_, n, plan_, table_, *dev_);
    }
    // What one call of n tokens needs (a workspace sized for more tokens may hold less: see above).
    std::size_t minimum_workspace_bytes(std::size_t n) const override {
        return layer_workspace_bytes_at(spec_, d_in_, d_out_, n, plan_, table_, *dev_);
    }

    void quantize(wush_dtype x_dtype, const void* x, std::size_t n, std::span<std::uint8_t> codes,
                  std::span<std::uint8_t> scales) override {
        require_dtype(x_dtype);
        const formats::PackedSizes s = formats::packed_sizes(spec_, n, d_in_);
        require(codes.size() >= s.codes && scales.size() >= s.scales, "quantize: codes or scales buffer too small");
        const DeviceGuard guard(dev_->index);
        require_device_tensor(x, x_dtype, "x", dev_->index);
        require_device_pointer(codes.data(), "codes", dev_->index);
        require_device_pointer(scales.data(), "scales", dev_->index);
        record(enqueue_quantize(x_dtype, x, n, codes.data(), scales.data()), std::nullopt);
    }

    void forward(wush_dtype x_dtype, const void* x, std::size_t n, const backend::Bias& bias, wush_dtype y_dtype,
                 void* y, std::span<std::byte> workspace) override {
        require_dtype(x_dtype);
        if (bias.data != nullptr) require_dtype(bias.dtype, "bias");
        require_output_dtype(y_dtype);
        require_workspace(n, workspace);
        const DeviceGuard guard(dev_->index);
        // Three pointer queries per forward: the activations' codes and scales lie in the workspace,
        // checked once here (quantize() would query them again).
        require_device_tensor(x, x_dtype, "x", dev_->index);
        require_device_tensor(y, y_dtype, "y", dev_->index);
        require_device_tensor(bias.data, bias.dtype, "bias", dev_->index);
        require_device_pointer(workspace.data(), "workspace", dev_->index);
        const WorkspaceParts parts = workspace_parts(spec_, d_in_, n);
        auto* codes = reinterpret_cast<std::uint8_t*>(workspace.data());
        auto* scales = reinterpret_cast<std::uint8_t*>(workspace.data() + parts.scales_at);
        const std::span<std::byte> gemm_ws = workspace.subspan(parts.gemm_at);
        GemmArgs g = gemm_args(n, y_dtype, y, codes, scales, gemm_ws);
        if (bias.data != nullptr) g.bias = OutputBias{bias.data, bias.dtype, dev_->flag()};
        const KernelRow* row = gemm_row(g, extras_, table_, *dev_);
        // The streaming decode's split-K counters are zeroed before the quantize, so that nothing
        // stands between the quantize and the kernel's programmatic dependent launch.
        const bool zero_first = row != nullptr && row->kernel == Kernel::StreamDecode;
        if (zero_first) zero_stream_decode_counters(g, dev_->stream);
        const Kernel q = enqueue_quantize(x_dtype, x, n, codes, scales);
        record(q, run_gemm(g, row, extras_, *dev_, zero_first));
    }

    void forward_quantized(const std::uint8_t* codes, const std::uint8_t* scales, std::size_t n, wush_dtype y_dtype,
                           void* y, std::span<std::byte> workspace) override {
        require_output_dtype(y_dtype);
        require_workspace(n, workspace);
        const DeviceGuard guard(dev_->index);
        require_device_pointer(codes, "codes", dev_->index);
        require_device_pointer(scales, "scales", dev_->index);
        require_device_tensor(y, y_dtype, "y", dev_->index);
        require_device_pointer(workspace.data(), "workspace", dev_->index);
        // The GEMM's scratch where forward() puts it, after the room for the activations.
        const GemmArgs g =
            gemm_args(n, y_dtype, y, codes, scales, workspace.subspan(workspace_parts(spec_, d_in_, n).gemm_at));
        record(std::nullopt, run_gemm(g, gemm_row(g, extras_, table_, *dev_), extras_, *dev_));
    }

    std::string last_kernels() const override {
        const int q = last_quantize_.load(std::memory_order_relaxed), m = last_gemm_.load(std::memory_order_relaxed);
        std::string out = q >= 0 ? kernel_name(Kernel(q)) : "";
        if (m >= 0) out += (out.empty() ? "" : " ") + std::string(kernel_name(Kernel(m)));
        return out;
    }

private:
    // The streaming decode kernel's copy of W (staged on the host, uploaded).
    void stage_for_streaming(const formats::PackedMatrix& w) {
        const std::vector<std::uint8_t> staged =
            stream::stage_weights(spec_.id, d_out_, d_in_, w.codes.data(), w.scales.data());
        w_staged_ = DeviceBuffer::upload(staged.data(), staged.size(), dev_->setup);
        extras_.stream = StreamDecodeWeights{w_staged_.get<std::uint8_t>()};
    }

    // forward()'s workspace of n tokens: large enough, and 256-byte aligned, so that sub-buffers at
    // 256-byte offsets are aligned as cuBLAS / cuBLASLt want them (cudaMalloc gives 256 bytes).
    void require_workspace(std::size_t n, std::span<std::byte> workspace) const {
        require(workspace.size() >= minimum_workspace_bytes(n), "forward: workspace too small");
        require(reinterpret_cast<std::uintptr_t>(workspace.data()) % 256 == 0,
                "forward: the workspace must be 256-byte aligned");
    }

    // The quantize launch on checked arguments (dtype, sizes and pointers); returns its kernel.
    Kernel enqueue_quantize(wush_dtype x_dtype, const void* x, std::size_t n, std::uint8_t* codes,
                            std::uint8_t* scales) {
        return launch_quantize(quantize_args(t_, spec_, d_in_, x_dtype, x, n, codes, scales, *dev_), table_, *dev_);
    }

    // What last_kernels() reports: the call's quantize kernel (none for forward_quantized) and
    // GEMM kernel (none for quantize). Relaxed atomics: a reader on another thread sees one
    // call's or the other's.
    void record(std::optional<Kernel> quantize, std::optional<Kernel> gemm) {
        last_quantize_.store(quantize ? int(*quantize) : -1, std::memory_order_relaxed);
        last_gemm_.store(gemm ? int(*gemm) : -1, std::memory_order_relaxed);
    }

    GemmArgs gemm_args(std::size_t m, wush_dtype y_dtype, void* y, const std::uint8_t* a_codes,
                       const std::uint8_t* a_scales, std::span<std::byte> ws) const {
        GemmArgs g = shape_args(spec_, m, d_out_, d_in_);
        g.a_codes = a_codes;
        g.a_scales = a_scales;
        g.w_codes = w_codes_.get<std::uint8_t>();
        g.w_scales = w_scales_.get<std::uint8_t>();
        g.y = y;
        g.y_dtype = y_dtype;
        g.workspace = ws.data();
        g.workspace_bytes = ws.size();
        return g;
    }

    std::shared_ptr<Device> dev_;
    const formats::FormatSpec& spec_;
    std::size_t d_in_, d_out_;
    KernelTable table_;  // before t_: its fragments follow the rows
    DeviceTransform t_;
    DeviceBuffer w_codes_, w_scales_, w_deq_, w_swizzled_, w_staged_;
    WeightPlan plan_;
    BlockScaledCache lt_cache_;
    WeightExtras extras_;
    std::atomic<int> last_quantize_{-1}, last_gemm_{-1};  // Kernel values; -1: none
};

// ---- the backend ---------------------------------------------------------------------------------

// A context's Device, made on its device and harmless to another thread's global-mode capture:
// cudaMalloc, cudaMallocHost, stream and handle creation are capture-unsafe calls.
std::shared_ptr<Device> make_device(int device) {
    const DeviceGuard guard(device);
    const RelaxedCaptureMode relaxed;
    return std::make_shared<Device>(device);
}

class CudaBackend final : public backend::Backend {
public:
    explicit CudaBackend(int device) : dev_(make_device(device)) {}

    wush_backend kind() const override { return WUSH_BACKEND_CUDA; }
    std::string describe() const override {
        return "cuda:" + std::to_string(dev_->index) + " (" + dev_->name + ", sm_" + std::to_string(dev_->sm) + ")";
    }

    // The host-side settings of this context (its calibration, transform builds and losses run on
    // the host), and the experimental kernel switches (WUSH_CONTEXT_CUDA_*), which a layer reads
    // when it is prepared (table_of).
    void set_parameter(wush_context_parameter parameter, std::int64_t value) override {
        parameters_.set(parameter, value);
    }
    std::int64_t parameter(wush_context_parameter parameter) const override { return parameters_.get(parameter); }
    std::size_t host_threads() const override { return parameters_.threads(); }

    void set_stream(void* stream) override {
        const auto next = static_cast<cudaStream_t>(stream);
        if (next == dev_->stream) return;  // python/wush/torch.py sets the stream before every forward
        const DeviceGuard guard(dev_->index);
        dev_->switch_stream(next);
    }
    void* stream() const override { return dev_->stream; }
    void synchronize() override {
        const DeviceGuard guard(dev_->index);
        dev_->synchronize_and_report("x");
    }

    void quantize_activations(backend::TransformRef t, const formats::FormatSpec& format, wush_dtype x_dtype,
                              const void* x, std::size_t n, std::span<std::uint8_t> codes,
                              std::span<std::uint8_t> scales) override {
        require_dtype(x_dtype);
        const formats::PackedSizes s = formats::packed_sizes(format, n, t.core.d_in());
        require(codes.size() >= s.codes && scales.size() >= s.scales, "quantize: codes or scales buffer too small");
        const DeviceGuard guard(dev_->index);
        require_device_tensor(x, x_dtype, "x", dev_->index);
        require_device_pointer(codes.data(), "codes", dev_->index);
        require_device_pointer(scales.data(), "scales", dev_->index);
        const KernelTable table = table_of(parameters_);
        const DeviceTransform dt(t, dev_->stream,
                                 table_needs(table, dev_->sm, Needs::TcFragments) && dev_->tc_quantize_usable());
        launch_quantize(quantize_args(dt, format, t.core.d_in(), x_dtype, x, n, codes.data(), scales.data(), *dev_),
                        table, *dev_);
        dev_->synchronize_and_report("x");
    }

    void gemm(const formats::PackedMatrix& w, std::span<const std::uint8_t> a_codes,
              std::span<const std::uint8_t> a_scales, std::size_t m, wush_dtype y_dtype, void* y) override {
        require_output_dtype(y_dtype);
        const DeviceGuard guard(dev_->index);
        require_device_pointer(a_codes.data(), "a_codes", dev_->index);
        require_device_pointer(a_scales.data(), "a_scales", dev_->index);
        require_device_tensor(y, y_dtype, "y", dev_->index);
        const formats::FormatSpec& f = formats::spec(w.format);
        const DeviceBuffer wc = DeviceBuffer::upload(w.codes.data(), w.codes.size(), dev_->stream);
        const DeviceBuffer ws = DeviceBuffer::upload(w.scales.data(), w.scales.size(), dev_->stream);
        GemmArgs g = shape_args(f, m, w.d_out, w.d_in);
        g.a_codes = a_codes.data();
        g.a_scales = a_scales.data();
        g.w_codes = wc.get<std::uint8_t>();
        g.w_scales = ws.get<std::uint8_t>();
        g.y = y;
        g.y_dtype = y_dtype;
        const KernelTable table = table_of(parameters_);
        BlockScaledCache lt_cache;
        WeightExtras extras;
        extras.lt_possible = blockscaled_possible(g, table, *dev_);
        extras.lt_cache = &lt_cache;
        const DeviceBuffer work(gemm_bytes(g, false, extras.lt_possible, table, *dev_));
        g.workspace = work.get();
        g.workspace_bytes = work.bytes();
        run_gemm(g, gemm_row(g, extras, table, *dev_), extras, *dev_);
        dev_->synchronize_and_report("x");  // the buffers above are freed on return
    }

    std::size_t linear_forward_workspace_bytes(backend::TransformRef, const formats::PackedMatrix& w,
                                               std::size_t n) override {
        const formats::FormatSpec& f = formats::spec(w.format);
        const KernelTable table = table_of(parameters_);
        return layer_workspace_bytes(f, w.d_in, w.d_out, n, plan_weight(f, w.d_in, w.d_out, table, *dev_), table,
                                     *dev_);
    }
    std::size_t linear_forward_minimum_workspace_bytes(backend::TransformRef, const formats::PackedMatrix& w,
                                                       std::size_t n) override {
        const formats::FormatSpec& f = formats::spec(w.format);
        const KernelTable table = table_of(parameters_);
        return layer_workspace_bytes_at(f, w.d_in, w.d_out, n, plan_weight(f, w.d_in, w.d_out, table, *dev_), table,
                                        *dev_);
    }

    void linear_forward(backend::TransformRef t, const formats::PackedMatrix& w, wush_dtype x_dtype, const void* x,
                        std::size_t n, wush_dtype y_dtype, void* y, std::span<std::byte> workspace) override {
        const DeviceGuard guard(dev_->index);
        CudaLayer layer(dev_, t, w, table_of(parameters_));
        layer.forward(x_dtype, x, n, {}, y_dtype, y, workspace);
        dev_->synchronize_and_report("x");  // the layer's device copies are freed on return
    }

    void calibrate(Calibrator& cal, wush_dtype x_dtype, const void* x, std::size_t n,
                   std::size_t sequence_length) override {
        const DeviceGuard guard(dev_->index);
        check_device_batch(x_dtype, x, n, "calibration");
        require(sequence_length == 0 || n % sequence_length == 0, "calibration: tokens are not whole sequences");
        // Sequences matter only to the token sample, which the host keeps.
        if (cal.sample_capacity() > 0) return calibrate_on_host(cal, x_dtype, x, n, sequence_length);
        const bool full = cal.mode() == MomentMode::Full;
        const std::size_t side = full ? cal.d_in() : cal.group();
        const std::size_t count = (full ? 1 : cal.blocks()) * side * side;
        DeviceBuffer sums(count * sizeof(double));
        WUSH_CUDA_CHECK(cudaMemsetAsync(sums.get(), 0, sums.bytes(), dev_->stream));
        const std::size_t tile = std::max<std::size_t>(1, std::min(n, kCalibrationTileDoubles / cal.d_in()));
        DeviceBuffer scratch(tile * cal.d_in() * sizeof(double));
        launch_moment_sums(full, cal.d_in(), cal.group(), x_dtype, x, n, sums.get<double>(), scratch.get<double>(),
                           tile, dev_->flag(), dev_->bound_blas(), dev_->stream);
        dev_->synchronize_and_report("calibration activations");
        std::vector<double> host(count);
        WUSH_CUDA_CHECK(cudaMemcpyAsync(host.data(), sums.get(), sums.bytes(), cudaMemcpyDeviceToHost, dev_->stream));
        WUSH_CUDA_CHECK(cudaStreamSynchronize(dev_->stream));
        cal.add_sums(host, n);
    }

    // A batch of activations in this device's memory, with nothing pending on the stream (the
    // caller holds the DeviceGuard).
    void check_device_batch(wush_dtype x_dtype, const void* x, std::size_t n, const char* what) {
        require_dtype(x_dtype);
        require(n > 0 && x != nullptr, std::string(what) + ": no tokens");
        require_device_tensor(x, x_dtype, "x", dev_->index);
        dev_->synchronize_and_report("x");  // a NaN/Inf pending from an earlier launch is that launch's
    }

    // A calibrator that keeps a token sample needs the tokens themselves on the host: the batch is
    // copied there and takes the CPU path (sums and sample), which is slower but the same result.
    void calibrate_on_host(Calibrator& cal, wush_dtype x_dtype, const void* x, std::size_t n,
                           std::size_t sequence_length) {
        const std::vector<std::byte> host = copy_tokens_to_host(cal, x_dtype, x, n);
        cal.add(x_dtype, host.data(), n, sequence_length);
    }

    // Validation tokens only feed a host-side sample: copied to the host, then the CPU path.
    void add_validation(Calibrator& cal, wush_dtype x_dtype, const void* x, std::size_t n) override {
        const DeviceGuard guard(dev_->index);
        check_device_batch(x_dtype, x, n, "validation");
        const std::vector<std::byte> host = copy_tokens_to_host(cal, x_dtype, x, n);
        cal.add_validation(x_dtype, host.data(), n);
    }

    std::vector<std::byte> copy_tokens_to_host(const Calibrator& cal, wush_dtype x_dtype, const void* x,
                                               std::size_t n) {
        const std::size_t bytes =
            checked_mul(checked_mul(n, cal.d_in(), "calibration batch"), dtype_size(x_dtype), "calibration batch");
        std::vector<std::byte> host(bytes);
        WUSH_CUDA_CHECK(cudaMemcpyAsync(host.data(), x, bytes, cudaMemcpyDeviceToHost, dev_->stream));
        WUSH_CUDA_CHECK(cudaStreamSynchronize(dev_->stream));
        return host;
    }

    // Allocates and uploads outside any capture of the caller's (wush.h: prepare outside captures),
    // and harmless to another thread's global-mode capture (RelaxedCaptureMode, the setup stream).
    std::unique_ptr<backend::PreparedLayer> prepare(backend::TransformRef t, const formats::PackedMatrix& w) override {
        const DeviceGuard guard(dev_->index);
        const RelaxedCaptureMode relaxed;
        return std::make_unique<CudaLayer>(dev_, t, w, table_of(parameters_));
    }

private:
    std::shared_ptr<Device> dev_;  // shared with the layers: they outlive nothing they need
    backend::ContextParameters parameters_;
};

}  // namespace

DeviceQuery query_devices() {
    DeviceQuery q;
    const cudaError_t err = cudaGetDeviceCount(&q.count);
    if (err != cudaSuccess) {
        q.count = 0;
        q.error = std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
        cudaGetLastError();  // clear the error so later calls start clean
    } else if (q.count == 0) {
        q.error = "the CUDA runtime reports no devices";
    }
    return q;
}

std::unique_ptr<backend::Backend> make_backend(int device) {
    return std::make_unique<CudaBackend>(device);
}

}  // namespace wush::cuda
