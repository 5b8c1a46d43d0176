#!/usr/bin/env python3
"""A prompt's pass through one decoder block's library layers against torch's own linear: each
library layer of block --block of a loaded quantize-model folder (a group's one layer for its
parts) at m = --tokens, against torch.nn.functional.linear with a weight of the same shape and
dtype, in the same run. Blocks of --calls calls of each alternate (so a busy machine's noise falls
on both), --blocks times; per call, milliseconds: the medians, and torch's time over ours (above 1:
ours faster). The rest of a prefill (attention, norms) is torch's in both engines of
bench_token_loop.py, so these layers are where wush-bf16 and bfloat16 differ.

  python3 bench/bench_prefill_layers.py --quantized OUT --library build/release/capi/libwush.so \
      [--dtype bfloat16] [--tokens 512] [--threads 2] [--block 0]
"""
import argparse
import os
import pathlib
import statistics
import sys
import time


def block_layers(block):
    """(name, library layer) for each library layer of a decoder block, a group's once."""
    from wush.quantized_linear import QuantizedLinear, QuantizedPart
    seen, out = set(), []
    for name, m in block.named_modules():
        layer = m if isinstance(m, QuantizedLinear) else m.group.layer if isinstance(m, QuantizedPart) else None
        if layer is None or id(layer) in seen:
            continue
        seen.add(id(layer))
        if isinstance(m, QuantizedPart):
            name = "+".join(part.rsplit(".", 1)[-1] for part, _ in m.group.parts)
        out.append((name, layer))
    return out


def alternating(fa, fb, calls, blocks):
    """Median seconds per call of fa and of fb, blocks of `calls` alternating."""
    ta, tb = [], []
    for f in (fa, fb):  # warm-up
        f()
    for _ in range(blocks):
        for f, into in ((fa, ta), (fb, tb)):
            t0 = time.perf_counter()
            for _ in range(calls):
                f()
            into.append((time.perf_counter() - t0) / calls)
    return statistics.median(ta), statistics.median(tb)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quantized", required=True, help="a quantize-model folder")
    p.add_argument("--library", help="libwush.so to load (else the package's or WUSH_LIBRARY's)")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--threads", type=int, default=2, help="torch's and the library's threads")
    p.add_argument("--block", type=int, default=0, help="which decoder block's layers")
    p.add_argument("--calls", type=int, default=5, help="calls per timed block")
    p.add_argument("--blocks", type=int, default=9, help="timed blocks of each, alternating")
    a = p.parse_args()
    if a.library:
        os.environ["WUSH_LIBRARY"] = a.library
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
    import torch
    import wush
    torch.set_num_threads(a.threads)
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[a.dtype]
    model = wush.load_quantized(a.quantized, dtype=dtype)
    block = model.model.layers[a.block]
    g = torch.Generator().manual_seed(0)
    print(f"{a.quantized}: block {a.block}, m = {a.tokens}, {a.dtype}, {a.threads} thread(s), torch "
          f"{torch.__version__}, {a.blocks} blocks x {a.calls} calls, medians")
    print(f"{'layer':>24} {'d_in x d_out':>12} | {'wush ms':>8} {'torch ms':>8} {'torch/wush':>10}")
    ours_total = torch_total = 0.0
    with torch.no_grad():
        for name, layer in block_layers(block):
            x = torch.randn(1, a.tokens, layer.in_features, generator=g).to(dtype)
            w = torch.randn(layer.out_features, layer.in_features, generator=g).to(dtype)
            ours, theirs = alternating(lambda: layer(x), lambda: torch.nn.functional.linear(x, w), a.calls,
                                       a.blocks)
            ours_total += ours
            torch_total += theirs
            shape = f"{layer.in_features}x{layer.out_features}"
            print(f"{name:>24} {shape:>12} | {1e3 * ours:8.3f} {1e3 * theirs:8.3f} {theirs / ours:10.2f}x",
                  flush=True)
    print(f"{'block':>24} {'':>12} | {1e3 * ours_total:8.3f} {1e3 * torch_total:8.3f} "
          f"{torch_total / ours_total:10.2f}x")


if __name__ == "__main__":
    main()
