// Regression tests of reader bugs (docs/CHECKPOINT.md, "Validation"):
//  - opening a file cost O(n^2) in its tensor count: nlohmann's callback parser rescans the whole
//    parent object at every end of object, metadata keys were matched against every layer, and
//    tensors were found by linear search (a 10,000-layer checkpoint took minutes);
//  - layer names the writer refuses (a reserved suffix, a NUL) were accepted;
//  - format names were matched case-insensitively and up to an embedded NUL ("mxfp4\0x");
//  - the damping was written with printf("%.17g") and read with strtod, both of which follow the
//    C locale: a host program with a comma decimal separator wrote "0,01" and could not read "0.01";
//  - the fp_quant export wrote block 0's matrix as the shared matrix of an identity/hadamard layer
//    without checking that the other blocks hold the same one (a file may say "hadamard" and hold
//    anything): the exported model then computed something else than the checkpoint.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <clocale>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "common/error.h"
#include "storage/checkpoint.h"
#include "storage/safetensors.h"

namespace {

using wush::storage::CheckpointReader;
using wush::storage::TensorSource;

// ctest runs each test in its own process, several at once: the process id keeps their files apart
// (a shared name let one test delete the file another was about to open).
std::string temp_path(const std::string& name) {
    return (std::filesystem::temp_directory_path() /
            ("wush_reader_regression_" + name + "_" + std::to_string(::getpid()) + ".safetensors"))
        .string();
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// One-layer NVFP4 checkpoint parts (d_out 1, d_in 16, identity transform) under `name`, added to
// `tensors` and `meta`; the vectors the tensors stream from are static (never modified).
void add_layer(const std::string& name, std::vector<TensorSource>& tensors, std::map<std::string, std::string>& meta,
               const std::string& format = "nvfp4") {
    static const std::vector<std::uint8_t> codes(8, 0x21), scales(1, 0x38);
    static const float factor = 0.1f;
    static const std::vector<float> eye = [] {
        std::vector<float> t(16 * 16, 0.0f);
        for (int i = 0; i < 16; ++i) t[i * 16 + i] = 1.0f;
        return t;
    }();
    tensors.push_back({name + ".codes", "U8", {1, 8}, [](const auto& s) { s(codes.data(), codes.size()); }});
    tensors.push_back({name + ".scales", "U8", {1, 1}, [](const auto& s) { s(scales.data(), 1); }});
    tensors.push_back({name + ".tensor_scale", "F32", {1}, [](const auto& s) { s(&factor, 4); }});
    tensors.push_back({name + ".transform", "F32", {1, 16, 16}, [](const auto& s) { s(eye.data(), eye.size() * 4); }});
    meta[name + ".format"] = format;
    meta[name + ".group_size"] = "16";
    meta[name + ".transform"] = "identity";
    meta[name + ".method"] = "rtn";
    meta[name + ".damping"] = "0.01";
}

void expect_corrupt(const std::vector<TensorSource>& tensors, const std::map<std::string, std::string>& meta,
                    const std::string& what) {
    const std::string path = temp_path("rule");
    wush::storage::write_file(path, tensors, meta);
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

TEST(ReaderScaling, AWideHeaderParsesInLinearTime) {
    // 60,000 empty tensors: a 4 MB header. Quadratic parsing took minutes; linear takes ~1 s (5 s under ASan).
    const std::size_t n = 60000;
    std::string json = "{";
    for (std::size_t i = 0; i < n; ++i)
        json += (i ? ",\"t" : "\"t") + std::to_string(i) + "\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}";
    json += "}";
    std::vector<std::byte> file(8 + json.size());
    for (int i = 0; i < 8; ++i) file[i] = std::byte((json.size() >> (8 * i)) & 0xFF);
    std::memcpy(file.data() + 8, json.data(), json.size());
    const auto t0 = std::chrono::steady_clock::now();
    const wush::storage::Header h = wush::storage::parse_header(file);
    const double s = seconds_since(t0);
    EXPECT_EQ(h.tensors.size(), n);
    EXPECT_LT(s, 60.0) << "parse_header of " << n << " tensors took " << s << " s";
}

TEST(ReaderScaling, ACheckpointWithManyLayersOpensInLinearTime) {
    const std::size_t layers = 10000;
    std::vector<TensorSource> tensors;
    std::map<std::string, std::string> meta{{"format_version", "1"}, {"producer", "test"}};
    for (std::size_t i = 0; i < layers; ++i)
        add_layer("model.layers." + std::to_string(i / 128) + ".experts." + std::to_string(i % 128) + ".w", tensors,
                  meta);
    const std::string path = temp_path("many_layers");
    wush::storage::write_file(path, tensors, meta);
    const auto t0 = std::chrono::steady_clock::now();
    {
        CheckpointReader r(path);
        ASSERT_EQ(r.layer_names().size(), layers);
        for (const std::string& n : r.layer_names()) EXPECT_EQ(r.load(n).weights.d_in, 16u);
        EXPECT_THROW(r.load("model.layers.0.experts.0"), wush::Error);
    }
    const double s = seconds_since(t0);
    std::filesystem::remove(path);
    EXPECT_LT(s, 60.0) << "opening and loading " << layers << " layers took " << s << " s";
}

TEST(ReaderRules, LayerNamesFollowTheWriterRules) {
    for (const char* bad : {"x.scales", "x.codes", "x.tensor_scale", "x.transform"}) {
        std::vector<TensorSource> t;
        std::map<std::string, std::string> m{{"format_version", "1"}};
        add_layer(bad, t, m);
        expect_corrupt(t, m, "ends with the reserved suffix");
    }
    std::vector<TensorSource> t;
    std::map<std::string, std::string> m{{"format_version", "1"}};
    add_layer(std::string("a\0b", 3), t, m);
    expect_corrupt(t, m, "NUL character");
}

TEST(ReaderRules, FormatNamesAreExact) {
    for (const std::string& bad : {std::string("NVFP4"), std::string("nvfp4\0x", 7), std::string("nvfp4 ")}) {
        std::vector<TensorSource> t;
        std::map<std::string, std::string> m{{"format_version", "1"}};
        add_layer("L", t, m, bad);
        expect_corrupt(t, m, "unknown format");
    }
}

TEST(ReaderRules, DampingIsAPlainDecimal) {
    for (const char* bad : {" 0.01", "0.01 ", "+0.01", "0x1p-7", "0,01", "1e400", "inf", "-0.5", ""}) {
        std::vector<TensorSource> t;
        std::map<std::string, std::string> m{{"format_version", "1"}};
        add_layer("L", t, m);
        m["L.damping"] = bad;
        expect_corrupt(t, m, "is not a damping");
    }
    for (const char* good : {"0", "0.01", "1e-3", "2.5E+1"}) {
        std::vector<TensorSource> t;
        std::map<std::string, std::string> m{{"format_version", "1"}};
        add_layer("L", t, m);
        m["L.damping"] = good;
        const std::string path = temp_path("damping");
        wush::storage::write_file(path, t, m);
        EXPECT_EQ(CheckpointReader(path).load("L").transform.damping(), std::strtod(good, nullptr)) << good;
        std::filesystem::remove(path);
    }
}

// Restores the "C" numeric locale however the test ends.
struct NumericLocale {
    explicit NumericLocale(const char* name) : ok(std::setlocale(LC_NUMERIC, name) != nullptr) {}
    ~NumericLocale() { std::setlocale(LC_NUMERIC, "C"); }
    bool ok;
};

TEST(ReaderRules, DampingDoesNotDependOnTheLocale) {
    // A German numeric locale (decimal comma), compiled into a temporary directory when the
    // system has none (Debian's `locales` package provides localedef and the sources).
    const auto dir = std::filesystem::temp_directory_path() / "wush_regression_locale";
    if (std::setlocale(LC_NUMERIC, "de_DE.UTF-8") == nullptr) {
        std::filesystem::create_directories(dir);
        const std::string cmd = "localedef -i de_DE -f UTF-8 '" + dir.string() + "/de_DE.UTF-8' >/dev/null 2>&1";
        if (std::system(cmd.c_str()) == 0) ::setenv("LOCPATH", dir.c_str(), 1);
    }
    NumericLocale de("de_DE.UTF-8");
    if (!de.ok) GTEST_SKIP() << "no de_DE.UTF-8 locale and localedef could not make one";
    char buf[16];
    std::snprintf(buf, sizeof buf, "%.2f", 0.5);
    ASSERT_STREQ(buf, "0,50") << "the locale does not use a decimal comma";

    const std::vector<float> eye = [] {
        std::vector<float> t(2 * 32 * 32, 0.0f);
        for (int b = 0; b < 2; ++b)
            for (int i = 0; i < 32; ++i) t[b * 1024 + i * 32 + i] = 1.0f;
        return t;
    }();
    const wush::BlockTransform transform(64, 32, wush::TransformKind::Identity, eye, 0.01);
    const wush::formats::PackedMatrix q{WUSH_FORMAT_MXFP4, 2, 64,
                                        wush::formats::ByteView(std::vector<std::uint8_t>(64, 0x21)),
                                        wush::formats::ByteView(std::vector<std::uint8_t>(4, 127))};
    const std::string path = temp_path("locale");
    wush::storage::write_checkpoint(path, {{"L", &transform, &q, "rtn"}}, nullptr);
    {
        const wush::storage::Reader raw(path);
        EXPECT_EQ(raw.header().metadata.at("L.damping"), "0.01");
        const CheckpointReader r(path);  // read back under the same locale
        EXPECT_EQ(r.load("L").transform.damping(), 0.01);
    }
    std::filesystem::remove(path);
    std::filesystem::remove_all(dir);
}

TEST(FpQuantExport, RefusesASharedKindWhoseBlocksDiffer) {
    // MXFP4, d_out 2, d_in 64 (two blocks), kind "hadamard" in the metadata; block 1 = s * block 0.
    const auto write = [](float s) {
        static std::vector<float> t;
        t.assign(2 * 32 * 32, 0.0f);
        for (int i = 0; i < 32; ++i) {
            t[i * 32 + i] = 1.0f;
            t[1024 + i * 32 + i] = s;
        }
        static const std::vector<std::uint8_t> codes(2 * 32, 0x21), scales(2 * 2, 127);
        static const float factor = 1.0f / 3.0f;
        const std::vector<TensorSource> tensors = {
            {"L.codes", "U8", {2, 32}, [](const auto& k) { k(codes.data(), codes.size()); }},
            {"L.scales", "U8", {2, 2}, [](const auto& k) { k(scales.data(), scales.size()); }},
            {"L.tensor_scale", "F32", {1}, [](const auto& k) { k(&factor, 4); }},
            {"L.transform", "F32", {2, 32, 32}, [](const auto& k) { k(t.data(), t.size() * 4); }}};
        const std::map<std::string, std::string> meta = {{"format_version", "1"}, {"L.format", "mxfp4"},
                                                         {"L.group_size", "32"},  {"L.transform", "hadamard"},
                                                         {"L.method", "rtn"},     {"L.damping", "0"}};
        const std::string path = temp_path("export_in");
        wush::storage::write_file(path, tensors, meta);
        return path;
    };
    const std::string out = temp_path("export_out");
    {
        const std::string same = write(1.0f);
        EXPECT_NO_THROW(wush::storage::export_fp_quant(CheckpointReader(same), out, nullptr));
        EXPECT_TRUE(std::filesystem::exists(out));
        std::filesystem::remove(out);
        std::filesystem::remove(same);
    }
    const std::string differ = write(2.0f);
    try {
        wush::storage::export_fp_quant(CheckpointReader(differ), out, nullptr);
        ADD_FAILURE() << "exported a hadamard layer whose blocks differ";
    } catch (const wush::Error& e) {
        EXPECT_EQ(e.status(), WUSH_ERR_UNSUPPORTED) << e.what();
        EXPECT_NE(std::string(e.what()).find("differs between blocks (block 1)"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(std::filesystem::exists(out));
    std::filesystem::remove(differ);
}

}  // namespace
