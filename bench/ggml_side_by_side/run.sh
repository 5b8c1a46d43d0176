#!/usr/bin/env bash
# ggml's MXFP4 matmul (repacked and plain) beside libwush's MXFP4 W4A4 layer, both timed in the
# same run on the same shapes and thread counts; the "Side by side with ggml" table of
# docs/record/performance-record.md.
#
# NOT part of libwush's build, install or ctest: ggml is not a dependency of libwush. This script
# builds ggml (from a checkout you give it) together with ggml_mxfp4_bench.cpp in a build
# directory of its own, outside the libwush build tree.
#
#   bench/ggml_side_by_side/run.sh GGML_SRC_DIR [WUSH_CLI]
#
# WUSH_CLI: the `wush` program of a libwush build (default: build/dev/tools/wush of this checkout).
# Environment (defaults in brackets):
#   LAYERS   [4096x4096]   libwush example layers, k x n (d_in x d_out), comma separated
#   MS       [1,16,128,512]
#   THREADS  [1 2]         space separated
#   ROUNDS   [1]           each (layer, threads) runs libwush then ggml this many times
#   BUILD_DIR              build here and keep it for the next run (default: a temporary
#                          directory, removed at exit)
#   PYTHON   [python3]
# Output: a markdown table, times in ms (medians of alternating samples): ggml with the weight
# repacked (CPU_REPACK buffer) and plain; libwush's prepared layer (wush_linear_run), per-call
# forward (wush_linear_forward) and GEMM alone (wush_gemm, activations quantized beforehand, so
# it excludes what the other four include); and ggml repacked / libwush (> 1: libwush faster).
# Time ggml and libwush on an otherwise idle machine; the ggml harness exits non-zero (and this
# script stops) if ggml did not take the repacked path or its results are numerically off.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ggml_src=$(cd "${1:?usage: run.sh GGML_SRC_DIR [WUSH_CLI]}" && pwd)
wush=${2:-$here/../../build/dev/tools/wush}
python=${PYTHON:-python3}
[[ -x $wush ]] || { echo "run.sh: no wush program at $wush (build the 'wush_cli' target)" >&2; exit 1; }

out=$(mktemp -d)
build=${BUILD_DIR:-$out/build}
trap 'rm -rf "$out"' EXIT
mkdir -p "$build"
if [[ ! -f $build/CMakeCache.txt ]]; then
    cmake -S "$here" -B "$build" -DGGML_SRC_DIR="$ggml_src" -DGGML_NATIVE=ON -DGGML_CUDA=OFF \
        -DGGML_BUILD_EXAMPLES=OFF -DGGML_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Release >"$build/configure.log"
fi
cmake --build "$build" -j"$(nproc)" --target ggml_mxfp4_bench >"$build/build.log"

echo "# ggml source: $ggml_src, commit $(git -C "$ggml_src" rev-parse HEAD 2>/dev/null || echo unknown)"
ms=${MS:-1,16,128,512}
for layer in $(echo "${LAYERS:-4096x4096}" | tr ',' ' '); do
    k=${layer%x*} n=${layer#*x}
    for round in $(seq "${ROUNDS:-1}"); do
        for t in ${THREADS:-1 2}; do
            tag=$layer.$t.$round
            "$wush" bench --layers "$layer" --format mxfp4 --m "$ms" --kind gemm,forward --threads "$t" --json \
                >"$out/wush.$tag.json"
            "$build/ggml_mxfp4_bench" --k "$k" --n "$n" --m "$ms" --threads "$t" >"$out/ggml.$tag.txt"
            grep '^#' "$out/ggml.$tag.txt" | sort -u
            echo "# $layer, $t thread(s), round $round done at $(date -u +%T); load average $(cut -d' ' -f1-3 /proc/loadavg)"
        done
    done
done

# One row per run: ggml's two paths and libwush's three calls, ms, and ggml repacked / libwush.
"$python" - "$out" <<'EOF'
import glob, json, os, sys
out = sys.argv[1]
rows, isas = [], set()
for path in sorted(glob.glob(os.path.join(out, "ggml.*.txt"))):
    tag = os.path.basename(path)[len("ggml."):-len(".txt")]
    run = tag.rsplit(".", 1)[1]
    wush = {}
    for r in json.load(open(os.path.join(out, f"wush.{tag}.json")))["results"]:
        wush[(r["kind"], r["m"])] = r["ours_s"]
        isas.add(r["isa"])
    for line in open(path):
        if line.startswith("#"):
            continue
        _, k, n, m, t, rep, plain, _, _ = line.split()
        prep, fwd, gemm = (wush[(kind, int(m))] for kind in ("prepared", "forward", "gemm"))
        rep, plain = float(rep), float(plain)
        rows.append(f"| {k}x{n} | {t} | {run} | {m} | {rep*1e3:.3f} | {plain*1e3:.3f} | {prep*1e3:.3f} | {fwd*1e3:.3f} "
                    f"| {gemm*1e3:.3f} | {rep/prep:.2f}x | {rep/fwd:.2f}x |")
print("# libwush kernels:", ", ".join(sorted(isas)))
print("| k x n | threads | round | m | ggml repacked | ggml plain | wush prepared | wush forward | wush gemm "
      "| repacked / prepared | repacked / forward |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
print("\n".join(rows))
EOF
