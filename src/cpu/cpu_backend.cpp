// The CPU backend: the runtime kernels of src/cpu (SIMD per ISA, threads) behind backend::Backend.
// Tensor arguments are host memory; there is no queue, so every call completes before it returns.
#include "cpu/cpu_backend.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <memory>
#include <vector>

#include "backend/context_parameters.h"
#include "common/dtype.h"
#include "common/error.h"
#include "cpu/gemm.h"
#include "cpu/linear_forward.h"
#include "threads/work_pool.h"

namespace wush::cpu {

namespace {

using backend::ContextParameters;
using backend::TransformRef;

void require_runtime_group(const formats::FormatSpec& f) {
    if (f.group != 16 && f.group != 32) fail(WUSH_ERR_UNSUPPORTED, "the CPU runtime supports groups of 16 and 32");
}

// The fused transform + quantization (wush_quantize_activations, a prepared layer's quantize).
// `prepared`: what a prepared layer derived from its transform (empty for the per-call functions).
void quantize_with(const ContextParameters& run, TransformRef t, const formats::FormatSpec& format, wush_dtype x_dtype,
                   const void* x, std::size_t n_tokens, std::span<std::uint8_t> codes, std::span<std::uint8_t> scales,
                   const PreparedMatrices& prepared = {}) {
    const threads::OpenMpTeamScope team(run.openmp_team());
    std::vector<float> scratch(prepared.norm_bounds.empty() ? quantize_scratch_floats(t.core, t.use) : 0);
    quantize_activations(t.core, t.use, format, x_dtype, x, n_tokens, codes, scales, run.isa(), scratch, run.threads(),
                         prepared);
}

// One layer's operations over a transform and weights that someone else keeps: the per-call
// functions (wush_linear_forward) run them on the caller's objects without packed panels, a
// prepared layer (CpuLayer) on its own copies with its panels. One code path for both, with the
// backend's parameters read at each call.
struct LayerView {
    const BlockTransform& transform;
    MatrixUse use;
    const formats::PackedMatrix& weights;
    const PanelPack* panels;         // nullptr: the GEMM packs what it needs per call
    PreparedMatrices prepared = {};  // derived from the transform once (empty: per call)

    std::size_t workspace_bytes(std::size_t n_tokens, std::size_t threads) const {
        return linear_forward_workspace_bytes(transform, weights, n_tokens, threads);
    }

    // For up to n_tokens tokens (what the workspace queries promise): the GEMM's split layout
    // needs more at kSplitMaxRows tokens than at a few more (gemm.h).
    std::size_t workspace_bytes_up_to(std::size_t n_tokens, std::size_t threads) const {
        const std::size_t at_n = workspace_bytes(n_tokens, threads);
        return n_tokens > kSplitMaxRows ? std::max(at_n, workspace_bytes(kSplitMaxRows, threads)) : at_n;
    }

    void forward(const ContextParameters& run, wush_dtype x_dtype, const void* x, std::size_t n_tokens,
                 wush_dtype y_dtype, void* y, std::span<std::byte> workspace, const backend::Bias& bias = {}) const {
        const threads::OpenMpTeamScope team(run.openmp_team());
        linear_forward(run.isa(), run.threads(), transform, use, weights, x_dtype, x, n_tokens, y_dtype, y, workspace,
                       panels, bias, prepared);
    }
};

// A transform and weights bound to the CPU: its own copy of the transform (with its matrix
// classification) and of the weights' bytes handle, and the weights' GEMM panels packed once (for
// the ISA of the moment; a later ISA setting runs unpacked).
class CpuLayer final : public backend::PreparedLayer {
public:
    CpuLayer(TransformRef t, const formats::PackedMatrix& w, std::shared_ptr<const ContextParameters> parameters)
        : transform_(t.core), use_(t.use), weights_(w), parameters_(std::move(parameters)),
          panels_(parameters_->isa(), parameters_->threads(), w),
          pairs_(best_isa() != Isa::Scalar ? bf16_matrix_pairs(transform_, use_) : std::vector<std::uint32_t>{}),
          norm_bounds_(matrix_norm_bounds(transform_, use_)) {
        require_layer(transform_, weights_);
    }

    std::size_t d_in() const override { return weights_.d_in; }
    std::size_t d_out() const override { return weights_.d_out; }
    wush_format format() const override { return weights_.format; }

    std::size_t workspace_bytes(std::size_t n_tokens) const override {
        return view().workspace_bytes_up_to(n_tokens, parameters_->threads());
    }
    std::size_t minimum_workspace_bytes(std::size_t n_tokens) const override {
        return view().workspace_bytes(n_tokens, 1);
    }

    void quantize(wush_dtype x_dtype, const void* x, std::size_t n_tokens, std::span<std::uint8_t> codes,
                  std::span<std::uint8_t> scales) override {
        record(kRanQuantize);
        quantize_with(*parameters_, {transform_, use_}, formats::spec(weights_.format), x_dtype, x, n_tokens, codes,
                      scales, prepared());
    }

    void forward(wush_dtype x_dtype, const void* x, std::size_t n_tokens, const backend::Bias& bias, wush_dtype y_dtype,
                 void* y, std::span<std::byte> workspace) override {
        record(kRanQuantize | kRanGemm);
        view().forward(*parameters_, x_dtype, x, n_tokens, y_dtype, y, workspace, bias);
    }

    void forward_quantized(const std::uint8_t* codes, const std::uint8_t* scales, std::size_t n_tokens,
                           wush_dtype y_dtype, void* y, std::span<std::byte> workspace) override {
        const formats::PackedSizes s = formats::packed_sizes(formats::spec(weights_.format), n_tokens, d_in());
        record(kRanGemm);
        const threads::OpenMpTeamScope team(parameters_->openmp_team());
        linear_gemm(parameters_->isa(), parameters_->threads(), transform_, weights_, {codes, s.codes},
                    {scales, s.scales}, n_tokens, y_dtype, y, workspace, &panels_);
    }

    // One quantize kernel and one GEMM per ISA: the ISA of the last call names them.
    std::string last_kernels() const override {
        const int isa = last_isa_.load(std::memory_order_relaxed), ran = last_ran_.load(std::memory_order_relaxed);
        if (isa < 0) return "";
        const std::string name = isa_name(Isa(isa));
        std::string out = (ran & kRanQuantize) ? "cpu.quantize." + name : "";
        if (ran & kRanGemm) out += (out.empty() ? "cpu.gemm." : " cpu.gemm.") + name;
        return out;
    }

private:
    PreparedMatrices prepared() const { return {pairs_, norm_bounds_}; }
    LayerView view() const { return {transform_, use_, weights_, &panels_, prepared()}; }

    // What last_kernels() reports: the call's ISA and which halves it ran. Relaxed atomics: a
    // reader on another thread sees one call's or the other's.
    static constexpr int kRanQuantize = 1, kRanGemm = 2;
    void record(int ran) {
        last_isa_.store(int(parameters_->isa()), std::memory_order_relaxed);
        last_ran_.store(ran, std::memory_order_relaxed);
    }

    BlockTransform transform_;
    MatrixUse use_;
    formats::PackedMatrix weights_;
    std::shared_ptr<const ContextParameters> parameters_;
    PanelPack panels_;
    // The transform as bf16 pairs when it is bf16-exact (a checkpoint stored as BF16) and the CPU
    // has SIMD kernels: one token's quantization reads these, half the float matrices' bytes, and
    // on AVX512_BF16 many bf16 tokens take the bf16 dot product.
    std::vector<std::uint32_t> pairs_;
    // The matrices' row-norm bounds, which every call's error bound needs: computed once here.
    std::vector<float> norm_bounds_;
    std::atomic<int> last_isa_{-1};
    std::atomic<int> last_ran_{0};
};

class CpuBackend final : public backend::Backend {
public:
    wush_backend kind() const override { return WUSH_BACKEND_CPU; }
    // The ISA this context's calls run with (WUSH_CONTEXT_CPU_ISA), which may be below the best.
    std::string describe() const override { return std::string("cpu (") + isa_name(parameters_->isa()) + ")"; }

    void set_parameter(wush_context_parameter parameter, std::int64_t value) override {
        parameters_->set(parameter, value);
    }
    std::int64_t parameter(wush_context_parameter parameter) const override { return parameters_->get(parameter); }
    std::size_t host_threads() const override { return parameters_->threads(); }

    void set_stream(void* stream) override {
        if (stream != nullptr) fail(WUSH_ERR_INVALID_ARGUMENT, "a CPU context has no stream: pass NULL");
    }
    void* stream() const override { return nullptr; }
    void synchronize() override {}

    void quantize_activations(TransformRef t, const formats::FormatSpec& format, wush_dtype x_dtype, const void* x,
                              std::size_t n_tokens, std::span<std::uint8_t> codes,
                              std::span<std::uint8_t> scales) override {
        quantize_with(*parameters_, t, format, x_dtype, x, n_tokens, codes, scales);
    }

    void gemm(const formats::PackedMatrix& w, std::span<const std::uint8_t> a_codes,
              std::span<const std::uint8_t> a_scales, std::size_t m, wush_dtype y_dtype, void* y) override {
        const formats::FormatSpec& f = formats::spec(w.format);
        require_runtime_group(f);
        check_activation_scales(f, a_scales, m, w.d_in);
        // Not value-initialized: zeroing the (mostly untouched) panel space would cost more than
        // a small product.
        const threads::OpenMpTeamScope team(parameters_->openmp_team());
        const std::size_t bytes = gemm_scratch_bytes(f, m, w.d_out, w.d_in, parameters_->threads());
        const std::unique_ptr<std::byte[]> scratch(new std::byte[bytes]);
        // Valid-by-spec extremes (transform entries near float32's maximum, an E8M0 scale of
        // 2^127) can overflow although every input is finite: reported, never infinities with
        // WUSH_OK.
        if (!cpu::gemm(parameters_->isa(), parameters_->threads(), w, a_codes, a_scales, m, y_dtype, y,
                       {scratch.get(), bytes}))
            require_finite_product(y_dtype, y, m, w.d_out);
    }

    // The per-call forward is the prepared layer's, over the caller's objects (no packed panels).
    std::size_t linear_forward_workspace_bytes(TransformRef t, const formats::PackedMatrix& w,
                                               std::size_t n_tokens) override {
        return LayerView{t.core, t.use, w, nullptr}.workspace_bytes_up_to(n_tokens, parameters_->threads());
    }
    std::size_t linear_forward_minimum_workspace_bytes(TransformRef t, const formats::PackedMatrix& w,
                                                       std::size_t n_tokens) override {
        return LayerView{t.core, t.use, w, nullptr}.workspace_bytes(n_tokens, 1);
    }

    void linear_forward(TransformRef t, const formats::PackedMatrix& w, wush_dtype x_dtype, const void* x,
                        std::size_t n_tokens, wush_dtype y_dtype, void* y, std::span<std::byte> workspace) override {
        LayerView{t.core, t.use, w, nullptr}.forward(*parameters_, x_dtype, x, n_tokens, y_dtype, y, workspace);
    }

    void calibrate(Calibrator& calibrator, wush_dtype x_dtype, const void* x, std::size_t n_tokens,
                   std::size_t sequence_length) override {
        calibrator.add(x_dtype, x, n_tokens, sequence_length);
    }

    void add_validation(Calibrator& calibrator, wush_dtype x_dtype, const void* x, std::size_t n_tokens) override {
        calibrator.add_validation(x_dtype, x, n_tokens);
    }

    std::unique_ptr<backend::PreparedLayer> prepare(TransformRef t, const formats::PackedMatrix& w) override {
        return std::make_unique<CpuLayer>(t, w, parameters_);
    }

private:
    // Shared with the layers it prepares, which read the settings current at each call.
    std::shared_ptr<ContextParameters> parameters_ = std::make_shared<ContextParameters>();
};

}  // namespace

std::unique_ptr<backend::Backend> make_cpu_backend() {
    return std::make_unique<CpuBackend>();
}

}  // namespace wush::cpu
