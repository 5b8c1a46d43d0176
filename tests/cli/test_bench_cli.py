#!/usr/bin/env python3
"""`wush bench --json` on a small layer: every kind and baseline is reported for every m and
format, with the documented fields, positive times and speedup = baseline_s / ours_s; the usage
errors exit with status 2. `--device cuda`: its options are parsed before any device is touched
(bad values exit with 2), and a run either fails cleanly where there is no GPU (exit 1, a message
naming CUDA) or reports both timings, L2-cold, with the documented fields.
Usage: test_bench_cli.py PATH_TO_WUSH"""
import json
import os
import subprocess
import sys


def check_cuda_row(r, failures):
    """A row of `wush bench --device cuda --json` (--timing both, --l2 cold)."""
    for field in ("ours_us", "baseline_us", "speedup", "ours_eager_us", "baseline_eager_us", "speedup_eager",
                  "ours_graph_us", "baseline_graph_us", "speedup_graph"):
        if not isinstance(r.get(field), float) or r[field] <= 0:
            failures.append(f"cuda {r}: field {field} is not a positive number")
            return
    for mode in ("eager", "graph"):
        ratio = r[f"baseline_{mode}_us"] / r[f"ours_{mode}_us"]
        if abs(r[f"speedup_{mode}"] - ratio) > 1e-2 * ratio:
            failures.append(f"cuda {r}: speedup_{mode} is not baseline_{mode}_us / ours_{mode}_us")
    if r["ours_us"] != r["ours_eager_us"] or r["baseline_us"] != r["baseline_eager_us"]:
        failures.append(f"cuda {r}: ours_us / baseline_us are not the eager figures")
    if not isinstance(r.get("copies_ours"), int) or r["copies_ours"] < 2 or not isinstance(r.get("copies_baseline"), int):
        failures.append(f"cuda {r}: copies_ours / copies_baseline missing or too few for L2-cold")


def check_cuda(wush, failures):
    """`wush bench --device cuda`: usage errors exit with 2; a run succeeds (GPU) or fails cleanly."""
    cuda_program = os.path.join(os.path.dirname(os.path.abspath(wush)), "wush-bench-cuda")
    for bad, option in ((["--l2", "lukewarm"], "--l2"), (["--timing", "sometimes"], "--timing"),
                        (["--m", "0"], "--m"), (["--kind", "gemm"], "--kind")):
        p = subprocess.run([wush, "bench", "--device", "cuda"] + bad, capture_output=True, text=True, timeout=60)
        # Without the CUDA program (a build without nvcc) `wush` refuses with 2 as well, naming it.
        if p.returncode != 2 or (os.path.exists(cuda_program) and option not in p.stderr):
            failures.append(f"bench --device cuda {bad}: rc {p.returncode}, {p.stderr!r} (wanted 2, naming {option})")
    # The kernel switches and --variants are checked by `wush` itself, before it runs the CUDA
    # program: their usage errors name the bad item on any machine.
    for bad, says in ((["--cuda-option", "bogus=1"], "unknown switch 'bogus'"),
                      (["--variants", "default,stream_decode"], "'stream_decode' is not default, all"),
                      (["--variants", "default,bogus=1+tc_quantize=1"], "unknown switch 'bogus'"),
                      (["--variants", "all,stream_decode=1+tc_quantize=x"], "tc_quantize needs an integer"),
                      (["--variants", "default,all,default"], "'default' is named twice")):
        p = subprocess.run([wush, "bench", "--device", "cuda"] + bad, capture_output=True, text=True, timeout=60)
        if p.returncode != 2 or says not in p.stderr:
            failures.append(f"bench --device cuda {bad}: rc {p.returncode}, {p.stderr!r} (wanted 2, saying {says!r})")
    p = subprocess.run([wush, "bench", "--device", "cuda", "--transform-dtype", "bf16"], capture_output=True,
                       text=True, timeout=60)
    if p.returncode != 2 or "--transform-dtype" not in p.stderr:
        failures.append(f"bench --device cuda --transform-dtype: rc {p.returncode}, {p.stderr!r} (wanted 2)")
    for bad in (["--l2", "warm"], ["--timing", "both"], ["--variants", "default,all"]):
        if subprocess.run([wush, "bench"] + bad, capture_output=True).returncode != 2:
            failures.append(f"bench {bad} without --device cuda does not exit with 2")
    if not os.path.exists(cuda_program):
        print("no wush-bench-cuda beside wush: the CUDA run is not checked")
        return
    p = subprocess.run([wush, "bench", "--device", "cuda", "--layers", "small_256x512", "--format", "mxfp4",
                        "--m", "1", "--json"], capture_output=True, text=True, timeout=600)
    if p.returncode == 1 and "CUDA" in p.stderr and not p.stdout:
        print("no usable GPU: wush bench --device cuda failed cleanly:", p.stderr.strip())
        return
    if p.returncode != 0:
        failures.append(f"bench --device cuda: rc {p.returncode}, {p.stderr!r}")
        return
    doc = json.loads(p.stdout)
    if doc.get("timing") != "both" or doc.get("l2") != "cold" or not doc.get("l2_bytes", 0) > 0:
        failures.append(f"bench --device cuda: timing / l2 / l2_bytes not the defaults: {doc}")
    if len(doc["results"]) != 3:
        failures.append(f"bench --device cuda: {len(doc['results'])} rows, not 3 (2 quantize, 1 forward)")
    for r in doc["results"]:
        check_cuda_row(r, failures)
    # --variants: every variant in each round, rows tagged with it and the round, min <= median <= max.
    p = subprocess.run([wush, "bench", "--device", "cuda", "--layers", "small_256x512", "--format", "mxfp4",
                        "--m", "1", "--kind", "forward", "--variants", "default,stream_decode=1", "--repeats", "2",
                        "--json"], capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        failures.append(f"bench --device cuda --variants: rc {p.returncode}, {p.stderr!r}")
        return
    rows = json.loads(p.stdout)["results"]
    seen = sorted((r.get("variant"), r.get("repeat")) for r in rows)
    if seen != [("default", 0), ("default", 1), ("stream_decode=1", 0), ("stream_decode=1", 1)]:
        failures.append(f"bench --variants: rows of (variant, repeat) {seen}")
    for r in rows:
        for side in ("ours", "baseline"):
            for mode in ("eager", "graph"):
                lo, med, hi = (r.get(f"{side}_{mode}_min_us"), r.get(f"{side}_{mode}_us"), r.get(f"{side}_{mode}_max_us"))
                if not all(isinstance(v, float) for v in (lo, med, hi)) or not lo <= med <= hi:
                    failures.append(f"bench --variants: {side} {mode} min/median/max {lo}, {med}, {hi}")


def main():
    wush = sys.argv[1]
    cmd = [wush, "bench", "--layers", "small_256x512", "--format", "mxfp4,int4", "--m", "1,5", "--repeats", "1",
           "--min-time", "0", "--json"]
    res = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)["results"]
    failures = []
    seen = set()
    for r in res:
        for field, kind in [("kind", str), ("m", int), ("n", int), ("k", int), ("format", str), ("ours_s", float),
                            ("baseline", str), ("baseline_s", float), ("speedup", float)]:
            if not isinstance(r.get(field), kind):
                failures.append(f"{r}: field {field} is not a {kind.__name__}")
        if r["ours_s"] <= 0 or r["baseline_s"] <= 0 or abs(r["speedup"] - r["baseline_s"] / r["ours_s"]) > 1e-3 * r["speedup"]:
            failures.append(f"{r}: bad times or speedup")
        if (r["n"], r["k"]) != (512, 256):
            failures.append(f"{r}: shape is not n=512, k=256")
        seen.add((r["kind"], r["baseline"], r["m"], r["format"]))
    for m in (1, 5):
        for f in ("mxfp4", "int4"):
            for kind, base in [("gemm", "openblas_sgemm"), ("forward", "openblas_sgemm"),
                               ("quantize", "shared_hadamard_quantize"), ("quantize", "memcpy")]:
                if (kind, base, m, f) not in seen:
                    failures.append(f"missing {kind} vs {base} for m={m} {f}")
    # bf16 transforms (quantize-model's): the one-token kinds run and report their rows.
    p = subprocess.run([wush, "bench", "--layers", "small_256x512", "--format", "mxfp4", "--m", "1", "--kind",
                        "l2,decode", "--transform-dtype", "bf16", "--repeats", "1", "--min-time", "0", "--json"],
                       capture_output=True, text=True)
    kinds = sorted(r["kind"] for r in json.loads(p.stdout)["results"]) if p.returncode == 0 else p.stderr
    if kinds != ["decode", "l2"]:
        failures.append(f"bench --transform-dtype bf16 --kind l2,decode: {kinds}")
    for bad in (["--m", "0"], ["--format", "fp8"], ["--isa", "sse9"], ["--bogus"], ["--transform-dtype", "half"]):
        if subprocess.run([wush, "bench"] + bad, capture_output=True).returncode != 2:
            failures.append(f"bench {bad} does not exit with 2")
    check_cuda(wush, failures)
    for f in failures:
        print("FAIL", f)
    print(f"{len(res)} results, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
