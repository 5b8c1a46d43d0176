"""``python -m wush``: whole Hugging Face models from local folders.

  python -m wush quantize-model MODEL_DIR --calib FILE [--calib FILE2 ...] --format mxfp4 --transform wush \
      --method gptq --out OUT_DIR [--export wush|fp_quant|auto] [--embeddings keep|bf16]
  python -m wush run OUT_DIR --prompt TEXT            # a causal model: generated text
  python -m wush run OUT_DIR --sentences FILE         # an encoder: sentence embeddings
  python -m wush eval-model MODEL_DIR --text FILE --quantized OUT_DIR [--quantized OUT_DIR2 ...]

MODEL_DIR is a local folder (config.json, weights, tokenizer), or a GGUF file of a causal model (or
a folder holding one .gguf file), which transformers dequantizes (the tokenizer from the file);
nothing is downloaded. OUT_DIR is
loaded with wush.load_quantized, or, after `import wush`, with transformers' own
AutoModel.from_pretrained(OUT_DIR) / SentenceTransformer(OUT_DIR): its quantized layers run on
libwush's runtime (without `import wush`, transformers refuses the folder). Errors are reported
as one line (exit status 2).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import time
from typing import Any, Dict, List, Optional, Tuple
from . import _core


def _load(model_dir: str):
    import torch
    from . import gguf as wg
    from . import torch as wt
    gguf_file = wg.find_file(model_dir)
    if gguf_file:  # a GGUF file, or a folder holding one: dequantized by transformers
        wg.read_header(gguf_file)
        return wg.load(gguf_file)
    model = wt.load_float_model(model_dir, torch.float32)  # first: it names a missing folder as such
    return model, _tokenizer(model_dir)


def _tokenizer(folder: str):
    """The folder's tokenizer; ValueError naming the folder when it cannot be loaded (the
    tokenizers library raises plain Exceptions, e.g. for a tokenizer.json that is not JSON)."""
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - whatever the tokenizer's files make it raise
        raise ValueError(f"{_core.printable(folder)}: cannot load its tokenizer: {type(e).__name__}: "
                         f"{_core.printable(' '.join(str(e).split())[:300], backslash=False)}") from None


def _read_text(path: str) -> str:
    """A text file's content; ValueError naming the file when it is not UTF-8."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise ValueError(f"{_core.printable(path)}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def _positive(v: int, what: str) -> int:
    if v < 1:
        raise ValueError(f"{what} must be a positive number, got {v}")
    return v


def token_batches(tok, path: str, seq_len: int, max_samples: int, batch_size: int = 4, stats: Optional[Dict] = None) -> List:
    """Consecutive windows of ``seq_len`` tokens of the file, at most ``max_samples`` of them.
    ``stats``, when given, receives what was used: windows, tokens, and the file's tokens."""
    _positive(seq_len, "the sequence length (--seq-len)")
    _positive(max_samples, "the number of samples (--max-samples)")
    ids = tok(_read_text(path), return_tensors="pt", add_special_tokens=False)["input_ids"][0]
    n = min(len(ids) // seq_len, max_samples)
    if n == 0:
        raise ValueError(f"{_core.printable(path)}: fewer than {seq_len} tokens")
    windows = ids[: n * seq_len].reshape(n, seq_len)
    if stats is not None:
        stats.update({"file": path, "unit": "windows", "samples": n, "available": len(ids) // seq_len,
                      "tokens": n * seq_len, "file_tokens": len(ids)})
    return [windows[i:i + batch_size] for i in range(0, n, batch_size)]


def sentence_batches(tok, path: str, seq_len: int, max_samples: int, batch_size: int = 8,
                     stats: Optional[Dict] = None) -> List[Dict[str, Any]]:
    """Encoders: the file's non-empty lines, tokenized in padded batches (dicts of keyword
    arguments for the model), at most ``max_samples`` lines of at most ``seq_len`` tokens.
    ``stats``, when given, receives what was used: lines, tokens, and the file's lines."""
    _positive(seq_len, "the sequence length (--seq-len)")
    _positive(max_samples, "the number of samples (--max-samples)")
    all_lines = read_sentences(path)
    lines = all_lines[:max_samples]
    batches = [dict(tok(lines[i:i + batch_size], padding=True, truncation=True, max_length=seq_len,
                        return_tensors="pt")) for i in range(0, len(lines), batch_size)]
    if stats is not None:
        stats.update({"file": path, "unit": "lines", "samples": len(lines), "available": len(all_lines),
                      "tokens": sum(int(b["attention_mask"].sum()) for b in batches)})
    return batches


def _calibration_line(kind: str, st: Dict[str, Any], a: argparse.Namespace, cap: Optional[int] = None) -> str:
    """One line saying which part of a text file the command used (the --max-samples cap, or this
    file's share ``cap`` of it)."""
    share = f" (this file's share {cap})" if cap is not None and cap != a.max_samples else ""
    capped = f", capped by --max-samples {a.max_samples}{share}" if st["samples"] < st["available"] else ""
    if st["unit"] == "windows":
        return (f"{kind}: {st['samples']} windows of {a.seq_len} tokens ({st['tokens']} tokens) of the "
                f"{st['file_tokens']} tokens of {_core.printable(st['file'])}{capped}")
    return (f"{kind}: the first {st['samples']} of the {st['available']} non-empty lines of {_core.printable(st['file'])}, "
            f"{st['tokens']} tokens (at most {a.seq_len} per line){capped}")


def calibration_documents(make, tok, a: argparse.Namespace) -> Tuple[List, List[List[int]], Dict[str, Any]]:
    """The calibration batches of every --calib file (``make``: token_batches or sentence_batches),
    --max-samples shared out between the files (the first ones one more when they do not divide);
    per batch, each sequence's document (its file's index); and what was used: one file's stats,
    or for several their files and summed counts. Prints a line per file."""
    files = a.calib
    if a.max_samples < len(files):
        raise ValueError(f"--max-samples {a.max_samples} is fewer than the {len(files)} --calib files: give each "
                         f"file at least one sample")
    batches: List = []
    documents: List[List[int]] = []
    every: List[Dict[str, Any]] = []
    for i, path in enumerate(files):
        st: Dict[str, Any] = {}
        share = a.max_samples // len(files) + (1 if i < a.max_samples % len(files) else 0)
        part = make(tok, path, a.seq_len, share, stats=st)
        batches += part
        documents += [[i] * len(b["input_ids"] if isinstance(b, dict) else b) for b in part]
        _note("quantize-model", _calibration_line("calibration", st, a, share))
        every.append(st)
    if len(every) == 1:
        return batches, documents, every[0]
    total = {k: sum(st[k] for st in every) for k in ("samples", "available", "tokens")}
    return batches, documents, {"file": list(files), "unit": every[0]["unit"], **total}


def read_sentences(path: str) -> List[str]:
    lines = [ln.strip() for ln in _read_text(path).split("\n") if ln.strip()]
    if not lines:
        raise ValueError(f"{_core.printable(path)}: no non-empty line")
    return lines


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


def mean_kl(reference, model, batches) -> Tuple[float, float]:
    """The mean per-token KL divergence KL(reference || model) of the next-token distributions
    (in float64, at every position of each window), as the mean over the windows (the documents)
    of each window's per-token mean, and that mean's standard error over the windows (NaN for
    one window)."""
    import torch
    per_window: List[float] = []
    with torch.no_grad():
        for b in batches:
            p = torch.log_softmax(reference(b).logits.double(), dim=-1)
            q = torch.log_softmax(model(b).logits.double(), dim=-1)
            per_window += (p.exp() * (p - q)).sum(-1).mean(-1).tolist()
    n = len(per_window)
    mean = sum(per_window) / n
    se = math.sqrt(sum((v - mean) ** 2 for v in per_window) / (n - 1) / n) if n > 1 else float("nan")
    return mean, se


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _note(cmd: str, text: str) -> None:
    print(f"python -m wush {cmd}: {_core.printable(text, backslash=False)}", file=sys.stderr)


def cmd_quantize(a: argparse.Namespace) -> int:
    from . import torch as wt
    # Everything that can be refused from the arguments alone, before the model is read and
    # before anything is written.
    wt.check_out_dir(a.out, a.model_dir)  # not the model folder, inside it or around it
    kind, search = _core.parse_transform_spec(a.transform)  # wush+s: the per-block search
    transform = kind.name.lower()
    if a.validation and not search:
        raise ValueError("--validation needs --transform wush+s")
    export, passed_over = wt.resolve_export(a.format, transform, a.export)
    if a.group_inputs and export == "fp_quant":
        if a.export == "fp_quant":
            raise ValueError("--group-inputs writes grouped layers, which the fp_quant layout does not hold "
                             "(one layer per module): use --export wush")
        export, passed_over = "wush", "grouped layers (--group-inputs)"
    if a.fp_quant_pseudo and export != "fp_quant":
        raise ValueError("--fp-quant-pseudo writes the fp_quant layout: it needs --export fp_quant"
                         + (f" ({passed_over})" if passed_over else ""))
    _positive(a.seq_len, "the sequence length (--seq-len)")
    _positive(a.max_samples, "the number of samples (--max-samples)")
    _positive(a.search_tokens, "the search's tokens (--search-tokens)")
    if a.layers:
        wt.compile_pattern(a.layers)
    wt.check_export(a.format, transform, export)  # before the model is even read
    from . import gguf as wg
    gguf_file = wg.find_file(a.model_dir)
    if gguf_file is None:
        return _quantize(a, a.model_dir, transform, search, export, passed_over, None)
    # A GGUF file (or a folder holding one): refused in one line when transformers cannot read it,
    # else written out as a Hugging Face folder beside --out, quantized from there, then removed.
    source = wg.read_header(gguf_file)
    types = ", ".join(f"{n} x{c}" for n, c in source["tensor_types"].items())
    _note("quantize-model", f"{gguf_file}: GGUF, architecture {source['architecture']}, tensors {types}: "
                            f"dequantized to float32 by transformers")
    with wg.staged_folder(gguf_file, a.out) as folder:
        return _quantize(a, folder, transform, search, export, passed_over, source)


def _quantize(a: argparse.Namespace, model_dir: str, transform: str, search: bool, export: str,
              passed_over: Optional[str], source: Optional[Dict[str, Any]]) -> int:
    """quantize-model from the Hugging Face folder ``model_dir`` (``a.model_dir``, or the folder
    a GGUF file ``source`` was written to)."""
    from . import torch as wt
    model, tok = _load(model_dir)
    if passed_over:  # said once the arguments and the folder passed, so that a refusal stays one line
        _note("quantize-model", f"{a.format} with {transform} transforms: the fp_quant layout does not fit "
                                f"({passed_over}); writing the libwush checkpoint alone (--export wush), "
                                f"which wush.load_quantized loads")
    if getattr(model, "wush_missing_keys", None):
        read = source["file"] if source else a.model_dir
        _note("quantize-model", f"note: tensors not in {_core.printable(read)}, initialized at random by transformers: "
                                f"{', '.join(model.wush_missing_keys[:6])}"
                                f"{' ...' if len(model.wush_missing_keys) > 6 else ''}")
    pattern = wt.with_output_layer(model, a.layers) if a.lm_head else a.layers
    selected = wt.select_linears(model, pattern)
    if not selected:
        raise ValueError(wt.selection_error(model, pattern))
    wt.check_stored_layers(model_dir, selected, model=model)  # in seconds, not after the calibration
    causal = wt.is_causal(model)
    make = token_batches if causal else sentence_batches
    batches, documents, cal_stats = calibration_documents(make, tok, a)
    validation = None
    if a.validation:
        val_stats: Dict[str, Any] = {}
        validation = make(tok, a.validation, a.seq_len, a.max_samples, stats=val_stats)
        _note("quantize-model", _calibration_line("validation", val_stats, a))
    t0 = time.time()
    res = wt.quantize_model(model, batches, format=a.format, transform=transform, method=a.method, layers=pattern,
                            damping=a.damping, progress=a.progress, search=search, search_tokens=a.search_tokens,
                            validation_batches=validation, search_guard=not a.no_search_guard,
                            documents=documents if search and len(a.calib) > 1 else None,
                            group_inputs=a.group_inputs)
    t1 = time.time()
    info = wt.save_quantized(model, res, a.out, model_dir=model_dir, pseudo=a.fp_quant_pseudo, export=export,
                             embeddings=a.embeddings)
    if info["fp_quant_refused"]:
        print(f"python -m wush quantize-model: note: the fp_quant layout was not written ({info['fp_quant_refused']}); "
              f"the folder holds the libwush checkpoint, which wush.load_quantized runs", file=sys.stderr)
    kinds = sorted(set(info["layers"].values()))
    guarded = {n: g for n, g in res.guard.items() if g is not None}
    if guarded:
        # What the search's per-layer guard compared and kept, one line per layer (as `wush quantize`).
        print(res.guard_table(), file=sys.stderr)
    unguarded = [n for n, g in res.guard.items() if g is None] if search else []
    if unguarded:
        _note("quantize-model", f"note: no guard ran on {len(unguarded)} searched layers "
                                f"({'--no-search-guard' if a.no_search_guard else 'no held-out tokens'})")
    if guarded:
        # The layers the guard could not decide on, in one line (as `wush quantize`).
        undecided = res.undecided
        print("undecided: " + (f"{len(undecided)} layer{'s' if len(undecided) != 1 else ''} (a candidate lower by "
                               f"more than 1% but within the noise; add validation text): " + ", ".join(undecided)
                               if undecided else "none"), file=sys.stderr)
    kept: Dict[str, int] = {}
    for g in guarded.values():
        kept[g["kept"]] = kept.get(g["kept"], 0) + 1
    print(json.dumps({"layers": len(res.layers), "format": a.format, "transform": a.transform, "method": a.method,
                      "layer_transforms": kinds, "export": info["export"],
                      "calibration_tokens": cal_stats["tokens"],
                      "calibration": {k: cal_stats[k] for k in ("file", "unit", "samples", "available", "tokens")},
                      "guard_kept": kept if search else None,
                      "guard_hold_out": sorted({g["source"] for g in guarded.values()}) if search else None,
                      "guard_undecided": res.undecided if search else None,
                      "quantize_s": round(t1 - t0, 3), "peak_rss_mib": round(_peak_rss_mib(), 1), "out": a.out,
                      **({"gguf": source} if source else {})}))
    return 0


def _folder_info(folder: str) -> Dict[str, Any]:
    from .torch import INFO_FILE
    path = os.path.join(folder, INFO_FILE)
    if not os.path.exists(path):
        return {}
    try:
        with open(path) as f:
            info = json.load(f)
    except ValueError as e:  # not JSON, not UTF-8
        raise ValueError(f"{_core.printable(path)}: not a wush_quantization.json ({e})") from None
    if not isinstance(info, dict):
        raise ValueError(f"{_core.printable(path)}: not a wush_quantization.json (not a JSON object)")
    return info


def _checkpoint_labels(folder: str, info: Dict[str, Any]) -> Dict[str, Any]:
    """What the folder's checkpoint holds, read from its layers (not from wush_quantization.json,
    which a copied or edited folder may contradict): the format and method of its layers, the
    transform kind most of them use (a searched folder's guard may keep others on some; all are
    counted in "transforms"), and the search flag of the info file when that file describes this
    checkpoint."""
    from collections import Counter
    from .torch import CHECKPOINT_FILE
    formats, methods, kinds = Counter(), Counter(), Counter()
    with _core.Checkpoint.open(os.path.join(folder, CHECKPOINT_FILE)) as ck:
        for name in ck.layer_names():
            t, q = ck.load_layer(name)
            with t, q:
                fmt, method, _, _ = q.info()
                kinds[t.info()[0].name.lower()] += 1
                formats[fmt.name.lower()] += 1
                methods[method.name.lower()] += 1
    label = lambda c: "/".join(sorted(c)) if len(c) > 1 else next(iter(c), None)  # noqa: E731
    transform = kinds.most_common(1)[0][0] if kinds else None
    same = (info.get("format"), info.get("transform"), info.get("method")) == (label(formats), transform,
                                                                              label(methods))
    return {"format": label(formats), "transform": transform, "method": label(methods),
            "transforms": dict(kinds), "search": bool(info.get("search")) and same}


def cmd_run(a: argparse.Namespace) -> int:
    import torch
    from . import torch as wt
    if (a.prompt is None) == (a.sentences is None):
        raise ValueError("give one of --prompt (a causal model) or --sentences FILE (an encoder)")
    _positive(a.max_new_tokens, "--max-new-tokens")
    wt.parse_device(a.device)  # an unknown device, before the folder is read
    model = wt.load_quantized(a.folder, device=a.device)  # first: it names a missing folder as such
    tok = _tokenizer(a.folder)
    causal = wt.is_causal(model)
    if a.prompt is not None:
        if not causal:
            raise ValueError(f"{_core.printable(a.folder)} holds an encoder ({type(model).__name__}); use --sentences FILE")
        enc = tok(a.prompt, return_tensors="pt").to(a.device)
        t0 = time.time()
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=a.max_new_tokens, do_sample=False,
                                 pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
        dt = time.time() - t0
        new = out[0, enc["input_ids"].shape[1]:]
        print(json.dumps({"model": type(model).__name__, "prompt": a.prompt,
                          "generated": tok.decode(new, skip_special_tokens=True), "new_tokens": int(new.numel()),
                          "seconds": round(dt, 3)}))
        return 0
    if causal:
        raise ValueError(f"{_core.printable(a.folder)} holds a causal model ({type(model).__name__}); use --prompt TEXT")
    sentences = read_sentences(a.sentences)
    t0 = time.time()
    e = wt.embed(model, tok, sentences, wt.pooling_config(a.folder))
    dt = time.time() - t0
    cos = torch.nn.functional.normalize(e, dim=-1)
    print(json.dumps({"model": type(model).__name__, "sentences": len(sentences), "dim": e.shape[1],
                      "pooling": wt.pooling_config(a.folder), "seconds": round(dt, 3),
                      "cosine": [[round(v, 4) for v in row] for row in (cos @ cos.T).tolist()] if len(sentences) <= 16 else None,
                      "embeddings_head": [[round(v, 5) for v in row[:4]] for row in e.tolist()[:4]]}))
    return 0


def cmd_eval(a: argparse.Namespace) -> int:
    import torch
    from . import torch as wt
    from .groups import is_quantized
    _positive(a.seq_len, "the sequence length (--seq-len)")
    _positive(a.max_samples, "the number of samples (--max-samples)")
    model, tok = _load(a.model_dir)
    causal = wt.is_causal(model)
    out: Dict[str, Any] = {"model": type(model).__name__}
    if causal:
        batches = token_batches(tok, a.text, a.seq_len, a.max_samples)
        out.update({"metric": "perplexity; KL(unquantized || quantized) per token, mean over windows",
                    "tokens": sum(b.numel() for b in batches), "windows": sum(b.shape[0] for b in batches),
                    "ppl": perplexity(model, batches)})
    else:
        sentences = read_sentences(a.text)[: a.max_samples]
        ref = wt.embed(model, tok, sentences, wt.pooling_config(a.model_dir), max_length=a.seq_len)
        out.update({"metric": "embedding cosine to the unquantized model", "sentences": len(sentences)})
    reference = model if causal else None  # the KL's reference, kept beside each quantized model
    del model
    rows = []
    for folder in a.quantized or []:
        qm = wt.load_quantized(folder)
        row: Dict[str, Any] = {"folder": folder, **_checkpoint_labels(folder, _folder_info(folder)),
                               "quantized_layers": sum(is_quantized(m) for m in qm.modules())}
        if causal:
            row["ppl"] = perplexity(qm, batches)
            row["kl"], row["kl_se"] = mean_kl(reference, qm, batches)
        else:
            e = wt.embed(qm, tok, sentences, wt.pooling_config(folder), max_length=a.seq_len)
            c = torch.nn.functional.cosine_similarity(e, ref, dim=-1)
            row.update({"cosine_mean": c.mean().item(), "cosine_min": c.min().item()})
        rows.append(row)
        del qm
    if rows:
        out["quantized"] = rows
        # The one-folder keys of earlier versions.
        out["quantized_layers"] = rows[0]["quantized_layers"]
        if causal:
            out["ppl_quantized"] = rows[0]["ppl"]
        else:
            out["cosine_quantized"] = rows[0]["cosine_mean"]
    print(json.dumps(out))
    if a.table:
        print(_table(out), file=sys.stderr)
    return 0


def _table(out: Dict[str, Any]) -> str:
    head = "| model | method | transform | format | " + ("perplexity | KL (± s.e.) |" if "ppl" in out
                                                        else "cosine mean | cosine min |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    if "ppl" in out:
        lines.append(f"| unquantized | - | - | - | {out['ppl']:.4f} | 0 |")
    else:
        lines.append("| unquantized | - | - | - | 1 | 1 |")
    for r in out.get("quantized", []):
        vals = (f"{r['ppl']:.4f} | {r['kl']:.4g} ± {r['kl_se']:.2g} |" if "ppl" in r
                else f"{r['cosine_mean']:.4f} | {r['cosine_min']:.4f} |")
        transform = f"{r['transform']}+s" if r.get("search") else r["transform"]  # as quantize-model names it
        name = _core.printable(os.path.basename(r["folder"].rstrip("/")))
        lines.append(f"| {name} | {r['method']} | {transform} | {r['format']} | {vals}")
    return "\n".join(lines)


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line, ``PROG: error: MESSAGE`` (exit status 2), like the command's
    other errors; ``--help`` shows the usage."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see --help)\n")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's default in its help, ``(default: ...)``; none for flags and missing values."""

    def _get_help_string(self, action: argparse.Action) -> str:
        h = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "(default" in h or action.required:
            return h
        return h + " (default: %(default)s)"


FORMATS = ["mxfp4", "nvfp4", "int4", "mxfp4_ocp"]


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m wush", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("quantize-model", help="quantize a local Hugging Face model folder",
                       formatter_class=_HelpFormatter)
    q.add_argument("model_dir", help="a local Hugging Face model folder (read only), or a GGUF file (or a folder "
                                     "holding one), which transformers dequantizes")
    q.add_argument("--calib", required=True, action="append",
                   help="calibration text file (causal: tokenized as one stream, cut into --max-samples windows of "
                        "--seq-len tokens; encoders: one sentence per line, the first --max-samples lines). "
                        "Repeated, each file is a document of its own (--max-samples shared out between them): "
                        "wush+s's guard then holds out whole files and scores the WUSH layers fit without them")
    q.add_argument("--format", default="mxfp4", choices=FORMATS,
                   help="4-bit format (the fp_quant layout holds mxfp4, and nvfp4 with identity/hadamard)")
    q.add_argument("--transform", default="wush", choices=["identity", "hadamard", "wush", "wush+s"],
                   help="wush+s: WUSH with the per-block search (scale, signs, fall-backs)")
    q.add_argument("--search-tokens", type=int, default=1024,
                   help="wush+s: calibration tokens per layer the search scores its candidates on")
    q.add_argument("--validation", default=None,
                   help="wush+s: text the calibration does not see, for the search's per-layer guard")
    q.add_argument("--no-search-guard", action="store_true",
                   help="wush+s without --validation: no per-layer guard (by default it holds out half of the "
                        "calibration windows or sentences that each layer's token sample drew from)")
    q.add_argument("--method", default="rtn", choices=["rtn", "gptq"], help="how the weights are rounded")
    q.add_argument("--out", required=True,
                   help="the output folder: new, empty, or one written by quantize-model (replaced whole), outside "
                        "MODEL_DIR; written beside it under a .wush-* name and renamed into place when complete")
    q.add_argument("--export", default="wush", choices=["wush", "fp_quant", "auto"],
                   help="wush: the quantized layers once, in the libwush checkpoint (any format x transform; "
                        "quantization_config names quant_method 'wush': AutoModel/SentenceTransformer load it after "
                        "`import wush`, transformers refuses it without); fp_quant: also in the fp_quant layout, "
                        "for transformers' GPU fp_quant loader (mxfp4, nvfp4 with identity/hadamard); auto: fp_quant "
                        "where that layout holds the format and transform, else wush (said on stderr)")
    q.add_argument("--embeddings", default="keep", choices=["keep", "bf16"],
                   help="the input embedding table as MODEL_DIR stores it, or in bfloat16 (half of float32's "
                        "size, on disk and, when not tied to the output layer, in memory)")
    q.add_argument("--fp-quant-pseudo", action="store_true",
                   help="write bf16 dqweight (transformers' pseudo-quantized fp_quant path) instead of packed codes")
    q.add_argument("--layers", default=None,
                   help="regex of linear layer names (default: every linear layer inside the repeated blocks)")
    q.add_argument("--lm-head", action="store_true",
                   help="also quantize the output layer (the LM head) in --format; a head tied to the input "
                        "embeddings is then written untied: the embeddings stay (as --embeddings says) for the input")
    q.add_argument("--group-inputs", action="store_true",
                   help="build the layers that read one input (a block's q/k/v, its gate/up) as one layer each: WUSH "
                        "from their concatenated weights, one activation quantization and one GEMM per token for all "
                        "of them (checkpoint format version 3)")
    q.add_argument("--damping", type=float, default=None, help="GPTQ's damping (default: the library's)")
    q.add_argument("--seq-len", type=int, default=128,
                   help="tokens per calibration window (causal) or at most per sentence (encoders)")
    q.add_argument("--max-samples", type=int, default=128,
                   help="calibration windows (causal) or lines (encoders) used, at most; the rest of the file is "
                        "not read (the command prints what it used)")
    q.add_argument("--progress", action="store_true", help="progress bars (tqdm)")
    q.set_defaults(fn=cmd_quantize)
    r = sub.add_parser("run", help="load a quantized folder (wush.load_quantized) and run it",
                       formatter_class=_HelpFormatter)
    r.add_argument("folder", help="a folder written by quantize-model")
    r.add_argument("--prompt", default=None, help="causal models: the prompt to continue (greedy)")
    r.add_argument("--max-new-tokens", type=int, default=32, help="causal models: tokens generated")
    r.add_argument("--sentences", default=None, help="encoders: a file of sentences, one per line")
    r.add_argument("--device", default="cpu", help="cpu, or cuda[:i] with libwush's CUDA backend")
    r.set_defaults(fn=cmd_run)
    e = sub.add_parser("eval-model", help="a model and its quantized folders, side by side, through the runtime",
                       formatter_class=_HelpFormatter)
    e.add_argument("model_dir", help="the unquantized model folder, or its GGUF file (or a folder holding one)")
    e.add_argument("--text", required=True,
                   help="held-out text (causal: perplexity over its tokens; encoders: one sentence per line)")
    e.add_argument("--quantized", action="append", default=None, help="an output folder of quantize-model (repeatable)")
    e.add_argument("--seq-len", type=int, default=128, help="tokens per window (causal) or at most per sentence")
    e.add_argument("--max-samples", type=int, default=64, help="windows (causal) or lines (encoders) used, at most")
    e.add_argument("--table", action="store_true", help="also print a markdown table to stderr")
    e.set_defaults(fn=cmd_eval)
    return p


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    from ._core import WushError
    try:
        from transformers.utils import logging as hf_logging
        hf_logging.disable_progress_bar()  # one bar per loaded folder is noise for a command
    except ImportError:
        pass
    try:
        return a.fn(a)
    except Exception as e:  # noqa: BLE001 - a command reports, it does not print tracebacks
        # What wush refuses is a ValueError, WushError or OSError; anything else was raised by
        # another library on input it could not take (a damaged file, say) and is named by type.
        # One line, whatever the message holds (another library's text, a path with control
        # characters: the paths wush names are escaped already, hence no backslash doubling).
        msg = _core.printable(" ".join(str(e).split()), backslash=False)
        if not isinstance(e, (ValueError, WushError, OSError)):
            msg = f"{type(e).__name__}: {msg}"
        print(f"python -m wush {a.cmd}: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
