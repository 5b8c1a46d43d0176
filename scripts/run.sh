#!/usr/bin/env bash
# The main job on its built-in default data: installs what is missing, builds the CPU library and
# the `wush` program in build/main, and runs `wush eval` (arguments are passed on to it).
# WUSH_CUDA=ON (or AUTO) scripts/run.sh builds the CUDA module too; the main job does not need it.
# scripts/test.sh builds everything, in build/release.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh main   # the build's packages only; the test environments come with scripts/test.sh
mkdir -p build
# -O2 without -g: the code of test.sh's RelWithDebInfo build, without the debug info that takes a
# third of the compile time.
scripts/build.sh build/main -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" \
  -DCMAKE_C_FLAGS_RELEASE="-O2 -DNDEBUG" -DWUSH_CUDA="${WUSH_CUDA:-OFF}" \
  -DWUSH_BUILD_TESTS=OFF -DWUSH_BUILD_BENCH=OFF >/dev/null
build/main/tools/wush eval "$@"
