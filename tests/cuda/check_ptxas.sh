#!/usr/bin/env bash
# Compiles the hot CUDA kernels (fused quantize, decode GEMM, prefill GEMM) for sm_80 and sm_90
# with ptxas resource reporting and fails if any kernel has a stack frame or spills: "nothing goes
# to local memory" as a check, not a hope. Prints each kernel's registers and shared memory.
# Usage: check_ptxas.sh NVCC SOURCE_DIR
set -euo pipefail
nvcc=$1
src=$2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
status=0
for arch in 80 90; do
  for file in quantize_kernel.cu gemm_decode.cu gemm_prefill.cu; do
    log="$out/$file.$arch.log"
    "$nvcc" -std=c++20 -O2 -DNDEBUG -I"$src/cuda" -I"$src/src" -I"$src/include" \
      --generate-code=arch=compute_$arch,code=sm_$arch -Xptxas -v -c "$src/cuda/$file" -o "$out/$file.$arch.o" \
      >"$log" 2>&1 || { cat "$log"; exit 1; }
    # ptxas prints "Function properties for K" then "N bytes stack frame, S bytes spill stores, L
    # bytes spill loads", then "Used R registers, ...".
    awk -v arch="$arch" -v file="$file" '
      /Compiling entry function/ { fn = $0; sub(/.*entry function .\047?/, "", fn); sub(/\047? for .*/, "", fn) }
      /bytes stack frame/ {
        split($0, f, /[ ,]+/); stack = f[2]; stores = f[6]; loads = f[10]
        if (stack + 0 != 0 || stores + 0 != 0 || loads + 0 != 0) { bad = 1; print "LOCAL MEMORY: sm_" arch " " file " " fn ": " $0 }
      }
      /Used [0-9]+ registers/ { print "sm_" arch " " file " " fn ": " $0 }
      END { exit bad }
    ' "$log" || status=1
  done
done
exit $status
