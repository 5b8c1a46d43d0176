#!/usr/bin/env bash
# The public header compiles without a single warning under clang's -Weverything, as C (C99, C11,
# C17) and as C++ (C++11, C++17, C++20), with -Werror: hosts build with their own strict flags and
# must not have to silence anything to include it.
#
#   tests/abi/check_header_warnings.sh CLANG INCLUDE_DIR
#
# The warnings left out, each because it judges the host's code or language choices rather than
# the header (none of them fires on the header with clang 14; newer clangs add them):
#   -Wno-unknown-warning-option    so that an older clang accepts the names below
#   -Wno-c++98-compat, -Wno-c++98-compat-pedantic
#                                  C++98 compatibility of a header compiled as C++11 and later
#   -Wno-pre-c2x-compat, -Wno-pre-c23-compat
#                                  "incompatible with C standards before C23" notes on C99 code
#   -Wno-unsafe-buffer-usage       a C++ coding-guideline lint on pointer arithmetic in the
#                                  including code
# -Wdocumentation stays on: the header's /*! ... @param ... */ comments must name real parameters.
set -euo pipefail
clang=$1 include=$2
off=(-Wno-unknown-warning-option -Wno-c++98-compat -Wno-c++98-compat-pedantic -Wno-pre-c2x-compat
     -Wno-pre-c23-compat -Wno-unsafe-buffer-usage)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo '#include "wush/wush.h"' >"$tmp/h.c"
cp "$tmp/h.c" "$tmp/h.cpp"
failed=0
for std in c99 c11 c17; do
  "$clang" -x c -std=$std -Weverything -Werror "${off[@]}" -fsyntax-only -I "$include" "$tmp/h.c" || failed=1
done
for std in c++11 c++17 c++20; do
  "$clang" -x c++ -std=$std -Weverything -Werror "${off[@]}" -fsyntax-only -I "$include" "$tmp/h.cpp" || failed=1
done
if [ $failed -ne 0 ]; then
  echo "check_header_warnings: FAIL: wush.h warns under clang -Weverything (see above)"
  exit 1
fi
echo "check_header_warnings: PASS ($("$clang" --version | head -n 1))"
