// Safetensors files (docs/ARCHITECTURE.md "Checkpoints", docs/CHECKPOINT.md): a validating
// parser of the header, a read-only memory-mapped reader, and an atomic streaming writer.
//
// Layout: u64 little-endian N, N bytes of UTF-8 JSON, then the data. The JSON maps tensor names
// to {"dtype", "shape", "data_offsets": [begin, end)} (offsets relative to the data start) and
// may hold "__metadata__": {string: string}.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace wush::storage {

class AtomicFile;

// Header bound of the reference implementation (huggingface/safetensors).
inline constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;
// Caps of what one header may describe, far above any real model (a few 10,000 tensors, tensors
// of at most 8 dimensions), so that a hostile header cannot make the parser allocate much more
// than its own size.
inline constexpr std::size_t kMaxEntries = 1'000'000;
inline constexpr std::size_t kMaxDims = 64;

struct TensorInfo {
    std::string name;
    std::string dtype;  // safetensors dtype string, e.g. "F32", "U8"
    std::vector<std::uint64_t> shape;
    std::uint64_t begin = 0;  // byte offsets into the data section
    std::uint64_t end = 0;
};

struct Header {
    std::vector<TensorInfo> tensors;  // in file (offset) order
    std::map<std::string, std::string> metadata;
    std::uint64_t data_offset = 0;  // 8 + N
};

// Bits per element of a safetensors dtype string; 0 for an unknown dtype.
unsigned dtype_bits(std::string_view dtype);

// Parses and validates the whole file image: header length bound, UTF-8 JSON object without a
// NUL byte or byte-order mark, no duplicate keys, at most kMaxEntries entries of at most kMaxDims
// dimensions, known dtypes, shapes with overflow-checked products, byte span = elements x
// dtype size, tensors tiling the data section exactly (no gap, no overlap) up to end of file.
// Throws wush::Error(CORRUPT_FILE) naming the first violation. Never reads outside `file`.
Header parse_header(std::span<const std::byte> file);
// The same from the file's first bytes (at least its 8-byte length and header) and its size.
Header parse_header(std::span<const std::byte> start, std::uint64_t file_size);

// A read-only, memory-mapped, validated safetensors file.
class Reader {
public:
    // How the file's bytes are held: mapped (read on demand; a file truncated while mapped makes
    // a read raise SIGBUS), or copied into memory of the process when opened.
    enum class Load { Map, Copy };
    // Throws IO if the file cannot be opened, mapped or read, CORRUPT_FILE if it is not valid.
    explicit Reader(const std::string& path, Load load = Load::Map);
    ~Reader();
    Reader(const Reader&) = delete;
    Reader& operator=(const Reader&) = delete;

    const Header& header() const noexcept { return header_; }
    // Throws IO if the file was truncated, extended or rewritten in place since it was opened
    // (size or modification time changed). Reading a mapping whose file shrank raises SIGBUS, so
    // callers check before they hand out views of the data; checkpoints are replaced by rename,
    // which leaves an opened file unchanged.
    void check_unchanged() const;
    // The tensor called `name`, or nullptr; a hash lookup (files may hold 100,000s of tensors).
    const TensorInfo* find(std::string_view name) const noexcept;
    std::span<const std::byte> bytes(const TensorInfo& t) const noexcept;
    // Whether `path` names the file this reader opened (same device and inode), so that writing
    // to it would replace the file being read.
    bool is_file(const std::string& path) const noexcept;

private:
    // pread of exactly n bytes at offset; throws IO on an error or a file that ends early.
    void read_exactly(std::byte* out, std::size_t n, std::size_t offset) const;
    // The file's 8-byte length and JSON header, read without reading the rest.
    std::vector<std::byte> read_header() const;

    std::string path_;
    int fd_ = -1;  // kept open so that check_unchanged() sees the file that is mapped
    bool copied_ = false;
    std::unique_ptr<std::byte[]> copy_;  // Load::Copy: the file's bytes
    const std::byte* map_ = nullptr;     // the mapping, or copy_
    std::size_t size_ = 0;
    std::int64_t mtime_ns_ = 0;
    std::uint64_t device_ = 0, inode_ = 0;
    Header header_;
    std::unordered_map<std::string_view, std::size_t> index_;  // name (viewing header_) -> position
};

// One tensor to be written: its bytes come from `write`, called once with a sink that must
// receive exactly the declared byte count (so the data is streamed, never copied whole).
struct TensorSource {
    std::string name;
    std::string dtype;
    std::vector<std::uint64_t> shape;
    std::function<void(const std::function<void(const void*, std::size_t)>& sink)> write;
};

// Writes a safetensors file atomically (storage/atomic_file.h). On any
// failure `path` is untouched. Throws IO or INVALID_ARGUMENT.
void write_file(const std::string& path, const std::vector<TensorSource>& tensors,
                const std::map<std::string, std::string>& metadata);
// The same into an open AtomicFile, not committed: for a file committed together with another
// (commit_both).
void write_tensors(AtomicFile& file, const std::vector<TensorSource>& tensors,
                   const std::map<std::string, std::string>& metadata);

}  // namespace wush::storage
