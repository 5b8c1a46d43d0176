#!/usr/bin/env bash
# scripts/device-check.sh --prebuilt DIR on a machine without a GPU (issue #58, item 6), on a
# stand-in folder with the layout scripts/device-prebuild.sh makes (scripts for binaries, dummy
# libraries, a real MANIFEST and module digest), so that it needs no CUDA build:
#   - a complete folder, and the same as DIR.tar.gz: exit 0 well under 120 s, at most 8 files, results.json and verdict.json,
#     every GPU stage and every verdict row "no device";
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

# The verdict's promotion rules on made-up rows (each rule shown saying yes and no).
python3 "$repo/scripts/device_verdict.py" --self-test || fail "device_verdict.py --self-test"

echo "device-check --prebuilt: complete folder in $(cat "$tmp/good.s") s, $fails failures"
[ "$fails" -eq 0 ]
