// Format queries and row (de)quantization.
#include <string>

#include "common/dtype.h"
#include "context.h"
#include "formats/block_format.h"
#include "guard.h"
#include "packed_output.h"

using namespace wush::capi;
namespace fmt = wush::formats;

namespace {}  // namespace

extern "C" {

WUSH_API wush_status wush_dtype_size(wush_dtype dtype, size_t* size) {
    return guarded(__func__, [&] {
        require_pointer(size, "size");
        *size = wush::dtype_size(dtype);
    });
}

WUSH_API const char* wush_format_name(wush_format format) {
    switch (format) {
        case WUSH_FORMAT_MXFP4:
        case WUSH_FORMAT_NVFP4:
        case WUSH_FORMAT_INT4:
        case WUSH_FORMAT_MXFP4_OCP: return fmt::spec(format).name;
        default: break;  // out-of-range values are handled after the switch
    }
    return nullptr;
}

WUSH_API wush_status wush_format_from_name(const char* name, wush_format* format) {
    return guarded(__func__, [&] {
        require_pointer(name, "name");
        require_pointer(format, "format");
        const fmt::FormatSpec* s = fmt::spec_by_name(name);
        if (s == nullptr) wush::fail(WUSH_ERR_INVALID_ARGUMENT, std::string("unknown format name \"") + name + "\"");
        *format = s->id;
    });
}

WUSH_API wush_status wush_format_group_size(wush_format format, size_t* group_size) {
    return guarded(__func__, [&] {
        require_pointer(group_size, "group_size");
        *group_size = fmt::spec(format).group;
    });
}

WUSH_API wush_status wush_format_tensor_factor(wush_format format, float* factor) {
    return guarded(__func__, [&] {
        require_pointer(factor, "factor");
        *factor = fmt::spec(format).tensor_factor();
    });
}

WUSH_API wush_status wush_format_scale_bytes(wush_format format, size_t* bytes) {
    return guarded(__func__, [&] {
        require_pointer(bytes, "bytes");
        *bytes = fmt::spec(format).scale_bytes;
    });
}

WUSH_API wush_status wush_format_buffer_sizes(wush_format format, size_t n_rows, size_t d_in, size_t* codes_bytes,
                                              size_t* scales_bytes) {
    return guarded(__func__, [&] {
        const fmt::PackedSizes s = fmt::packed_sizes(fmt::spec(format), n_rows, d_in);
        if (codes_bytes) *codes_bytes = s.codes;
        if (scales_bytes) *scales_bytes = s.scales;
    });
}

WUSH_API wush_status wush_quantize_rows(wush_context* ctx, wush_format format, wush_dtype dtype, const void* x,
                                        size_t n_rows, size_t d_in, void* codes, size_t codes_bytes, void* scales,
                                        size_t scales_bytes) {
    return guarded(__func__, [&] {
        ContextUse use(ctx, "ctx");
        const fmt::FormatSpec& f = fmt::spec(format);
        wush::dtype_size(dtype);  // validates the dtype
        const fmt::PackedSizes need = fmt::packed_sizes(f, n_rows, d_in);
        if (n_rows == 0) return;
        require_pointer(x, "x");
        const PackedOutput out = packed_output(codes, codes_bytes, scales, scales_bytes, need);
        wush::require_finite(dtype, x, n_rows, d_in, "x");
        fmt::require_encodable(f, dtype, x, n_rows, d_in, "x");
        fmt::quantize_rows(f, dtype, x, n_rows, d_in, out.codes, out.scales);
    });
}

WUSH_API wush_status wush_dequantize_rows(wush_context* ctx, wush_format format, const void* codes, size_t codes_bytes,
                                          const void* scales, size_t scales_bytes, size_t n_rows, size_t d_in, float* y,
                                          size_t y_count) {
    return guarded(__func__, [&] {
        ContextUse use(ctx, "ctx");
        const fmt::FormatSpec& f = fmt::spec(format);
        const fmt::PackedSizes need = fmt::packed_sizes(f, n_rows, d_in);
        if (n_rows == 0) return;
        require_pointer(y, "y");
        const PackedInput in = packed_input(codes, codes_bytes, scales, scales_bytes, need);
        require_size(y_count, n_rows * d_in, "y", "floats");
        fmt::dequantize_rows(f, in.codes, in.scales, n_rows, d_in, {y, n_rows * d_in});
    });
}

}  // extern "C"
