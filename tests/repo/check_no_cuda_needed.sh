#!/usr/bin/env bash
# A CPU host never needs CUDA: the core library and the `wush` program list no CUDA library among
# their DT_NEEDED entries (the CUDA backend is the module libwush-cuda.so, opened on demand), and
# `wush version` starts promptly under an 800 MB address-space limit, where a process that maps
# cuBLAS at start-up hangs or fails.
# Usage: check_no_cuda_needed.sh LIBWUSH_SO WUSH_PROGRAM
set -euo pipefail
lib=$1 program=$2
status=0
for f in "$lib" "$program"; do
  needed=$(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  [ -n "$needed" ] || { echo "check_no_cuda_needed: readelf found no NEEDED entries in $f" >&2; exit 2; }
  bad=$(grep -E '^lib(cu|nv)' <<<"$needed" || true)
  if [ -n "$bad" ]; then
    echo "check_no_cuda_needed: $f needs CUDA libraries:" $bad >&2
    status=1
  else
    echo "check_no_cuda_needed: $f needs" $needed
  fi
done
# A sanitizer runtime reserves terabytes of address space for its shadow memory, so the limit
# test means nothing in such a build: it is skipped there (the release build runs it).
if readelf -d "$program" | grep -qE '\[lib(a|t|ub)san'; then
  echo "check_no_cuda_needed: sanitizer build: the address-space limit test is skipped"
elif command -v prlimit >/dev/null; then
  if ! out=$(timeout 60 prlimit --as=800000000 "$program" version 2>&1); then
    echo "check_no_cuda_needed: '$program version' under an 800 MB address-space limit failed or hung: $out" >&2
    status=1
  else
    echo "check_no_cuda_needed: under an 800 MB address-space limit: $out"
  fi
fi
exit $status
