// Caller-owned buffers for packed codes and scales (the layouts of wush_quantize_rows), checked
// against the sizes a call needs: one rule for every function that writes or reads them.
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

struct PackedInput {
    std::span<const std::uint8_t> codes, scales;
};

// The same checks for buffers a call reads; `codes_name` / `scales_name` name them in messages.
inline PackedInput packed_input(const void* codes, std::size_t codes_bytes, const void* scales,
                                std::size_t scales_bytes, const formats::PackedSizes& need,
                                const char* codes_name = "codes", const char* scales_name = "scales") {
    require_pointer(codes, codes_name);
    require_pointer(scales, scales_name);
    require_size(codes_bytes, need.codes, codes_name, "bytes");
    require_size(scales_bytes, need.scales, scales_name, "bytes");
    return {{static_cast<const std::uint8_t*>(codes), need.codes},
            {static_cast<const std::uint8_t*>(scales), need.scales}};
}

}  // namespace wush::capi
