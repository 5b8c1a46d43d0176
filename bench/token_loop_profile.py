#!/usr/bin/env python3
"""Decode --decode greedy tokens of a quantize-model folder through wush.load_quantized after a
--prefill-token prompt, and print ms per token: the loop alone (no timers, no hooks), for a
profiler to attribute (docs/PERFORMANCE.md, "Whose time a token is"):

  perf record -g -o perf.data python3 bench/token_loop_profile.py --quantized OUT --text heldout.txt
  perf report -i perf.data --no-children --sort pid -g none     # the main thread's pid, then
  perf report -i perf.data --no-children --tid PID --sort dso -g none

bench/bench_token_loop.py is the benchmark (engines side by side, medians); this is its wush
engine's decode loop bare.
"""
import argparse
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quantized", required=True, help="a quantize-model folder")
    ap.add_argument("--text", required=True, help="text whose first --prefill tokens are the prompt")
    ap.add_argument("--prefill", type=int, default=64)
    ap.add_argument("--decode", type=int, default=600)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    import torch
    from transformers import AutoTokenizer
    import wush
    torch.set_num_threads(a.threads)
    tok = AutoTokenizer.from_pretrained(a.quantized, local_files_only=True)
    model = wush.load_quantized(a.quantized)
    ids = tok(pathlib.Path(a.text).read_text(encoding="utf-8"))["input_ids"][:a.prefill]
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=True)
        past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
        t0 = time.perf_counter()
        for _ in range(a.decode):
            out = model(nxt, past_key_values=past, use_cache=True)
            past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
        t1 = time.perf_counter()
    print(f"decode {a.decode} tokens after {len(ids)}: {(t1 - t0) / a.decode * 1e3:.2f} ms/token, "
          f"{a.decode / (t1 - t0):.1f} tok/s")


if __name__ == "__main__":
    main()
