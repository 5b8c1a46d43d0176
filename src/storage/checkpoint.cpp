#include "storage/checkpoint.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/escape.h"
#include "common/float_bits.h"
#include "common/names.h"
#include "common/sha256.h"
#include "common/utf8.h"
#include "formats/block_format.h"
#include "formats/group_quantizer.h"
#include "storage/atomic_file.h"

namespace wush::storage {

namespace {

// Tensor name suffixes of a layer, and its metadata keys (after "<layer>.").
constexpr const char* kCodes = ".codes";
constexpr const char* kScales = ".scales";
constexpr const char* kTensorScale = ".tensor_scale";
constexpr const char* kTransform = ".transform";
constexpr const char* kSuffixes[] = {kCodes, kScales, kTensorScale, kTransform};
constexpr const char* kLayerKeys[] = {"format", "group_size", "transform", "method", "damping"};
// Optional from format version "2": SHA-256 of the layer's four tensors' bytes, in kSuffixes order.
constexpr const char* kDigestKey = "sha256";
constexpr const char* kFirstVersion = "1";
// From format version "3": a grouped layer's parts, one "ROWS NAME" line each, in row order. A
// grouped layer's digest also covers this value (appended after its four tensors).
constexpr const char* kPartsKey = "parts";

[[noreturn]] void corrupt(const std::string& what) {
    fail(WUSH_ERR_CORRUPT_FILE, "invalid libwush checkpoint: " + what);
}

bool ends_with(std::string_view s, std::string_view suffix) {
    return s.size() > suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::string scale_dtype(wush_format f) {
    return formats::spec(f).scale_bytes == 2 ? "BF16" : "U8";
}

// A file holds names exactly as the writer spells them (the tables of common/names.h): a name the
// API would read in another case, or with anything after a NUL, is not one this library wrote.
bool written_name(std::string_view stored, std::string_view canonical) {
    return stored == canonical;
}

std::string checked_method(const std::string& method) {
    const auto m = parse_name<wush_method>(kMethodNames, method);
    if (!m || !written_name(method, name_of<wush_method>(kMethodNames, *m)))
        corrupt("unknown method \"" + method + "\"");
    return method;
}

// Shortest decimal form that reads back to the same double; independent of the C locale (a host
// program with a comma decimal separator must write and read the same files).
std::string format_double(double v) {
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);
    return std::string(buf, r.ptr);
}

// SHA-256 over a layer's tensors as stored, in kSuffixes order: what a reader recomputes from
// the file. Swapping two layers' bytes, or changing one, changes it.
std::string layer_digest(std::span<const std::span<const std::byte>> tensors) {
    Sha256 h;
    for (const auto& t : tensors) h.update(t);
    return to_hex(h.finish());
}

// The metadata value of a grouped layer's parts (kPartsKey).
std::string parts_value(const std::vector<LayerPart>& parts) {
    std::string v;
    for (const LayerPart& p : parts) v += (v.empty() ? "" : "\n") + std::to_string(p.rows) + " " + p.name;
    return v;
}

// The name rules of a part (a layer name that also has no newline, the parts' separator); the
// error text is `what`'s.
std::optional<std::string> part_name_problem(const std::string& part) {
    if (part.empty() || part.find('\0') != std::string::npos || part.find('\n') != std::string::npos)
        return "part names must be non-empty, without NUL or newline";
    if (!is_valid_utf8(part)) return "part name \"" + to_valid_utf8(part) + "\" is not valid UTF-8";
    for (const char* suffix : kSuffixes)
        if (ends_with(part, suffix))
            return "part name \"" + part + "\" ends with the reserved suffix \"" + suffix + "\"";
    return std::nullopt;
}

// The rules every grouped layer's parts follow (writer and reader): two or more, each with rows,
// the rows summing to d_out, names unique among every layer and part of the file (`taken`).
std::optional<std::string> parts_problem(const std::vector<LayerPart>& parts, std::uint64_t d_out,
                                         std::set<std::string>& taken) {
    if (parts.size() < 2) return "a grouped layer has two or more parts";
    std::uint64_t rows = 0;
    for (const LayerPart& p : parts) {
        if (auto problem = part_name_problem(p.name)) return problem;
        if (p.rows == 0 || p.rows > d_out - rows)
            return "its parts' rows do not sum to its " + std::to_string(d_out) + " output rows";
        rows += p.rows;
        if (!taken.insert(p.name).second) return "part \"" + p.name + "\" repeats the name of a layer or part";
    }
    if (rows != d_out) return "its parts' rows do not sum to its " + std::to_string(d_out) + " output rows";
    return std::nullopt;
}

}  // namespace

void check_layer_ref(const LayerRef& l, std::set<std::string>& names) {
    require(!l.name.empty() && l.name.find('\0') == std::string::npos, "layer names must be non-empty");
    // Checked here, not first when the writer's JSON encoder meets the name (an INTERNAL error).
    require(is_valid_utf8(l.name), "layer name \"" + to_valid_utf8(l.name) + "\" is not valid UTF-8");
    for (const char* suffix : kSuffixes)
        require(!ends_with(l.name, suffix), "layer name \"" + l.name + "\" ends with a reserved suffix");
    require(names.insert(l.name).second, "layer \"" + l.name + "\" is added twice");
    const formats::FormatSpec& f = formats::spec(l.weights->format);
    require(f.group == l.transform->group() && l.weights->d_in == l.transform->d_in(),
            "layer \"" + l.name + "\": the qweight's format/width does not match the transform");
    require(parse_name<wush_method>(kMethodNames, l.method).has_value(), "layer \"" + l.name + "\": unknown method");
    if (!l.parts.empty())
        if (auto problem = parts_problem(l.parts, l.weights->d_out, names))
            fail(WUSH_ERR_INVALID_ARGUMENT, "layer \"" + l.name + "\": " + *problem);
}

void write_checkpoint(const std::string& path, const std::vector<LayerRef>& layers, Progress* progress) {
    std::set<std::string> names;
    for (const LayerRef& l : layers) check_layer_ref(l, names);
    const bool grouped = std::any_of(layers.begin(), layers.end(), [](const LayerRef& l) { return !l.parts.empty(); });
    std::map<std::string, std::string> meta{
        {"format_version", grouped ? kGroupedFormatVersion : kCheckpointFormatVersion},
        {"producer", "libwush " + std::to_string(WUSH_VERSION_MAJOR) + "." + std::to_string(WUSH_VERSION_MINOR) + "." +
                         std::to_string(WUSH_VERSION_PATCH)}};
    std::vector<TensorSource> tensors;
    const double total = double(layers.size());
    for (std::size_t i = 0; i < layers.size(); ++i) {
        const LayerRef& l = layers[i];
        const formats::FormatSpec& f = formats::spec(l.weights->format);
        const std::size_t g = f.group, d_out = l.weights->d_out, d_in = l.weights->d_in;
        meta[l.name + ".format"] = f.name;
        meta[l.name + ".group_size"] = std::to_string(g);
        meta[l.name + ".transform"] = transform_kind_name(l.transform->kind());
        meta[l.name + ".method"] = l.method;
        meta[l.name + ".damping"] = format_double(l.transform->damping());
        const auto codes = l.weights->codes.span(), scales = l.weights->scales.span();
        tensors.push_back({l.name + kCodes, "U8", {d_out, d_in / 2}, [codes](const auto& sink) {
                               sink(codes.data(), codes.size());
                           }});
        tensors.push_back({l.name + kScales, scale_dtype(f.id), {d_out, d_in / g}, [scales](const auto& sink) {
                               sink(scales.data(), scales.size());
                           }});
        tensors.push_back(
            {l.name + kTensorScale, "F32", {1}, [factor = f.tensor_factor()](const auto& sink) { sink(&factor, 4); }});
        const auto act = l.transform->activation_matrices();
        const float factor = f.tensor_factor();
        const std::string parts = parts_value(l.parts);
        if (!l.parts.empty()) meta[l.name + "." + kPartsKey] = parts;
        const std::span<const std::byte> digested[] = {std::as_bytes(codes), std::as_bytes(scales),
                                                       std::as_bytes(std::span(&factor, 1)), std::as_bytes(act),
                                                       std::as_bytes(std::span(parts))};
        meta[l.name + "." + kDigestKey] = layer_digest(digested);
        tensors.push_back({l.name + kTransform, "F32", {d_in / g, g, g}, [act, progress, i, total](const auto& sink) {
                               sink(act.data(), act.size() * sizeof(float));
                               if (progress && !progress->report(double(i + 1), total)) progress->throw_if_cancelled();
                           }});
    }
    write_file(path, tensors, meta);
}

namespace {

const TensorInfo& tensor_of(const Reader& r, const std::string& name) {
    const TensorInfo* t = r.find(name);
    if (t == nullptr) corrupt("tensor \"" + name + "\" is missing");
    return *t;
}

void expect(const TensorInfo& t, const std::string& dtype, const std::vector<std::uint64_t>& shape) {
    if (t.dtype != dtype) corrupt("tensor \"" + t.name + "\" has dtype " + t.dtype + ", expected " + dtype);
    if (t.shape != shape) {
        std::string s;
        for (std::uint64_t d : shape) s += (s.empty() ? "" : ", ") + std::to_string(d);
        corrupt("tensor \"" + t.name + "\" has the wrong shape, expected (" + s + ")");
    }
}

std::size_t parse_size(const std::string& v, const std::string& key) {
    if (v.empty() || v.size() > 9 || v.find_first_not_of("0123456789") != std::string::npos)
        corrupt("metadata \"" + key + "\" = \"" + v + "\" is not a size");
    return std::size_t(std::stoul(v));
}

double parse_damping(const std::string& v, const std::string& key) {
    double d = 0.0;
    const auto r = std::from_chars(v.data(), v.data() + v.size(), d);  // locale-independent, no hex, no spaces
    if (v.empty() || r.ec != std::errc() || r.ptr != v.data() + v.size() || !std::isfinite(d) || d < 0)
        corrupt("metadata \"" + key + "\" = \"" + v + "\" is not a damping");
    return d;
}

struct LayerMeta {
    const formats::FormatSpec* format;
    TransformKind kind;
    std::string method;
    double damping;
};

LayerMeta layer_meta(const Header& h, const std::string& name) {
    auto get = [&](const char* key) {
        const auto it = h.metadata.find(name + "." + key);
        if (it == h.metadata.end()) corrupt("layer \"" + name + "\" lacks metadata \"" + name + "." + key + "\"");
        return it->second;
    };
    LayerMeta m{};
    m.format = formats::spec_by_name(get("format").c_str());
    if (m.format == nullptr || get("format") != m.format->name)  // the writer's spelling exactly (below)
        corrupt("layer \"" + name + "\" has unknown format \"" + get("format") + "\"");
    if (parse_size(get("group_size"), name + ".group_size") != m.format->group)
        corrupt("layer \"" + name + "\": group_size " + get("group_size") + " does not match " + m.format->name);
    const auto kind = transform_kind_from_name(get("transform"));
    if (!kind || !written_name(get("transform"), transform_kind_name(*kind)))
        corrupt("layer \"" + name + "\" has unknown transform \"" + get("transform") + "\"");
    m.kind = *kind;
    m.method = checked_method(get("method"));
    m.damping = parse_damping(get("damping"), name + ".damping");
    return m;
}

// Shapes and dtypes of one layer's four tensors, consistent with its metadata.
void check_layer_tensors(const Reader& r, const std::string& name, const LayerMeta& m) {
    const TensorInfo& codes = tensor_of(r, name + kCodes);
    if (codes.shape.size() != 2) corrupt("tensor \"" + codes.name + "\" is not 2-D");
    const std::uint64_t g = m.format->group, d_out = codes.shape[0], d_in = codes.shape[1] * 2;
    if (d_out == 0 || d_in == 0 || d_in % g != 0)
        corrupt("layer \"" + name + "\" has d_in not a positive multiple of G");
    expect(codes, "U8", {d_out, d_in / 2});
    expect(tensor_of(r, name + kScales), scale_dtype(m.format->id), {d_out, d_in / g});
    const TensorInfo& ts = tensor_of(r, name + kTensorScale);
    expect(ts, "F32", {1});
    float factor;
    std::memcpy(&factor, r.bytes(ts).data(), 4);
    if (factor != m.format->tensor_factor())
        corrupt("layer \"" + name + "\": tensor_scale " + format_double(factor) + " is not the " + m.format->name +
                " factor");
    expect(tensor_of(r, name + kTransform), "F32", {d_in / g, g, g});
}

// Layer names from the tensor names; every tensor and metadata key must belong to a layer.
std::vector<std::string> collect_layers(const Reader& r) {
    const Header& h = r.header();
    const auto version = h.metadata.find("format_version");
    if (version == h.metadata.end()) corrupt("no \"format_version\" metadata: not a libwush checkpoint");
    if (version->second != kCheckpointFormatVersion && version->second != kFirstVersion &&
        version->second != kGroupedFormatVersion)
        corrupt("format_version \"" + version->second + "\" is not supported (this library reads " + kFirstVersion +
                ", " + kCheckpointFormatVersion + " and " + kGroupedFormatVersion + ")");
    const bool digests = version->second != kFirstVersion;
    const bool groups = version->second == kGroupedFormatVersion;
    std::vector<std::string> names;
    for (const TensorInfo& t : h.tensors) {
        if (!ends_with(t.name, kCodes)) {
            bool known = false;
            for (const char* s : kSuffixes) known = known || ends_with(t.name, s);
            if (!known) corrupt("unexpected tensor \"" + t.name + "\"");
            continue;
        }
        std::string name = t.name.substr(0, t.name.size() - std::strlen(kCodes));
        // The writer's naming rules (check_layer_ref), so that every layer read can be written again.
        if (const std::size_t nul = name.find('\0'); nul != std::string::npos)
            corrupt("layer name \"" + name.substr(0, nul) + "\\0...\" holds a NUL character");
        for (const char* s : kSuffixes)
            if (ends_with(name, s)) corrupt("layer name \"" + name + "\" ends with the reserved suffix \"" + s + "\"");
        names.push_back(std::move(name));
    }
    const std::set<std::string> layer_set(names.begin(), names.end());
    for (const TensorInfo& t : h.tensors) {
        for (const char* s : kSuffixes)
            if (ends_with(t.name, s) && !layer_set.count(t.name.substr(0, t.name.size() - std::strlen(s))))
                corrupt("tensor \"" + t.name + "\" belongs to no layer (its .codes tensor is missing)");
    }
    for (const auto& [key, value] : h.metadata) {
        if (key == "format_version" || key == "producer") continue;
        // "<layer>.<key>": the key names have no dot, so the layer is what precedes the last one.
        const std::size_t dot = key.rfind('.');
        bool known = false;
        if (dot != std::string::npos && layer_set.count(key.substr(0, dot))) {
            for (const char* k : kLayerKeys) known = known || key.compare(dot + 1, std::string::npos, k) == 0;
            known = known || (groups && key.compare(dot + 1, std::string::npos, kPartsKey) == 0);
            if (digests && key.compare(dot + 1, std::string::npos, kDigestKey) == 0) {
                known = true;
                if (value.size() != 64 || value.find_first_not_of("0123456789abcdef") != std::string::npos)
                    corrupt("metadata \"" + key + "\" is not 64 lower-case hexadecimal digits");
            }
        }
        if (!known) corrupt("unexpected metadata key \"" + key + "\"");
    }
    return names;
}

// The parts of layer `name` from its metadata value (empty without one), checked against the
// layer's rows and the names taken by layers and earlier parts.
std::vector<LayerPart> read_parts(const Reader& r, const std::string& name, std::set<std::string>& taken) {
    const auto it = r.header().metadata.find(name + "." + kPartsKey);
    if (it == r.header().metadata.end()) return {};
    std::vector<LayerPart> parts;
    std::string_view rest = it->second;
    while (true) {
        const std::string_view line = rest.substr(0, rest.find('\n'));
        const std::size_t space = line.find(' ');
        if (space == std::string_view::npos) corrupt("layer \"" + name + "\": a part is not \"ROWS NAME\"");
        parts.push_back({std::string(line.substr(space + 1)),
                         parse_size(std::string(line.substr(0, space)), name + "." + kPartsKey)});
        if (line.size() == rest.size()) break;
        rest.remove_prefix(line.size() + 1);
    }
    if (auto problem = parts_problem(parts, tensor_of(r, name + kCodes).shape[0], taken))
        corrupt("layer \"" + name + "\": " + *problem);
    return parts;
}

}  // namespace

CheckpointReader::CheckpointReader(const std::string& path, Reader::Load load)
    : file_(std::make_shared<const Reader>(path, load)) {
    names_ = collect_layers(*file_);
    for (const std::string& n : names_) check_layer_tensors(*file_, n, layer_meta(file_->header(), n));
    std::set<std::string> taken(names_.begin(), names_.end());
    for (const std::string& n : names_) parts_[n] = read_parts(*file_, n, taken);
    // The copy is what every later call reads, so checking it once here covers them all.
    if (load == Reader::Load::Copy) verify();
}

std::size_t CheckpointReader::verify() const {
    file_->check_unchanged();
    std::size_t verified = 0;
    for (const std::string& n : names_) {
        const auto recorded = file_->header().metadata.find(n + "." + kDigestKey);
        if (recorded == file_->header().metadata.end()) continue;
        const std::string parts = parts_value(parts_.at(n));
        std::span<const std::byte> digested[std::size(kSuffixes) + 1];
        for (std::size_t k = 0; k < std::size(kSuffixes); ++k)
            digested[k] = file_->bytes(tensor_of(*file_, n + kSuffixes[k]));
        digested[std::size(kSuffixes)] = std::as_bytes(std::span(parts));
        if (layer_digest(digested) != recorded->second)
            corrupt("layer \"" + n +
                    "\": its bytes differ from the digest its writer recorded (the file was changed "
                    "or damaged after it was written)");
        ++verified;
    }
    return verified;
}

CheckpointLayer CheckpointReader::load_part(const std::string& name) const {
    for (const auto& [group, parts] : parts_) {
        std::size_t begin = 0;
        for (const LayerPart& p : parts) {
            if (p.name == name) {
                CheckpointLayer l = load(group);
                // The part's rows, borrowed like the group's: codes and scales are row-major.
                const formats::PackedMatrix& w = l.weights;
                const std::size_t code_row = w.d_in / 2, scale_row = w.scales.size() / w.d_out;
                l.weights = {w.format, p.rows, w.d_in,
                             formats::ByteView(w.codes.span().subspan(begin * code_row, p.rows * code_row), file_),
                             formats::ByteView(w.scales.span().subspan(begin * scale_row, p.rows * scale_row), file_)};
                l.name = name;
                return l;
            }
            begin += p.rows;
        }
    }
    fail(WUSH_ERR_NOT_FOUND, "the checkpoint has no layer \"" + name + "\"");
}

const std::vector<LayerPart>& CheckpointReader::parts(std::string_view name) const {
    const auto it = parts_.find(name);
    if (it == parts_.end()) fail(WUSH_ERR_NOT_FOUND, "the checkpoint has no layer \"" + std::string(name) + "\"");
    return it->second;
}

CheckpointLayer CheckpointReader::load(std::string_view name) const {
    const std::string n(name);
    // Every ".codes" tensor makes a layer (collect_layers), so this is "n is one of names_".
    if (n.empty() || file_->find(n + kCodes) == nullptr) return load_part(n);
    // A layer is loaded once and then read in every forward pass: the last point where a file
    // changed in place can be refused cleanly instead of faulting (SIGBUS) or computing garbage.
    file_->check_unchanged();
    const LayerMeta m = layer_meta(file_->header(), n);
    const auto bytes = [&](const char* suffix) {
        const auto b = file_->bytes(tensor_of(*file_, n + suffix));
        return std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(b.data()), b.size());
    };
    const auto t_bytes = bytes(kTransform);
    std::vector<float> act(t_bytes.size() / sizeof(float));
    std::memcpy(act.data(), t_bytes.data(), t_bytes.size());  // the mapping need not be float-aligned
    const std::size_t g = m.format->group, d_in = act.size() / g;
    const auto codes = bytes(kCodes), scales = bytes(kScales);
    // Every later use (dequantize, loss, forward) reads these values: a scale valid by the format
    // but overflowing float32 when decoded is refused once, here.
    try {
        formats::require_decodable(*m.format, codes, scales, codes.size() * 2 / d_in, d_in);
    } catch (const Error& e) {
        corrupt("layer \"" + n + "\": " + e.what());
    }
    try {
        BlockTransform t(d_in, g, m.kind, std::move(act), m.damping);
        const formats::PackedMatrix w{m.format->id, codes.size() * 2 / d_in, d_in, formats::ByteView(codes, file_),
                                      formats::ByteView(scales, file_)};
        return {n, std::move(t), w, m.method};
    } catch (const Error& e) {
        corrupt("layer \"" + n + "\": " + e.what());
    }
}

namespace {

// What the fp_quant layout says of a whole checkpoint: one format, one transform_init, one group.
struct FpQuantPlan {
    std::string forward_dtype, init;
    std::size_t group = 0;
};

// The fp_quant name of a layer's transform ("wush" for a per-block export, else "identity" or
// "hadamard"), or an UNSUPPORTED refusal naming the layer.
std::string fp_quant_init(const CheckpointLayer& l, bool per_block) {
    if (per_block) return "wush";
    const TransformKind k = l.transform.kind();
    if (k != TransformKind::Identity && k != TransformKind::Hadamard)
        fail(WUSH_ERR_UNSUPPORTED,
             "layer \"" + l.name + "\": fp_quant has no transform_init for " + transform_kind_name(k));
    return transform_kind_name(k);
}

// One layer against the layout's rules; UNSUPPORTED names the layer and the rule.
void check_fp_quant_layer(const CheckpointLayer& l, const std::string& init) {
    const std::string& n = l.name;
    const formats::FormatSpec& f = formats::spec(l.weights.format);
    if (f.id != WUSH_FORMAT_MXFP4 && f.id != WUSH_FORMAT_NVFP4)
        fail(WUSH_ERR_UNSUPPORTED, "layer \"" + n + "\": fp_quant holds only mxfp4 and nvfp4, not " + f.name);
    // The layout could hold it, but its consumers (QuTLASS / fp_quant) apply one shared (G, G)
    // rotation for NVFP4 and would misread per-block matrices: a file none of them loads
    // correctly is refused rather than written.
    if (init == "wush" && f.id == WUSH_FORMAT_NVFP4)
        fail(WUSH_ERR_UNSUPPORTED, "layer \"" + n +
                                       "\": no fp_quant consumer loads NVFP4 with per-block (WUSH) "
                                       "matrices (QuTLASS / fp_quant apply one shared (G, G) rotation for NVFP4)");
    const auto act = l.transform.activation_matrices();
    for (float v : act)
        if (bits::bf16_decode(bits::bf16_encode(v)) != v)
            fail(WUSH_ERR_UNSUPPORTED, "layer \"" + n +
                                           "\": its transform is not exactly representable in bf16 "
                                           "(build it with WUSH_OPTION_TRANSFORM_DTYPE = WUSH_DTYPE_BF16)");
    if (init == "wush") return;
    // Exported as one shared (G, G) matrix: every block must be block 0's.
    const std::size_t gg = std::size_t(f.group) * f.group;
    for (std::size_t b = 1; b < act.size() / gg; ++b)
        if (!std::equal(act.begin(), act.begin() + gg, act.begin() + b * gg))
            fail(WUSH_ERR_UNSUPPORTED, "layer \"" + n + "\": its " + init +
                                           " transform differs between blocks (block " + std::to_string(b) +
                                           "), fp_quant shares one matrix");
}

// Every refusal of the export, before anything is written (ZSTD_checkCParams' place): the
// outputs against the input and each other, then each layer, then their agreement.
FpQuantPlan check_fp_quant_export(const CheckpointReader& ck, const std::vector<CheckpointLayer>& layers,
                                  const std::string& path, const std::string& config_path) {
    // Writing over the checkpoint being read would replace it with the export.
    for (const std::string* out : {&path, &config_path})
        if (!out->empty() && ck.is_file(*out))
            fail(WUSH_ERR_INVALID_ARGUMENT, "the output \"" + *out + "\" is the checkpoint being exported");
    if (!config_path.empty() && same_destination(path, config_path))
        fail(WUSH_ERR_INVALID_ARGUMENT,
             "the model and the config would both be written to \"" + escape_controls(path) + "\"");
    require(!layers.empty(), "the checkpoint has no layers");
    // One WUSH layer makes the export per-block ((G, d_in) matrices, transform_init "wush"); the
    // other layers of such a checkpoint (a search's guard may keep I, H or R on some) are then
    // written as their explicit per-block matrices, which that layout represents exactly.
    const bool per_block = std::any_of(layers.begin(), layers.end(), [](const CheckpointLayer& l) {
        return l.transform.kind() == TransformKind::WUSH;
    });
    FpQuantPlan plan;
    for (const CheckpointLayer& l : layers) {
        if (!ck.parts(l.name).empty())
            fail(WUSH_ERR_UNSUPPORTED, "layer \"" + l.name +
                                           "\" is grouped (its parts share one transform): the fp_quant layout has "
                                           "one layer per module");
        const std::string init = fp_quant_init(l, per_block);
        check_fp_quant_layer(l, init);
        const formats::FormatSpec& f = formats::spec(l.weights.format);
        if (!plan.forward_dtype.empty() && (plan.forward_dtype != f.name || plan.init != init))
            fail(WUSH_ERR_UNSUPPORTED, "fp_quant needs one format and one transform kind for all layers");
        plan = {f.name, init, f.group};
    }
    return plan;
}

// The fp_quant tensors of one layer, streamed from its objects.
void add_fp_quant_tensors(std::vector<TensorSource>& tensors, const CheckpointLayer& l, const FpQuantPlan& plan,
                          std::function<void()> after) {
    const std::size_t d_out = l.weights.d_out, d_in = l.weights.d_in, g = plan.group;
    const auto codes = l.weights.codes.span(), scales = l.weights.scales.span();
    const float global = float(formats::spec(l.weights.format).tensor_divisor);
    tensors.push_back(
        {l.name + ".qweight", "U8", {d_out, d_in / 2}, [codes](const auto& s) { s(codes.data(), codes.size()); }});
    tensors.push_back(
        {l.name + ".scales", "U8", {d_out, d_in / g}, [scales](const auto& s) { s(scales.data(), scales.size()); }});
    // WUSH: (G, d_in), column block j holds T_j^T, so a token's block x_j (a row) times it is
    // (T_j x_j)^T. Identity/Hadamard: the one shared (G, G) matrix.
    const auto act = l.transform.activation_matrices();
    const std::size_t width = plan.init == "wush" ? d_in : g;
    auto matrix = [act, g, width](const auto& sink) {
        std::vector<std::uint16_t> row(width);
        for (std::size_t r = 0; r < g; ++r) {
            for (std::size_t c = 0; c < width; ++c) {
                const std::size_t block = c / g, col = c % g;  // entry (r, col) of T_block^T = T_block(col, r)
                row[c] = bits::bf16_encode(act[block * g * g + col * g + r]);
            }
            sink(row.data(), row.size() * 2);
        }
    };
    tensors.push_back({l.name + ".forward_hadamard_matrix", "BF16", {g, width}, matrix});
    tensors.push_back({l.name + ".backward_hadamard_matrix", "BF16", {g, width}, matrix});
    tensors.push_back({l.name + ".weight_global_scale", "F32", {1}, [global](const auto& s) { s(&global, 4); }});
    tensors.push_back({l.name + ".act_global_scale", "F32", {1}, [global, after](const auto& s) {
                           s(&global, 4);
                           after();
                       }});
}

nlohmann::json fp_quant_config(const FpQuantPlan& plan) {
    return {{"quantization_config",
             {{"quant_method", "fp_quant"},
              {"forward_dtype", plan.forward_dtype},
              {"forward_method", "abs_max"},
              {"hadamard_group_size", plan.group},
              {"transform_init", plan.init},
              {"backward_dtype", "bf16"},
              {"store_master_weights", false},
              {"pseudoquantization", false},
              {"modules_to_not_convert", {"lm_head"}}}}};
}

}  // namespace

std::string export_fp_quant(const CheckpointReader& ck, const std::string& path, Progress* progress,
                            const std::string& config_path) {
    // Both temporaries exist before any work: an unwritable destination fails first, and neither
    // file is committed unless both are written (a refusal below discards them).
    AtomicFile model(path);
    std::optional<AtomicFile> config_file;
    if (!config_path.empty()) config_file.emplace(config_path);
    std::vector<CheckpointLayer> layers;
    for (const std::string& n : ck.layer_names()) layers.push_back(ck.load(n));
    const FpQuantPlan plan = check_fp_quant_export(ck, layers, path, config_path);
    std::vector<TensorSource> tensors;
    for (std::size_t i = 0; i < layers.size(); ++i)
        add_fp_quant_tensors(tensors, layers[i], plan, [progress, i, n = layers.size()] {
            if (progress && !progress->report(double(i + 1), double(n))) progress->throw_if_cancelled();
        });
    write_tensors(model, tensors, {});
    const std::string text = fp_quant_config(plan).dump(2);
    if (config_file) {
        const std::string line = text + "\n";
        config_file->write(line.data(), line.size());
        commit_both(model, *config_file);
    } else {
        model.commit();
    }
    return text;
}

}  // namespace wush::storage
