// Caller-owned buffers for packed codes and scales (the layouts of wush_quantize_rows), checked
// against the sizes a call needs.
#pragma once

#include <cstdint>
#include <span>

#include "formats/block_format.h"
#include "guard.h"

namespace wush::capi {

struct PackedOutput {
    std::span<std::uint8_t> codes, scales;
};

// INVALID_ARGUMENT for a NULL buffer, BUFFER_TOO_SMALL for one smaller than `need`.
inline PackedOutput packed_output(void* codes, std::size_t codes_bytes, void* scales, std::size_t scales_bytes,
                                  const formats::PackedSizes& need) {
    require_pointer(codes, "codes");
    require_pointer(scales, "scales");
    require_size(codes_bytes, need.codes, "codes", "bytes");
    require_size(scales_bytes, need.scales, "scales", "bytes");
    return {{static_cast<std::uint8_t*>(codes), need.codes}, {static_cast<std::uint8_t*>(scales), need.scales}};
}

}  // namespace wush::capi
