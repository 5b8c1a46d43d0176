#!/usr/bin/env python3
"""`wush bench --json` on a small layer: every kind and baseline is reported for every m and
format, with the documented fields, positive times and speedup = baseline_s / ours_s; the usage
errors exit with status 2. Usage: test_bench_cli.py PATH_TO_WUSH"""
import json
import subprocess
import sys


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
    for bad in (["--m", "0"], ["--format", "fp8"], ["--isa", "sse9"], ["--bogus"]):
        if subprocess.run([wush, "bench"] + bad, capture_output=True).returncode != 2:
            failures.append(f"bench {bad} does not exit with 2")
    for f in failures:
        print("FAIL", f)
    print(f"{len(res)} results, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
