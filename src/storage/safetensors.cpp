#include "storage/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/escape.h"
#include "common/read_at.h"
#include "storage/atomic_file.h"

namespace wush::storage {

namespace {

using nlohmann::json;

[[noreturn]] void corrupt(const std::string& what) {
    fail(WUSH_ERR_CORRUPT_FILE, "invalid safetensors file: " + what);
}

std::uint64_t read_u64_le(const std::byte* p) {
    std::uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | std::uint64_t(p[i]);
    return v;
}

// The header is read in one SAX pass straight into a Header: no JSON DOM, whose memory cost was
// 23-29x the header's size and whose destructor could let std::bad_alloc escape. The pass
// accepts exactly the safetensors schema (top object > tensor object > shape/data_offsets array,
// or "__metadata__" > string values), rejects duplicate keys, and caps what a hostile header
// can make it allocate (kMaxEntries, kMaxDims).
class HeaderBuilder : public nlohmann::json_sax<json> {
public:
    explicit HeaderBuilder(Header& h) : h_(h) {}
    std::string problem;

    bool null() override { return scalar("null"); }
    bool boolean(bool) override { return scalar("a boolean"); }
    bool number_integer(number_integer_t v) override {
        if (v < 0) return fail_with(field_name() + " is not a non-negative integer");
        return number(std::uint64_t(v));
    }
    bool number_unsigned(number_unsigned_t v) override { return number(v); }
    bool number_float(number_float_t, const string_t&) override {
        return fail_with(field_name() + " is not a non-negative integer");
    }
    bool binary(binary_t&) override { return scalar("binary"); }
    bool string(string_t& v) override {
        if (state_ == State::MetadataValue) {
            h_.metadata.emplace(std::move(key_), std::move(v));
            state_ = State::Metadata;
            return true;
        }
        if (state_ == State::TensorField && field_ == Field::Dtype) {
            tensor_.dtype = std::move(v);
            if (dtype_bits(tensor_.dtype) == 0)
                return fail_with("tensor \"" + tensor_.name + "\" has unknown dtype \"" + tensor_.dtype + "\"");
            state_ = State::Tensor;
            return true;
        }
        return scalar("a string");
    }
    bool start_object(std::size_t) override {
        switch (state_) {
            case State::Start: state_ = State::Top; return true;
            case State::TopValue:
                if (key_ == "__metadata__") {
                    state_ = State::Metadata;
                    keys_.clear();
                } else {
                    tensor_ = TensorInfo{};
                    tensor_.name = std::move(key_);
                    seen_ = 0;
                    state_ = State::Tensor;
                }
                return true;
            default: return scalar("an object");
        }
    }
    bool key(string_t& k) override {
        switch (state_) {
            case State::Top:
                if (!names_.insert(k).second) return fail_with("duplicate key \"" + k + "\"");
                if (names_.size() > kMaxEntries)
                    return fail_with("more than " + std::to_string(kMaxEntries) + " entries in the header");
                key_ = std::move(k);
                state_ = State::TopValue;
                return true;
            case State::Metadata:
                if (!keys_.insert(k).second) return fail_with("duplicate key \"" + k + "\"");
                if (keys_.size() > kMaxEntries)
                    return fail_with("more than " + std::to_string(kMaxEntries) + " __metadata__ entries");
                key_ = std::move(k);
                state_ = State::MetadataValue;
                return true;
            case State::Tensor: {
                Field f;
                if (k == "dtype") f = Field::Dtype;
                else if (k == "shape") f = Field::Shape;
                else if (k == "data_offsets") f = Field::Offsets;
                else return fail_with("tensor \"" + tensor_.name + "\" has unknown field \"" + k + "\"");
                const unsigned bit = 1u << unsigned(f);
                if (seen_ & bit) return fail_with("duplicate key \"" + k + "\"");
                seen_ |= bit;
                field_ = f;
                state_ = State::TensorField;
                return true;
            }
            default: return fail_with("unexpected key \"" + k + "\"");
        }
    }
    bool end_object() override {
        switch (state_) {
            case State::Top: state_ = State::End; return true;
            case State::Metadata: state_ = State::Top; return true;
            case State::Tensor:
                if (seen_ != 0b111)
                    return fail_with("tensor \"" + tensor_.name + "\" lacks dtype, shape or data_offsets");
                if (tensor_.end < tensor_.begin)
                    return fail_with("tensor \"" + tensor_.name + "\" ends before it begins");
                h_.tensors.push_back(std::move(tensor_));
                state_ = State::Top;
                return true;
            default: return fail_with("unexpected end of object");
        }
    }
    bool start_array(std::size_t) override {
        if (state_ != State::TensorField || field_ == Field::Dtype) return scalar("an array");
        state_ = State::Array;
        offsets_ = 0;
        return true;
    }
    bool end_array() override {
        if (state_ != State::Array) return fail_with("unexpected end of array");
        if (field_ == Field::Offsets && offsets_ != 2)
            return fail_with("tensor \"" + tensor_.name + "\" data_offsets is not [begin, end]");
        state_ = State::Tensor;
        return true;
    }
    bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
        if (problem.empty()) problem = std::string("header is not valid JSON (") + e.what() + ")";
        return false;
    }
    bool complete() const { return state_ == State::End; }

private:
    enum class State { Start, Top, TopValue, Metadata, MetadataValue, Tensor, TensorField, Array, End };
    enum class Field { Dtype, Shape, Offsets };

    bool fail_with(std::string what) {
        problem = std::move(what);
        return false;
    }
    std::string field_name() const {
        if (state_ == State::Array && field_ == Field::Shape) return "a dimension of \"" + tensor_.name + "\"";
        if (state_ == State::Array) return "data_offsets of \"" + tensor_.name + "\"";
        return "a value in the header";
    }
    // A value of the wrong kind where the schema expects something else.
    bool scalar(const char* kind) {
        switch (state_) {
            case State::Start: return fail_with("header is not a JSON object");
            case State::TopValue:
                return fail_with(key_ == "__metadata__" ? std::string("__metadata__ is not an object")
                                                        : "entry \"" + key_ + "\" is not an object");
            case State::MetadataValue: return fail_with("__metadata__ value of \"" + key_ + "\" is not a string");
            case State::TensorField:
                if (field_ == Field::Dtype) return fail_with("tensor \"" + tensor_.name + "\" dtype is not a string");
                if (field_ == Field::Shape) return fail_with("tensor \"" + tensor_.name + "\" shape is not an array");
                return fail_with("tensor \"" + tensor_.name + "\" data_offsets is not [begin, end]");
            case State::Array: return fail_with(field_name() + " is not a non-negative integer");
            default: return fail_with(std::string("unexpected ") + kind + " in the header");
        }
    }
    bool number(std::uint64_t v) {
        if (state_ != State::Array) return scalar("a number");
        if (field_ == Field::Shape) {
            if (tensor_.shape.size() == kMaxDims)
                return fail_with("tensor \"" + tensor_.name + "\" has more than " + std::to_string(kMaxDims) +
                                 " dimensions");
            tensor_.shape.push_back(v);
            return true;
        }
        if (offsets_ == 2) return fail_with("tensor \"" + tensor_.name + "\" data_offsets is not [begin, end]");
        (offsets_++ == 0 ? tensor_.begin : tensor_.end) = v;
        return true;
    }

    Header& h_;
    State state_ = State::Start;
    Field field_ = Field::Dtype;
    unsigned seen_ = 0;
    int offsets_ = 0;
    std::string key_;
    TensorInfo tensor_;
    std::set<std::string> names_, keys_;
};

void parse_json(std::string_view text, Header& h) {
    // nlohmann would stop at a NUL byte and skip a byte-order mark; the reference implementation
    // (PyPI safetensors) rejects both.
    if (text.find('\0') != std::string_view::npos) corrupt("header contains a NUL byte");
    if (text.starts_with("\xEF\xBB\xBF")) corrupt("header starts with a UTF-8 byte-order mark");
    HeaderBuilder builder(h);
    // nlohmann rejects invalid UTF-8 in strings.
    if (!json::sax_parse(text.begin(), text.end(), &builder) || !builder.complete())
        corrupt(builder.problem.empty() ? "header is not valid JSON" : builder.problem);
}

// Bytes the tensor's dtype and shape require, with overflow checks.
std::uint64_t required_bytes(const TensorInfo& t) {
    std::uint64_t elements = 1;
    for (std::uint64_t d : t.shape)
        if (__builtin_mul_overflow(elements, d, &elements)) corrupt("shape of \"" + t.name + "\" overflows");
    std::uint64_t bits = 0;
    if (__builtin_mul_overflow(elements, std::uint64_t(dtype_bits(t.dtype)), &bits))
        corrupt("size of \"" + t.name + "\" overflows");
    if (bits % 8 != 0) corrupt("tensor \"" + t.name + "\" does not fill whole bytes");
    return bits / 8;
}

// Tensors sorted by offset must tile [0, data_size) exactly.
void check_tiling(std::vector<TensorInfo>& tensors, std::uint64_t data_size) {
    std::sort(tensors.begin(), tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
        return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    std::uint64_t cursor = 0;
    for (const TensorInfo& t : tensors) {
        if (t.begin != cursor)
            corrupt("tensor \"" + t.name + "\" begins at " + std::to_string(t.begin) + ", expected " +
                    std::to_string(cursor) + (t.begin < cursor ? " (overlap)" : " (gap)"));
        if (t.end - t.begin != required_bytes(t))
            corrupt("tensor \"" + t.name + "\" spans " + std::to_string(t.end - t.begin) +
                    " bytes, its dtype and shape need " + std::to_string(required_bytes(t)));
        cursor = t.end;
    }
    if (cursor != data_size)
        corrupt("tensor data ends at " + std::to_string(cursor) + " but the data section holds " +
                std::to_string(data_size) + " bytes");
}

}  // namespace

unsigned dtype_bits(std::string_view d) {
    static const std::pair<std::string_view, unsigned> kTable[] = {
        {"BOOL", 8},        {"U8", 8},          {"I8", 8},      {"F8_E5M2", 8}, {"F8_E4M3", 8}, {"F8_E8M0", 8},
        {"F8_E4M3FNUZ", 8}, {"F8_E5M2FNUZ", 8}, {"I16", 16},    {"U16", 16},    {"F16", 16},    {"BF16", 16},
        {"I32", 32},        {"U32", 32},        {"F32", 32},    {"C64", 64},    {"F64", 64},    {"I64", 64},
        {"U64", 64},        {"F4", 4},          {"F6_E2M3", 6}, {"F6_E3M2", 6}};
    for (const auto& [name, bits] : kTable)
        if (name == d) return bits;
    return 0;
}

namespace {

// The header length of a file starting with `start`, checked against the limit and the file size.
std::uint64_t header_length(std::span<const std::byte> start, std::uint64_t file_size) {
    if (file_size < 8 || start.size() < 8) corrupt("shorter than the 8-byte header length");
    const std::uint64_t n = read_u64_le(start.data());
    if (n > kMaxHeaderBytes) corrupt("header length " + std::to_string(n) + " exceeds the 100,000,000-byte limit");
    if (n > file_size - 8) corrupt("header length " + std::to_string(n) + " runs past the end of the file");
    return n;
}

}  // namespace

Header parse_header(std::span<const std::byte> start, std::uint64_t file_size) {
    const std::uint64_t n = header_length(start, file_size);
    if (start.size() < 8 + n) corrupt("header runs past the bytes read");
    const std::string_view text(reinterpret_cast<const char*>(start.data() + 8), n);
    Header h;
    h.data_offset = 8 + n;
    parse_json(text, h);
    check_tiling(h.tensors, file_size - h.data_offset);
    return h;
}

Header parse_header(std::span<const std::byte> file) {
    return parse_header(file, file.size());
}

namespace {

std::int64_t mtime_ns(const struct stat& st) {
    return std::int64_t(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

}  // namespace

Reader::Reader(const std::string& path, Load load) : path_(path), copied_(load == Load::Copy) {
    // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever, before
    // the regular-file check below could refuse it. It changes nothing for a regular file.
    fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd_ < 0) fail(WUSH_ERR_IO, "cannot open \"" + escape_controls(path) + "\": " + std::strerror(errno));
    try {
        struct stat st {};
        if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode))
            fail(WUSH_ERR_IO, "\"" + escape_controls(path) + "\" is not a readable regular file");
        size_ = std::size_t(st.st_size);
        mtime_ns_ = mtime_ns(st);
        device_ = std::uint64_t(st.st_dev);
        inode_ = std::uint64_t(st.st_ino);
        if (size_ > 0 && copied_) {
            // The header first: a file that is not safetensors is refused before its whole size is
            // read (a 4 GB file with a garbage header took seconds and gigabytes to reject).
            parse_header(read_header(), size_);
            // Read into memory of our own: a later change of the file cannot reach this process.
            copy_ = std::make_unique<std::byte[]>(size_);
            read_exactly(copy_.get(), size_, 0);
            map_ = copy_.get();
        } else if (size_ > 0) {
            void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
            if (p == MAP_FAILED)
                fail(WUSH_ERR_IO, "cannot map \"" + escape_controls(path) + "\": " + std::strerror(errno));
            map_ = static_cast<const std::byte*>(p);
        }
        header_ = parse_header({map_, size_});
        index_.reserve(header_.tensors.size());
        for (std::size_t i = 0; i < header_.tensors.size(); ++i) index_.emplace(header_.tensors[i].name, i);
    } catch (...) {
        if (map_ && !copied_) ::munmap(const_cast<std::byte*>(map_), size_);
        ::close(fd_);
        throw;
    }
}

void Reader::read_exactly(std::byte* out, std::size_t n, std::size_t offset) const {
    if (const int err = read_at(fd_, out, n, off_t(offset)); err != 0)
        fail(WUSH_ERR_IO, "cannot read \"" + escape_controls(path_) +
                              "\": " + (err == ENODATA ? "it was truncated" : std::strerror(err)));
}

std::vector<std::byte> Reader::read_header() const {
    std::vector<std::byte> start(std::min<std::size_t>(size_, 8));
    read_exactly(start.data(), start.size(), 0);
    start.resize(std::size_t(8 + header_length(start, size_)));
    read_exactly(start.data() + 8, start.size() - 8, 8);
    return start;
}

Reader::~Reader() {
    if (map_ && !copied_) ::munmap(const_cast<std::byte*>(map_), size_);
    ::close(fd_);
}

void Reader::check_unchanged() const {
    if (copied_) return;  // the copy is what was validated, whatever happens to the file
    struct stat st {};
    if (::fstat(fd_, &st) != 0)
        fail(WUSH_ERR_IO, "cannot stat \"" + escape_controls(path_) + "\": " + std::strerror(errno));
    if (std::size_t(st.st_size) != size_ || mtime_ns(st) != mtime_ns_)
        fail(WUSH_ERR_IO,
             "\"" + escape_controls(path_) + "\" was " + (std::size_t(st.st_size) < size_ ? "truncated" : "modified") +
                 " after it was opened; replace a checkpoint by writing a new file and renaming it over the "
                 "old one");
}

bool Reader::is_file(const std::string& path) const noexcept {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && std::uint64_t(st.st_dev) == device_ && std::uint64_t(st.st_ino) == inode_;
}

const TensorInfo* Reader::find(std::string_view name) const noexcept {
    const auto it = index_.find(name);
    return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

std::span<const std::byte> Reader::bytes(const TensorInfo& t) const noexcept {
    return {map_ + header_.data_offset + t.begin, std::size_t(t.end - t.begin)};
}

namespace {

std::string header_json(const std::vector<TensorSource>& tensors, const std::map<std::string, std::string>& metadata,
                        std::vector<std::uint64_t>& sizes) {
    json j = json::object();
    if (!metadata.empty()) j["__metadata__"] = metadata;
    std::uint64_t offset = 0;
    std::set<std::string> names;
    for (const TensorSource& t : tensors) {
        if (t.name == "__metadata__" || !names.insert(t.name).second)
            fail(WUSH_ERR_INVALID_ARGUMENT, "tensor name \"" + t.name + "\" is reserved or repeated");
        TensorInfo info{t.name, t.dtype, t.shape, 0, 0};
        if (dtype_bits(t.dtype) == 0) fail(WUSH_ERR_INVALID_ARGUMENT, "unknown safetensors dtype \"" + t.dtype + "\"");
        const std::uint64_t bytes = required_bytes(info);
        j[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
        sizes.push_back(bytes);
        offset += bytes;
    }
    std::string text = j.dump();
    text.append((8 - text.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned
    return text;
}

}  // namespace

void write_file(const std::string& path, const std::vector<TensorSource>& tensors,
                const std::map<std::string, std::string>& metadata) {
    AtomicFile file(path);
    write_tensors(file, tensors, metadata);
    file.commit();
}

void write_tensors(AtomicFile& file, const std::vector<TensorSource>& tensors,
                   const std::map<std::string, std::string>& metadata) {
    std::vector<std::uint64_t> sizes;
    const std::string header = header_json(tensors, metadata, sizes);
    std::byte len[8];
    for (int i = 0; i < 8; ++i) len[i] = std::byte((header.size() >> (8 * i)) & 0xFF);
    file.write(len, 8);
    file.write(header.data(), header.size());
    for (std::size_t i = 0; i < tensors.size(); ++i) {
        std::uint64_t written = 0;
        tensors[i].write([&](const void* data, std::size_t n) {
            if (written + n > sizes[i])
                fail(WUSH_ERR_INTERNAL, "tensor \"" + tensors[i].name + "\" wrote too many bytes");
            file.write(data, n);
            written += n;
        });
        if (written != sizes[i]) fail(WUSH_ERR_INTERNAL, "tensor \"" + tensors[i].name + "\" wrote too few bytes");
    }
}

}  // namespace wush::storage
