// Software prefetches shared by the kernel files. Functions here are `static`: each kernel file,
// compiled with its own target flags, gets a private copy (kernels.h says why).
#pragma once

namespace wush::cpu {

// Prefetches row `row` of a G x G float matrix into every cache level (nothing for nullptr).
template <int G>
static inline void prefetch_row(const float* matrix, int row) {
    if (matrix == nullptr) return;
    const char* p = reinterpret_cast<const char*>(matrix + row * G);
    for (int line = 0; line < G * 4; line += 64) __builtin_prefetch(p + line, 0, 3);
}

}  // namespace wush::cpu
