#!/usr/bin/env bash
# Formats every tracked C, C++ and CUDA source in place with .clang-format (clang-format 14; the
# check is tests/repo/check_format.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
git ls-files -z -- '*.c' '*.h' '*.cpp' '*.cu' '*.cuh' ':!:abi/previous/*' | xargs -0 clang-format -i --style=file
