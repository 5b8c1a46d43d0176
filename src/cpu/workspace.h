// Carves a caller-provided workspace into 64-byte-aligned arrays, so the hot paths allocate
// nothing. The same code measures the size: with a null base, take() returns nullptr and only
// counts. Every piece reserves 63 spare bytes, so the size does not depend on the base address.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/checked_math.h"
#include "common/error.h"

namespace wush::cpu {

class Carver {
public:
    // Measuring mode.
    Carver() = default;
    Carver(void* base, std::size_t size) : base_(static_cast<std::byte*>(base)), size_(size) {}

    template <typename T>
    T* take(std::size_t count) {
        const std::size_t bytes =
            checked_add(checked_mul(count, sizeof(T), "workspace piece"), kAlign - 1, "workspace piece");
        const std::size_t start = used_;
        used_ = checked_add(used_, bytes, "workspace size");
        if (base_ == nullptr) return nullptr;
        require(used_ <= size_, "internal: workspace smaller than measured");
        const std::uintptr_t p = reinterpret_cast<std::uintptr_t>(base_ + start);
        return reinterpret_cast<T*>((p + kAlign - 1) & ~std::uintptr_t(kAlign - 1));
    }
    std::size_t used() const noexcept { return used_; }
    std::size_t left() const noexcept { return size_ - used_; }

private:
    static constexpr std::size_t kAlign = 64;
    std::byte* base_ = nullptr;
    std::size_t size_ = SIZE_MAX;
    std::size_t used_ = 0;
};

}  // namespace wush::cpu
