#!/usr/bin/env python3
"""`wush eval --runtime` against `wush eval` (the float64 reference path): the same losses to 1e-6
relative for every format x transform (RTN) on the small built-in layers, with the runtime's
kernels forced by no option (the CPU's best ISA). Usage: test_eval_runtime_cli.py PATH_TO_WUSH"""
import json
import subprocess
import sys


def losses(wush, extra):
    cmd = [wush, "eval", "--layers", "small_256x512,small_512x256", "--format", "mxfp4,nvfp4,int4",
           "--transform", "i,h,wush", "--calib-tokens", "512", "--heldout-tokens", "96",
           "--json"] + extra
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return {(r["layer"], r["format"], r["transform"], r["method"]): r["loss"] for r in json.loads(out)["results"]}


def main():
    wush = sys.argv[1]
    ref, fast = losses(wush, []), losses(wush, ["--runtime"])
    failures = 0
    if set(ref) != set(fast) or not ref:
        print("different result sets:", sorted(ref), sorted(fast))
        return 1
    for key, r in sorted(ref.items()):
        f = fast[key]
        rel = abs(f - r) / r
        ok = r > 0 and rel <= 1e-6
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {key}: reference {r:.9e} runtime {f:.9e} rel {rel:.2e}")
    print(f"{len(ref)} losses compared, {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
