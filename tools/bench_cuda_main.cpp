// wush-bench-cuda: `wush bench --device cuda` as its own program, run by `wush bench` (which execs
// it with its arguments). A separate program because it links the CUDA runtime and cuBLAS for the
// baselines, and the `wush` program must start on machines that have neither.
#include <cstdio>

#include "bench_options.h"
#include "commands.h"

int bench_cuda(cli::Args& a);  // cmd_bench_cuda.cpp

int main(int argc, char** argv) {
    cli::Args a = bench_args(argc - 1, argv + 1);
    if (!a.ok()) return cli::usage_error("bench", a);
    try {
        return bench_cuda(a);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "wush bench: %s\n", e.what());
        return 1;
    }
}
