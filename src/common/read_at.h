// One positioned read of a whole range (pread retried over short reads and EINTR): what the
// safetensors reader and the backend-module check both need, without the SIGBUS a mapping risks.
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cstddef>

namespace wush {

// Reads exactly n bytes at `offset` of `fd` into `out`. Returns 0, the errno of a failed read, or
// ENODATA when the file ends first.
inline int read_at(int fd, void* out, std::size_t n, off_t offset) {
    auto* p = static_cast<char*>(out);
    while (n > 0) {
        const ssize_t r = ::pread(fd, p, n, offset);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return errno;
        if (r == 0) return ENODATA;
        p += r, n -= std::size_t(r), offset += r;
    }
    return 0;
}

}  // namespace wush
