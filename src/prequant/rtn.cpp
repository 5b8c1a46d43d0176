#include "prequant/rtn.h"

#include <cstdint>
#include <string>
#include <vector>

#include "common/checked_math.h"
#include "common/dtype.h"
#include "common/error.h"

namespace wush {

formats::PackedMatrix prequantize_rtn(const BlockTransform& transform, const formats::FormatSpec& format,
                                      std::span<const float> w, std::size_t d_out) {
    formats::require_group(format, transform.group());
    const std::size_t d_in = transform.d_in();
    require(d_out > 0, "prequantize: d_out must be positive");
    require(w.size() == checked_mul(d_out, d_in, "weight size"),
            "prequantize: weight has " + std::to_string(w.size()) +
                " values, expected d_out x d_in = " + std::to_string(d_out) + " x " + std::to_string(d_in));
    require_finite(WUSH_DTYPE_F32, w.data(), d_out, d_in, "weight");
    std::vector<float> transformed(w.size());
    transform.apply_weights(w, d_out, transformed);
    require_finite(WUSH_DTYPE_F32, transformed.data(), d_out, d_in, "transformed weight");
    const formats::PackedSizes sizes = formats::packed_sizes(format, d_out, d_in);
    std::vector<std::uint8_t> codes(sizes.codes), scales(sizes.scales);
    formats::quantize_rows(format, transformed, d_out, d_in, codes, scales);
    // Weights near float32's maximum can round to a valid scale under which an element decodes
    // past it (E8M0 2^127 x 6): refuse them here rather than produce infinities in every product.
    formats::require_decodable(format, codes, scales, d_out, d_in);
    return {format.id, d_out, d_in, formats::ByteView(std::move(codes)), formats::ByteView(std::move(scales))};
}

}  // namespace wush
