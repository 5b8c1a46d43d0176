#!/usr/bin/env python3
"""Writes the inputs of the Rust and Go model examples: a two-layer MLP (fc1: 256 -> 512, ReLU,
fc2: 512 -> 256) as safetensors files that `wush quantize` reads.

    python3 bindings/examples/tiny_model.py OUT_DIR
    wush quantize --weights OUT_DIR/weights.safetensors --activations OUT_DIR/activations.safetensors \
        --format mxfp4 --transform wush --out OUT_DIR/checkpoint.safetensors

weights.safetensors holds fc1 (512 x 256) and fc2 (256 x 512), F32; activations.safetensors
holds each layer's calibration inputs under the layer's name (fc1: 512 x 256; fc2: ReLU of fc1's
float output on those tokens, 512 x 512), F32. Seeded Gaussian weights and LLM-like
activations (a few outlier channels, correlated neighbours), standard library only.
"""
import json
import math
import pathlib
import random
import struct
import sys

D_IN, D_HID, N_TOK = 256, 512, 512


def write_safetensors(path, tensors):
    """tensors: name -> (rows, cols, flat list of floats), stored as F32."""
    header, blobs, offset = {}, [], 0
    for name, (rows, cols, values) in tensors.items():
        blob = struct.pack(f"<{len(values)}f", *values)
        header[name] = {"dtype": "F32", "shape": [rows, cols], "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)  # 8-byte aligned data section
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def main():
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(31)
    w1 = [rng.gauss(0, 1 / math.sqrt(D_IN)) for _ in range(D_HID * D_IN)]
    w2 = [rng.gauss(0, 1 / math.sqrt(D_HID)) for _ in range(D_IN * D_HID)]
    outliers = set(rng.sample(range(D_IN), 6))
    x = []
    for _ in range(N_TOK):
        prev = 0.0
        for c in range(D_IN):
            v = 0.6 * prev + rng.gauss(0, 1)  # neighbouring channels correlate
            prev = v
            x.append(v * (12.0 if c in outliers else 1.0))
    h = []
    for t in range(N_TOK):
        xt = x[t * D_IN:(t + 1) * D_IN]
        for o in range(D_HID):
            wo = w1[o * D_IN:(o + 1) * D_IN]
            h.append(max(0.0, sum(a * b for a, b in zip(xt, wo))))
    write_safetensors(out / "weights.safetensors", {"fc1": (D_HID, D_IN, w1), "fc2": (D_IN, D_HID, w2)})
    write_safetensors(out / "activations.safetensors", {"fc1": (N_TOK, D_IN, x), "fc2": (N_TOK, D_HID, h)})
    print(f"tiny_model: wrote {out}/weights.safetensors and {out}/activations.safetensors")


if __name__ == "__main__":
    main()
