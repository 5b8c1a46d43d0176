#!/usr/bin/env bash
# Fuzzes the safetensors parser and the checkpoint reader: scripts/fuzz.sh [SECONDS] (default 60).
#
# Builds tests/fuzz/fuzz_checkpoint.cpp with clang, libFuzzer, AddressSanitizer (+ LeakSanitizer)
# and UndefinedBehaviorSanitizer in build/fuzz (the library code is coverage-instrumented too), then
# runs it for SECONDS on a working corpus build/fuzz/corpus seeded from tests/fuzz/corpus (the
# committed corpus is only read). Fails on any crash, sanitizer report, leak, timeout (> 25 s for
# one input) or out-of-memory (> 2 GiB); the input that caused it is left in build/fuzz/artifacts/.
# Add it to tests/fuzz/corpus as regress-<what> with the fix, so that the fuzz_corpus_replay test
# keeps it. Needs clang and libclang-rt-14-dev (scripts/install-deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
case $seconds in ''|*[!0-9]*) echo "usage: scripts/fuzz.sh [SECONDS]" >&2; exit 2 ;; esac
command -v clang >/dev/null && command -v clang++ >/dev/null || {
  echo "fuzz.sh: clang is missing: run scripts/install-deps.sh" >&2
  exit 1
}

dir=build/fuzz
mkdir -p "$dir"
cmake -S . -B "$dir" -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DWUSH_CUDA=OFF -DWUSH_SANITIZE=ON -DWUSH_BUILD_BENCH=OFF \
  -DCMAKE_C_FLAGS=-fsanitize=fuzzer-no-link -DCMAKE_CXX_FLAGS=-fsanitize=fuzzer-no-link \
  >"$dir.configure.log" 2>&1 || { cat "$dir.configure.log"; exit 1; }
cmake --build "$dir" --target wush_fuzz_checkpoint -j"${JOBS:-$(nproc)}"
fuzzer=$dir/tests/fuzz/wush_fuzz_checkpoint
[ -x "$fuzzer" ] || { echo "fuzz.sh: $fuzzer was not built (clang without libFuzzer?)" >&2; exit 1; }

rm -rf "$dir/artifacts"
mkdir -p "$dir/corpus" "$dir/artifacts"
echo "fuzz.sh: running $fuzzer for $seconds s" >&2
status=0
ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:abort_on_error=0 \
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
OMP_NUM_THREADS=1 \
  "$fuzzer" -max_total_time="$seconds" -timeout=25 -rss_limit_mb=2048 -max_len=16384 \
    -dict=tests/fuzz/safetensors.dict -artifact_prefix="$dir/artifacts/" -print_final_stats=1 \
    "$dir/corpus" tests/fuzz/corpus >"$dir/fuzz.log" 2>&1 || status=$?
tail -n 25 "$dir/fuzz.log"
found=$(find "$dir/artifacts" -type f | head -n 20)
if [ "$status" -ne 0 ] || [ -n "$found" ]; then
  echo "fuzz.sh: FAILED (exit $status); full log: $dir/fuzz.log; inputs: ${found:-none}" >&2
  exit 1
fi
echo "fuzz.sh: no crash, leak or timeout in $seconds s" >&2
