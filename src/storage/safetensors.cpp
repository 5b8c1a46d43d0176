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
#include "storage/atomic_file.h"

namespace wush::storage {

namespace {

using nlohmann::json;

[[noreturn]] void corrupt(const std::string& what) { fail(WUSH_ERR_CORRUPT_FILE, "invalid safetensors file: " + what); }

std::uint64_t read_u64_le(const std::byte* p) {
    std::uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | std::uint64_t(p[i]);
    return v;
}

// First pass over the header: a SAX handler that rejects duplicate keys at any depth and nesting
// deeper than a safetensors header ever needs (top object > tensor object > shape array), so
// hostile inputs stay cheap. (nlohmann's callback parser is not used for this: its end_object()
// scans the whole parent object, which makes a header with n tensors cost O(n^2).)
class HeaderChecker : public nlohmann::json_sax<json> {
public:
    std::string problem;

    bool null() override { return true; }
    bool boolean(bool) override { return true; }
    bool number_integer(number_integer_t) override { return true; }
    bool number_unsigned(number_unsigned_t) override { return true; }
    bool number_float(number_float_t, const string_t&) override { return true; }
    bool string(string_t&) override { return true; }
    bool binary(binary_t&) override { return true; }
    bool start_object(std::size_t) override {
        keys_.emplace_back();
        return enter();
    }
    bool key(string_t& k) override {
        if (!keys_.back().insert(k).second) problem = "duplicate key \"" + k + "\"";
        return problem.empty();
    }
    bool end_object() override {
        keys_.pop_back();
        --depth_;
        return true;
    }
    bool start_array(std::size_t) override { return enter(); }
    bool end_array() override {
        --depth_;
        return true;
    }
    bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
        problem = std::string("header is not valid JSON (") + e.what() + ")";
        return false;
    }

private:
    bool enter() {
        if (++depth_ > 3) problem = "JSON nested deeper than a safetensors header allows";
        return problem.empty();
    }
    std::vector<std::set<std::string>> keys_;
    int depth_ = 0;
};

// Parses the header JSON (nlohmann rejects invalid UTF-8 in strings) after the checks above.
json parse_json(std::string_view text) {
    HeaderChecker checker;
    if (!json::sax_parse(text.begin(), text.end(), &checker))
        corrupt(checker.problem.empty() ? "header is not valid JSON" : checker.problem);
    try {
        return json::parse(text.begin(), text.end());
    } catch (const json::exception& e) {
        corrupt(std::string("header is not valid JSON (") + e.what() + ")");
    }
}

std::uint64_t as_u64(const json& v, const std::string& what) {
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<std::int64_t>() >= 0))
        corrupt(what + " is not a non-negative integer");
    return v.get<std::uint64_t>();
}

TensorInfo parse_tensor(const std::string& name, const json& v) {
    if (!v.is_object()) corrupt("entry \"" + name + "\" is not an object");
    for (const auto& [key, _] : v.items())
        if (key != "dtype" && key != "shape" && key != "data_offsets")
            corrupt("tensor \"" + name + "\" has unknown field \"" + key + "\"");
    if (!v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
        corrupt("tensor \"" + name + "\" lacks dtype, shape or data_offsets");
    TensorInfo t;
    t.name = name;
    if (!v["dtype"].is_string()) corrupt("tensor \"" + name + "\" dtype is not a string");
    t.dtype = v["dtype"].get<std::string>();
    if (dtype_bits(t.dtype) == 0) corrupt("tensor \"" + name + "\" has unknown dtype \"" + t.dtype + "\"");
    if (!v["shape"].is_array()) corrupt("tensor \"" + name + "\" shape is not an array");
    for (const json& d : v["shape"]) t.shape.push_back(as_u64(d, "a dimension of \"" + name + "\""));
    const json& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2) corrupt("tensor \"" + name + "\" data_offsets is not [begin, end]");
    t.begin = as_u64(off[0], "data_offsets of \"" + name + "\"");
    t.end = as_u64(off[1], "data_offsets of \"" + name + "\"");
    if (t.end < t.begin) corrupt("tensor \"" + name + "\" ends before it begins");
    return t;
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

void parse_metadata(const json& v, Header& h) {
    if (!v.is_object()) corrupt("__metadata__ is not an object");
    for (const auto& [key, value] : v.items()) {
        if (!value.is_string()) corrupt("__metadata__ value of \"" + key + "\" is not a string");
        h.metadata[key] = value.get<std::string>();
    }
}

// Tensors sorted by offset must tile [0, data_size) exactly.
void check_tiling(std::vector<TensorInfo>& tensors, std::uint64_t data_size) {
    std::sort(tensors.begin(), tensors.end(),
              [](const TensorInfo& a, const TensorInfo& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
    std::uint64_t cursor = 0;
    for (const TensorInfo& t : tensors) {
        if (t.begin != cursor)
            corrupt("tensor \"" + t.name + "\" begins at " + std::to_string(t.begin) + ", expected " + std::to_string(cursor) +
                    (t.begin < cursor ? " (overlap)" : " (gap)"));
        if (t.end - t.begin != required_bytes(t))
            corrupt("tensor \"" + t.name + "\" spans " + std::to_string(t.end - t.begin) + " bytes, its dtype and shape need " +
                    std::to_string(required_bytes(t)));
        cursor = t.end;
    }
    if (cursor != data_size)
        corrupt("tensor data ends at " + std::to_string(cursor) + " but the data section holds " + std::to_string(data_size) +
                " bytes");
}

}  // namespace

unsigned dtype_bits(std::string_view d) {
    static const std::pair<std::string_view, unsigned> kTable[] = {
        {"BOOL", 8},    {"U8", 8},           {"I8", 8},           {"F8_E5M2", 8}, {"F8_E4M3", 8}, {"F8_E8M0", 8},
        {"F8_E4M3FNUZ", 8}, {"F8_E5M2FNUZ", 8}, {"I16", 16},      {"U16", 16},    {"F16", 16},    {"BF16", 16},
        {"I32", 32},    {"U32", 32},         {"F32", 32},         {"C64", 64},    {"F64", 64},    {"I64", 64},
        {"U64", 64},    {"F4", 4},           {"F6_E2M3", 6},      {"F6_E3M2", 6}};
    for (const auto& [name, bits] : kTable)
        if (name == d) return bits;
    return 0;
}

Header parse_header(std::span<const std::byte> file) {
    if (file.size() < 8) corrupt("shorter than the 8-byte header length");
    const std::uint64_t n = read_u64_le(file.data());
    if (n > kMaxHeaderBytes) corrupt("header length " + std::to_string(n) + " exceeds the 100,000,000-byte limit");
    if (n > file.size() - 8) corrupt("header length " + std::to_string(n) + " runs past the end of the file");
    const std::string_view text(reinterpret_cast<const char*>(file.data() + 8), n);
    const json j = parse_json(text);  // nlohmann rejects invalid UTF-8 in strings
    if (!j.is_object()) corrupt("header is not a JSON object");
    Header h;
    h.data_offset = 8 + n;
    for (const auto& [key, value] : j.items()) {
        if (key == "__metadata__") parse_metadata(value, h);
        else h.tensors.push_back(parse_tensor(key, value));
    }
    check_tiling(h.tensors, file.size() - h.data_offset);
    return h;
}

Reader::Reader(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail(WUSH_ERR_IO, "cannot open \"" + path + "\": " + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        fail(WUSH_ERR_IO, "\"" + path + "\" is not a readable regular file");
    }
    size_ = std::size_t(st.st_size);
    if (size_ > 0) {
        void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
        ::close(fd);
        if (p == MAP_FAILED) fail(WUSH_ERR_IO, "cannot map \"" + path + "\": " + std::strerror(errno));
        map_ = static_cast<const std::byte*>(p);
    } else {
        ::close(fd);
    }
    try {
        header_ = parse_header({map_, size_});
        index_.reserve(header_.tensors.size());
        for (std::size_t i = 0; i < header_.tensors.size(); ++i) index_.emplace(header_.tensors[i].name, i);
    } catch (...) {
        if (map_) ::munmap(const_cast<std::byte*>(map_), size_);
        throw;
    }
}

Reader::~Reader() {
    if (map_) ::munmap(const_cast<std::byte*>(map_), size_);
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
    std::vector<std::uint64_t> sizes;
    const std::string header = header_json(tensors, metadata, sizes);
    AtomicFile file(path);
    std::byte len[8];
    for (int i = 0; i < 8; ++i) len[i] = std::byte((header.size() >> (8 * i)) & 0xFF);
    file.write(len, 8);
    file.write(header.data(), header.size());
    for (std::size_t i = 0; i < tensors.size(); ++i) {
        std::uint64_t written = 0;
        tensors[i].write([&](const void* data, std::size_t n) {
            if (written + n > sizes[i]) fail(WUSH_ERR_INTERNAL, "tensor \"" + tensors[i].name + "\" wrote too many bytes");
            file.write(data, n);
            written += n;
        });
        if (written != sizes[i]) fail(WUSH_ERR_INTERNAL, "tensor \"" + tensors[i].name + "\" wrote too few bytes");
    }
    file.commit();
}

}  // namespace wush::storage
