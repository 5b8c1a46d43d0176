#!/usr/bin/env python3
"""Regression tests of the `wush` program's handling of bad input, each of which once misbehaved:
per-command --help was an "unknown argument"; a run too large for memory aborted on
std::bad_alloc; --damping abc silently meant 0; quantize checked --out only after all the work;
eval --checkpoint read a weights file of another shape out of bounds; --json did not escape
names; inspect printed control characters from names raw.

Usage: test_cli_robustness.py PATH/TO/wush
"""
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
import time

failures = 0


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print("FAIL:", what)


def run(*args, timeout=120):
    p = subprocess.run([WUSH, *args], capture_output=True, timeout=timeout)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace"), p.stdout


def write_f32(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, (shape, values) in tensors.items():
        blob = struct.pack("<%df" % len(values), *values)
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def gauss(n, rng):
    return [rng.gauss(0.0, 1.0) for _ in range(n)]


WUSH = sys.argv[1]
rng = random.Random(7)

# --help of each command prints that command's usage, exit 0.
for cmd in ("eval", "quantize", "inspect", "export", "bench", "formats"):
    rc, out, err, _ = run(cmd, "--help")
    check(rc == 0 and out.startswith("usage: wush " + cmd), f"wush {cmd} --help: rc {rc}, {out[:80]!r} {err[:80]!r}")

# Too large for memory: said before it starts, no abort (a signal gives a negative returncode).
rc, out, err, _ = run("eval", "--layers", "small_256x512", "--calib-tokens", "100000000000")
check(rc == 1 and "memory" in err, f"huge --calib-tokens: rc {rc}, {err!r}")

# Strict numbers.
for bad in ("abc", "0.1x", "", "nan", "1e999"):
    rc, out, err, _ = run("eval", "--layers", "small_256x512", "--damping", bad)
    check(rc == 2 and "--damping" in err, f"--damping {bad!r}: rc {rc}, {err!r}")

with tempfile.TemporaryDirectory() as tmp:
    # A layer name with a quote, a backslash and an escape sequence.
    name = 'blk"0\\\x1b[31mred'
    d_out, d_in, n = 8, 64, 48
    weights, acts, wrong = (os.path.join(tmp, f) for f in ("w.safetensors", "x.safetensors", "w2.safetensors"))
    write_f32(weights, {name: ((d_out, d_in), gauss(d_out * d_in, rng))})
    write_f32(acts, {name: ((n, d_in), gauss(n * d_in, rng))})
    write_f32(wrong, {name: ((2 * d_out, d_in), gauss(2 * d_out * d_in, rng))})
    ck = os.path.join(tmp, "ck.safetensors")

    # --out is checked before the work.
    start = time.monotonic()
    rc, out, err, _ = run("quantize", "--weights", weights, "--activations", acts, "--format", "mxfp4",
                          "--transform", "wush", "--out", os.path.join(tmp, "missing-dir", "ck.safetensors"))
    check(rc == 1 and "cannot write into" in err, f"quantize into a missing directory: rc {rc}, {err!r}")
    rc, out, err, _ = run("quantize", "--weights", weights, "--activations", acts, "--format", "mxfp4",
                          "--transform", "wush", "--out", tmp)
    check(rc == 1 and "is a directory" in err, f"quantize onto a directory: rc {rc}, {err!r}")

    rc, out, err, _ = run("quantize", "--weights", weights, "--activations", acts, "--format", "mxfp4",
                          "--transform", "wush", "--out", ck)
    check(rc == 0, f"quantize: rc {rc}, {err!r}")

    # inspect: no control characters from the name reach the terminal.
    rc, out, err, raw = run("inspect", ck)
    check(rc == 0 and b"\x1b" not in raw and "blk" in out, f"inspect: rc {rc}, {raw[:300]!r}")

    # eval --checkpoint --json: valid JSON with the exact name.
    rc, out, err, _ = run("eval", "--checkpoint", ck, "--weights", weights, "--activations", acts, "--json")
    try:
        results = json.loads(out)["results"]
        check(rc == 0 and len(results) == 1 and results[0]["layer"] == name, f"eval --json: {out!r}")
        check(isinstance(results[0]["loss"], float) and results[0]["loss"] > 0, f"eval --json loss: {out!r}")
    except (ValueError, KeyError) as e:
        check(False, f"eval --json is not valid JSON ({e}): {out!r}")

    # A weights file of another shape than the checkpoint's layer: a clear error, not a crash.
    rc, out, err, _ = run("eval", "--checkpoint", ck, "--weights", wrong, "--activations", acts)
    check(rc == 1 and "16 x 64" in err and "8 x 64" in err, f"eval --checkpoint, wrong shape: rc {rc}, {err!r}")

print("cli robustness:", "ok" if failures == 0 else f"{failures} failures")
sys.exit(1 if failures else 0)
