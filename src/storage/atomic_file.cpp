#include "storage/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <random>

#include "common/error.h"
#include "common/escape.h"

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
    fail(WUSH_ERR_IO, what + " \"" + escape_controls(path) + "\": " + std::strerror(err));
}

const char* kind_of(mode_t mode) {
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISSOCK(mode)) return "a socket";
    return "a special file";
}

[[noreturn]] void refuse_destination(const std::string& path, const std::string& what) {
    fail(WUSH_ERR_INVALID_ARGUMENT, "cannot write \"" + escape_controls(path) + "\": it is " + what +
                                        ", not a regular file; libwush writes only regular files (nothing was "
                                        "written)");
}

}  // namespace

std::string resolve_destination(const std::string& path) {
    struct stat st {};
    // Absent, or not reachable for another reason: creating the temporary reports the real one.
    if (::lstat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode)) return path;
    if (!S_ISLNK(st.st_mode)) refuse_destination(path, kind_of(st.st_mode));
    char resolved[PATH_MAX];
    if (::realpath(path.c_str(), resolved) == nullptr)
        refuse_destination(path, std::string("a symbolic link that cannot be followed (") + std::strerror(errno) + ")");
    if (::stat(resolved, &st) != 0 || !S_ISREG(st.st_mode))
        refuse_destination(path, std::string("a symbolic link to ") + resolved + ", which is " + kind_of(st.st_mode));
    return resolved;
}

void AtomicFile::check_destination() const {
    // Checked again just before the rename: what sits at the name may have changed since.
    struct stat st {};
    if (::lstat(path_.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) refuse_destination(path_, kind_of(st.st_mode));
}

AtomicFile::AtomicFile(std::string path) : path_(resolve_destination(path)), dir_(directory_of(path_)) {
    // 0666 is reduced by the umask: a new file gets the permissions the user asked for; prepare()
    // gives a replacement those of the file it replaces.
    // An anonymous temporary leaves nothing behind if the process is killed before commit();
    // naming it later goes through /proc.
    if (::access("/proc/self/fd", X_OK) == 0) {
        fd_ = ::open(dir_.c_str(), O_WRONLY | O_TMPFILE | O_CLOEXEC, 0666);
        if (fd_ >= 0) return;
    }
    // File systems without O_TMPFILE: a named one, exclusive (O_EXCL also refuses a symlink).
    for (int attempt = 0; attempt < 16 && fd_ < 0; ++attempt) {
        temp_name_ = random_temp_name(path_);
        fd_ = ::open(temp_name_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
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

void AtomicFile::prepare() {
    if (fd_ < 0) return;  // already prepared
    // The file being replaced keeps its owner, group (where this process may set them: fchown
    // fails harmlessly otherwise) and permission bits. Owner first: fchown may clear mode bits.
    struct stat st {};
    if (::lstat(path_.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
        if (::fchown(fd_, st.st_uid, st.st_gid) != 0 && ::fchown(fd_, static_cast<uid_t>(-1), st.st_gid) != 0) {
            // Neither the owner nor the group may be kept (only a privileged process may give a
            // file away): the new file stays this process's, with the old permission bits.
        }
        if (::fchmod(fd_, st.st_mode & 0777) != 0) io_error("cannot set the permissions of the new", path_, errno);
    }
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
}

namespace {

void sync_directory(const std::string& dir) {
    // A rename is durable only once the directory entry is.
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        ::fsync(dfd);
        ::close(dfd);
    }
}

}  // namespace

void AtomicFile::commit() {
    prepare();
    check_destination();
    if (::rename(temp_name_.c_str(), path_.c_str()) != 0) io_error("cannot rename to", path_, errno);
    committed_ = true;
    sync_directory(dir_);
}

void commit_both(AtomicFile& first, AtomicFile& second) {
    first.prepare();
    second.prepare();
    first.check_destination();
    second.check_destination();
    // Keep what `first` replaces reachable (a hard link beside it), so that it can be put back if
    // `second` cannot be committed. A file system without hard links gets no backup; a
    // destination that does not exist yet is removed instead.
    const std::string& path = first.path();
    std::string backup;
    struct stat st {};
    const bool existed = ::lstat(path.c_str(), &st) == 0;
    if (existed) {
        for (int attempt = 0; attempt < 16 && backup.empty(); ++attempt) {
            std::string name = random_temp_name(path);
            if (::link(path.c_str(), name.c_str()) == 0) backup = std::move(name);
            else if (errno != EEXIST) break;
        }
    }
    first.commit();
    try {
        second.commit();
    } catch (...) {
        if (!backup.empty()) ::rename(backup.c_str(), path.c_str());
        else if (!existed) ::unlink(path.c_str());
        throw;
    }
    if (!backup.empty()) ::unlink(backup.c_str());
}

bool same_destination(const std::string& a, const std::string& b) {
    struct stat sa {
    }, sb{};
    const bool ea = ::stat(a.c_str(), &sa) == 0, eb = ::stat(b.c_str(), &sb) == 0;
    if (ea || eb) return ea && eb && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    const auto base = [](const std::string& p) {
        return p.substr(p.rfind('/') == std::string::npos ? 0 : p.rfind('/') + 1);
    };
    return base(a) == base(b) && ::stat(directory_of(a).c_str(), &sa) == 0 &&
           ::stat(directory_of(b).c_str(), &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

}  // namespace wush::storage
