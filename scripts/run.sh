#!/usr/bin/env bash
# The main job on its built-in default data: installs what is missing, builds libwush and the
# `wush` program, and runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh main   # the build's packages only; the test environments come with scripts/test.sh
mkdir -p build
scripts/build.sh build/release -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWUSH_BUILD_TESTS=OFF -DWUSH_BUILD_BENCH=OFF >/dev/null
build/release/tools/wush eval "$@"
