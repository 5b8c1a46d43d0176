// A matrix quantized in a block format (packed codes + group scales, layouts of quantize_rows).
// The bytes are either owned or borrowed from a longer-lived owner (a memory-mapped checkpoint),
// so loaded weights are used in place, without a copy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "wush/wush.h"

namespace wush::formats {

class ByteView {
public:
    ByteView() = default;
    explicit ByteView(std::vector<std::uint8_t> owned)
        : owned_(std::make_shared<std::vector<std::uint8_t>>(std::move(owned))), view_(*owned_) {}
    // Borrows `bytes`; `keep_alive` owns the memory they live in.
    ByteView(std::span<const std::uint8_t> bytes, std::shared_ptr<const void> keep_alive)
        : keep_alive_(std::move(keep_alive)), view_(bytes) {}

    std::span<const std::uint8_t> span() const noexcept { return view_; }
    const std::uint8_t* data() const noexcept { return view_.data(); }
    std::size_t size() const noexcept { return view_.size(); }

private:
    std::shared_ptr<std::vector<std::uint8_t>> owned_;
    std::shared_ptr<const void> keep_alive_;
    std::span<const std::uint8_t> view_;
};

// Quantized weights of a linear layer: d_out rows of d_in elements in `format`.
struct PackedMatrix {
    wush_format format = WUSH_FORMAT_MXFP4;
    std::size_t d_out = 0;
    std::size_t d_in = 0;
    ByteView codes;
    ByteView scales;
};

}  // namespace wush::formats
