#!/usr/bin/env bash
# scripts/device-check.sh --prebuilt DIR on a machine without a GPU (issue #58, item 6), on a
# stand-in folder with the layout scripts/device-prebuild.sh makes (scripts for binaries, dummy
# libraries, a real MANIFEST and module digest), so that it needs no CUDA build:
#   - a complete folder, and the same as DIR.tar.gz: exit 0 well under 120 s, at most 8 files, results.json and verdict.json,
#     every GPU stage and every verdict row "no device";
#   - with stand-ins for the GPU tools and programs: every stage runs and is recorded, the bench
#     rows reach the verdict, and a failing opt-in test makes the run exit non-zero;
#   - a missing binary, a module that differs from its digest, a file that differs from MANIFEST,
#     a missing libwush: each fails within seconds, naming the problem.
# Where a GPU is present the run is made to take the no-device path (WUSH_DEVICE_CHECK_NO_DEVICE).
# Usage: check_device_check_prebuilt.sh REPO
set -uo pipefail
repo=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then export WUSH_DEVICE_CHECK_NO_DEVICE=1; fi
fails=0
fail() {
  echo "FAIL: $*"
  fails=$((fails + 1))
}

make_folder() { # DIR
  local d=$1 b
  mkdir -p "$d/bin" "$d/lib"
  for b in wush wush-bench-cuda wush_backend_ops_test wush_gpu_context_test wush_gpu_gemm_tests wush_gpu_kernel_tests \
    wush_gpu_stream_decode_tests wush_gpu_quantize_tc_tests; do
    printf '#!/bin/sh\necho "stand-in %s: must not run without a device" >&2\nexit 3\n' "$b" >"$d/bin/$b"
    chmod +x "$d/bin/$b"
  done
  echo "libwush stand-in" >"$d/lib/libwush.so.0.9.0"
  ln -s libwush.so.0.9.0 "$d/lib/libwush.so.0"
  echo "module stand-in" >"$d/lib/libwush-cuda.so"
  (cd "$d/lib" && sha256sum libwush-cuda.so >libwush-cuda.so.sha256)
  echo 0000000000000000000000000000000000000000 >"$d/COMMIT"
  (cd "$d" && find bin lib COMMIT -type f | LC_ALL=C sort | xargs sha256sum >MANIFEST)
}

run_check() { # NAME DIR -> $tmp/NAME.{out,rc,s}, OUT=$tmp/NAME.out.d
  local s0=$SECONDS
  OUT=$tmp/$1.out.d bash "$repo/scripts/device-check.sh" --prebuilt "$2" >"$tmp/$1.log" 2>&1
  echo $? >"$tmp/$1.rc"
  echo $((SECONDS - s0)) >"$tmp/$1.s"
}

# A complete folder.
make_folder "$tmp/good"
run_check good "$tmp/good"
rc=$(cat "$tmp/good.rc") s=$(cat "$tmp/good.s")
[ "$rc" -eq 0 ] || fail "complete folder: exit $rc, not 0: $(tail -5 "$tmp/good.log")"
[ "$s" -lt 120 ] || fail "complete folder: took $s s, not under 120"
n=$(find "$tmp/good.out.d" -type f | wc -l)
[ "$n" -le 8 ] || fail "complete folder: $n files in OUT, more than 8"
grep -q 'total 480' "$tmp/good.log" || fail "the stage limits do not add to 480 s: $(grep -m1 'stage limits' "$tmp/good.log")"
python3 - "$tmp/good.out.d" <<'EOF' || fail "complete folder: results.json / verdict.json"
import json, sys
d = sys.argv[1]
results, verdict = json.load(open(d + "/results.json")), json.load(open(d + "/verdict.json"))
bad = []
rows = {r["opt_in"]: r for r in verdict["rows"]}
if set(rows) != {"stream_decode", "tc_quantize", "bf16_prefill", "all"}:
    bad.append(f"verdict rows {sorted(rows)}")
for name, r in rows.items():
    for field in ("tests", "speed", "should_become_default"):
        if r.get(field) != "no device":
            bad.append(f"verdict {name}.{field} = {r.get(field)!r}, not 'no device'")
if verdict.get("device") != "no device" or verdict.get("stages_failed"):
    bad.append(f"verdict device {verdict.get('device')!r}, stages failed {verdict.get('stages_failed')}")
stages = {s["stage"]: s["status"] for s in results["stages"]}
want = ["verify", "probe", "optin-stream-decode", "optin-tc-quantize", "optin-bf16-prefill", "bench", "ncu",
        "tests", "memcheck", "racecheck"]
if list(stages) != want:
    bad.append(f"stages {list(stages)}, not {want}")
if stages.get("verify") != "pass" or any(v != "no device" for k, v in stages.items() if k != "verify"):
    bad.append(f"stage statuses {stages}")
if sum(s["limit_s"] for s in results["stages"]) > 480:
    bad.append("stage limits over 480 s")
if results["probe"]["result"] != "no device":
    bad.append(f"probe {results['probe']}")
for b in bad:
    print("  ", b)
sys.exit(1 if bad else 0)
EOF

# The same folder as the archive that travels (DIR.tar.gz).
tar -C "$tmp/good" -czf "$tmp/good.tar.gz" .
run_check archive "$tmp/good.tar.gz"
[ "$(cat "$tmp/archive.rc")" -eq 0 ] || fail "complete folder as .tar.gz: exit $(cat "$tmp/archive.rc"): $(tail -5 "$tmp/archive.log")"
grep -q '"should_become_default": "no device"' "$tmp/archive.out.d/verdict.json" || fail "archive: no 'no device' verdict"

# Broken folders: each must fail fast with its reason.
broken() { # NAME EXPECTED-MESSAGE SETUP-COMMAND...
  local name=$1 want=$2
  shift 2
  make_folder "$tmp/$name"
  (cd "$tmp/$name" && "$@")
  run_check "$name" "$tmp/$name"
  rc=$(cat "$tmp/$name.rc") s=$(cat "$tmp/$name.s")
  [ "$rc" -ne 0 ] || fail "$name: exit 0, wanted a failure"
  [ "$s" -le 10 ] || fail "$name: took $s s to fail, not seconds"
  grep -qF -- "$want" "$tmp/$name.log" || fail "$name: no message '$want' in: $(cat "$tmp/$name.log")"
}
broken missing_binary "bin/wush_gpu_gemm_tests is missing" rm bin/wush_gpu_gemm_tests
broken module_digest "does not match its digest" sh -c 'echo changed >>lib/libwush-cuda.so'
broken manifest "MANIFEST: bin/wush: FAILED" sh -c 'echo "# changed" >>bin/wush'
broken missing_library "lib/libwush.so.* is missing" rm lib/libwush.so.0 lib/libwush.so.0.9.0
broken no_manifest "no MANIFEST" rm MANIFEST
broken module_without_digest "lib/libwush-cuda.so.sha256 is missing" rm lib/libwush-cuda.so.sha256

# The GPU path's plumbing, with stand-ins for nvidia-smi, ncu, compute-sanitizer and the programs:
# every stage runs in order and is recorded, the bench rows reach the verdict (the streaming decode
# at 1.33x with racecheck clean is promoted), ncu's kernels are found, and one failing opt-in test
# (the BF16 prefill's) makes the run exit non-zero and its row say "fail".
make_folder "$tmp/gpu"
mkdir -p "$tmp/tools"
cat >"$tmp/tools/nvidia-smi" <<'EOS'
#!/bin/sh
case "$1" in -L) echo "GPU 0: Stand-in H100 (UUID: GPU-0)" ;; *) echo "Stand-in H100, 580.00, 81559 MiB, 1980 MHz" ;; esac
EOS
cat >"$tmp/tools/ncu" <<'EOS'
#!/bin/sh
while [ $# -gt 0 ]; do case "$1" in -k) k=${2#regex:}; shift ;; esac; shift; done
echo "  ${k}_kernel<1>(wush::cuda::Args) (132, 1, 1)x(256, 1, 1), Context 1, Stream 13, Device 0, CC 9.0"
EOS
printf '#!/bin/sh\necho "========= ERROR SUMMARY: 0 errors"\n' >"$tmp/tools/compute-sanitizer"
cat >"$tmp/gpu/bin/wush" <<'EOS'
#!/bin/sh
row() { # variant repeat ours_us kernels
  printf '{"kind": "forward", "layer": "4096x4096", "format": "mxfp4", "m": 1, "baseline": "cublas_bf16", "variant": "%s", "repeat": %s, "ours_graph_us": %s, "ours_graph_min_us": %s, "ours_graph_max_us": %s, "baseline_graph_us": 9.0, "baseline_graph_min_us": 8.9, "baseline_graph_max_us": 9.1, "kernels": "%s"}' "$1" "$2" "$3" "$3" "$3" "$4"
}
echo '{"device": "Stand-in H100", "timing": "graph", "l2": "cold", "l2_bytes": 52428800, "results": ['
d="quantize.small_m gemm.decode" s="quantize.small_m gemm.stream_decode"
row default 0 10.0 "$d"; echo ,; row stream_decode=1 0 7.5 "$s"; echo ,; row default 1 10.0 "$d"; echo ,
row stream_decode=1 1 7.5 "$s"
echo ']}'
EOS
printf '#!/bin/sh\necho "tc accumulator probe: sm_90, 4096 outputs, 0 inexact, largest error / model bound 0.5: PASS"\n' \
  >"$tmp/gpu/bin/wush_gpu_quantize_tc_tests"
# Fails the BF16 prefill's tests (--gtest_filter=*Bf16Prefill*), passes the rest (-*Bf16Prefill*:...).
# shellcheck disable=SC2016  # the stand-in's own $1
printf '#!/bin/sh\ncase "$1" in *=-*) exit 0 ;; *Bf16Prefill*) echo "[  FAILED  ] stand-in"; exit 1 ;; esac\n' \
  >"$tmp/gpu/bin/wush_gpu_gemm_tests"
for b in wush-bench-cuda wush_backend_ops_test wush_gpu_context_test wush_gpu_kernel_tests wush_gpu_stream_decode_tests; do
  printf '#!/bin/sh\nexit 0\n' >"$tmp/gpu/bin/$b"
done
chmod +x "$tmp"/tools/* "$tmp"/gpu/bin/*
(cd "$tmp/gpu" && find bin lib COMMIT -type f | LC_ALL=C sort | xargs sha256sum >MANIFEST)
(
  unset WUSH_DEVICE_CHECK_NO_DEVICE
  PATH=$tmp/tools:$PATH
  run_check gpu "$tmp/gpu"
)
[ "$(cat "$tmp/gpu.rc")" -eq 1 ] || fail "stand-in GPU with a failing opt-in test: exit $(cat "$tmp/gpu.rc"), not 1"
n=$(find "$tmp/gpu.out.d" -type f | wc -l)
[ "$n" -le 8 ] || fail "stand-in GPU: $n files in OUT, more than 8"
python3 - "$tmp/gpu.out.d" <<'EOF' || fail "stand-in GPU: results.json / verdict.json: $(tail -20 "$tmp/gpu.log")"
import json, sys
d = sys.argv[1]
results, verdict = json.load(open(d + "/results.json")), json.load(open(d + "/verdict.json"))
bad = []
stages = {s["stage"]: s["status"] for s in results["stages"]}
want = {k: "pass" for k in ("verify", "probe", "optin-stream-decode", "optin-tc-quantize", "bench", "ncu", "tests",
                            "memcheck", "racecheck")}
want["optin-bf16-prefill"] = "fail"
if stages != want:
    bad.append(f"stages {stages}")
if verdict["stages_failed"] != ["optin-bf16-prefill"]:
    bad.append(f"stages_failed {verdict['stages_failed']}")
rows = {r["opt_in"]: r for r in verdict["rows"]}
sd = rows["stream_decode"]
if sd["should_become_default"] is not True or sd["tests"] != "pass" or abs(sd["speed"][0]["speedup"] - 10 / 7.5) > 1e-9:
    bad.append(f"stream_decode row {sd}")
if rows["bf16_prefill"]["tests"] != "fail" or rows["bf16_prefill"]["should_become_default"] is not False:
    bad.append(f"bf16_prefill row {rows['bf16_prefill']}")
if rows["tc_quantize"].get("probe") != "pass" or rows["tc_quantize"]["should_become_default"] is not False:
    bad.append(f"tc_quantize row {rows['tc_quantize']} (probe passed, nothing measured: not promoted)")
if len(results["rows"]) != 4 or results["probe"]["result"] != "pass":
    bad.append(f"{len(results['rows'])} bench rows, probe {results['probe']}")
ncu = {(r["variant"], r["kernel"]): r["profiled"] for r in results["ncu"]}
if len(ncu) != 6 or not all(ncu.values()):
    bad.append(f"ncu runs {results['ncu']}")
for b in bad:
    print("  ", b)
sys.exit(1 if bad else 0)
EOF

# The verdict's promotion rules on made-up rows (each rule shown saying yes and no).
python3 "$repo/scripts/device_verdict.py" --self-test || fail "device_verdict.py --self-test"

echo "device-check --prebuilt: complete folder in $(cat "$tmp/good.s") s, $fails failures"
[ "$fails" -eq 0 ]
