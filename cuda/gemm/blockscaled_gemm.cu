// The block-scaled FP4 GEMM of cuBLASLt for sm_100 / sm_120 (Blackwell): E2M1 operands with
// CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3 (NVFP4) or VEC32_UE8M0 (MXFP4, MXFP4_OCP) scales.
//
// UNTESTED ON HARDWARE: written against the cuBLASLt documentation and compiled for every
// target, never run. Hence opt-in: its table rows (gemm_table.h) serve only sm_100 / sm_120 and
// only layers prepared with WUSH_CONTEXT_CUDA_BLOCKSCALED = 1 (docs/RUNTIME.md); a prepared layer keeps a
// BlockScaledCache (descriptors and algorithm per m) and runs the reference GEMM whenever
// cuBLASLt offers no algorithm or refuses a launch (e.g. if a cuBLAS version lacks MXFP4).
//
// Layout. cuBLASLt wants FP4 products as TN with K contiguous. Our packed rows are K-contiguous
// with element 2j in the low nibble of byte j (cuBLASLt's packing), so, column-major:
//   Y^T (n x m, ld n) = op(W) op(A), op(W) = W^T of the stored k x n (T), op(A) = the stored k x m (N).
// The group scales are rewritten into cuBLASLt's tiled layout (blockscaled_layout.h); padding
// is zero.
#include "kernels.h"

#include <deque>
#include <map>
#include <memory>
#include <utility>

#include "blockscaled_layout.h"
#include "common/error.h"
#include "cuda_check.h"

namespace wush::cuda {

namespace {

constexpr std::size_t kLtWorkspaceBytes = kBlockScaledLtWorkspaceBytes;

std::size_t round_up(std::size_t v, std::size_t a) {
    return (v + a - 1) / a * a;
}

std::size_t swizzled_scale_bytes(std::size_t rows, std::size_t k, int group) {
    return round_up(rows, 128) * round_up(k / std::size_t(group), 4);
}

__global__ void swizzle_scales_kernel(const std::uint8_t* in, std::size_t rows, std::size_t cols, std::uint8_t* out) {
    const std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= rows * cols) return;
    out[tiled_scale_offset(i / cols, i % cols, cols)] = in[i];
}

void swizzle(const std::uint8_t* in, std::size_t rows, std::size_t k, int group, std::uint8_t* out, cudaStream_t s) {
    const std::size_t cols = k / std::size_t(group);
    WUSH_CUDA_CHECK(cudaMemsetAsync(out, 0, swizzled_scale_bytes(rows, k, group), s));
    const std::size_t count = rows * cols;
    if (count == 0) return;
    swizzle_scales_kernel<<<unsigned((count + 255) / 256), 256, 0, s>>>(in, rows, cols, out);
    check_launch("swizzle_scales_kernel");
}

// RAII for the cuBLASLt descriptors of one product.
struct LtProduct {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;

    explicit LtProduct(const GemmArgs& g) {
        const cublasLtMatmulMatrixScale_t mode = g.format == WUSH_FORMAT_NVFP4
                                                     ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3
                                                     : CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0;
        const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
        WUSH_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        WUSH_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
        WUSH_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
        WUSH_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode));
        WUSH_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode));
        set_scales(nullptr, nullptr);
        const cudaDataType_t dt = g.y_dtype == WUSH_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
        WUSH_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a, CUDA_R_4F_E2M1, g.k, g.n, int64_t(g.k)));
        WUSH_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b, CUDA_R_4F_E2M1, g.k, g.m, int64_t(g.k)));
        WUSH_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d, dt, g.n, g.m, int64_t(g.n)));
        WUSH_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
        const std::size_t ws = kLtWorkspaceBytes;
        WUSH_CUBLAS_CHECK(
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    }
    ~LtProduct() {
        if (pref) cublasLtMatmulPreferenceDestroy(pref);
        if (d) cublasLtMatrixLayoutDestroy(d);
        if (b) cublasLtMatrixLayoutDestroy(b);
        if (a) cublasLtMatrixLayoutDestroy(a);
        if (op) cublasLtMatmulDescDestroy(op);
    }
    LtProduct(const LtProduct&) = delete;
    LtProduct& operator=(const LtProduct&) = delete;

    // The scale pointers change with the caller's workspace: set before every launch (host only).
    void set_scales(const void* w_scales, const void* a_scales) {
        WUSH_CUBLAS_CHECK(
            cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scales, sizeof w_scales));
        WUSH_CUBLAS_CHECK(
            cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scales, sizeof a_scales));
    }

    bool heuristic(cublasLtHandle_t h, cublasLtMatmulHeuristicResult_t& r) const {
        int found = 0;
        const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(h, op, a, b, d, d, pref, 1, &r, &found);
        return st == CUBLAS_STATUS_SUCCESS && found > 0;
    }
};

bool is_fp4(wush_format f) {
    return f == WUSH_FORMAT_NVFP4 || f == WUSH_FORMAT_MXFP4 || f == WUSH_FORMAT_MXFP4_OCP;
}

}  // namespace

std::size_t blockscaled_scale_bytes(std::size_t rows, std::size_t k, int group) {
    return swizzled_scale_bytes(rows, k, group);
}

void launch_swizzle_scales(const std::uint8_t* scales, std::size_t rows, std::size_t k, int group, std::uint8_t* out,
                           cudaStream_t stream) {
    swizzle(scales, rows, k, group, out, stream);
}

std::size_t blockscaled_gemm_workspace_bytes(wush_format format, std::size_t m, std::size_t n, std::size_t k) {
    const int g = format == WUSH_FORMAT_NVFP4 ? 16 : 32;
    return kLtWorkspaceBytes + round_up(swizzled_scale_bytes(m, k, g), 256) +
           round_up(swizzled_scale_bytes(n, k, g), 256);
}

bool blockscaled_gemm_supported(const GemmArgs& g, int sm) {
    // sm_100 / sm_103 (datacenter Blackwell) and sm_120 / sm_121 (consumer Blackwell) only.
    const bool arch = sm / 10 == 10 || sm / 10 == 12;
    // cuBLASLt's FP4 alignment rules: 16-byte aligned rows (K a multiple of 32 elements).
    return arch && is_fp4(g.format) && g.k % 32 == 0 && g.m > 0 && g.n > 0;
}

struct BlockScaledCache::Entry {
    std::unique_ptr<LtProduct> product;  // null: cuBLASLt refused this m
    cublasLtMatmulHeuristicResult_t result{};
};

struct BlockScaledCache::Impl {
    std::map<std::pair<std::size_t, int>, Entry> entries;
    std::deque<std::pair<std::size_t, int>> order;  // oldest first
};

BlockScaledCache::BlockScaledCache() : impl_(new Impl) {}
BlockScaledCache::~BlockScaledCache() {
    delete impl_;
}

bool BlockScaledCache::launch(const GemmArgs& g, const std::uint8_t* w_scales_swizzled, cublasLtHandle_t handle,
                              cudaStream_t stream) {
    require(g.workspace_bytes >= blockscaled_gemm_workspace_bytes(g.format, g.m, g.n, g.k),
            "block-scaled GEMM: workspace too small");
    const std::pair<std::size_t, int> key(g.m, int(g.y_dtype));
    auto it = impl_->entries.find(key);
    if (it == impl_->entries.end()) {
        if (impl_->order.size() >= kMaxEntries) {
            impl_->entries.erase(impl_->order.front());
            impl_->order.pop_front();
        }
        Entry e;
        e.product = std::make_unique<LtProduct>(g);
        if (!e.product->heuristic(handle, e.result)) e.product.reset();
        it = impl_->entries.emplace(key, std::move(e)).first;
        impl_->order.push_back(key);
    }
    Entry& e = it->second;
    if (!e.product) return false;
    auto* ws = static_cast<std::uint8_t*>(g.workspace);
    std::uint8_t* lt_ws = ws;
    std::uint8_t* a_sw = ws + kLtWorkspaceBytes;
    std::uint8_t* w_sw = a_sw + round_up(swizzled_scale_bytes(g.m, g.k, g.group), 256);
    swizzle(g.a_scales, g.m, g.k, g.group, a_sw, stream);
    if (w_scales_swizzled == nullptr) {
        swizzle(g.w_scales, g.n, g.k, g.group, w_sw, stream);
        w_scales_swizzled = w_sw;
    }
    e.product->set_scales(w_scales_swizzled, a_sw);
    const float alpha = g.alpha, beta = 0.0f;
    const cublasStatus_t st =
        cublasLtMatmul(handle, e.product->op, &alpha, g.w_codes, e.product->a, g.a_codes, e.product->b, &beta, g.y,
                       e.product->d, g.y, e.product->d, &e.result.algo, lt_ws, kLtWorkspaceBytes, stream);
    if (st == CUBLAS_STATUS_SUCCESS) return true;
    // Refused at launch (nothing of the product was enqueued; the swizzles only wrote workspace):
    // remembered, and the caller takes the reference path.
    e.product.reset();
    return false;
}

}  // namespace wush::cuda
