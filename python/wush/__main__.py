"""``python -m wush quantize-model`` / ``eval-model``: whole Hugging Face models from local folders.

  python -m wush quantize-model MODEL_DIR --calib FILE --format mxfp4 --transform wush \
      --method gptq --out OUT_DIR [--fp-quant-pseudo]
  python -m wush eval-model MODEL_DIR --text FILE [--quantized OUT_DIR]

MODEL_DIR is a local folder (config.json, safetensors, tokenizer); nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import sys
import time
from typing import List


def _load(model_dir: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, torch_dtype=torch.float32)
    return model.eval(), tok


def token_batches(tok, path: str, seq_len: int, max_samples: int, batch_size: int = 4) -> List:
    """Consecutive windows of ``seq_len`` tokens of the file, at most ``max_samples`` of them."""
    import torch
    with open(path, encoding="utf-8") as f:
        ids = tok(f.read(), return_tensors="pt")["input_ids"][0]
    n = min(len(ids) // seq_len, max_samples)
    if n == 0:
        raise SystemExit(f"{path}: fewer than {seq_len} tokens")
    windows = ids[: n * seq_len].reshape(n, seq_len)
    return [windows[i:i + batch_size] for i in range(0, n, batch_size)]


def perplexity(model, batches) -> float:
    import torch
    nll, count = 0.0, 0
    with torch.no_grad():
        for b in batches:
            logits = model(b).logits.float()
            lp = torch.log_softmax(logits[:, :-1], dim=-1)
            nll -= lp.gather(-1, b[:, 1:, None]).sum().item()
            count += b[:, 1:].numel()
    return math.exp(nll / count)


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def cmd_quantize(a: argparse.Namespace) -> int:
    from . import torch as wt
    model, tok = _load(a.model_dir)
    batches = token_batches(tok, a.calib, a.seq_len, a.max_samples)
    search = a.transform.endswith("+s")  # wush+s: the per-block search
    if a.validation and not search:
        raise SystemExit("python -m wush quantize-model: --validation needs --transform wush+s")
    validation = token_batches(tok, a.validation, a.seq_len, a.max_samples) if a.validation else None
    t0 = time.time()
    res = wt.quantize_model(model, batches, format=a.format, transform=a.transform.removesuffix("+s"),
                            method=a.method, layers=a.layers, damping=a.damping, progress=a.progress,
                            search=search, search_tokens=a.search_tokens, validation_batches=validation)
    t1 = time.time()
    wt.save_quantized(model, res, a.out, model_dir=a.model_dir, pseudo=a.fp_quant_pseudo)
    print(json.dumps({"layers": len(res.layers), "format": a.format, "transform": a.transform, "method": a.method,
                      "calibration_tokens": sum(b.numel() for b in batches), "quantize_s": round(t1 - t0, 3),
                      "peak_rss_mib": round(_peak_rss_mib(), 1), "out": a.out}))
    return 0


def cmd_eval(a: argparse.Namespace) -> int:
    from . import torch as wt
    model, tok = _load(a.model_dir)
    batches = token_batches(tok, a.text, a.seq_len, a.max_samples)
    out = {"tokens": sum(b.numel() for b in batches), "ppl": perplexity(model, batches)}
    if a.quantized:
        import os
        names = wt.load_quantized_layers(model, os.path.join(a.quantized, "wush_checkpoint.safetensors"))
        out["quantized_layers"] = len(names)
        out["ppl_quantized"] = perplexity(model, batches)
    print(json.dumps(out))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m wush", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("quantize-model", help="quantize a local Hugging Face model folder")
    q.add_argument("model_dir")
    q.add_argument("--calib", required=True, help="calibration text file (tokenized with the model's tokenizer)")
    q.add_argument("--format", default="mxfp4", choices=["mxfp4", "nvfp4"])
    q.add_argument("--transform", default="wush", choices=["identity", "hadamard", "wush", "wush+s"],
                   help="wush+s: WUSH with the per-block search (scale, signs, fall-backs)")
    q.add_argument("--search-tokens", type=int, default=1024,
                   help="wush+s: calibration tokens per layer the search scores its candidates on")
    q.add_argument("--validation", default=None,
                   help="wush+s: text the calibration does not see, for the search's per-layer guard")
    q.add_argument("--method", default="rtn", choices=["rtn", "gptq"])
    q.add_argument("--out", required=True)
    q.add_argument("--fp-quant-pseudo", action="store_true",
                   help="write bf16 dqweight (transformers' pseudo-quantized fp_quant path) instead of packed codes")
    q.add_argument("--layers", default=None, help="regex of linear layer names (default: those in the blocks)")
    q.add_argument("--damping", type=float, default=None)
    q.add_argument("--seq-len", type=int, default=128)
    q.add_argument("--max-samples", type=int, default=128)
    q.add_argument("--progress", action="store_true")
    q.set_defaults(fn=cmd_quantize)
    e = sub.add_parser("eval-model", help="perplexity of a model, and of its quantized version")
    e.add_argument("model_dir")
    e.add_argument("--text", required=True)
    e.add_argument("--quantized", default=None, help="an output folder of quantize-model")
    e.add_argument("--seq-len", type=int, default=128)
    e.add_argument("--max-samples", type=int, default=64)
    e.set_defaults(fn=cmd_eval)
    a = p.parse_args(argv)
    return a.fn(a)


if __name__ == "__main__":
    sys.exit(main())
