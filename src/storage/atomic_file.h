// Atomic replacement of a file: the new content is written to an anonymous or exclusively
// created, unpredictably named temporary in the destination's directory, flushed, and renamed
// over the destination; then the directory is flushed so that the rename survives a crash.
// Readers see the old file or the new one, never a mix; concurrent writers of one path each
// produce a whole file (the last rename wins); a symlink planted next to the destination is
// never followed.
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
    // Makes the written bytes the content of `path`. Throws wush::Error(IO).
    void commit();

private:
    std::string path_;
    std::string dir_;
    std::string temp_name_;  // empty while the temporary is anonymous (O_TMPFILE)
    int fd_ = -1;
    bool committed_ = false;
};

// A whole small file, atomically (AtomicFile).
void write_file_atomically(const std::string& path, const void* data, std::size_t n);

}  // namespace wush::storage
