#!/usr/bin/env python3
"""A real decoder's token loop: prefill and greedy decode with the KV cache, the same token ids and
thread count for every engine, each engine in its own process (its memory its own).

  python3 bench/bench_token_loop.py --gguf MODEL.gguf --quantized OUT_DIR --text PROMPT.txt \
      [--library build/release/capi/libwush.so] [--threads 2] [--prefill 512] [--decode 128] \
      [--reps 3] [--engines llama.cpp,float32,bfloat16,wush,wush-bf16] [--llama-python VENV/bin/python] \
      [--isa auto|avx2|avx512_vnni|scalar]

Engines:
- llama.cpp: the GGUF file itself through llama-cpp-python (built from its public source, in a
  venv of its own: bench/token_loop_llama_cpp.sh makes one; --llama-python names its python;
  skipped, said so, when there is none);
- float32, bfloat16: the GGUF file dequantized by transformers (wush.gguf.load), torch's CPU
  kernels;
- wush: OUT_DIR (a `python -m wush quantize-model` folder of the same GGUF) through
  wush.load_quantized, its linear layers W4A4 on libwush's CPU runtime, the rest torch float32;
- wush-bf16: the same with the rest (attention, norms, embeddings) in torch bfloat16, as the
  bfloat16 engine runs it: the like-for-like row for prefill against bfloat16 on CPUs whose
  bfloat16 is native (AVX-512 BF16, AMX); where torch emulates bfloat16 it is slow, as that
  engine is.

The prompt is the first --prefill tokens of --text (the quantized folder's tokenizer, which is the
GGUF's); decode runs --decode greedy steps from there. Per engine: prefill tokens/s and decode
tokens/s (medians of --reps runs, each a fresh cache), the first 16 decoded ids (the table says
how many lead as float32's do), resident memory after the runs (VmRSS) and peak (VmHWM). For wush, one more decode
run with timers around its quantized layers and the LM head gives the per-token decomposition
(layers, LM head, everything else: attention, norms, embeddings, sampling, torch's dispatch); the
timers' own cost lands in "everything else". Of the layers' and the head's time, the part inside
the library's C calls is timed too: the rest of theirs is the Python wrapper's.

Prints one JSON line per engine, then a markdown table with decode speed relative to float32 and
to llama.cpp (the targets of docs/PERFORMANCE.md). Run it on an otherwise idle machine.
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
ENGINES = ("llama.cpp", "float32", "bfloat16", "wush", "wush-bf16")


def memory_mib():
    """(VmRSS, VmHWM) of this process in MiB."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1]) / 1024.0
    return round(out.get("VmRSS", 0.0), 1), round(out.get("VmHWM", 0.0), 1)


def prompt_ids(a):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(a.quantized, local_files_only=True)
    ids = tok(pathlib.Path(a.text).read_text(encoding="utf-8"))["input_ids"]
    if len(ids) < a.prefill:
        raise SystemExit(f"{a.text}: {len(ids)} tokens, fewer than --prefill {a.prefill}")
    return ids[:a.prefill]


def torch_loop(model, ids, decode, after_prefill=None):
    """One prefill of ``ids`` and ``decode`` greedy steps: (prefill s, decode s, decoded ids). The
    prefill computes the logits of its last token alone, as transformers' generate() and llama.cpp
    do (every position's would be a 49152-wide product per prompt token). ``after_prefill()``,
    if given, runs between the two timed parts."""
    import torch
    x = torch.tensor([ids])
    with torch.no_grad():
        t0 = time.perf_counter()
        out = model(x, use_cache=True, logits_to_keep=1)
        t1 = time.perf_counter()
        if after_prefill is not None:
            after_prefill()
            t1 = time.perf_counter()
        past, nxt, got = out.past_key_values, out.logits[:, -1:].argmax(-1), []
        for _ in range(decode):
            got.append(int(nxt))
            o = model(nxt, past_key_values=past, use_cache=True)
            past, nxt = o.past_key_values, o.logits[:, -1:].argmax(-1)
        t2 = time.perf_counter()
    return t1 - t0, t2 - t1, got


class Timers:
    """Wall time inside the quantized layers and inside the LM head (forward pre/post hooks), and,
    of both, inside the library's calls (each layer's ctypes run functions wrapped)."""

    def __init__(self, model):
        from wush.groups import is_quantized
        self.reset()
        self.handles = []
        self.wrapped = []
        head = model.get_output_embeddings()
        for m in model.modules():
            # The head first: quantized (--lm-head), it is a library layer too.
            kind = "lm_head" if m is head else "layers" if is_quantized(m) else None
            if kind:
                self.handles.append(m.register_forward_pre_hook(self._start))
                self.handles.append(m.register_forward_hook(self._stop(kind)))
        for rt in library_layers(model):
            for name in ("_run_fn", "_run_bias_fn"):
                self.wrapped.append((rt, name, getattr(rt, name)))
                setattr(rt, name, self._timed(getattr(rt, name)))

    def reset(self):
        self.total = {"layers": 0.0, "lm_head": 0.0, "library": 0.0}

    def _start(self, *_):
        self.t0 = time.perf_counter()

    def _stop(self, kind):
        def hook(*_):
            self.total[kind] += time.perf_counter() - self.t0
        return hook

    def _timed(self, fn):
        def call(*args):
            t0 = time.perf_counter()
            status = fn(*args)
            self.total["library"] += time.perf_counter() - t0
            return status
        return call

    def remove(self):
        for h in self.handles:
            h.remove()
        for rt, name, fn in self.wrapped:
            setattr(rt, name, fn)


def library_layers(model):
    """The library layers (``_core.Linear``) of a loaded model, the LM head's included: a group's
    parts share their group's one."""
    out = {}
    for m in model.modules():
        kind = type(m).__name__
        layer = m if kind == "QuantizedLinear" else m.group.layer if kind == "QuantizedPart" else None
        if layer is not None:
            out[id(layer.runtime)] = layer.runtime
    return list(out.values())


def layer_counts(model):
    """The quantized layers besides the LM head, and the library calls they make per token: the
    parts of a group (`--group-inputs`) share one call."""
    head = model.get_output_embeddings()
    layers = [m for m in model.modules() if m is not head and type(m).__name__ in ("QuantizedLinear", "QuantizedPart")]
    head_calls = 1 if type(head).__name__ == "QuantizedLinear" else 0
    return len(layers), len(library_layers(model)) - head_calls


def measure_torch(a, ids):
    import torch
    import wush
    import wush.gguf as wg
    wush_engine = a.engine in ("wush", "wush-bf16")
    if wush_engine:
        if a.isa != "auto":  # the library's kernel set, before the layers are prepared for it
            from wush import _core, device
            device.cpu_context().set_parameter("CPU_ISA", int(_core.CpuIsa[a.isa.upper()]))
        model = wush.load_quantized(a.quantized, dtype=torch.bfloat16 if a.engine == "wush-bf16" else torch.float32)
    else:
        model, _ = wg.load(a.gguf, {"float32": torch.float32, "bfloat16": torch.bfloat16}[a.engine])
    torch_loop(model, ids[:16], 2)  # warm-up
    runs = [torch_loop(model, ids, a.decode) for _ in range(a.reps)]
    row = {"engine": a.engine, "threads": a.threads, "prefill_tokens": len(ids), "decode_tokens": a.decode,
           "prefill_tok_s": [round(len(ids) / r[0], 1) for r in runs],
           "decode_tok_s": [round(a.decode / r[1], 2) for r in runs], "first_ids": runs[0][2][:16]}
    if wush_engine:
        from wush import device
        row["isa"] = device.cpu_context().cpu_isa
        timers = Timers(model)
        _, d, _ = torch_loop(model, ids, a.decode, timers.reset)  # decode steps only
        timers.remove()
        per = {k: round(1e3 * v / a.decode, 3) for k, v in timers.total.items()}
        per["total"] = round(1e3 * d / a.decode, 3)
        per["other"] = round(per["total"] - per["layers"] - per["lm_head"], 3)
        row["decode_ms_per_token"] = per
        row["quantized_layers"], row["layer_calls"] = layer_counts(model)
    row["rss_mib"], row["peak_rss_mib"] = memory_mib()
    return row


def measure_llama_cpp(a, ids):
    import numpy as np
    from llama_cpp import Llama
    llm = Llama(model_path=a.gguf, n_ctx=len(ids) + a.decode + 8, n_threads=a.threads, n_threads_batch=a.threads,
                n_batch=len(ids), verbose=False)

    n_vocab = llm.n_vocab()

    def last_logits():
        # The batch's last row (llama.cpp computes logits for it alone, as in its own generation).
        return np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(n_vocab,))

    def loop(prompt, decode):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt)
        t1 = time.perf_counter()
        got = []
        for _ in range(decode):
            nxt = int(np.argmax(last_logits()))
            got.append(nxt)
            llm.eval([nxt])
        return t1 - t0, time.perf_counter() - t1, got

    loop(ids[:16], 2)  # warm-up
    runs = [loop(ids, a.decode) for _ in range(a.reps)]
    row = {"engine": "llama.cpp", "threads": a.threads, "prefill_tokens": len(ids), "decode_tokens": a.decode,
           "prefill_tok_s": [round(len(ids) / r[0], 1) for r in runs],
           "decode_tok_s": [round(a.decode / r[1], 2) for r in runs], "first_ids": runs[0][2][:16]}
    row["rss_mib"], row["peak_rss_mib"] = memory_mib()
    return row


def child(a):
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    ids = json.loads(a.ids)
    if a.engine == "llama.cpp":
        return measure_llama_cpp(a, ids)
    import torch
    torch.set_num_threads(a.threads)
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    return measure_torch(a, ids)


def run_engine(a, engine, ids):
    python = a.llama_python if engine == "llama.cpp" else sys.executable
    cmd = [python, __file__, "--engine", engine, "--ids", json.dumps(ids), "--gguf", a.gguf, "--quantized",
           a.quantized, "--text", a.text, "--threads", str(a.threads), "--decode", str(a.decode), "--reps",
           str(a.reps), "--isa", a.isa]
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    if a.library:
        env["WUSH_LIBRARY"] = os.path.abspath(a.library)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode:
        print(f"bench_token_loop: {engine} failed:\n{r.stderr[-2000:]}", file=sys.stderr)
        return None
    row = json.loads(r.stdout.strip().splitlines()[-1])
    print(json.dumps(row), flush=True)
    return row


def table(rows):
    med = {r["engine"]: (statistics.median(r["prefill_tok_s"]), statistics.median(r["decode_tok_s"])) for r in rows}
    lines = ["| engine | prefill tok/s | decode tok/s (min-max) | decode vs float32 | decode vs llama.cpp | "
             "RSS MiB (peak) | leading ids as float32 |", "|---|---|---|---|---|---|---|"]
    ref = next((r["first_ids"] for r in rows if r["engine"] == "float32"), None)
    for r in rows:
        p, d = med[r["engine"]]
        vs = [f"{d / med[e][1]:.2f}x" if e in med else "-" for e in ("float32", "llama.cpp")]
        agree = "-" if ref is None else f"{next((i for i, (x, y) in enumerate(zip(r['first_ids'], ref)) if x != y), len(ref))}/{len(ref)}"
        name = f"{r['engine']} ({r['isa']})" if "isa" in r else r["engine"]
        lines.append(f"| {name} | {p:.1f} | {d:.2f} ({min(r['decode_tok_s'])}-{max(r['decode_tok_s'])}) | "
                     f"{vs[0]} | {vs[1]} | {r['rss_mib']} ({r['peak_rss_mib']}) | {agree} |")
    for wush_row in (r for r in rows if "decode_ms_per_token" in r):
        per = wush_row["decode_ms_per_token"]
        lines.append("")
        lines.append(f"{wush_row['engine']} decode, ms per token (timed run): {per['total']} = "
                     f"{wush_row['quantized_layers']} quantized layers ({wush_row['layer_calls']} library calls) "
                     f"{per['layers']} + LM head {per['lm_head']} + "
                     f"everything else {per['other']}; of layers and head, inside the library's calls "
                     f"{per['library']}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", required=True, help="the decoder's GGUF file")
    ap.add_argument("--quantized", required=True, help="a quantize-model folder of that GGUF file")
    ap.add_argument("--text", required=True, help="text whose first --prefill tokens are the prompt")
    ap.add_argument("--library", default=None, help="libwush.so (else as `import wush` finds it)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--isa", default="auto", choices=("auto", "avx2", "avx512_vnni", "scalar"),
                    help="libwush's CPU kernels for the wush engine (as `wush bench --isa`)")
    ap.add_argument("--llama-python", default=None,
                    help="the python of a venv with llama-cpp-python (bench/token_loop_llama_cpp.sh)")
    ap.add_argument("--engine", default=None, help=argparse.SUPPRESS)  # a child process: one engine
    ap.add_argument("--ids", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.engine:
        print(json.dumps(child(a)))
        return 0
    if a.library:
        os.environ["WUSH_LIBRARY"] = os.path.abspath(a.library)
    engines = [e for e in a.engines.split(",") if e]
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        ap.error(f"unknown engine(s) {unknown}; choose from {ENGINES}")
    if "llama.cpp" in engines and not a.llama_python:
        print("bench_token_loop: llama.cpp skipped (no --llama-python; bench/token_loop_llama_cpp.sh builds one)",
              file=sys.stderr)
        engines.remove("llama.cpp")
    ids = prompt_ids(a)
    rows = []
    for e in engines:
        row = run_engine(a, e, ids)
        if row is None:
            return 1
        rows.append(row)
    print(f"\n{len(ids)}-token prompt, {a.decode} greedy tokens, {a.threads} threads, medians of {a.reps}")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
