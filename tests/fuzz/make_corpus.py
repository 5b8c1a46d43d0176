#!/usr/bin/env python3
"""Writes the seed corpus of the checkpoint fuzzer (tests/fuzz/corpus).

Usage: make_corpus.py PATH/TO/wush OUT_DIR     (with numpy + safetensors: .devdeps/venv/bin/python3)

Seeds: small valid checkpoints written by `wush quantize` (every format and transform kind, one
and two layers), small valid safetensors files written by the PyPI package, and invalid variants
of them, each breaking one rule of docs/CHECKPOINT.md. The committed corpus was made with this script;
regression inputs found by the fuzzer are added by hand (named regress-*).

The names say what the replay test (wush_fuzz_checkpoint_replay) expects of each file:
  valid-ck-*  a valid checkpoint (opens, every layer loads);
  valid-st-*  a valid safetensors file, not a checkpoint;
  bad-ck-*    a valid safetensors file that the checkpoint reader rejects;
  bad-st-*    rejected already as a safetensors file.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import safetensors.numpy

WUSH, OUT = sys.argv[1], sys.argv[2]
os.makedirs(OUT, exist_ok=True)
TMP = tempfile.mkdtemp(prefix="wush_corpus_")


def write(name, data):
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)


def split(data):
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + n]), data[8 + n:]


def join(header, body, pad=True, raw_header=None):
    text = raw_header if raw_header is not None else json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + body


def quantize(name, fmt, transform, layers, dtype="f32"):
    rng = np.random.default_rng(len(name))
    w = {n: (rng.standard_normal((d_out, d_in)) / 4).astype(np.float32) for n, (d_out, d_in) in layers.items()}
    x = {n: rng.standard_normal((8, d_in)).astype(np.float32) for n, (d_out, d_in) in layers.items()}
    wp, xp, out = (os.path.join(TMP, name + s) for s in ("_w.safetensors", "_x.safetensors", ".safetensors"))
    safetensors.numpy.save_file(w, wp)
    safetensors.numpy.save_file(x, xp)
    subprocess.run([WUSH, "quantize", "--weights", wp, "--activations", xp, "--format", fmt, "--transform",
                    transform, "--transform-dtype", dtype, "--out", out], check=True, capture_output=True)
    with open(out, "rb") as f:
        data = f.read()
    write("valid-ck-" + name, data)
    return data


# ---- valid checkpoints --------------------------------------------------------------------------
base = quantize("nvfp4-h", "nvfp4", "h", {"L": (2, 16)})
quantize("nvfp4-wush-2layers", "nvfp4", "wush", {"model.layers.0.q": (2, 16), "model.layers.0.k": (1, 32)})
quantize("mxfp4-i", "mxfp4", "i", {"blk.0": (1, 32)})
quantize("mxfp4-wush-bf16", "mxfp4", "wush", {"w": (2, 32)}, dtype="bf16")
quantize("mxfp4_ocp-r", "mxfp4_ocp", "r", {"w": (1, 32)})
quantize("int4-wus", "int4", "wus", {"w": (1, 32)})

# ---- valid plain safetensors files (not checkpoints) --------------------------------------------
def save(name, tensors, metadata=None):
    p = os.path.join(TMP, name)
    safetensors.numpy.save_file(tensors, p, metadata=metadata)
    with open(p, "rb") as f:
        write("valid-st-" + name, f.read())


save("mixed", {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, np.float16),
               "c": np.array([1, 2], np.uint8), "d": np.array(7, np.int64), "e": np.zeros((0, 4), np.float32)},
     {"k": "v"})
save("empty-metadata", {"t": np.ones(2, np.float32)}, {})
save("no-tensors", {}, {"only": "metadata"})

# ---- invalid variants of the valid NVFP4 checkpoint, one broken rule each --------------------------
h, body = split(base)
meta = h["__metadata__"]


def variant(name, fn, pad=True):
    hh = json.loads(json.dumps(h))
    b = fn(hh)  # may edit hh in place; returns the new data section, or anything else to keep it
    b = b if isinstance(b, (bytes, bytearray)) else None
    write("bad-" + name, join(hh, body if b is None else b, pad))


def set_meta(key, value):
    def f(hh):
        if value is None:
            del hh["__metadata__"][key]
        else:
            hh["__metadata__"][key] = value
    return f


def patch(data, at, new):
    return data[:at] + new + data[at + len(new):]


def scale_byte(v):
    def f(hh):
        b = bytearray(body)
        b[hh["L.scales"]["data_offsets"][0]] = v
        return bytes(b)
    return f


def zero_transform(hh):
    b = bytearray(body)
    s, e = hh["L.transform"]["data_offsets"]
    b[s:e] = bytes(e - s)
    return bytes(b)


def factor(v):
    def f(hh):
        b = bytearray(body)
        s = hh["L.tensor_scale"]["data_offsets"][0]
        b[s:s + 4] = struct.pack("<f", v)
        return bytes(b)
    return f


variant("ck-format-version-4", set_meta("format_version", "4"))
variant("ck-no-format-version", set_meta("format_version", None))
variant("ck-unknown-meta-key", set_meta("L.colour", "red"))
variant("ck-format-uppercase", set_meta("L.format", "NVFP4"))
variant("ck-format-int4-mismatch", set_meta("L.format", "int4"))
variant("ck-group-size-32", set_meta("L.group_size", "32"))
variant("ck-damping-comma", set_meta("L.damping", "0,01"))
variant("ck-damping-negative", set_meta("L.damping", "-1"))
variant("ck-transform-kind", set_meta("L.transform", "fancy"))
variant("ck-method-awq", set_meta("L.method", "awq"))
variant("ck-nan-scale", scale_byte(0x7F))
variant("ck-singular-transform", zero_transform)
variant("ck-nan-transform", lambda hh: patch(body, hh["L.transform"]["data_offsets"][0], struct.pack("<f", float("nan"))))
variant("ck-wrong-factor", factor(0.25))
variant("ck-codes-i8", lambda hh: hh["L.codes"].update(dtype="I8"))
variant("ck-codes-1d", lambda hh: hh["L.codes"].update(shape=[16]))


def rename_layer(new):
    def f(hh):
        for s in (".codes", ".scales", ".tensor_scale", ".transform"):
            hh[new + s] = hh.pop("L" + s)
        for k in ("format", "group_size", "transform", "method", "damping"):
            hh["__metadata__"][new + "." + k] = hh["__metadata__"].pop("L." + k)
    return f


variant("ck-layer-name-reserved-suffix", rename_layer("x.scales"))
variant("ck-layer-name-nul", rename_layer("a\u0000b"))
variant("st-missing-scales", lambda hh: hh.pop("L.scales"))  # leaves a gap in the data too
variant("ck-stray-tensor", lambda hh: hh.update({"stray": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]}}))
variant("st-overlap", lambda hh: hh["L.scales"].update(data_offsets=[0, 2]))
variant("st-shape-overflow", lambda hh: hh["L.codes"].update(shape=[2 ** 40, 2 ** 40]))
variant("st-f4-odd", lambda hh: hh.update({"odd": {"dtype": "F4", "shape": [3], "data_offsets": [0, 0]}}))
variant("st-unknown-dtype", lambda hh: hh["L.codes"].update(dtype="Q4"))
variant("st-extra-field", lambda hh: hh["L.codes"].update(extra=1))
variant("st-offsets-reversed", lambda hh: hh["L.codes"].update(data_offsets=[16, 0]))
variant("st-trailing-bytes", lambda hh: body + b"\0")
write("valid-ck-no-padding", join(h, body, pad=False))  # alignment is not required

write("bad-st-truncated", base[:len(base) // 2])
write("bad-st-short", base[:5])
write("bad-st-header-too-long", struct.pack("<Q", 100_000_001) + base[8:])
write("bad-st-header-past-end", struct.pack("<Q", len(base)) + base[8:])
write("bad-st-duplicate-key", join(None, body, raw_header=b'{"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},'
                                                      b'"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}'))
write("bad-st-utf8", join(None, b"", raw_header=b'{"\xff\xfe":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}'))
write("bad-st-too-deep", join(None, b"", raw_header=b'{"a":{"shape":[[[1]]]}}'))
write("bad-st-not-object", join(None, b"", raw_header=b"[1,2,3]"))
write("bad-st-metadata-number", join(None, b"", raw_header=b'{"__metadata__":{"k":1}}'))
print("wrote %d files to %s" % (len(os.listdir(OUT)), OUT))
