#!/usr/bin/env bash
# The ThreadSanitizer stage of scripts/test.sh: the runtime's own thread pool and team policy
# (with their fork handler) and the C API's thread tests, built with -fsanitize=thread in
# build/tsan. Only the test programs that start threads are built and run, which keeps the
# stage to a few minutes. libwush's OpenMP loops are compiled serially here (WUSH_OPENMP_REGIONS=OFF:
# libgomp is not instrumented, so TSan cannot see its barriers); tests/tsan/tsan.supp covers the
# OpenMP threads OpenBLAS still starts, and says why.
#
#   scripts/tsan.sh            JOBS=N sets the build's parallelism (default: nproc)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
flags=-fsanitize=thread
# WUSH_OPENMP_REGIONS=OFF: libwush's OpenMP loops run serially (src/CMakeLists.txt says why).
cmake -S . -B build/tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWUSH_CUDA=OFF -DWUSH_BUILD_TESTS=ON -DWUSH_BUILD_BENCH=OFF -DWUSH_OPENMP_REGIONS=OFF \
  -DCMAKE_C_FLAGS=$flags -DCMAKE_CXX_FLAGS=$flags -DCMAKE_EXE_LINKER_FLAGS=$flags \
  -DCMAKE_SHARED_LINKER_FLAGS=$flags >build/tsan.configure.log 2>&1 || { cat build/tsan.configure.log; exit 1; }
cmake --build build/tsan -j"${JOBS:-$(nproc)}" \
  --target wush_capi_tests wush_capi_runtime_tests wush_capi_fork_tests wush_runtime_tests
# The C API tests with threads (capi: handles and errors from 8 threads; capi_runtime: one layer
# run by several threads at once on every ISA; capi_runtime_fork: fork while the pool is busy),
# and the pool's unit tests: the team policy and concurrent GEMM callers.
tests='^(capi|capi_runtime|capi_runtime_fork|RuntimeTeamPolicy\..*|.*ConcurrentCallersGetTheSameResults.*|.*ThreadCountIndependence.*)$'
# die_after_fork=0: the fork test's child starts pool threads again, which is what it tests.
TSAN_OPTIONS="suppressions=$root/tests/tsan/tsan.supp halt_on_error=1 die_after_fork=0 second_deadlock_stack=1" \
ctest --test-dir build/tsan --no-tests=error --output-on-failure -R "$tests" -j"${JOBS:-$(nproc)}"
