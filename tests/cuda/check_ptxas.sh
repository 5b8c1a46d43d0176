#!/usr/bin/env bash
# The hot CUDA kernels' roofline checks, without a GPU (ctest label `ptxas`). For sm_80 and sm_90
# (and sm_90a when the build's architectures name it), compiles every kernel family (the fused
# quantize on CUDA cores and on tensor cores, decode, prefill, BF16 prefill and streaming decode)
# with ptxas's resource report, then fails on:
#   1. local memory: any stack frame or spill ("nothing goes to local memory" as a check);
#   2. a missing designed instruction in the SASS (cuobjdump, from PyPI's nvidia-cuda-cuobjdump,
#      installed by scripts/install-deps.sh into .devdeps/venv-cudatools): IMMA in the prefill
#      kernel, HMMA in the tensor-core quantize and the BF16 prefill, IDP.4A in both decode
#      kernels, LDGSTS (cp.async) in the streaming one;
#   3. the streaming decode kernel's weight bytes in flight per SM under its budget: ring stages x
#      stage bytes x the blocks per SM that ptxas's registers and the shared memory allow
#      (tests/cuda/roofline.cpp, from cuda/gemm/stream_decode_plan.h's constants).
# Prints each kernel's registers, the occupancy, and the predicted time of the streaming decode
# kernel (its bytes at H100 / H200 bandwidth) beside the last measured decode forward of
# docs/PERFORMANCE.md.
# Usage: check_ptxas.sh NVCC SOURCE_DIR [ARCHITECTURES]     (ARCHITECTURES: CMake's list with commas, e.g. 80,90,90a)
#        check_ptxas.sh --self-test NVCC SOURCE_DIR          (each check must fail on tests/cuda/ptxas_selftest.cu)
set -euo pipefail
selftest=0
if [ "${1:-}" = --self-test ]; then selftest=1; shift; fi
nvcc=$1
src=$2
archs_in=${3:-}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

tools=${WUSH_CUDA_TOOLS_VENV:-$src/.devdeps/venv-cudatools}
cuobjdump=$(find "$tools" -type f -name cuobjdump -perm -u+x 2>/dev/null | head -n 1)
if [ -z "$cuobjdump" ]; then
  echo "check_ptxas: no cuobjdump under $tools: run scripts/install-deps.sh (PyPI nvidia-cuda-cuobjdump)" >&2
  exit 1
fi

# compile FILE ARCH CODE: object and ptxas log in $out.
compile() {
  local file=$1 arch=$2 code=$3 base
  base="$out/$(basename "$file").$code"
  "$nvcc" -std=c++20 -O2 -DNDEBUG -I"$src/cuda" -I"$src/src" -I"$src/include" \
    --generate-code=arch=compute_$arch,code=$code -Xptxas -v -c "$file" -o "$base.o" >"$base.log" 2>&1 ||
    { cat "$base.log"; exit 1; }
}

# local_memory LOG LABEL: prints every kernel's registers; status 1 if any has a stack frame or spills.
# ptxas prints "Compiling entry function 'K'", "N bytes stack frame, S bytes spill stores, L bytes
# spill loads", then "Used R registers, ...".
local_memory() {
  awk -v label="$2" '
    /Compiling entry function/ { fn = $0; sub(/.*entry function .\047?/, "", fn); sub(/\047? for .*/, "", fn) }
    /bytes stack frame/ {
      split($0, f, /[ ,]+/); stack = f[2]; stores = f[6]; loads = f[10]
      if (stack + 0 != 0 || stores + 0 != 0 || loads + 0 != 0) { bad = 1; print "LOCAL MEMORY: " label " " fn ": " $0 }
    }
    /Used [0-9]+ registers/ { print label " " fn ": " $0 }
    END { exit bad }
  ' "$1"
}

# designed OBJ FUNCTION_REGEX OPCODE: status 1 unless every function matching the regex has OPCODE
# in its SASS (and at least one function matches).
designed() {
  "$cuobjdump" --dump-sass "$1" | awk -v fre="$2" -v op="$3" '
    function close_fn() { if (fn != "" && !has) { bad = 1; print "MISSING " op ": " fn } }
    /Function : / { close_fn(); fn = $3; has = 0; if (fn !~ fre) fn = ""; else seen++ ; next }
    fn != "" && index($0, op) { has = 1 }
    END {
      close_fn()
      if (!seen) { print "NO FUNCTION matches " fre; bad = 1 }
      else if (!bad) print op " in all " seen " functions matching " fre
      exit bad
    }
  '
}

# registers LOG: "MR G REGS" per streaming decode instantiation (from the mangled <MR, G>).
stream_registers() {
  awk '
    /Compiling entry function .*stream_decode_kernel/ {
      match($0, /ILi[0-9]+ELi[0-9]+E/); t = substr($0, RSTART, RLENGTH); gsub(/[^0-9]+/, " ", t); on = 1; next
    }
    on && /Used [0-9]+ registers/ { match($0, /Used [0-9]+/); r = substr($0, RSTART + 5, RLENGTH - 5); print t, r; on = 0 }
  ' "$1"
}

roofline="$out/roofline"
"${CXX:-c++}" -std=c++20 -O1 -I"$src/cuda" -I"$src/src" -I"$src/include" "$src/tests/cuda/roofline.cpp" -o "$roofline"

if [ "$selftest" = 1 ]; then
  # Every check must fail on a kernel built to fail it; the self-test fails if one passes.
  f="$src/tests/cuda/ptxas_selftest.cu"
  compile "$f" 80 sm_80
  status=0
  if local_memory "$out/ptxas_selftest.cu.sm_80.log" sm_80; then echo "SELF-TEST: local memory went unseen"; status=1; fi
  if designed "$out/ptxas_selftest.cu.sm_80.o" selftest_designed_mma_kernel IMMA; then
    echo "SELF-TEST: a missing IMMA went unseen"; status=1
  fi
  if ! designed "$out/ptxas_selftest.cu.sm_80.o" selftest_designed_mma_kernel IMAD; then
    echo "SELF-TEST: an instruction that is there was not found"; status=1
  fi
  if "$roofline" occupancy 90 32 32 128 2; then echo "SELF-TEST: a 2-stage ring passed the in-flight budget"; status=1; fi
  [ "$status" = 0 ] && echo "self-test: each check fails where it should"
  exit $status
fi

codes=(80:sm_80 90:sm_90)
case ",$archs_in," in *",90a,"* | *",90a-real,"*) codes+=(90a:sm_90a) ;; esac
status=0
for ac in "${codes[@]}"; do
  arch=${ac%%:*}; code=${ac#*:}
  for path in quantize/quantize_kernel.cu quantize/quantize_tc.cu gemm/gemm_decode.cu gemm/gemm_prefill.cu \
    gemm/gemm_bf16_prefill.cu gemm/stream_decode.cu; do
    file=$(basename "$path")
    compile "$src/cuda/$path" "$arch" "$code"
    local_memory "$out/$file.$code.log" "$code $file" || status=1
  done
  designed "$out/gemm_prefill.cu.$code.o" prefill_gemm_kernel IMMA || status=1
  designed "$out/quantize_tc.cu.$code.o" quantize_tc_kernel HMMA || status=1
  designed "$out/gemm_bf16_prefill.cu.$code.o" bf16_prefill_kernel HMMA || status=1
  designed "$out/gemm_decode.cu.$code.o" decode_gemm_kernel IDP.4A || status=1
  designed "$out/stream_decode.cu.$code.o" stream_decode_kernel IDP.4A || status=1
  designed "$out/stream_decode.cu.$code.o" stream_decode_kernel LDGSTS || status=1
  sm=${arch%a}
  while read -r mr g regs; do
    "$roofline" occupancy "$sm" "$mr" "$g" "$regs" || status=1
  done < <(stream_registers "$out/stream_decode.cu.$code.log")
done
"$roofline" predict
echo "last measured (docs/PERFORMANCE.md, existing decode path): $(grep -m1 'forward m = 1, 4096 x 4096' "$src/docs/PERFORMANCE.md" || echo none)"
exit $status
