#!/usr/bin/env python3
"""Writes the inputs of every linear layer of all-MiniLM-L6-v2's encoder blocks on held-out text
(python/tools/minilm_eval.py's model, text and capture) as raw float32 files DIR/NAME.<rows>x<cols>.f32,
the form tests/unit/test_quantize_tc_rates.cpp reads (WUSH_TC_RATE_DIR=DIR).

    .devdeps/venv-torch/bin/python python/tools/minilm_activations.py DIR [--tokens 2048]
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import minilm_eval as me  # noqa: E402

PATTERN = r"encoder\.layer\.\d+\.(attention\.self\.query|attention\.output\.dense|intermediate\.dense|output\.dense)$"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir")
    p.add_argument("--tokens", type=int, default=2048)
    args = p.parse_args()
    out = pathlib.Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        model, tok = me.load_model(pathlib.Path(d))
        batch = me.spread_windows(tok, me.HELDOUT_MODULES, args.tokens, 128)
        for name, a in me.capture(model, [batch], PATTERN).items():
            a = a.astype("float32", copy=False)
            a.tofile(out / f"{name}.{a.shape[0]}x{a.shape[1]}.f32")
            print(name, a.shape)
    return 0


if __name__ == "__main__":
    sys.exit(main())
