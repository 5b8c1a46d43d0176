"""Shared pieces of the Python interoperability tests (tests/python).

The independent side of every comparison lives here: PyPI `safetensors` (the reference reader and
writer, Hugging Face's Rust implementation) and `numpy` implementations of the block formats
written from their rules (docs/BLOCK_FORMATS.md, docs/CHECKPOINT.md), not from libwush's code.

Usage of every test script: SCRIPT --wush PATH/TO/wush --dump PATH/TO/wush_interop_dump
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import unittest

try:
    import numpy as np
    import safetensors
    import safetensors.numpy
except ImportError as e:  # a missing dependency is a failure, never a skip
    print("FAILED: the Python interoperability tests need numpy and safetensors from PyPI (%s); "
          "run scripts/install-deps.sh, which installs them into .devdeps/venv" % e, file=sys.stderr)
    sys.exit(1)

WUSH = None
DUMP = None


def parse_args():
    global WUSH, DUMP
    p = argparse.ArgumentParser()
    p.add_argument("--wush", required=True)
    p.add_argument("--dump", required=True)
    args, rest = p.parse_known_args()
    WUSH, DUMP = args.wush, args.dump
    return [sys.argv[0]] + rest


def main():
    argv = parse_args()
    unittest.main(argv=argv, verbosity=2)


class TempDirTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="wush_pytest_")
        self.tmp = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def path(self, name):
        return os.path.join(self.tmp, name)


def run_wush(*args, expect_ok=True):
    p = subprocess.run([WUSH, *map(str, args)], capture_output=True, text=True)
    if expect_ok and p.returncode != 0:
        raise AssertionError("wush %s exited %d: %s" % (" ".join(map(str, args)), p.returncode, p.stderr[-2000:]))
    return p


def run_dump(*args, expect_ok=True):
    p = subprocess.run([DUMP, *map(str, args)], capture_output=True, text=True)
    if expect_ok and p.returncode != 0:
        raise AssertionError("wush_interop_dump %s exited %d: %s %s" % (" ".join(map(str, args)), p.returncode,
                                                                        p.stdout[-2000:], p.stderr[-2000:]))
    return json.loads(p.stdout) if p.stdout.strip() else {"status": None, "stderr": p.stderr}


def unhex(s):
    return bytes.fromhex(s)


def raw_tensors(path):
    """{name: (dtype, shape, bytes)} as the reference implementation parses the file."""
    with open(path, "rb") as f:
        data = f.read()
    return {name: (t["dtype"], list(t["shape"]), bytes(t["data"])) for name, t in safetensors.deserialize(data)}


def raw_header(path):
    """The JSON header, parsed with Python's json (independent of both safetensors readers)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n))


def save_tensors(path, tensors, metadata=None):
    """Writes {name: (dtype, np.ndarray)} with the safetensors package. dtype "BF16" takes the
    raw uint16 bit patterns (numpy has no bfloat16), through the package's low-level serializer."""
    if all(dt != "BF16" for dt, _ in tensors.values()):
        safetensors.numpy.save_file({k: np.array(a, order="C") for k, (dt, a) in tensors.items()}, path,
                                    metadata=metadata)
        return
    names = {"BF16": "bfloat16", "F32": "float32", "F16": "float16", "U8": "uint8", "I8": "int8",
             "I16": "int16", "U16": "uint16", "I32": "int32", "U32": "uint32", "I64": "int64", "U64": "uint64",
             "F64": "float64", "BOOL": "bool"}
    keep = {k: np.array(a, order="C") for k, (dt, a) in tensors.items()}  # (not ascontiguousarray: it makes 0-d 1-d)
    if hasattr(safetensors, "TensorSpec"):  # safetensors >= 0.8
        specs = {k: safetensors.TensorSpec(dtype=names[dt], shape=list(keep[k].shape), data_ptr=keep[k].ctypes.data,
                                           data_len=keep[k].nbytes) for k, (dt, _) in tensors.items()}
    else:
        specs = {k: {"dtype": names[dt], "shape": list(keep[k].shape), "data": keep[k].tobytes()}
                 for k, (dt, _) in tensors.items()}
    safetensors.serialize_file(specs, path, metadata=metadata)


# ---- element and scale types, from their definitions -------------------------------------------

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def e2m1_decode(codes):
    codes = np.asarray(codes, dtype=np.int64)
    v = E2M1[codes & 7]
    return np.where(codes & 8, -v, v)


def e2m1_rne(v):
    """Codes (0..15) of the E2M1 values nearest to v, ties to the even code, saturating at 6;
    the sign bit follows the sign of v (so -0.0 gives code 8)."""
    v = np.asarray(v, dtype=np.float64)
    a = np.abs(v)[..., None]
    d = np.abs(a - E2M1)
    best = d.min(axis=-1, keepdims=True)
    idx = np.arange(8)
    score = np.where(d == best, idx % 2, 2)  # among the (at most two) nearest, the even code
    code = np.argmin(score, axis=-1)
    return code | np.where(np.signbit(v), 8, 0)


def unpack_nibbles(packed, n_cols):
    """(rows, n_cols/2) bytes -> (rows, n_cols) codes: element 2k low nibble, 2k+1 high nibble."""
    packed = np.asarray(packed, dtype=np.uint8).reshape(-1, n_cols // 2)
    out = np.empty((packed.shape[0], n_cols), dtype=np.int64)
    out[:, 0::2] = packed & 0x0F
    out[:, 1::2] = packed >> 4
    return out


def pack_nibbles(codes):
    codes = np.asarray(codes, dtype=np.uint8)
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)


def e8m0_decode(b):
    b = np.asarray(b, dtype=np.float64)
    return np.where(b == 255, np.nan, np.exp2(b - 127))


def _e4m3_table():
    vals = []
    for b in range(0x7F):  # 0x7F is NaN
        e, m = b >> 3, b & 7
        vals.append(m / 8 * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    return np.array(vals)


E4M3 = _e4m3_table()  # E4M3[byte] for the non-negative finite bytes 0x00..0x7E (max 448)


def e4m3_decode(b):
    b = np.asarray(b, dtype=np.int64)
    v = E4M3[np.minimum(b & 0x7F, 0x7E)]
    v = np.where((b & 0x7F) == 0x7F, np.nan, v)
    return np.where(b & 0x80, -v, v)


def e4m3_rne(v):
    """Bytes of the E4M3 values nearest to v >= 0, ties to the even byte, saturating at 448."""
    v = np.asarray(v, dtype=np.float64)
    hi = np.clip(np.searchsorted(E4M3, v), 0, len(E4M3) - 1)  # first table value >= v
    lo = np.maximum(hi - 1, 0)
    dlo, dhi = np.abs(v - E4M3[lo]), np.abs(E4M3[hi] - v)
    pick = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    return np.where(v >= 448.0, 0x7E, pick).astype(np.uint8)


def bf16_decode(bits):
    return (np.asarray(bits, dtype=np.uint32) << 16).view(np.float32)


def bf16_rne(v):
    """float64 -> the nearest bfloat16 (8 significant bits, ties to even), as float64."""
    v = np.asarray(v, dtype=np.float64)
    m, e = np.frexp(v)  # v = m * 2^e, 0.5 <= |m| < 1
    return np.ldexp(np.round(np.ldexp(m, 8)), e - 8)  # np.round: half to even


def bf16_bits(v):
    """float32-exact bfloat16 values -> their uint16 bit patterns."""
    f = np.asarray(v, dtype=np.float32)
    assert np.all((f.view(np.uint32) & 0xFFFF) == 0), "not exactly representable in bfloat16"
    return (f.view(np.uint32) >> 16).astype(np.uint16)


def hadamard(g):
    """Normalized Sylvester Hadamard matrix."""
    h = np.array([[1.0]])
    while h.shape[0] < g:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(g)


# ---- the block formats (docs/BLOCK_FORMATS.md), float64 reference quantizers ----------------------

GROUP = {"mxfp4": 32, "nvfp4": 16, "int4": 32}
FACTOR = {"mxfp4": 1.0 / 3.0, "nvfp4": 1.0 / 10.0, "int4": 1.0}


def quantize_reference(fmt, x):
    """x (rows, d_in) float32 values -> (codes (rows, d_in) int, scale bytes (rows, d_in/G, nbytes))
    by the default scale rule of `fmt`."""
    x = np.asarray(x, dtype=np.float64)
    g = GROUP[fmt]
    rows, d_in = x.shape
    xg = x.reshape(rows, d_in // g, g)
    amax = np.abs(xg).max(axis=-1, keepdims=True)
    if fmt == "mxfp4":
        _, ex = np.frexp(amax)
        e = np.clip(ex - 1, -127, 127)  # floor(log2(amax)) from the exponent bits
        codes = e2m1_rne(xg * 3.0 / np.exp2(e))
        codes = np.where(amax == 0, 0, codes)
        scale = np.where(amax == 0, 0, e + 127).astype(np.uint8)
    elif fmt == "nvfp4":
        sb = e4m3_rne(amax * 10.0 / 6.0)
        s = E4M3[sb]
        with np.errstate(divide="ignore", invalid="ignore"):
            codes = np.where(s == 0, 0, e2m1_rne(np.where(s == 0, 0, xg * 10.0 / np.where(s == 0, 1, s))))
        scale = sb.astype(np.uint8)
    elif fmt == "int4":
        rms = np.sqrt(np.mean(xg * xg, axis=-1, keepdims=True))
        s = bf16_rne(2.5139305785684 * 2.0 / 15.0 * rms)
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.clip(np.floor(xg / np.where(s == 0, 1, s)), -8, 7).astype(np.int64)
        codes = np.where(s == 0, 0, q & 0xF)
        scale = bf16_bits(s.astype(np.float32)).astype("<u2").view(np.uint8).reshape(rows, d_in // g, 2)
    else:
        raise ValueError(fmt)
    return codes.reshape(rows, d_in), scale.reshape(rows, d_in // g, -1)


def decode_reference(fmt, codes, scale_bytes, d_in):
    """Decoded values (float64) of stored codes (packed bytes) and scale bytes, by the format rules:
    element value x group scale x per-tensor factor."""
    g = GROUP[fmt]
    c = unpack_nibbles(codes, d_in)
    rows = c.shape[0]
    if fmt == "int4":
        q = np.where(c >= 8, c - 16, c)
        bits = np.frombuffer(np.asarray(scale_bytes, dtype=np.uint8).tobytes(), dtype="<u2")
        s = bf16_decode(bits).astype(np.float64).reshape(rows, d_in // g, 1)
        return ((q.reshape(rows, d_in // g, g) + 0.5) * s).reshape(rows, d_in)
    s = np.asarray(scale_bytes, dtype=np.uint8).reshape(rows, d_in // g, 1)
    s = e8m0_decode(s) if fmt == "mxfp4" else e4m3_decode(s)
    return (e2m1_decode(c).reshape(rows, d_in // g, g) * s * FACTOR[fmt]).reshape(rows, d_in)


def layer_data(seed, d_out, d_in, n_tokens, outliers=True):
    """A float32 weight and activations with a few outlier channels (so that transforms matter)."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((d_out, d_in)) / np.sqrt(d_in)).astype(np.float32)
    x = rng.standard_normal((n_tokens, d_in))
    if outliers:
        x[:, 3] *= 25.0
        x[:, d_in // 2 + 1] *= 12.0
    return w, x.astype(np.float32)
