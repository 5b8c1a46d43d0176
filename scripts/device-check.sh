#!/usr/bin/env bash
# The CUDA backend's checks and figures on a GPU machine, in one go (issue #32, section 4). It
# builds only what the GPU checks need, for sm_90 (set WUSH_DEVICE_ARCHS for another GPU), then,
# each under its own time limit, with logs in $OUT (default /tmp/wush-device-out):
#   0. the tensor-core accumulator probe (cuda/quantize/quantize_tc.cu)          -> run.log
#   1. every ctest test labelled gpu                                   -> ctest.log
#      and the Python GPU test with this machine's torch               -> python-cuda.log
#   2. the GEMM kernels' own benchmark (WUSH_GEMM_BENCH)               -> gemm-bench.log
#   3. `wush bench --device cuda --json` on the default layers (L2-cold,
#      eager and graph-replayed: the defaults)                       -> bench.json
#      and at m = 1, 16 with --l2 warm (the weights left in L2)       -> bench-warm.json
#   4. the prefill kernel forced on from m = 33 (selection evidence)   -> bench-prefill.json
#      the streaming decode kernel (m <= 32) with --cuda-option stream_decode=1 and without, back to
#      back on the same layers (L2-cold, eager and graph)             -> bench-stream.json
#      ({"off": ..., "on": ...}; its gpu tests run in stage 1: wush_gpu_stream_decode_tests)
#   4b. m = 4096 forwards (4096 x 4096, MXFP4 / NVFP4) on the default path and with the opt-in
#      BF16 prefill kernel (--cuda-option bf16_prefill=1), in one file (the opt-in run's layers
#      tagged "/bf16"; the BF16 kernel's own tests run in step 1)     -> bench-bf16-prefill.json
#   5. compute-sanitizer memcheck over the C API's CUDA operations     -> run.log (summary)
#   6. (profile) Nsight Compute sections of the hot kernels            -> profile.log
# The build needs the Debian libraries of scripts/install-deps.sh. On a machine that reaches no
# package registry they can travel as .deb files in .gpudeps/ (apt-get download of OpenBLAS,
# LAPACKE, GoogleTest, Google Benchmark, nlohmann-json): they are then unpacked into /opt/devdeps
# and the build is pointed at them, leaving the machine's own / untouched.
# Usage: bash scripts/device-check.sh [stages] [ctest-regex]
#   stages: comma-separated from tests,gemm,bench,prefill,stream,bf16,memcheck,profile (default: all but profile)
# Or: bash scripts/device-check.sh --prebuilt DIR
#   runs the decision run on a folder built beforehand by scripts/device-prebuild.sh, without
#   configuring or building (scripts/device-check-prebuilt.sh says what it runs and writes).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
[ "${1:-}" = --prebuilt ] && exec bash scripts/device-check-prebuilt.sh "${@:2}"
stages=",${1:-tests,gemm,bench,prefill,stream,bf16,memcheck},"
regex=${2:-}
want() { [[ $stages == *",$1,"* ]]; }
out=${OUT:-/tmp/wush-device-out}
mkdir -p "$out"
log=$out/run.log
exec > >(tee "$log") 2>&1
t0=$(date +%s)
stamp() { echo "[$(($(date +%s) - t0)) s] $*"; }

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
# At most 8 files come back from a lent machine's $OUT: the build log stays outside unless the build
# fails, the sanitizer's and bench's stderr go to run.log.
blog=/tmp/wush-device-build.log
deps=()
if compgen -G ".gpudeps/*.deb" >/dev/null; then
  mkdir -p /opt/devdeps && for f in .gpudeps/*.deb; do dpkg -x "$f" /opt/devdeps; done
  D=/opt/devdeps/usr
  L=$D/lib/x86_64-linux-gnu
  export LD_LIBRARY_PATH=$L/openblas-openmp:$L/lapack:$L/blas:$L:${LD_LIBRARY_PATH:-}
  deps=("-DCMAKE_PREFIX_PATH=$D" "-DWUSH_OPENBLAS_DIR=$L/openblas-openmp"
    "-DWUSH_CBLAS_INCLUDE=$D/include/x86_64-linux-gnu/openblas-openmp" "-DWUSH_LAPACKE_INCLUDE=$D/include")
  stamp "deps unpacked"
fi
cmake -S . -B build/device -DCMAKE_BUILD_TYPE=Release -DWUSH_CUDA=ON -DWUSH_BUILD_TESTS=ON \
  -DCMAKE_CUDA_ARCHITECTURES="${WUSH_DEVICE_ARCHS:-90}" "${deps[@]}" >"$blog" 2>&1 || {
  tail -30 "$blog"
  cp "$blog" "$out/build.log"
  exit 1
}
stamp "configured"
targets=(wush_cli wush_bench_cuda wush_cuda_module wush_backend_ops_test wush_gpu_context_test
  wush_gpu_gemm_tests wush_gpu_kernel_tests wush_gpu_stream_decode_tests wush_gpu_quantize_tc_tests)
timeout 200 cmake --build build/device -j"$(nproc)" --target "${targets[@]}" >>"$blog" 2>&1 || {
  grep -m20 -B2 -A8 'error' "$blog"
  cp "$blog" "$out/build.log"
  exit 1
}
stamp "built"

rc=0
# The tensor-core accumulator probe (the model under the tensor-core quantize's bound; the backend
# keeps the CUDA-core quantize where it fails), into run.log.
timeout 60 build/device/tests/wush_gpu_quantize_tc_tests --gtest_filter='QuantizeTc.AccumulatorProbe' 2>&1 |
  grep -E 'tc accumulator probe|OK|FAILED'
stamp "tc probe"
if want tests; then
  # The Python GPU test runs below with this machine's torch (ctest's would want the dev venv).
  if [ -n "$regex" ]; then sel=(-R "$regex"); else sel=(-L gpu -E python_test_python_cuda); fi
  (cd build/device && timeout 240 ctest --no-tests=error "${sel[@]}" --output-on-failure --timeout 200 -j2 >"$out/ctest.log" 2>&1)
  rc=$?
  grep -E "tests passed|tests failed|\*\*\*|Failed|SKIPPED|Skipped" "$out/ctest.log" | tail -30
  stamp "ctest rc=$rc"
  PYTHONUNBUFFERED=1 timeout 300 "${PYTHON:-python3}" tests/python/test_python_cuda.py --library build/device/capi/libwush.so \
    >"$out/python-cuda.log" 2>&1
  prc=$?
  grep -E "^FAIL|failures|SKIPPED" "$out/python-cuda.log"
  stamp "python CUDA test rc=$prc"
  [ "$rc" -eq 0 ] && [ "$prc" -ne 0 ] && [ "$prc" -ne 77 ] && rc=$prc
fi

if want gemm; then
  WUSH_GEMM_BENCH=1 timeout 90 build/device/tests/wush_gpu_gemm_tests --gtest_filter='*Bench*' >"$out/gemm-bench.log" 2>&1
  stamp "gemm bench rc=$?"
  grep -E "^(mxfp4|nvfp4|int4|format)" "$out/gemm-bench.log"
fi

bin=build/device/tools/wush
if want bench; then
  # shellcheck disable=SC2086  # WUSH_BENCH_ARGS: several words on purpose
  # The defaults: --l2 cold (each call on the next of several weight copies that overflow L2)
  # and --timing both (eager and replayed from a CUDA graph, in the same run).
  timeout 300 "$bin" bench --device cuda --json ${WUSH_BENCH_ARGS:-} >"$out/bench.json"
  stamp "bench rc=$?"
  # The small-m figures with the weights left in L2, as measured before: how much L2 flattered them.
  timeout 90 "$bin" bench --device cuda --l2 warm --m 1,16 --json >"$out/bench-warm.json"
  stamp "bench (L2-warm, m = 1, 16) rc=$?"
fi
if want prefill; then
  timeout 90 "$bin" bench --device cuda --cuda-option prefill_min_m=33 --kind forward --layers 4096x4096 \
    --format mxfp4,nvfp4 --m 33,128,1024,4096 --json >"$out/bench-prefill.json"
  stamp "prefill bench rc=$?"
fi
if want stream; then
  # The same forward products with the existing decode kernel (off) and the streaming one (on), in
  # separate processes back to back; cuBLAS BF16 is measured in each, so each carries its baseline.
  sargs=(bench --device cuda --kind forward --layers 4096x4096,14336x4096,4096x14336 --m 1,4,16,32 --json)
  timeout 120 "$bin" "${sargs[@]}" >/tmp/wush-stream-off.json
  stamp "stream decode off rc=$?"
  timeout 120 "$bin" "${sargs[@]}" --cuda-option stream_decode=1 >/tmp/wush-stream-on.json
  stamp "stream decode on rc=$?"
  python3 -c 'import json, sys
def load(p):
    try: return json.load(open(p))
    except Exception as e: return {"error": str(e)}
json.dump({"off": load(sys.argv[1]), "on": load(sys.argv[2])}, open(sys.argv[3], "w"), indent=1)' \
    /tmp/wush-stream-off.json /tmp/wush-stream-on.json "$out/bench-stream.json"
fi
if want bf16; then
  for v in 0 1; do
    timeout 90 "$bin" bench --device cuda --cuda-option bf16_prefill=$v --kind forward --layers 4096x4096 \
      --format mxfp4,nvfp4 --m 4096 --json >"/tmp/wush-bf16-prefill-$v.json"
    stamp "BF16 prefill bench (bf16_prefill=$v) rc=$?"
  done
  python3 - "$out/bench-bf16-prefill.json" /tmp/wush-bf16-prefill-0.json /tmp/wush-bf16-prefill-1.json <<'EOF'
import json, sys
docs = []
for path in sys.argv[2:]:
    try:
        docs.append(json.load(open(path)))
    except Exception as e:
        print(path, "unreadable:", e)
if docs:
    merged = dict(docs[0], results=list(docs[0]["results"]))
    for r in (docs[1]["results"] if len(docs) > 1 else []):
        merged["results"].append(dict(r, layer=r["layer"] + "/bf16"))
    json.dump(merged, open(sys.argv[1], "w"), indent=1)
EOF
fi
if want memcheck && command -v compute-sanitizer >/dev/null; then
  timeout 60 compute-sanitizer --tool memcheck build/device/tests/wush_backend_ops_test cuda >/tmp/wush-memcheck.log 2>&1
  stamp "memcheck backend_ops_cuda rc=$?"
  tail -3 /tmp/wush-memcheck.log
fi
if want profile; then
  # Hardware counters of the quantize tile kernel (m = 4096), the small-m kernel and the decode
  # GEMM (m = 1), and the reference path's dequantization (SASS: cuobjdump works off the GPU).
  sections=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
    --section Occupancy --section LaunchStats --section WarpStateStats --section InstructionStats)
  for m in 4096 1; do
    timeout 120 ncu --clock-control none -k regex:'quantize|decode_gemm|dequantize' --launch-count 4 "${sections[@]}" \
      "$bin" bench --device cuda --kind forward --layers 4096x4096 --format mxfp4 --m $m >>"$out/profile.log" 2>&1
    stamp "ncu m=$m rc=$?"
  done
  # The streaming decode kernel (opt-in), m = 1 and 16.
  timeout 120 ncu --clock-control none -k regex:'stream_decode' --launch-count 2 \
    "${sections[@]}" "$bin" bench --device cuda --cuda-option stream_decode=1 --kind forward --layers 4096x4096 \
    --format mxfp4 --m 1,16 \
    >>"$out/profile.log" 2>&1
  stamp "ncu stream decode rc=$?"
fi
python3 - "$out/bench.json" "$out/bench-warm.json" "$out/bench-prefill.json" "$out/bench-stream.json" "$out/bench-bf16-prefill.json" <<'EOF'
import json, os, sys
def f(v, spec):
    return "-" if v is None else format(v, spec)
docs = []
for path in sys.argv[1:]:
    if not os.path.exists(path):
        continue
    try:
        doc = json.load(open(path))
    except Exception as e:
        print(path, "unreadable:", e); continue
    name = path.split("/")[-1]
    if "off" in doc and "on" in doc:  # bench-stream.json: the decode kernels off and on
        docs += [(name + " (stream decode off)", doc["off"]), (name + " (stream decode on)", doc["on"])]
    else:
        docs.append((name, doc))
for name, doc in docs:
    rs = doc.get("results")
    if rs is None:
        print(name, "has no results:", doc.get("error")); continue
    print(name, "timing", doc.get("timing"), "l2", doc.get("l2"), "L2 bytes", doc.get("l2_bytes"))
    print("kind     layer      format     m baseline    copies   eager: ours      base  speedup   graph: ours      base  speedup")
    for r in rs:
        copies = f'{r.get("copies_ours", 1)}/{r.get("copies_baseline", 1)}'
        print(f'{r["kind"]:8} {r["layer"]:10} {r["format"]:6} {r["m"]:5} {r["baseline"]:11} {copies:>6} '
              f'{f(r.get("ours_eager_us"), "9.2f"):>15} {f(r.get("baseline_eager_us"), "9.2f"):>9} '
              f'{f(r.get("speedup_eager"), ".2f"):>8} {f(r.get("ours_graph_us"), "9.2f"):>15} '
              f'{f(r.get("baseline_graph_us"), "9.2f"):>9} {f(r.get("speedup_graph"), ".2f"):>8}')
EOF
exit "$rc"
