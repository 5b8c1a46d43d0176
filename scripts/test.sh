#!/usr/bin/env bash
# The whole test suite: installs what is missing; builds and runs every test; again under
# AddressSanitizer + UndefinedBehaviorSanitizer; the threaded tests under ThreadSanitizer
# (scripts/tsan.sh); fuzzes the safetensors/checkpoint reader for 60 s
# (libFuzzer + ASan + UBSan, scripts/fuzz.sh); then installs into a temporary prefix and runs
# the bindings (C, Python, MPI examples; the Rust and Go packages with their tests; programs built
# against the previous release's header run on this library; pkg-config only) and the ABI checks
# against that installed copy. Exits non-zero on the first failing stage.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
scripts/install-deps.sh
mkdir -p build
stages=0
total=5

stage() { echo; echo "=== [$((stages + 1))/$total] $* ==="; }

stage "build and test (release, CUDA backend if nvcc is present)"
# The tests and benchmarks are forced on: a cache configured without them (scripts/run.sh once
# built this folder so; it has build/main now) must not turn this stage into one that runs nothing.
scripts/build.sh build/release -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWUSH_BUILD_TESTS=ON -DWUSH_BUILD_BENCH=ON
ctest --test-dir build/release --no-tests=error --output-on-failure -j"${JOBS:-$(nproc)}"
stages=$((stages + 1))

stage "build and test under ASan + UBSan"
scripts/build.sh build/sanitize -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWUSH_SANITIZE=ON -DWUSH_CUDA=OFF -DWUSH_BUILD_TESTS=ON -DWUSH_BUILD_BENCH=OFF
ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:abort_on_error=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  ctest --test-dir build/sanitize --no-tests=error --output-on-failure -j"${JOBS:-$(nproc)}"
stages=$((stages + 1))

stage "the runtime's thread pool and the C API's thread tests under ThreadSanitizer"
scripts/tsan.sh
stages=$((stages + 1))

stage "fuzz the safetensors parser and checkpoint reader (libFuzzer + ASan + UBSan, 60 s)"
scripts/fuzz.sh 60
stages=$((stages + 1))

stage "install into a temporary prefix; bindings examples and ABI checks against it"
prefix=$(mktemp -d /tmp/wush-prefix.XXXXXX)
trap 'rm -rf "$prefix"' EXIT
cmake --install build/release --prefix "$prefix" >/dev/null
lib=$(find "$prefix" -name 'libwush.so.[0-9]*' -type f | head -n 1)
tests/abi/check_exports.sh "$lib"
tests/repo/check_no_cuda_needed.sh "$lib" "$prefix/bin/wush"
tests/abi/check_abi.sh "$lib" "$root/abi/libwush.abi" "$prefix/include/wush"
tests/bindings/run_bindings.sh "$prefix"
stages=$((stages + 1))

echo
echo "test.sh: $stages passed, 0 failed"
