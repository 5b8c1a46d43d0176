// libFuzzer harness of the safetensors parser and the checkpoint reader (docs/CHECKPOINT.md).
//
// One input is a whole file image. It goes through
//   1. parse_header() on the bytes in memory,
//   2. Reader on a memory file (memfd) holding the bytes: the real open + mmap + validate path,
//      and a read of every tensor's bytes,
//   3. CheckpointReader on the same memory file: validation, the layer list, and load() of every
//      layer, whose transform, weight side, codes and scales are then read in full.
// Every rejection must be a wush::Error with status CORRUPT_FILE; any other exception or status
// is a bug and aborts (libFuzzer reports it), as do ASan/UBSan findings, leaks and timeouts.
//
// Built two ways (tests/fuzz/CMakeLists.txt): with clang's -fsanitize=fuzzer (scripts/fuzz.sh),
// and with replay_main.cpp, which runs the committed corpus through this same function as an
// ordinary ctest test under any compiler, and checks wush_fuzz_last_outcome against what each
// file's name says it is.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <span>
#include <string>

#include "common/error.h"
#include "storage/checkpoint.h"
#include "storage/safetensors.h"

namespace {

[[noreturn]] void bug(const char* where, const char* what) {
    std::fprintf(stderr, "fuzz_checkpoint: %s: unexpected failure: %s\n", where, what);
    std::abort();
}

// The input as a file that exists only in memory; closed on scope exit.
struct MemoryFile {
    int fd = -1;
    std::string path;
    MemoryFile(const std::uint8_t* data, std::size_t size) {
        fd = ::memfd_create("wush_fuzz", MFD_CLOEXEC);
        if (fd < 0) bug("memfd_create", "cannot create a memory file");
        std::size_t done = 0;
        while (done < size) {
            const ssize_t w = ::write(fd, data + done, size - done);
            if (w <= 0) bug("write", "cannot fill the memory file");
            done += std::size_t(w);
        }
        path = "/proc/self/fd/" + std::to_string(fd);
    }
    ~MemoryFile() { ::close(fd); }
};

// Reads every byte so that ASan sees any out-of-bounds view; the sum keeps the reads alive.
volatile std::uint64_t g_sink;
void touch(const void* p, std::size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    std::uint64_t s = 0;
    for (std::size_t i = 0; i < n; ++i) s += b[i];
    g_sink = g_sink + s;
}

template <typename F>
void expect_valid_or_corrupt(const char* where, F&& f) {
    try {
        f();
    } catch (const wush::Error& e) {
        if (e.status() != WUSH_ERR_CORRUPT_FILE) bug(where, e.what());
    } catch (const std::exception& e) {
        bug(where, e.what());
    } catch (...) {
        bug(where, "a non-standard exception");
    }
}

}  // namespace

// What the last input was found to be: WUSH_FUZZ_SAFETENSORS if parse_header() and Reader
// accepted it, plus WUSH_FUZZ_CHECKPOINT if CheckpointReader accepted it and loaded every layer.
extern "C" int wush_fuzz_last_outcome;
int wush_fuzz_last_outcome = 0;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace wush::storage;
    const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
    int outcome = 0;
    bool parsed = false, opened = false;
    expect_valid_or_corrupt("parse_header", [&] {
        const Header h = parse_header(bytes);
        for (const TensorInfo& t : h.tensors)
            if (h.data_offset + t.end > size) bug("parse_header", "a tensor runs past the end of the input");
        parsed = true;
    });

    const MemoryFile file(data, size);
    expect_valid_or_corrupt("Reader", [&] {
        const Reader r(file.path);
        for (const TensorInfo& t : r.header().tensors) {
            if (r.find(t.name) == nullptr) bug("Reader", "find() misses a listed tensor");
            const auto b = r.bytes(t);
            touch(b.data(), b.size());
        }
        opened = true;
    });
    if (parsed != opened) bug("Reader", "parse_header() and Reader disagree");
    if (parsed) outcome |= 1;
    expect_valid_or_corrupt("CheckpointReader", [&] {
        const CheckpointReader ck(file.path);
        for (const std::string& name : ck.layer_names()) {
            const CheckpointLayer layer = ck.load(name);
            const auto act = layer.transform.activation_matrices();
            const auto wt = layer.transform.weight_matrices();
            touch(act.data(), act.size_bytes());
            touch(wt.data(), wt.size_bytes());
            const auto codes = layer.weights.codes.span(), scales = layer.weights.scales.span();
            touch(codes.data(), codes.size());
            touch(scales.data(), scales.size());
            if (codes.size() * 2 != layer.weights.d_out * layer.weights.d_in)
                bug("CheckpointReader", "codes do not match d_out x d_in");
        }
        if (!parsed) bug("CheckpointReader", "accepted a file that is not valid safetensors");
        outcome |= 2;
    });
    wush_fuzz_last_outcome = outcome;
    return 0;
}
