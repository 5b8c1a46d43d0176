#!/usr/bin/env python3
"""`wush eval --runtime` against `wush eval` (the float64 reference path): the same losses to 1e-6
relative for every format x transform (RTN) on the small built-in layers, and for the layers of a
checkpoint written by `wush quantize` (`eval --checkpoint --runtime`), with the CPU's best ISA.
Usage: test_eval_runtime_cli.py PATH_TO_WUSH"""
import json
import os
import random
import struct
import subprocess
import sys
import tempfile


def losses(wush, extra):
    cmd = [wush, "eval", "--layers", "small_256x512,small_512x256", "--format", "mxfp4,nvfp4,int4",
           "--transform", "i,h,wush", "--calib-tokens", "512", "--heldout-tokens", "96",
           "--json"] + extra
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return {(r["layer"], r["format"], r["transform"], r["method"]): r["loss"] for r in json.loads(out)["results"]}


def write_safetensors(path, tensors):
    """tensors: name -> (rows, cols, list of floats), written as F32."""
    header, blobs, offset = {}, [], 0
    for name, (rows, cols, values) in tensors.items():
        blob = struct.pack(f"<{len(values)}f", *values)
        header[name] = {"dtype": "F32", "shape": [rows, cols], "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def checkpoint_losses(wush, tmp, fmt, runtime):
    weights, acts, ck = (os.path.join(tmp, n) for n in ("w.safetensors", "x.safetensors", f"ck_{fmt}.safetensors"))
    if not os.path.exists(weights):
        rng = random.Random(3)
        d_out, d_in, n = 40, 128, 200
        w = [rng.gauss(0, 0.05) for _ in range(d_out * d_in)]
        x = [rng.gauss(0, 1) * (6 if j % 11 == 0 else 1) for _ in range(n) for j in range(d_in)]
        write_safetensors(weights, {"blk.0.proj": (d_out, d_in, w)})
        write_safetensors(acts, {"blk.0.proj": (n, d_in, x)})
    if not os.path.exists(ck):
        subprocess.run([wush, "quantize", "--weights", weights, "--activations", acts, "--format", fmt, "--transform",
                        "wush", "--out", ck], check=True, capture_output=True)
    cmd = [wush, "eval", "--checkpoint", ck, "--weights", weights, "--activations", acts, "--json"]
    out = subprocess.run(cmd + (["--runtime"] if runtime else []), check=True, capture_output=True, text=True).stdout
    return {("checkpoint", r["layer"], r["format"], r["transform"]): r["loss"] for r in json.loads(out)["results"]}


def main():
    wush = sys.argv[1]
    ref, fast = losses(wush, []), losses(wush, ["--runtime"])
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in ("mxfp4", "nvfp4", "int4"):
            ref.update(checkpoint_losses(wush, tmp, fmt, False))
            fast.update(checkpoint_losses(wush, tmp, fmt, True))
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
