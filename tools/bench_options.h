// The options of `wush bench`, shared by `wush` and wush-bench-cuda (which `wush bench --device
// cuda` runs), so both read the same command line the same way.
#pragma once

#include "cli.h"

inline cli::Args bench_args(int argc, char** argv) {
    return cli::Args(
        argc, argv, {"--quick", "--json", "--contend", "--contend-process", "--paired"},
        {"--layers", "--format", "--m", "--kind", "--threads", "--isa", "--repeats", "--min-time", "--device",
         "--contend-cpu", "--timing", "--l2", "--cuda-option", "--variants", "--transform-dtype"});
}
