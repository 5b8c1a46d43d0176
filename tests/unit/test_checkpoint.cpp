// libwush checkpoints: a write -> open -> load round trip, and one test per validation rule of the
// reader, each on a file assembled here with the generic safetensors writer (not the checkpoint
// writer under test).
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "common/error.h"
#include "common/names.h"
#include "eval/layer_loss.h"
#include "prequant/rtn.h"
#include "storage/checkpoint.h"
#include "storage/safetensors.h"
#include "transforms/basis.h"

namespace {

using wush::storage::CheckpointReader;
using wush::storage::TensorSource;

// The process id in the name: ctest -j runs each test of this file as its own process, and tests
// that write a file of the same name would read each other's.
std::string temp_path(const std::string& name) {
    return (std::filesystem::temp_directory_path() /
            ("wush_test_ck_" + name + "_" + std::to_string(::getpid()) + ".safetensors"))
        .string();
}

// A valid one-layer MXFP4 checkpoint's parts (d_out = 4, d_in = 64, G = 32, identity transform),
// which each test may alter before writing.
struct Parts {
    std::vector<TensorSource> tensors;
    std::map<std::string, std::string> meta;
    std::vector<std::uint8_t> codes = std::vector<std::uint8_t>(4 * 32, 0x21);
    std::vector<std::uint8_t> scales = std::vector<std::uint8_t>(4 * 2, 127);
    float factor = 1.0f / 3.0f;
    std::vector<float> transform = identity(2, 32);

    static std::vector<float> identity(std::size_t c, std::size_t g) {
        std::vector<float> t(c * g * g, 0.0f);
        for (std::size_t b = 0; b < c; ++b)
            for (std::size_t i = 0; i < g; ++i) t[b * g * g + i * g + i] = 1.0f;
        return t;
    }

    Parts() {
        tensors = {
            {"L.codes", "U8", {4, 32}, [this](const auto& s) { s(codes.data(), codes.size()); }},
            {"L.scales", "U8", {4, 2}, [this](const auto& s) { s(scales.data(), scales.size()); }},
            {"L.tensor_scale", "F32", {1}, [this](const auto& s) { s(&factor, 4); }},
            {"L.transform", "F32", {2, 32, 32}, [this](const auto& s) { s(transform.data(), transform.size() * 4); }},
        };
        meta = {{"format_version", "1"},     {"L.format", "mxfp4"}, {"L.group_size", "32"},
                {"L.transform", "identity"}, {"L.method", "rtn"},   {"L.damping", "0.01"}};
    }

    TensorSource& tensor(const std::string& name) {
        for (TensorSource& t : tensors)
            if (t.name == name) return t;
        throw std::logic_error("no tensor " + name);
    }

    std::string write(const std::string& name) const {
        const std::string path = temp_path(name);
        wush::storage::write_file(path, tensors, meta);
        return path;
    }
};

// Opening (and loading every layer of) the file must fail with CORRUPT_FILE mentioning `what`.
void expect_rejected(const Parts& p, const std::string& what) {
    const std::string path = p.write("rule");
    try {
        CheckpointReader r(path);
        for (const std::string& n : r.layer_names()) r.load(n);
        ADD_FAILURE() << "accepted; expected an error about: " << what;
    } catch (const wush::Error& e) {
        EXPECT_EQ(e.status(), WUSH_ERR_CORRUPT_FILE) << e.what();
        EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
    std::filesystem::remove(path);
}

TEST(CheckpointValidation, TheBaselineFileIsValid) {
    Parts p;
    const std::string path = p.write("baseline");
    CheckpointReader r(path);
    ASSERT_EQ(r.layer_names(), std::vector<std::string>{"L"});
    const auto layer = r.load("L");
    EXPECT_EQ(layer.weights.d_out, 4u);
    EXPECT_EQ(layer.weights.d_in, 64u);
    EXPECT_EQ(layer.transform.kind(), wush::TransformKind::Identity);
    std::filesystem::remove(path);
}

// One rule for names (common/names.h): read in any ASCII case, written as the table spells them;
// nothing after a NUL matches.
TEST(Names, ReadInAnyCaseWrittenAsTheTableSpellsThem) {
    using wush::TransformKind;
    for (TransformKind k : wush::kTransformKinds) {
        std::string upper = wush::transform_kind_name(k);
        for (char& c : upper) c = char(std::toupper(static_cast<unsigned char>(c)));
        EXPECT_EQ(wush::transform_kind_from_name(upper), k) << upper;
        EXPECT_EQ(wush::transform_kind_from_name(wush::transform_kind_name(k)), k);
    }
    EXPECT_EQ(wush::parse_name<wush_method>(wush::kMethodNames, "GpTq"), WUSH_METHOD_GPTQ);
    EXPECT_EQ(wush::parse_name<wush_method>(wush::kMethodNames, std::string_view("rtn\0x", 5)), std::nullopt);
    EXPECT_EQ(wush::parse_name<wush_method>(wush::kMethodNames, "rt"), std::nullopt);
    EXPECT_EQ(wush::name_list<wush_method>(wush::kMethodNames), "rtn, gptq");
    EXPECT_EQ(std::string(wush::transform_kind_name(TransformKind(7))), "unknown");
}

// The API reads names in any case; a file holds them exactly as the writer spells them.
TEST(CheckpointValidation, NamesAreTheWritersSpelling) {
    {
        Parts p;
        p.meta["L.transform"] = "Identity";
        expect_rejected(p, "unknown transform \"Identity\"");
    }
    {
        Parts p;
        p.meta["L.method"] = "RTN";
        expect_rejected(p, "unknown method \"RTN\"");
    }
    {
        Parts p;
        p.meta["L.method"] = std::string("rtn\0x", 5);
        expect_rejected(p, "unknown method");
    }
}

TEST(CheckpointValidation, EachRuleHasItsOwnError) {
    {
        Parts p;
        p.meta.erase("format_version");
        expect_rejected(p, "no \"format_version\"");
    }
    {
        Parts p;
        p.meta["format_version"] = "4";
        expect_rejected(p, "format_version \"4\" is not supported");
    }
    {
        Parts p;  // digests came with version 2
        p.meta["L.sha256"] = std::string(64, '0');
        expect_rejected(p, "unexpected metadata key \"L.sha256\"");
    }
    {
        Parts p;
        p.meta["format_version"] = "2";
        p.meta["L.sha256"] = std::string(64, 'G');
        expect_rejected(p, "is not 64 lower-case hexadecimal digits");
    }
    {
        Parts p;
        p.meta["extra"] = "x";
        expect_rejected(p, "unexpected metadata key \"extra\"");
    }
    {
        Parts p;
        p.meta.erase("L.method");
        expect_rejected(p, "lacks metadata \"L.method\"");
    }
    {
        Parts p;
        p.meta["L.format"] = "fp5";
        expect_rejected(p, "unknown format \"fp5\"");
    }
    {
        Parts p;
        p.meta["L.group_size"] = "16";
        expect_rejected(p, "group_size 16 does not match");
    }
    {
        Parts p;
        p.meta["L.group_size"] = "3x";
        expect_rejected(p, "is not a size");
    }
    {
        Parts p;
        p.meta["L.transform"] = "fancy";
        expect_rejected(p, "unknown transform \"fancy\"");
    }
    {
        Parts p;
        p.meta["L.method"] = "awq";
        expect_rejected(p, "unknown method \"awq\"");
    }
    {
        Parts p;
        p.meta["L.damping"] = "-1";
        expect_rejected(p, "is not a damping");
    }
    {
        Parts p;
        p.meta["L.damping"] = "nan";
        expect_rejected(p, "is not a damping");
    }
    {
        Parts p;
        p.tensors.push_back({"stray", "U8", {1}, [](const auto& s) {
                                 const std::uint8_t b = 0;
                                 s(&b, 1);
                             }});
        expect_rejected(p, "unexpected tensor \"stray\"");
    }
    {
        Parts p;
        p.tensors.push_back({"M.scales", "U8", {1}, [](const auto& s) {
                                 const std::uint8_t b = 0;
                                 s(&b, 1);
                             }});
        expect_rejected(p, "belongs to no layer");
    }
    {
        Parts p;
        p.tensors.erase(p.tensors.begin() + 1);  // L.scales
        expect_rejected(p, "tensor \"L.scales\" is missing");
    }
    {
        Parts p;
        p.tensor("L.codes").dtype = "I8";
        expect_rejected(p, "has dtype I8, expected U8");
    }
    {
        Parts p;
        p.codes.resize(4 * 16);
        p.tensor("L.codes").shape = {4, 16};  // d_in 32: scales (4, 2) no longer fit
        expect_rejected(p, "tensor \"L.scales\" has the wrong shape");
    }
    {
        Parts p;
        p.codes.resize(4 * 8);
        p.tensor("L.codes").shape = {4, 8};  // d_in 16, not a multiple of 32
        expect_rejected(p, "not a positive multiple of G");
    }
    {
        Parts p;
        p.tensor("L.codes").shape = {128};
        expect_rejected(p, "is not 2-D");
    }
    {
        Parts p;
        p.factor = 0.25f;
        expect_rejected(p, "is not the mxfp4 factor");
    }
    {
        Parts p;
        p.transform.resize(32 * 32);
        p.tensor("L.transform").shape = {1, 32, 32};
        expect_rejected(p, "tensor \"L.transform\" has the wrong shape");
    }
    {
        Parts p;
        p.scales[3] = 0xFF;
        expect_rejected(p, "row 1, group 1 is NaN or infinite");
    }
    {
        // E8M0 2^127 is a valid scale, but MXFP4's element 6 (code 7) under it decodes to 2^128.
        Parts p;
        p.scales[3] = 0xFE;
        p.codes[48] = 0x07;
        expect_rejected(p, "row 1, group 1 decodes element 0 beyond the float32 range");
    }
    {
        Parts p;
        p.transform[5] = NAN;
        expect_rejected(p, "NaN or Inf");
    }
    {
        Parts p;
        std::fill(p.transform.begin() + 32 * 32, p.transform.end(), 0.0f);  // block 1 singular
        expect_rejected(p, "singular");
    }
}

TEST(Checkpoint, WriteOpenLoadRoundTrip) {
    const std::size_t d_in = 128, d_out = 24, g = 32;
    std::mt19937_64 rng(5);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> w(d_out * d_in), x(64 * d_in);
    for (float& v : w) v = normal(rng);
    for (float& v : x) v = normal(rng);
    wush::Calibrator cal(d_in, g, wush::MomentMode::BlockDiagonal);
    cal.add(WUSH_DTYPE_F32, x.data(), 64);
    const wush::BlockTransform t = wush::build_transform({wush::TransformKind::WUSH, 0.01, 0}, cal, w, d_out);
    const auto& f = wush::formats::spec(WUSH_FORMAT_MXFP4);
    const wush::formats::PackedMatrix q = wush::prequantize_rtn(t, f, w, d_out);
    const std::string path = temp_path("roundtrip");
    wush::storage::write_checkpoint(path, {{"blocks.0.mlp", &t, &q, "rtn"}}, nullptr);

    CheckpointReader r(path);
    const auto layer = r.load("blocks.0.mlp");
    const auto a = t.activation_matrices(), b = layer.transform.activation_matrices();
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "stored transform is bit-exact";
    const auto wa = t.weight_matrices(), wb = layer.transform.weight_matrices();
    EXPECT_EQ(std::memcmp(wa.data(), wb.data(), wa.size() * 8), 0) << "weight side re-derived identically";
    EXPECT_EQ(layer.transform.kind(), wush::TransformKind::WUSH);
    EXPECT_EQ(layer.transform.damping(), 0.01);
    EXPECT_TRUE(std::equal(q.codes.span().begin(), q.codes.span().end(), layer.weights.codes.span().begin()));
    EXPECT_TRUE(std::equal(q.scales.span().begin(), q.scales.span().end(), layer.weights.scales.span().begin()));
    EXPECT_EQ(wush::eval::layer_loss(t, q, w, x, 64), wush::eval::layer_loss(layer.transform, layer.weights, w, x, 64));
    std::filesystem::remove(path);
}

// Truncating an opened checkpoint used to make the next load fault with SIGBUS, and rewriting it
// in place to give silently different weights; both are refused at load time now.
TEST(Checkpoint, LoadRefusesAFileChangedAfterOpen) {
    const std::size_t d_in = 64, d_out = 8;
    std::vector<float> w(d_out * d_in);
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = float(int(i % 7) - 3);
    std::vector<float> identity(d_in * 32, 0.0f);
    for (std::size_t b = 0; b < d_in / 32; ++b)
        for (std::size_t i = 0; i < 32; ++i) identity[b * 32 * 32 + i * 32 + i] = 1.0f;
    const wush::BlockTransform t(d_in, 32, wush::TransformKind::Identity, identity, 0.01);
    const wush::formats::PackedMatrix q = wush::prequantize_rtn(t, wush::formats::spec(WUSH_FORMAT_MXFP4), w, d_out);
    const std::string path = temp_path("changed");
    const auto expect_refused = [&](const CheckpointReader& r, const char* what) {
        try {
            r.load("l");
            ADD_FAILURE() << "loaded a checkpoint that was " << what;
        } catch (const wush::Error& e) {
            EXPECT_EQ(e.status(), WUSH_ERR_IO);
            EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
        }
    };
    wush::storage::write_checkpoint(path, {{"l", &t, &q, "rtn"}}, nullptr);
    {
        CheckpointReader r(path);
        std::filesystem::resize_file(path, 16);
        expect_refused(r, "truncated");
    }
    wush::storage::write_checkpoint(path, {{"l", &t, &q, "rtn"}}, nullptr);
    {
        CheckpointReader r(path);
        const auto size = std::filesystem::file_size(path);
        const auto when = std::filesystem::last_write_time(path);
        {
            std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
            f.seekp(std::streamoff(size - 1));
            f.put('\x7f');
        }
        // Same size; the modification time is what tells, even within one clock tick.
        std::filesystem::last_write_time(path, when + std::chrono::seconds(1));
        expect_refused(r, "modified");
    }
    std::filesystem::remove(path);
}

// The digest catches what loads as valid: one changed scale byte (perplexity 2.65 -> 260 in the
// report), a flipped code byte, and two same-shape layers whose bytes were swapped. Copy mode
// verifies at the open; a mapped checkpoint when asked (verify()).
namespace {

struct TwoLayers {
    std::vector<float> identity;
    wush::BlockTransform t;
    wush::formats::PackedMatrix a, b;
    static std::vector<float> eye(std::size_t d_in) {
        std::vector<float> m(d_in * 32, 0.0f);
        for (std::size_t blk = 0; blk < d_in / 32; ++blk)
            for (std::size_t i = 0; i < 32; ++i) m[blk * 32 * 32 + i * 32 + i] = 1.0f;
        return m;
    }
    static std::vector<float> weights(int seed) {
        std::vector<float> w(8 * 64);
        for (std::size_t i = 0; i < w.size(); ++i) w[i] = float(int((i * 7 + seed) % 11) - 5);
        return w;
    }
    TwoLayers()
        : t(64, 32, wush::TransformKind::Identity, eye(64), 0.0),
          a(wush::prequantize_rtn(t, wush::formats::spec(WUSH_FORMAT_MXFP4), weights(1), 8)),
          b(wush::prequantize_rtn(t, wush::formats::spec(WUSH_FORMAT_MXFP4), weights(4), 8)) {}
    std::string write(const std::string& name) const {
        const std::string path = temp_path(name);
        wush::storage::write_checkpoint(path, {{"a", &t, &a, "rtn"}, {"b", &t, &b, "rtn"}}, nullptr);
        return path;
    }
};

std::vector<char> slurp(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void spill(const std::string& path, const std::vector<char>& bytes) {
    std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), std::streamsize(bytes.size()));
}

// Where tensor `name`'s bytes start in the file.
std::size_t file_offset(const std::string& path, const std::string& name) {
    const wush::storage::Reader r(path);
    return std::size_t(r.header().data_offset + r.find(name)->begin);
}

// A damaged file opens mapped (its structure is valid), and fails verify() and a copy-mode open
// naming `layer`.
void expect_caught(const std::string& path, const std::string& layer) {
    const CheckpointReader mapped(path);
    for (const auto& open : {std::function<void()>([&] { mapped.verify(); }), std::function<void()>([&] {
                                 CheckpointReader(path, wush::storage::Reader::Load::Copy);
                             })}) {
        try {
            open();
            ADD_FAILURE() << "a damaged file verified";
        } catch (const wush::Error& e) {
            EXPECT_EQ(e.status(), WUSH_ERR_CORRUPT_FILE);
            EXPECT_NE(std::string(e.what()).find("layer \"" + layer + "\""), std::string::npos) << e.what();
        }
    }
}

}  // namespace

TEST(CheckpointDigest, CatchesAChangedByteAndSwappedLayers) {
    const TwoLayers layers;
    const std::string path = layers.write("digest");
    EXPECT_EQ(CheckpointReader(path).verify(), 2u);
    EXPECT_EQ(CheckpointReader(path, wush::storage::Reader::Load::Copy).layer_names().size(), 2u);
    const std::vector<char> good = slurp(path);
    for (const char* tensor : {"b.scales", "b.codes", "b.transform"}) {
        std::vector<char> bad = good;
        bad[file_offset(path, tensor)] ^= 1;
        spill(path, bad);
        expect_caught(path, "b");
        spill(path, good);
    }
    // The two layers' codes and scales swapped: each layer is still valid, the digests are not.
    std::vector<char> swapped = good;
    for (const char* suffix : {".codes", ".scales"}) {
        const std::size_t oa = file_offset(path, std::string("a") + suffix),
                          ob = file_offset(path, std::string("b") + suffix);
        const std::size_t n = suffix == std::string(".codes") ? 8 * 32 : 8 * 2;
        std::swap_ranges(swapped.begin() + std::ptrdiff_t(oa), swapped.begin() + std::ptrdiff_t(oa + n),
                         swapped.begin() + std::ptrdiff_t(ob));
    }
    ASSERT_NE(swapped, good);
    spill(path, swapped);
    expect_caught(path, "a");
    std::filesystem::remove(path);
}

// Files of format version 1 (no digests) still open; they have nothing to verify.
TEST(CheckpointDigest, VersionOneFilesStillOpen) {
    Parts p;
    const std::string path = p.write("version1");
    EXPECT_EQ(CheckpointReader(path).verify(), 0u);
    EXPECT_EQ(CheckpointReader(path, wush::storage::Reader::Load::Copy).layer_names().size(), 1u);
    std::filesystem::remove(path);
}

TEST(Checkpoint, WriterRejectsBadLayers) {
    const auto t = wush::build_data_free_transform({wush::TransformKind::Hadamard, 0.01, 0}, 64, 16);  // G = 16
    wush::formats::PackedMatrix q{WUSH_FORMAT_MXFP4, 2, 64, {}, {}};                                   // G = 32
    const std::string path = temp_path("bad");
    EXPECT_THROW(wush::storage::write_checkpoint(path, {{"a", &t, &q, "rtn"}}, nullptr), wush::Error);
    q.format = WUSH_FORMAT_NVFP4;
    EXPECT_THROW(wush::storage::write_checkpoint(path, {{"a.codes", &t, &q, "rtn"}}, nullptr), wush::Error);
    EXPECT_THROW(wush::storage::write_checkpoint(path, {{"a", &t, &q, "rtn"}, {"a", &t, &q, "rtn"}}, nullptr),
                 wush::Error);
    EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace

namespace {

// An MXFP4 identity-transform checkpoint that fp_quant can export.
std::string exportable_checkpoint(const std::string& name) {
    Parts p;
    return p.write(name);
}

std::string file_bytes(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

}  // namespace

// A config that cannot be written used to fail only after the model had been committed: the
// export reported WUSH_ERR_IO and left a fresh model file behind.
TEST(Checkpoint, FailedExportLeavesNoFile) {
    const auto dir = std::filesystem::temp_directory_path() / ("wush_test_export_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    const std::string ck = exportable_checkpoint("export_src");
    const std::string model = (dir / "fresh.safetensors").string();
    CheckpointReader r(ck);
    EXPECT_THROW(wush::storage::export_fp_quant(r, model, nullptr, (dir / "missing" / "c.json").string()), wush::Error);
    EXPECT_TRUE(std::filesystem::is_empty(dir)) << "neither the model nor a temporary";

    // The config's rename fails (its destination is a directory) after the model's succeeded:
    // the model is put back as it was, both when it existed and when it did not.
    std::filesystem::create_directories(dir / "cfg");
    const std::string cfg_dir = (dir / "cfg").string();
    EXPECT_THROW(wush::storage::export_fp_quant(r, model, nullptr, cfg_dir), wush::Error);
    EXPECT_FALSE(std::filesystem::exists(model));
    { std::ofstream(model) << "old model"; }
    EXPECT_THROW(wush::storage::export_fp_quant(r, model, nullptr, cfg_dir), wush::Error);
    EXPECT_EQ(file_bytes(model), "old model");
    std::filesystem::remove(model);
    std::filesystem::remove(cfg_dir);
    EXPECT_TRUE(std::filesystem::is_empty(dir)) << "no temporary or backup left behind";

    // And a successful export writes both.
    const std::string cfg = (dir / "c.json").string();
    const std::string text = wush::storage::export_fp_quant(r, model, nullptr, cfg);
    EXPECT_EQ(file_bytes(cfg), text + "\n");
    EXPECT_NO_THROW(wush::storage::Reader{model});
    std::filesystem::remove_all(dir);
    std::filesystem::remove(ck);
}

// `wush export --checkpoint ck --out ck` used to replace the checkpoint with its export.
TEST(Checkpoint, ExportRefusesToOverwriteItsInput) {
    const std::string ck = exportable_checkpoint("export_self");
    const std::string before = file_bytes(ck);
    const std::string link = ck + ".link";
    std::filesystem::remove(link);
    std::filesystem::create_hard_link(ck, link);  // another name, same inode
    CheckpointReader r(ck);
    for (const std::string& out : {ck, link}) {
        for (const bool as_config : {false, true}) {
            const std::string other = temp_path("export_other");
            try {
                if (as_config) wush::storage::export_fp_quant(r, other, nullptr, out);
                else wush::storage::export_fp_quant(r, out, nullptr);
                ADD_FAILURE() << "exported over the checkpoint via " << out;
            } catch (const wush::Error& e) {
                EXPECT_EQ(e.status(), WUSH_ERR_INVALID_ARGUMENT);
                EXPECT_NE(std::string(e.what()).find("is the checkpoint"), std::string::npos) << e.what();
            }
            EXPECT_FALSE(std::filesystem::exists(other));
        }
    }
    EXPECT_EQ(file_bytes(ck), before);
    // The model and the config at one path (one does not exist yet): refused too.
    const std::string out = temp_path("export_same");
    std::filesystem::remove(out);
    EXPECT_THROW(wush::storage::export_fp_quant(r, out, nullptr, out), wush::Error);
    EXPECT_FALSE(std::filesystem::exists(out));
    std::filesystem::remove(link);
    std::filesystem::remove(ck);
}

// Grouped layers (format version 3): layers that read one input, stored as one layer whose rows
// are split into named parts.
namespace {

// A grouped layer "g" of 8 rows (parts p0: 3 rows, p1: 5) and a plain layer "a", written by the
// checkpoint writer.
struct GroupedFile {
    TwoLayers layers;
    std::string write(const std::string& name, std::vector<wush::storage::LayerPart> parts) const {
        const std::string path = temp_path(name);
        wush::storage::write_checkpoint(
            path, {{"a", &layers.t, &layers.a, "rtn"}, {"g", &layers.t, &layers.b, "rtn", parts}}, nullptr);
        return path;
    }
};

std::string metadata(const std::string& path, const std::string& key) {
    return wush::storage::Reader(path).header().metadata.at(key);
}

// The writer's error for `parts` must mention `what`; nothing is written.
void expect_writer_refuses(std::vector<wush::storage::LayerPart> parts, const std::string& what) {
    const GroupedFile f;
    const std::string path = temp_path("bad_parts");
    try {
        f.write("bad_parts", parts);
        ADD_FAILURE() << "written; expected an error about: " << what;
    } catch (const wush::Error& e) {
        EXPECT_EQ(e.status(), WUSH_ERR_INVALID_ARGUMENT);
        EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
    EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace

TEST(CheckpointGroups, RoundTripAndPartsLoadAsTheirRows) {
    const GroupedFile f;
    const std::string path = f.write("grouped", {{"p0", 3}, {"p1", 5}});
    EXPECT_EQ(metadata(path, "format_version"), "3");
    EXPECT_EQ(metadata(path, "g.parts"), "3 p0\n5 p1");
    const std::string plain = f.layers.write("plain");  // no group: still version 2
    EXPECT_EQ(metadata(plain, "format_version"), "2");
    std::filesystem::remove(plain);

    for (const auto load : {wush::storage::Reader::Load::Map, wush::storage::Reader::Load::Copy}) {
        const CheckpointReader r(path, load);
        EXPECT_EQ(r.layer_names(), (std::vector<std::string>{"a", "g"}));
        EXPECT_TRUE(r.parts("a").empty());
        ASSERT_EQ(r.parts("g").size(), 2u);
        EXPECT_EQ(r.parts("g")[1].name, "p1");
        EXPECT_EQ(r.parts("g")[1].rows, 5u);
        EXPECT_THROW(r.parts("p0"), wush::Error);  // a part is not a layer
        EXPECT_EQ(r.verify(), 2u);
        // Part p1 is rows 3..7 of the group, under the group's transform: its codes and scales are
        // the independently quantized weights' rows (rows of RTN are quantized independently).
        const auto part = r.load("p1");
        const auto& b = f.layers.b;
        EXPECT_EQ(part.weights.d_out, 5u);
        EXPECT_TRUE(std::equal(part.weights.codes.span().begin(), part.weights.codes.span().end(),
                               b.codes.span().begin() + 3 * 32));
        EXPECT_TRUE(std::equal(part.weights.scales.span().begin(), part.weights.scales.span().end(),
                               b.scales.span().begin() + 3 * 2));
        const auto t = f.layers.t.activation_matrices(), pt = part.transform.activation_matrices();
        EXPECT_TRUE(std::equal(t.begin(), t.end(), pt.begin(), pt.end()));
        EXPECT_THROW(r.load("p2"), wush::Error);
    }
    std::filesystem::remove(path);
}

TEST(CheckpointGroups, WriterRefusesBadParts) {
    expect_writer_refuses({{"p0", 8}}, "two or more parts");
    expect_writer_refuses({{"p0", 3}, {"p1", 4}}, "do not sum to its 8 output rows");
    expect_writer_refuses({{"p0", 3}, {"p1", 6}}, "do not sum to its 8 output rows");
    expect_writer_refuses({{"p0", 0}, {"p1", 8}}, "do not sum");
    expect_writer_refuses({{"p0", 3}, {"p0", 5}}, "repeats the name");
    expect_writer_refuses({{"a", 3}, {"p1", 5}}, "repeats the name");  // the plain layer's name
    expect_writer_refuses({{"g", 3}, {"p1", 5}}, "repeats the name");  // the group's own
    expect_writer_refuses({{"p\n0", 3}, {"p1", 5}}, "without NUL or newline");
    expect_writer_refuses({{"p0.codes", 3}, {"p1", 5}}, "reserved suffix");
}

TEST(CheckpointGroups, ReaderRefusesBadParts) {
    Parts ok;  // one layer "L" of 4 rows
    ok.meta["format_version"] = "3";
    ok.meta["L.parts"] = "1 x\n3 y";
    const std::string path = ok.write("parts_ok");
    EXPECT_EQ(CheckpointReader(path).parts("L").size(), 2u);
    std::filesystem::remove(path);
    const std::pair<const char*, const char*> cases[] = {
        {"4 x", "two or more parts"},     {"1 x\n2 y", "do not sum"},
        {"0 x\n4 y", "do not sum"},       {"2 x\n2 x", "repeats the name"},
        {"2 L\n2 y", "repeats the name"}, {"2x\n2 y", "ROWS NAME"},
        {"2 x\n2 y\n", "ROWS NAME"},      {"2 x\n2 y.scales", "reserved suffix"},
        {"-2 x\n6 y", "is not a size"},
    };
    for (const auto& [value, what] : cases) {
        Parts p = ok;
        p.meta["L.parts"] = value;
        expect_rejected(p, what);
    }
    Parts v2 = ok;  // a version 2 file has no parts
    v2.meta["format_version"] = "2";
    expect_rejected(v2, "unexpected metadata key \"L.parts\"");
    Parts v4 = ok;
    v4.meta["format_version"] = "4";
    expect_rejected(v4, "reads 1, 2 and 3");
}

// The digest covers the parts: two parts' names swapped in the header (same length, each part
// still valid) fail the digest.
TEST(CheckpointGroups, DigestCoversTheParts) {
    const GroupedFile f;
    const std::string path = f.write("parts_digest", {{"p0", 4}, {"p1", 4}});
    std::string bytes = file_bytes(path);
    const std::string from = "4 p0\\n4 p1", to = "4 p1\\n4 p0";  // as the header's JSON spells it
    const std::size_t at = bytes.find(from);
    ASSERT_NE(at, std::string::npos);
    bytes.replace(at, from.size(), to);
    spill(path, std::vector<char>(bytes.begin(), bytes.end()));
    EXPECT_EQ(CheckpointReader(path).parts("g")[0].name, "p1");  // valid structure, mapped
    expect_caught(path, "g");
    std::filesystem::remove(path);
}

TEST(CheckpointGroups, FpQuantExportRefusesAGroup) {
    const GroupedFile f;
    const std::string path = f.write("parts_export", {{"p0", 3}, {"p1", 5}});
    const std::string out = temp_path("parts_export_out");
    try {
        wush::storage::export_fp_quant(CheckpointReader(path), out, nullptr);
        ADD_FAILURE() << "exported a grouped layer";
    } catch (const wush::Error& e) {
        EXPECT_EQ(e.status(), WUSH_ERR_UNSUPPORTED);
        EXPECT_NE(std::string(e.what()).find("grouped"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(std::filesystem::exists(out));
    std::filesystem::remove(path);
}
