// The safetensors reader/writer: round trips, and one test per validation rule, each on a file
// image built by hand here (not by the writer under test).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "common/error.h"
#include "storage/safetensors.h"

namespace {

using wush::storage::parse_header;

// A file image from a header text and a data section.
std::vector<std::byte> image(const std::string& header, std::size_t data_bytes) {
    std::vector<std::byte> f(8 + header.size() + data_bytes, std::byte{0});
    const std::uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) f[i] = std::byte((n >> (8 * i)) & 0xFF);
    std::memcpy(f.data() + 8, header.data(), header.size());
    return f;
}

// Expects CORRUPT_FILE with a message containing `what`.
void expect_corrupt(const std::vector<std::byte>& f, const std::string& what) {
    try {
        parse_header(f);
        ADD_FAILURE() << "accepted; expected an error about: " << what;
    } catch (const wush::Error& e) {
        EXPECT_EQ(e.status(), WUSH_ERR_CORRUPT_FILE);
        EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
}

const std::string kTwo =
    R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"b":{"dtype":"U8","shape":[4],"data_offsets":[24,28]}})";

TEST(Safetensors, ValidImageParses) {
    const auto h = parse_header(image(kTwo, 28));
    ASSERT_EQ(h.tensors.size(), 2u);
    EXPECT_EQ(h.tensors[0].name, "a");
    EXPECT_EQ(h.tensors[0].shape, (std::vector<std::uint64_t>{2, 3}));
    EXPECT_EQ(h.tensors[1].begin, 24u);
    EXPECT_EQ(h.data_offset, 8 + kTwo.size());
}

TEST(Safetensors, EachValidationRuleHasItsError) {
    expect_corrupt(std::vector<std::byte>(5), "shorter than the 8-byte");
    {
        auto f = image(kTwo, 28);
        f[7] = std::byte{0x7F};  // absurd header length
        expect_corrupt(f, "exceeds the 100,000,000-byte limit");
        f[7] = std::byte{0};
        f[0] = std::byte(0xFF);
        f[1] = std::byte(0xFF);  // 65535 > file
        expect_corrupt(f, "runs past the end");
    }
    expect_corrupt(image("{\"a\":", 0), "not valid JSON");
    expect_corrupt(image("[1,2]", 0), "not a JSON object");
    expect_corrupt(
        image(
            R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
            8),
        "duplicate key");
    expect_corrupt(image(R"({"a":{"dtype":"Q9","shape":[1],"data_offsets":[0,4]}})", 4), "unknown dtype");
    expect_corrupt(image(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4), "non-negative integer");
    expect_corrupt(image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 4), "ends before it begins");
    expect_corrupt(image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})", 4), "unknown field");
    expect_corrupt(image(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
                   "its dtype and shape need 12");
    expect_corrupt(image(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}})", 8),
                   "overflows");
    expect_corrupt(image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8), "(gap)");
    expect_corrupt(
        image(
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
            8),
        "(overlap)");
    expect_corrupt(image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 6), "data section holds 6");
    expect_corrupt(image(R"({"__metadata__":{"k":1}})", 0), "is not a string");
    expect_corrupt(image(R"({"a":{"dtype":"F32","shape":[[[[1]]]],"data_offsets":[0,4]}})", 4), "a dimension of");
    expect_corrupt(image("{\"\xff\":1}", 0), "not valid JSON");  // invalid UTF-8
    expect_corrupt(image(R"({"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", 2), "whole bytes");
}

// What the reference implementation (PyPI safetensors) rejects and nlohmann's parser lets
// through: a NUL byte ends nlohmann's input early, a byte-order mark is skipped.
TEST(Safetensors, RejectsNulBytesAndAByteOrderMark) {
    const std::string valid = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
    expect_corrupt(image(valid + std::string("\0garbage", 8), 4), "NUL byte");
    expect_corrupt(image("\xEF\xBB\xBF" + valid, 4), "byte-order mark");
}

// A header of huge shapes used to cost 23-29x its size in a JSON DOM (and abort the process when
// that allocation failed); shapes and entries are capped instead.
TEST(Safetensors, CapsDimensionsAndEntries) {
    std::string dims = "0";
    for (std::size_t i = 0; i < wush::storage::kMaxDims; ++i) dims += ",0";
    expect_corrupt(image(R"({"a":{"dtype":"F32","shape":[)" + dims + R"(],"data_offsets":[0,0]}})", 0),
                   "more than 64 dimensions");
    std::string meta = R"({"__metadata__":{)";
    for (std::size_t i = 0; i <= wush::storage::kMaxEntries; ++i)
        meta += (i ? ",\"" : "\"") + std::to_string(i) + "\":\"\"";
    meta += "}}";
    expect_corrupt(image(meta, 0), "__metadata__ entries");
}

TEST(Safetensors, WriterRoundTripsThroughTheReader) {
    const std::string path = (std::filesystem::temp_directory_path() /
                              ("wush_test_roundtrip_" + std::to_string(::getpid()) + ".safetensors"))
                                 .string();
    const std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 5.0f, 6.0f};
    const std::vector<std::uint8_t> b = {7, 8, 9};
    wush::storage::write_file(path,
                              {{"weights",
                                "F32",
                                {2, 3},
                                [&](const auto& sink) {
                                    sink(a.data(), 12);
                                    sink(a.data() + 3, 12);
                                }},
                               {"codes", "U8", {3}, [&](const auto& sink) { sink(b.data(), b.size()); }}},
                              {{"format", "mxfp4"}});
    wush::storage::Reader r(path);
    EXPECT_EQ(r.header().data_offset % 8, 0u);
    EXPECT_EQ(r.header().metadata.at("format"), "mxfp4");
    const auto* w = r.find("weights");
    ASSERT_NE(w, nullptr);
    EXPECT_EQ(std::memcmp(r.bytes(*w).data(), a.data(), 24), 0);
    EXPECT_EQ(std::memcmp(r.bytes(*r.find("codes")).data(), b.data(), 3), 0);
    std::filesystem::remove(path);
}

TEST(Safetensors, FailedWriteLeavesNoFileBehind) {
    const auto dir = std::filesystem::temp_directory_path() / ("wush_test_atomic_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    const std::string path = (dir / "out.safetensors").string();
    const std::vector<float> a(4, 1.0f);
    EXPECT_THROW(wush::storage::write_file(path, {{"t", "F32", {4}, [&](const auto& sink) { sink(a.data(), 8); }}}, {}),
                 wush::Error);  // too few bytes
    EXPECT_TRUE(std::filesystem::is_empty(dir)) << "no final file, no temporary";
    EXPECT_THROW(wush::storage::write_file(path, {{"t", "F32", {1}, {}}, {"t", "F32", {1}, {}}}, {}), wush::Error);
    std::filesystem::remove_all(dir);
}

// Two writers of one path each leave a whole file: the temporary used to be PATH.tmp-<pid>,
// shared by every thread of the process, so their bytes interleaved in it.
TEST(Safetensors, ConcurrentWritersOfOnePathEachWriteAWholeFile) {
    const auto dir = std::filesystem::temp_directory_path() / ("wush_test_concurrent_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    const std::string path = (dir / "out.safetensors").string();
    constexpr std::size_t kBytes = 1 << 20;
    auto writer = [&](unsigned char fill, int rounds) {
        const std::vector<unsigned char> data(kBytes, fill);
        for (int r = 0; r < rounds; ++r)
            wush::storage::write_file(path,
                                      {{"t",
                                        "U8",
                                        {kBytes},
                                        [&](const auto& sink) {
                                            for (std::size_t i = 0; i < kBytes; i += 4096) sink(data.data() + i, 4096);
                                        }}},
                                      {});
    };
    for (int round = 0; round < 10; ++round) {
        std::thread a(writer, 0xAA, 2), b(writer, 0x55, 2);
        a.join();
        b.join();
        wush::storage::Reader r(path);
        const auto bytes = r.bytes(*r.find("t"));
        ASSERT_EQ(bytes.size(), kBytes);
        const std::byte first = bytes[0];
        for (std::byte v : bytes) ASSERT_EQ(v, first) << "the file mixes both writers' bytes";
    }
    std::size_t entries = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++entries;
    EXPECT_EQ(entries, 1u) << "temporaries left behind";
    std::filesystem::remove_all(dir);
}

// A symlink planted where the old writer put its temporary must not redirect the write.
TEST(Safetensors, WriterDoesNotFollowAPlantedSymlink) {
    const auto dir = std::filesystem::temp_directory_path() / ("wush_test_symlink_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    const std::string path = (dir / "out.safetensors").string();
    const auto victim = dir / "victim";
    { std::ofstream(victim) << "keep"; }
    std::filesystem::create_symlink(victim, path + ".tmp-" + std::to_string(::getpid()));
    const std::vector<float> a(4, 1.0f);
    wush::storage::write_file(path, {{"t", "F32", {4}, [&](const auto& sink) { sink(a.data(), 16); }}}, {});
    std::ifstream in(victim);
    std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(content, "keep");
    EXPECT_FALSE(std::filesystem::is_symlink(path));
    wush::storage::Reader r(path);
    EXPECT_NE(r.find("t"), nullptr);
    std::filesystem::remove_all(dir);
}

// A write replaces what sits at its name, so a name that is not a regular file must be refused
// before anything is written, and left as it was: as root, `--out /dev/null` once turned the null
// device into a regular file. Each kind is made by the test itself in its own folder.
namespace {

std::string write_error(const std::string& path) {
    const std::vector<float> a(4, 1.0f);
    try {
        wush::storage::write_file(path, {{"t", "F32", {4}, [&](const auto& sink) { sink(a.data(), 16); }}}, {});
    } catch (const wush::Error& e) {
        EXPECT_EQ(e.status(), WUSH_ERR_INVALID_ARGUMENT);
        return e.what();
    }
    return "";
}

}  // namespace

TEST(Safetensors, WriterRefusesWhatIsNotARegularFile) {
    const auto dir = std::filesystem::temp_directory_path() / ("wush_test_nonregular_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    const std::string fifo = (dir / "fifo").string(), sub = (dir / "sub").string(), sock = (dir / "sock").string();
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    std::filesystem::create_directories(sub);
    ASSERT_EQ(::mknod(sock.c_str(), S_IFSOCK | 0600, 0), 0);
    std::vector<std::pair<std::string, mode_t>> cases = {{fifo, S_IFIFO}, {sub, S_IFDIR}, {sock, S_IFSOCK}};
    // A character device like /dev/null (1, 3) where this process may make one (root).
    const std::string dev = (dir / "null").string();
    if (::mknod(dev.c_str(), S_IFCHR | 0600, makedev(1, 3)) == 0) cases.push_back({dev, S_IFCHR});
    // Links to them: replacing the link would be harmless, but the caller meant the target.
    const std::string link = (dir / "link_to_fifo").string();
    std::filesystem::create_symlink(fifo, link);
    cases.push_back({link, S_IFLNK});
    for (const auto& [path, kind] : cases) {
        const std::string message = write_error(path);
        EXPECT_NE(message.find("not a regular file"), std::string::npos) << path << ": " << message;
        struct stat st {};
        ASSERT_EQ(::lstat(path.c_str(), &st), 0) << path;
        EXPECT_EQ(st.st_mode & S_IFMT, kind) << path << " was replaced";
    }
    std::size_t entries = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++entries;
    EXPECT_EQ(entries, cases.size()) << "a temporary was left behind";
    std::filesystem::remove_all(dir);
}

// A link to a regular file is written through: the file it names gets the content, the link stays.
TEST(Safetensors, WriterWritesThroughALinkToARegularFile) {
    const auto dir = std::filesystem::temp_directory_path() / ("wush_test_linkout_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir / "store");
    const auto target = dir / "store" / "model.safetensors";
    { std::ofstream(target) << "old"; }
    const std::string link = (dir / "model.safetensors").string();
    std::filesystem::create_symlink(target, link);
    EXPECT_EQ(write_error(link), "");
    EXPECT_TRUE(std::filesystem::is_symlink(link));
    wush::storage::Reader r(target.string());
    EXPECT_NE(r.find("t"), nullptr);
    std::filesystem::remove_all(dir);
}

// Copy mode reads the header before the file: a 64 GB sparse file with a garbage header was read
// whole (or refused as OUT_OF_MEMORY) before its header was looked at.
TEST(Safetensors, CopyModeRefusesAGarbageHeaderBeforeReadingTheFile) {
    const auto path =
        (std::filesystem::temp_directory_path() / ("wush_test_sparse_" + std::to_string(::getpid()))).string();
    {
        std::ofstream out(path, std::ios::binary);
        const char garbage[16] = {8, 0, 0, 0, 0, 0, 0, 0, '{', '{', '{', '{', '{', '{', '{', '{'};
        out.write(garbage, sizeof garbage);
    }
    ASSERT_EQ(::truncate(path.c_str(), off_t(64) << 30), 0);
    try {
        wush::storage::Reader r(path, wush::storage::Reader::Load::Copy);
        ADD_FAILURE() << "a garbage header was accepted";
    } catch (const wush::Error& e) {
        EXPECT_EQ(e.status(), WUSH_ERR_CORRUPT_FILE) << e.what();
    }
    std::filesystem::remove(path);
}

// Opening a FIFO used to block forever waiting for a writer.
TEST(Safetensors, ReaderRefusesAFifoWithoutWaiting) {
    const auto fifo = std::filesystem::temp_directory_path() / ("wush_test_fifo_" + std::to_string(::getpid()));
    std::filesystem::remove(fifo);
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    try {
        wush::storage::Reader r(fifo.string());
        ADD_FAILURE() << "a FIFO was accepted";
    } catch (const wush::Error& e) {
        EXPECT_EQ(e.status(), WUSH_ERR_IO);
        EXPECT_NE(std::string(e.what()).find("regular file"), std::string::npos) << e.what();
    }
    std::filesystem::remove(fifo);
}

TEST(Safetensors, ReaderReportsMissingFileAsIo) {
    try {
        wush::storage::Reader r("/nonexistent/dir/x.safetensors");
        ADD_FAILURE();
    } catch (const wush::Error& e) {
        EXPECT_EQ(e.status(), WUSH_ERR_IO);
    }
}

}  // namespace

namespace {

mode_t mode_of(const std::string& path) {
    struct stat st {};
    EXPECT_EQ(::stat(path.c_str(), &st), 0);
    return st.st_mode & 0777;
}

}  // namespace

// Rewriting a checkpoint used to reset its permissions: a private 0600 file became 0644.
TEST(Safetensors, RewriteKeepsTheModeOfTheReplacedFile) {
    const std::string path =
        (std::filesystem::temp_directory_path() / ("wush_test_mode_" + std::to_string(::getpid()))).string();
    std::filesystem::remove(path);
    const std::vector<float> a(4, 1.0f);
    const std::vector<wush::storage::TensorSource> t = {
        {"t", "F32", {4}, [&](const auto& sink) { sink(a.data(), 16); }}};
    const mode_t old_mask = ::umask(022);
    wush::storage::write_file(path, t, {});
    EXPECT_EQ(mode_of(path), 0644u) << "a new file: 0666 minus the umask";
    for (const mode_t m : {0600u, 0640u, 0604u}) {
        ASSERT_EQ(::chmod(path.c_str(), m), 0);
        wush::storage::write_file(path, t, {});
        EXPECT_EQ(mode_of(path), m) << "the replaced file's mode is kept";
    }
    std::filesystem::remove(path);
    for (const mode_t mask : {0u, 077u}) {
        ::umask(mask);
        wush::storage::write_file(path, t, {});
        EXPECT_EQ(mode_of(path), 0666u & ~mask) << "a new file follows the umask";
        std::filesystem::remove(path);
    }
    ::umask(old_mask);
    std::filesystem::remove(path);
}
