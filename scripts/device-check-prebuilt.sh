#!/usr/bin/env bash
# scripts/device-check.sh --prebuilt DIR: the GPU run that decides whether the opt-in kernels become
# the default (issue #58, item 6), on a folder made beforehand by scripts/device-prebuild.sh. It
# neither configures nor builds. In this order, each stage under its own time limit (the limits
# add to 480 s; printed at the start):
#   verify     every binary and library the check needs is in DIR, MANIFEST's digests match, the
#              module's own digest matches, and ldd finds every library (fails in seconds)
#   probe      the tensor-core accumulator probe (QuantizeTc.AccumulatorProbe)
#   optin-*    the opt-ins' GPU tests: streaming decode, tensor-core quantize, BF16 prefill
#   bench      one `wush bench --device cuda --variants ...` process: every variant (default, each
#              opt-in, all of them) in turn on the same card, 2 repetitions, L2-cold, graph-replayed
#   ncu        Nsight Compute on one launch of each new kernel and of the default it would replace
#   tests      the remaining GPU tests
#   memcheck, racecheck   compute-sanitizer, all opt-ins on, a small layer
# Without a GPU (no nvidia-smi, no device listed, or WUSH_DEVICE_CHECK_NO_DEVICE=1) only `verify`
# runs; every other stage, and every opt-in's verdict, says "no device", and the exit status is 0.
# Writes at most 8 files into $OUT (default /tmp/wush-device-out): run.log, tests.log, ncu.log,
# sanitizer.log, results.json (every row, its variant, the stages, the probe) and verdict.json
# (scripts/device_verdict.py: per opt-in, its tests, its speed against the default with the
# spread, against cuBLAS BF16 and the target, and whether it should become the default).
# The exit status is non-zero when any stage fails or runs out of time.
# Usage: bash scripts/device-check.sh --prebuilt DIR|DIR.tar.gz
# shellcheck disable=SC2016,SC2054,SC2317  # bash -c bodies in single quotes, comma lists as one word, ncu_one run through bash -c
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[ $# -eq 1 ] || {
  echo "usage: $0 --prebuilt DIR" >&2
  exit 2
}
out=${OUT:-/tmp/wush-device-out}
mkdir -p "$out"
work=$(mktemp -d /tmp/wush-device-check.XXXXXX)
trap 'rm -rf "$work"' EXIT
exec > >(tee "$out/run.log") 2>&1
t0=$(date +%s)
# DIR, or DIR.tar.gz as scripts/device-prebuild.sh writes it (unpacked here first).
if [ -f "$1" ] && [[ $1 == *.tar.gz ]]; then
  if ! { mkdir "$work/prebuilt" && tar -C "$work/prebuilt" -xzf "$1"; }; then
    echo "device-check: cannot unpack $1" >&2
    exit 1
  fi
  dir=$work/prebuilt
else
  dir=$(cd "$1" 2>/dev/null && pwd) || {
    echo "device-check: no folder $1" >&2
    exit 1
  }
fi
stamp() { echo "[$(($(date +%s) - t0)) s] $*"; }

# The stages and their limits in seconds (the issue's order; at most 480 s together).
stages=(verify probe optin-stream-decode optin-tc-quantize optin-bf16-prefill bench ncu tests memcheck racecheck)
declare -A budget=([verify]=10 [probe]=20 [optin-stream-decode]=30 [optin-tc-quantize]=20 [optin-bf16-prefill]=25
  [bench]=170 [ncu]=60 [tests]=75 [memcheck]=35 [racecheck]=35)
total=0
for s in "${stages[@]}"; do total=$((total + budget[$s])); done
echo "device-check --prebuilt $1: stage limits (s):$(for s in "${stages[@]}"; do printf ' %s=%s' "$s" "${budget[$s]}"; done), total $total"
[ "$total" -le 480 ] || {
  echo "device-check: the stage limits add to $total s, over 480" >&2
  exit 1
}
# One line per stage: name, status (pass, fail, timeout, no device), exit status, seconds, limit.
status_file=$work/stages.tsv
: >"$status_file"
record() { printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "${budget[$1]}" >>"$status_file"; }

# ---- verify: fails fast, before anything runs ------------------------------------------------
bins=(wush wush-bench-cuda wush_backend_ops_test wush_gpu_context_test wush_gpu_gemm_tests wush_gpu_kernel_tests
  wush_gpu_stream_decode_tests wush_gpu_quantize_tc_tests)
problems=()
[ -f "$dir/MANIFEST" ] || problems+=("no MANIFEST in $dir (made by scripts/device-prebuild.sh)")
for b in "${bins[@]}"; do
  [ -x "$dir/bin/$b" ] || problems+=("binary bin/$b is missing or not executable")
done
compgen -G "$dir/lib/libwush.so.*" >/dev/null || problems+=("library lib/libwush.so.* is missing")
[ -f "$dir/lib/libwush-cuda.so" ] || problems+=("the CUDA module lib/libwush-cuda.so is missing")
if [ ! -f "$dir/lib/libwush-cuda.so.sha256" ]; then
  problems+=("the module digest lib/libwush-cuda.so.sha256 is missing")
elif [ -f "$dir/lib/libwush-cuda.so" ] && ! (cd "$dir/lib" && sha256sum --quiet -c libwush-cuda.so.sha256 >/dev/null 2>&1); then
  problems+=("the module lib/libwush-cuda.so does not match its digest lib/libwush-cuda.so.sha256")
fi
if [ -f "$dir/MANIFEST" ]; then
  while read -r line; do problems+=("MANIFEST: $line"); done < <(cd "$dir" && sha256sum --quiet -c MANIFEST 2>&1 | grep -v '^sha256sum: WARNING')
fi
# Libraries: ldd must find each one. The CUDA toolkit's (libcudart, libcublas*, libcuda) come from
# the GPU machine, so only their absence there is a problem.
if nvidia-smi -L 2>/dev/null | grep -q '^GPU ' && [ -z "${WUSH_DEVICE_CHECK_NO_DEVICE:-}" ]; then
  device=$(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | head -1)
else
  device=""
fi
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/usr/local/cuda/lib64
# Where the toolkit's libraries are not in /usr/local/cuda/lib64 (the RPATHs' fallback), the CUDA
# wheels of the machine's Python (nvidia-cublas, nvidia-cuda-runtime) may hold them.
if [ -x "$dir/bin/wush-bench-cuda" ] && ldd "$dir/bin/wush-bench-cuda" 2>/dev/null | grep -q 'libcu.*not found'; then
  for pkg in cublas cuda_runtime; do
    d=$(python3 -c "import os, nvidia.$pkg as m; print(os.path.join(list(m.__path__)[0], 'lib'))" 2>/dev/null) &&
      [ -d "$d" ] && LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d && echo "note: the CUDA libraries from $d"
  done
fi
# Any other library must come from DIR itself (the GPU image lacks OpenBLAS and the rest), whatever
# this machine happens to have installed: the same list as scripts/device-prebuild.sh.
system='^(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux-x86-64|linux-vdso|libcuda|libcudart|libcublas|libcublasLt)\.so'
for f in "$dir"/bin/* "$dir"/lib/*.so*; do
  head -c 4 "$f" | grep -q 'ELF' || continue
  while read -r lib path; do
    if [ "$path" = "not" ]; then
      if [[ $lib =~ ^lib(cuda|cudart|cublas|cublasLt)\.so ]] && [ -z "$device" ]; then
        echo "note: ${f#"$dir"/} needs $lib, which this machine lacks (the GPU machine's CUDA toolkit has it)"
      else
        problems+=("${f#"$dir"/} needs $lib, which is not found")
      fi
    elif [[ ! $lib =~ $system ]] && [[ $path != "$dir"/* ]]; then
      problems+=("${f#"$dir"/} loads $lib from $path, outside the folder (the GPU machine lacks it)")
    fi
  done < <(ldd "$f" 2>/dev/null | awk '$2 == "=>" {print $1, $3}')
done
vt=$(($(date +%s) - t0))
if [ ${#problems[@]} -gt 0 ]; then
  printf 'device-check: %s\n' "${problems[@]}" >&2
  echo "device-check: $dir is not a complete prebuilt folder (${#problems[@]} problems, ${vt} s): rebuild it with scripts/device-prebuild.sh" >&2
  exit 1
fi
record verify pass 0 "$vt"
stamp "verify: $(wc -l <"$dir/MANIFEST") files match MANIFEST, commit $(cat "$dir/COMMIT" 2>/dev/null)"

# ---- the GPU stages -----------------------------------------------------------------------
bin=$dir/bin
# stage NAME LOG COMMAND...: runs COMMAND under the stage's limit, appending to LOG.
stage() {
  local name=$1 log=$2
  shift 2
  if [ -z "$device" ]; then
    record "$name" "no device" "" 0
    return
  fi
  local s0 rc st
  s0=$(date +%s)
  echo "==== $name: $*" >>"$log"
  timeout -k 5 "${budget[$name]}" "$@" >>"$log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then st=pass; elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then st=timeout; else st=fail; fi
  record "$name" "$st" "$rc" "$(($(date +%s) - s0))"
  stamp "$name: $st (rc $rc)"
}
if [ -z "$device" ]; then
  stamp "no GPU here (nvidia-smi lists none${WUSH_DEVICE_CHECK_NO_DEVICE:+, or WUSH_DEVICE_CHECK_NO_DEVICE is set}): every GPU stage is 'no device'"
else
  stamp "device: $device"
fi
tlog=$out/tests.log
bf16='*Bf16Prefill*'
stage probe "$tlog" "$bin/wush_gpu_quantize_tc_tests" --gtest_filter='QuantizeTc.AccumulatorProbe'
grep -E 'tc accumulator probe' "$tlog" >"$work/probe.txt" 2>/dev/null
stage optin-stream-decode "$tlog" "$bin/wush_gpu_stream_decode_tests"
stage optin-tc-quantize "$tlog" "$bin/wush_gpu_quantize_tc_tests" --gtest_filter='-QuantizeTc.AccumulatorProbe'
stage optin-bf16-prefill "$tlog" bash -c '"$1" --gtest_filter="$3" && "$2" --gtest_filter="$3"' _ \
  "$bin/wush_gpu_gemm_tests" "$bin/wush_gpu_kernel_tests" "$bf16"

# One process, every variant in turn per shape, alternating, 2 repetitions. WUSH_CHECK_BENCH_ARGS
# replaces the shapes (e.g. "--layers 4096x4096 --m 1,128").
variants=default,stream_decode=1,tc_quantize=1,bf16_prefill=1,all
# shellcheck disable=SC2086  # several words on purpose
stage bench "$work/bench.err" bash -c '"$@" >"'"$work"'/bench.json"' _ "$bin/wush" bench --device cuda \
  --variants "$variants" --repeats 2 --l2 cold --timing graph --kind quantize,forward --json \
  ${WUSH_CHECK_BENCH_ARGS:---layers 4096x4096,14336x4096,4096x14336 --format mxfp4,nvfp4 --m 1,16,32,128,4096}
[ -f "$work/bench.err" ] && tail -20 "$work/bench.err"

# Nsight Compute: one launch of each new kernel and of the default it would replace, 4096 x 4096.
# The tools run wush-bench-cuda itself (what `wush bench --device cuda` execs), not through `wush`.
nlog=$out/ncu.log
ncu_one() { # VARIANT M KERNEL-REGEX
  ncu --clock-control none -k "regex:$3" -c 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section Occupancy --section LaunchStats "$bin/wush-bench-cuda" --device cuda --variants "$1" --kind forward \
    --layers 4096x4096 --format mxfp4 --m "$2" --timing eager --l2 warm --repeats 1
}
export -f ncu_one
export bin
stage ncu "$nlog" bash -c 'rc=0
  for spec in "default 1 decode_gemm" "stream_decode=1 1 stream_decode" "default 128 quantize_tile" \
    "tc_quantize=1 128 quantize_tc" "default 4096 dequantize" "bf16_prefill=1 4096 bf16_prefill"; do
    set -- $spec; echo "---- ncu: variant $1, m = $2, kernel $3"; ncu_one "$1" "$2" "$3" || rc=1
  done; exit $rc'

stage tests "$tlog" bash -c 'rc=0
  "$1/wush_gpu_gemm_tests" --gtest_filter="-*Bf16Prefill*:*Bench*" || rc=1
  "$1/wush_gpu_kernel_tests" --gtest_filter="-*Bf16Prefill*" || rc=1
  r=0; "$1/wush_backend_ops_test" cuda || r=$?; [ $r -eq 0 ] || [ $r -eq 77 ] || rc=1
  r=0; "$1/wush_gpu_context_test" || r=$?; [ $r -eq 0 ] || [ $r -eq 77 ] || rc=1
  exit $rc' _ "$bin"

# compute-sanitizer with every opt-in on, on a small layer, eager, one repetition: m = 17 reaches
# the streaming decode (m <= 32) and the tensor-core quantize (m >= 17), m = 33 the BF16 prefill.
slog=$out/sanitizer.log
small=(--device cuda --variants all --kind quantize,forward --layers small_256x512 --format mxfp4
  --m 17,33 --timing eager --l2 warm --repeats 1)
stage memcheck "$slog" compute-sanitizer --tool memcheck --error-exitcode 1 "$bin/wush-bench-cuda" "${small[@]}"
stage racecheck "$slog" compute-sanitizer --tool racecheck --error-exitcode 1 "$bin/wush-bench-cuda" "${small[@]}"

# ---- results.json and verdict.json ----------------------------------------------------------
python3 "$here/device_verdict.py" --stages "$status_file" --probe "$work/probe.txt" --bench "$work/bench.json" \
  --ncu "$out/ncu.log" --device "$device" --commit "$(cat "$dir/COMMIT" 2>/dev/null)" --results "$out/results.json" \
  --verdict "$out/verdict.json"
vrc=$?
rc=0
[ $vrc -eq 0 ] || rc=1
if grep -qP '\t(fail|timeout)\t' "$status_file"; then rc=1; fi
n=$(find "$out" -type f | wc -l)
stamp "done: $n files in $out, exit $rc"
[ "$n" -le 8 ] || {
  echo "device-check: $n files in $out, more than the 8 that come back" >&2
  rc=1
}
exit $rc
