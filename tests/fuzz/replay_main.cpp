// Runs inputs through LLVMFuzzerTestOneInput without libFuzzer, so that the committed corpus is
// an ordinary regression test with any compiler (and under the ASan/UBSan build):
//   wush_fuzz_checkpoint_replay FILE_OR_DIR...
// Directories are walked recursively, files in sorted order. A bug aborts inside the harness.
// Files named by what they are (tests/fuzz/make_corpus.py) must be found to be that:
//   valid-ck-*: a checkpoint; valid-st-*: valid safetensors, not a checkpoint;
//   bad-ck-*: valid safetensors, not a checkpoint; bad-st-*: not valid safetensors.
// Other names (regress-*, inputs the fuzzer saved) only have to not crash.
// Exits 1 on an unmet expectation, an unreadable argument, or no input at all.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);
extern "C" int wush_fuzz_last_outcome;  // bit 0: valid safetensors; bit 1: valid checkpoint

int main(int argc, char** argv) {
    namespace fs = std::filesystem;
    std::vector<fs::path> inputs;
    for (int i = 1; i < argc; ++i) {
        std::error_code ec;
        if (fs::is_directory(argv[i], ec)) {
            for (const auto& e : fs::recursive_directory_iterator(argv[i]))
                if (e.is_regular_file()) inputs.push_back(e.path());
        } else if (fs::is_regular_file(argv[i], ec)) {
            inputs.emplace_back(argv[i]);
        } else {
            std::fprintf(stderr, "replay: cannot read %s\n", argv[i]);
            return 1;
        }
    }
    std::sort(inputs.begin(), inputs.end());
    if (inputs.empty()) {
        std::fprintf(stderr, "replay: no inputs\n");
        return 1;
    }
    const std::pair<const char*, int> expectations[] = {
        {"valid-ck-", 3}, {"valid-st-", 1}, {"bad-ck-", 1}, {"bad-st-", 0}};
    int unmet = 0;
    for (const fs::path& p : inputs) {
        std::ifstream in(p, std::ios::binary);
        const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        if (!in.good() && !in.eof()) {
            std::fprintf(stderr, "replay: cannot read %s\n", p.c_str());
            return 1;
        }
        std::fprintf(stderr, "replay: %s (%zu bytes)\n", p.c_str(), bytes.size());
        LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
        const std::string name = p.filename().string();
        for (const auto& [prefix, want] : expectations)
            if (name.rfind(prefix, 0) == 0 && wush_fuzz_last_outcome != want) {
                std::fprintf(stderr,
                             "replay: %s: outcome %d, its name says %d (bit 0: safetensors, bit 1: checkpoint)\n",
                             p.c_str(), wush_fuzz_last_outcome, want);
                ++unmet;
            }
    }
    std::printf("replay: %zu inputs, %d unmet expectations\n", inputs.size(), unmet);
    return unmet == 0 ? 0 : 1;
}
