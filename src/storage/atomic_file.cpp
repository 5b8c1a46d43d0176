#include "storage/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "common/error.h"

namespace wush::storage {

namespace {

std::string directory_of(const std::string& path) {
    const std::size_t slash = path.rfind('/');
    if (slash == std::string::npos) return ".";
    return slash == 0 ? "/" : path.substr(0, slash);
}

// A name no other writer can predict: a process-id suffix let two threads share one temporary
// and let anyone plant a symlink at it.
std::string random_temp_name(const std::string& path) {
    static constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";
    std::random_device rd;
    std::string name = path + ".tmp-";
    for (int i = 0; i < 16; ++i) name += kAlphabet[rd() % (sizeof kAlphabet - 1)];
    return name;
}

[[noreturn]] void io_error(const std::string& what, const std::string& path, int err) {
    fail(WUSH_ERR_IO, what + " \"" + path + "\": " + std::strerror(err));
}

}  // namespace

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), dir_(directory_of(path_)) {
    // An anonymous temporary leaves nothing behind if the process is killed before commit();
    // naming it later goes through /proc.
    if (::access("/proc/self/fd", X_OK) == 0) {
        fd_ = ::open(dir_.c_str(), O_WRONLY | O_TMPFILE | O_CLOEXEC, 0644);
        if (fd_ >= 0) return;
    }
    // File systems without O_TMPFILE: a named one, exclusive (O_EXCL also refuses a symlink).
    for (int attempt = 0; attempt < 16 && fd_ < 0; ++attempt) {
        temp_name_ = random_temp_name(path_);
        fd_ = ::open(temp_name_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (fd_ < 0 && errno != EEXIST) break;
    }
    if (fd_ < 0) {
        const int err = errno;
        temp_name_.clear();
        io_error("cannot create a temporary file for", path_, err);
    }
}

AtomicFile::~AtomicFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_ && !temp_name_.empty()) ::unlink(temp_name_.c_str());
}

void AtomicFile::write(const void* data, std::size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
        const ssize_t w = ::write(fd_, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) io_error("cannot write", path_, w < 0 ? errno : ENOSPC);
        p += w;
        n -= std::size_t(w);
    }
}

void AtomicFile::commit() {
    if (::fsync(fd_) != 0) io_error("cannot sync", path_, errno);
    if (temp_name_.empty()) {
        // Give the anonymous file a name (exclusive, like the named fallback), then rename it.
        const std::string fd_path = "/proc/self/fd/" + std::to_string(fd_);
        for (int attempt = 0; attempt < 16; ++attempt) {
            std::string name = random_temp_name(path_);
            if (::linkat(AT_FDCWD, fd_path.c_str(), AT_FDCWD, name.c_str(), AT_SYMLINK_FOLLOW) == 0) {
                temp_name_ = std::move(name);
                break;
            }
            if (errno != EEXIST) io_error("cannot link the temporary file of", path_, errno);
        }
        if (temp_name_.empty()) io_error("cannot link the temporary file of", path_, EEXIST);
    }
    ::close(fd_);
    fd_ = -1;
    if (::rename(temp_name_.c_str(), path_.c_str()) != 0) io_error("cannot rename to", path_, errno);
    committed_ = true;
    // The rename is durable only once the directory entry is.
    const int dfd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        ::fsync(dfd);
        ::close(dfd);
    }
}

void write_file_atomically(const std::string& path, const void* data, std::size_t n) {
    AtomicFile file(path);
    file.write(data, n);
    file.commit();
}

}  // namespace wush::storage
