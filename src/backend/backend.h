// The private interface between the C API and the places that run a layer: the CPU backend
// (src/cpu/cpu_backend.*) and the CUDA backend (cuda/cuda_backend.*). A wush_context owns one
// Backend; capi/ calls these operations and never names a backend's own types, so a new backend
// adds files (and one line in capi/backend_registry.cpp), not branches in C API functions.
//
// Memory: every tensor argument (x, codes, scales, y, workspace) lives where the backend computes
// (host memory for the CPU backend, device memory for CUDA). Objects (transforms, packed weights,
// calibrators) are host objects; a backend copies what it needs (prepare()).
//
// Errors are thrown as wush::Error (common/error.h); capi/ turns them into statuses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "calibration/calibrator.h"
#include "formats/block_format.h"
#include "formats/packed_matrix.h"
#include "transforms/block_transform.h"
#include "transforms/matrix_use.h"
#include "wush/wush.h"

namespace wush::backend {

// A transform as the runtimes read it: the matrices and how they are used (classified once per
// wush_transform by value, see transforms/matrix_use.h).
struct TransformRef {
    const BlockTransform& core;
    MatrixUse use;
};

// The optional bias of a forward (wush_linear_run_bias): d_out values of `dtype` (F32, F16 or
// BF16) in backend memory, added to every row of y in float32 before the rounding to y's dtype.
// data == nullptr: no bias (the result is the bias-free forward's, bit for bit).
struct Bias {
    wush_dtype dtype = WUSH_DTYPE_F32;
    const void* data = nullptr;
};

// A transform and a quantized weight bound to one backend (wush_linear). Created by
// Backend::prepare(); used only through the context that created it (the C API checks).
class PreparedLayer {
public:
    virtual ~PreparedLayer() = default;
    virtual std::size_t d_in() const = 0;
    virtual std::size_t d_out() const = 0;
    virtual wush_format format() const = 0;

    // Workspace bytes of forward() for up to n_tokens tokens: what it uses to run at full speed,
    // and the least it accepts (a CPU layer runs on fewer threads with less).
    virtual std::size_t workspace_bytes(std::size_t n_tokens) const = 0;
    virtual std::size_t minimum_workspace_bytes(std::size_t n_tokens) const = 0;

    // The activation side alone: codes / scales (layouts of wush_quantize_rows) of T_wush x.
    virtual void quantize(wush_dtype x_dtype, const void* x, std::size_t n_tokens, std::span<std::uint8_t> codes,
                          std::span<std::uint8_t> scales) = 0;

    // y (n_tokens x d_out, F32 or BF16) = q(T_wush x) q(T_xvsh W)^T (+ bias), intermediates in
    // `workspace`. A non-finite bias is NON_FINITE (as a NaN in x: at once or at the next synchronize).
    virtual void forward(wush_dtype x_dtype, const void* x, std::size_t n_tokens, const Bias& bias, wush_dtype y_dtype,
                         void* y, std::span<std::byte> workspace) = 0;

    // The GEMM half of forward(): y from activations quantized for this layer (quantize()'s codes
    // and scales, n_tokens rows), in forward()'s workspace (its sizes cover this call).
    virtual void forward_quantized(const std::uint8_t* codes, const std::uint8_t* scales, std::size_t n_tokens,
                                   wush_dtype y_dtype, void* y, std::span<std::byte> workspace) = 0;

    // The kernels the layer's last quantize(), forward() or forward_quantized() ran, by name,
    // separated by spaces ("" before the first call). Safe to call while another thread runs one.
    virtual std::string last_kernels() const = 0;
};

class Backend {
public:
    virtual ~Backend() = default;

    virtual wush_backend kind() const = 0;
    // "cpu" or e.g. "cuda:0 (NVIDIA H100 80GB HBM3, sm_90)": for messages and `wush bench`.
    virtual std::string describe() const = 0;

    // The context's parameters (wush_context_set_parameter / _get_parameter), owned by the backend
    // (backend/context_parameters.h says what each governs). set_parameter throws
    // INVALID_ARGUMENT / UNSUPPORTED for a bad value and then changes nothing.
    virtual void set_parameter(wush_context_parameter parameter, std::int64_t value) = 0;
    virtual std::int64_t parameter(wush_context_parameter parameter) const = 0;
    // The thread count of the context's host-side work: ContextParameters::threads().
    virtual std::size_t host_threads() const = 0;

    // The queue launches go to (cudaStream_t for CUDA; the CPU backend takes only nullptr).
    virtual void set_stream(void* stream) = 0;
    virtual void* stream() const = 0;
    // Waits until everything enqueued so far has finished (no-op on the CPU).
    virtual void synchronize() = 0;

    // Fused transform + quantization (wush_quantize_activations). Buffers sized by
    // formats::packed_sizes(format, n_tokens, d_in).
    virtual void quantize_activations(TransformRef t, const formats::FormatSpec& format, wush_dtype x_dtype,
                                      const void* x, std::size_t n_tokens, std::span<std::uint8_t> codes,
                                      std::span<std::uint8_t> scales) = 0;

    // Y (m x d_out) = A W^T with A given by its codes and scales in w's format (wush_gemm).
    virtual void gemm(const formats::PackedMatrix& w, std::span<const std::uint8_t> a_codes,
                      std::span<const std::uint8_t> a_scales, std::size_t m, wush_dtype y_dtype, void* y) = 0;

    // wush_linear_forward: workspace size (as PreparedLayer's two sizes) and the layer.
    virtual std::size_t linear_forward_workspace_bytes(TransformRef t, const formats::PackedMatrix& w,
                                                       std::size_t n_tokens) = 0;
    virtual std::size_t linear_forward_minimum_workspace_bytes(TransformRef t, const formats::PackedMatrix& w,
                                                               std::size_t n_tokens) = 0;
    virtual void linear_forward(TransformRef t, const formats::PackedMatrix& w, wush_dtype x_dtype, const void* x,
                                std::size_t n_tokens, wush_dtype y_dtype, void* y, std::span<std::byte> workspace) = 0;

    // Adds n_tokens x d_in activations (backend memory) to a host calibrator's float64 sums;
    // sequence_length as Calibrator::add's (0: no sequences marked).
    virtual void calibrate(Calibrator& calibrator, wush_dtype x_dtype, const void* x, std::size_t n_tokens,
                           std::size_t sequence_length) = 0;
    // Offers n_tokens x d_in activations (backend memory) to a host calibrator's validation sample.
    virtual void add_validation(Calibrator& calibrator, wush_dtype x_dtype, const void* x, std::size_t n_tokens) = 0;

    // Binds a transform and a quantized weight of one layer to this backend (copies what it keeps:
    // the result does not reference t or w afterwards).
    virtual std::unique_ptr<PreparedLayer> prepare(TransformRef t, const formats::PackedMatrix& w) = 0;
};

// The one place that knows every backend (capi/backend_registry.cpp). Throws INVALID_ARGUMENT for an unknown
// backend or a bad device index, UNSUPPORTED when this build or machine cannot serve it.
std::unique_ptr<Backend> make_backend(wush_backend kind, int device);

}  // namespace wush::backend
