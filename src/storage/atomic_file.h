// Atomic replacement of a file: the new content is written to an anonymous or exclusively
// created, unpredictably named temporary in the destination's directory, flushed, and renamed
// over the destination; then the directory is flushed so that the rename survives a crash.
// Readers see the old file or the new one, never a mix; concurrent writers of one path each
// produce a whole file (the last rename wins); a symlink planted next to the destination is
// never followed. Replacing a file keeps its permission bits (and its owner and group where the
// process may set them), so rewriting a private 0600 checkpoint does not publish it; a new file
// gets 0666 minus the umask, like any file the user creates.
// The destination must be absent or a regular file: a rename replaces whatever the name holds, so
// a device, FIFO, socket or directory is refused (wush::Error(INVALID_ARGUMENT)) before anything
// is written, and checked again just before the rename. A symbolic link to a regular file is
// written through: the file it names is replaced and the link kept; a link to anything else, or
// one that cannot be followed, is refused.
#pragma once

#include <cstddef>
#include <string>

namespace wush::storage {

class AtomicFile {
public:
    // Throws wush::Error(IO) if no temporary can be created next to `path`.
    explicit AtomicFile(std::string path);
    // Discards the temporary unless commit() succeeded.
    ~AtomicFile();
    AtomicFile(const AtomicFile&) = delete;
    AtomicFile& operator=(const AtomicFile&) = delete;

    void write(const void* data, std::size_t n);
    // Flushes the temporary and gives it a name next to `path`, without touching `path`: the
    // step of commit() that can fail for lack of space. Idempotent. Throws wush::Error(IO).
    void prepare();
    // Makes the written bytes the content of `path` (prepare(), then rename). Throws wush::Error(IO).
    void commit();
    // The file replaced: `path`, or the regular file a symbolic link at `path` names.
    const std::string& path() const noexcept { return path_; }
    // Throws wush::Error(INVALID_ARGUMENT) if something other than a regular file now sits at path().
    void check_destination() const;

private:
    std::string path_;
    std::string dir_;
    std::string temp_name_;  // empty while the temporary is anonymous (O_TMPFILE)
    int fd_ = -1;
    bool committed_ = false;
};

// Commits two files so that both are replaced or neither is: both are prepared first (so a full
// disk fails before either is touched); if the second rename fails, the first destination is put
// back as it was (its old content kept through a hard link, or removed if it did not exist).
// Only a crash between the two renames can leave one replaced. Throws wush::Error(IO).
void commit_both(AtomicFile& first, AtomicFile& second);

// The file a write to `path` replaces: `path` itself when it is absent or a regular file, the
// target of a symbolic link to a regular file. Throws wush::Error(INVALID_ARGUMENT) for anything
// else (a device, FIFO, socket, directory, or a link to one of them or to nothing).
std::string resolve_destination(const std::string& path);

// Whether two destination paths name the same file: the same device and inode when both exist,
// otherwise the same name in the same directory (device and inode of the directory).
bool same_destination(const std::string& a, const std::string& b);

}  // namespace wush::storage
