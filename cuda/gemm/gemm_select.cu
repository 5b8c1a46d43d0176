// Which W4A4 GEMM kernel serves a product (cuda/gemm/w4a4_gemm.h).
//
// The rules themselves are a table (gemm_table.h); this file says which kernel supports which
// shapes and operands.
#include <cstdint>

#include "gemm_plan.h"
#include "w4a4_gemm.h"

namespace wush::cuda {

namespace {

bool valid_format(wush_format f, int group) {
    switch (f) {
        case WUSH_FORMAT_MXFP4:
        case WUSH_FORMAT_MXFP4_OCP:
        case WUSH_FORMAT_INT4: return group == 32;
        case WUSH_FORMAT_NVFP4: return group == 16;
        default: return false;
    }
}

bool aligned16(const void* p) {
    return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0;
}

// What both custom kernels need: a known format with its own G, k a multiple of 32 (a lane's
// 16-byte unit never straddles a row), F32/BF16 output, 16-byte aligned code rows.
bool common_ok(const GemmArgs& a) {
    if (!valid_format(a.format, a.group)) return false;
    if (a.k == 0 || a.k % 32 != 0 || a.m == 0 || a.n == 0) return false;
    if (a.y_dtype != WUSH_DTYPE_F32 && a.y_dtype != WUSH_DTYPE_BF16) return false;
    return aligned16(a.a_codes) && aligned16(a.w_codes);  // (null pointers pass: pick_gemm may run first)
}

}  // namespace

// Shape and architecture only: pick_gemm runs before the backend has sized the workspace.
bool gemm_shape_supported(GemmKernel kernel, const GemmArgs& args, int sm) {
    switch (kernel) {
        case GemmKernel::Reference: return true;
        case GemmKernel::Decode: return sm >= 61 && common_ok(args);
        case GemmKernel::StreamDecode: return sm >= 80 && args.m <= kDecodeMaxRows && common_ok(args);
        case GemmKernel::Prefill: return sm >= 80 && common_ok(args);
        case GemmKernel::Bf16Prefill:
            return sm >= 80 && args.format != WUSH_FORMAT_INT4 && valid_format(args.format, args.group);
        case GemmKernel::BlockScaledLt:
            return ((sm >= 100 && sm < 110) || (sm >= 120 && sm < 130)) &&
                   (args.format == WUSH_FORMAT_MXFP4 || args.format == WUSH_FORMAT_NVFP4);
        default: return false;  // the quantize kernels
    }
}

std::size_t gemm_workspace_bytes(GemmKernel kernel, wush_format format, std::size_t m, std::size_t n, std::size_t k) {
    const int group = format == WUSH_FORMAT_NVFP4 ? 16 : 32;
    switch (kernel) {
        case GemmKernel::Decode: return plan::decode_workspace_bytes(m, n, k);
        case GemmKernel::Prefill: return plan::prefill_workspace_bytes(m, n, k, group);
        default: return 0;
    }
}

bool gemm_supported(GemmKernel kernel, const GemmArgs& args, int sm) {
    if (!gemm_shape_supported(kernel, args, sm)) return false;
    if (kernel != GemmKernel::Decode && kernel != GemmKernel::Prefill) return true;
    if (!args.a_codes || !args.w_codes || !args.a_scales || !args.w_scales || !args.y) return false;
    const std::size_t need = gemm_workspace_bytes(kernel, args.format, args.m, args.n, args.k);
    return need == 0 || (args.workspace != nullptr && args.workspace_bytes >= need && aligned16(args.workspace));
}

GemmKernel pick_gemm(const GemmArgs& args, int sm, bool blockscaled_available, const KernelTable* table) {
    static const KernelTable kDefault = active_table(KernelOptions{});
    return table_pick(table ? *table : kDefault, sm, args.m, int(args.format), [&](GemmKernel k) {
        return (k != GemmKernel::BlockScaledLt || blockscaled_available) && gemm_shape_supported(k, args, sm);
    });
}

}  // namespace wush::cuda
