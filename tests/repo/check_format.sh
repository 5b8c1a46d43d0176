#!/usr/bin/env bash
# The C, C++ and CUDA sources follow .clang-format: prints each file that clang-format would change
# (and how many lines) and fails if there is one. Formatting rules differ between clang-format
# major versions, so the check runs only with the version .clang-format was written for (14,
# Debian bookworm's, installed by scripts/install-deps.sh); with another it says so and exits 77,
# which ctest reports as Skipped.
#
#   tests/repo/check_format.sh [REPO_ROOT]        fix:  scripts/format.sh
set -euo pipefail
root=${1:-$(dirname "$0")/../..}
cd "$root"
want=14
command -v clang-format >/dev/null || { echo "check_format: SKIP: clang-format not found"; exit 77; }
have=$(clang-format --version | sed -n 's/.*version \([0-9]*\)\..*/\1/p')
if [[ "$have" != "$want" ]]; then
  echo "check_format: SKIP: clang-format $have here, the style is checked with $want"
  exit 77
fi
bad=0
while IFS= read -r -d '' f; do
  n=$(clang-format --style=file "$f" | diff "$f" - | grep -c '^<' || true)
  if [[ "$n" != 0 ]]; then
    echo "$f: $n line(s) not formatted"
    bad=$((bad + 1))
  fi
done < <(git ls-files -z -- '*.c' '*.h' '*.cpp' '*.cu' '*.cuh' ':!:abi/previous/*')
if [[ $bad -gt 0 ]]; then
  echo "check_format: FAIL: $bad file(s) differ from .clang-format (scripts/format.sh fixes them)"
  exit 1
fi
echo "check_format: PASS: every C/C++/CUDA source follows .clang-format"
