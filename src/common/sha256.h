// SHA-256 (FIPS 180-4): the digest of checkpoint tensors and of the CUDA module, chosen because
// every other reader (Python's hashlib, sha256sum, CMake's file(SHA256)) computes the same value.
// It guards against accidents (a partial copy, a flipped byte), not against someone who can also
// rewrite the recorded digest.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace wush {

class Sha256 {
public:
    Sha256() noexcept;
    void update(std::span<const std::byte> data) noexcept;
    // The digest of everything given to update(); the object is spent afterwards.
    std::array<std::uint8_t, 32> finish() noexcept;

private:
    void block(const std::uint8_t* p) noexcept;
    std::array<std::uint32_t, 8> h_;
    std::array<std::uint8_t, 64> buffer_{};
    std::size_t buffered_ = 0;
    std::uint64_t length_ = 0;
};

// Lower-case hexadecimal, 64 characters.
std::string to_hex(const std::array<std::uint8_t, 32>& digest);

}  // namespace wush
