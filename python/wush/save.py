"""Writing the output folder of a quantized model (:func:`save_quantized`): the libwush
checkpoint, the model's other tensors, config.json and the model folder's other files.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from typing import Any, Dict, List, Optional

import torch
from torch import nn

from . import _core, hf
from ._core import Checkpoint
from .export import check_export
from .folder import CHECKPOINT_FILE, INFO_FILE, WEIGHT_DIRS, WEIGHT_FILES
from .layers import linear_names
from .quantize import QuantizationResult
from .stored import _file_key_prefix, _stored_key, read_folder_tensors
from .whole_folder import _WholeFolder, check_out_dir


EMBEDDINGS = ("keep", "bf16")  # the input embedding table as stored, or in bfloat16


def save_quantized(model: nn.Module, result: QuantizationResult, out_dir: str, model_dir: Optional[str] = None,
                   pseudo: bool = False, max_shard_bytes: int = 2 << 30, export: str = "wush",
                   embeddings: str = "keep") -> Dict[str, Any]:
    """Writes the complete output folder:

    - ``wush_checkpoint.safetensors``: the libwush checkpoint (transforms + packed weights),
      written first and always; :func:`load_quantized` runs the model from it;
    - ``model-0000i-of-0000n.safetensors`` + ``model.safetensors.index.json``: with
      ``model_dir``, every tensor stored in that folder, under its stored name and dtype, bit for
      bit, except the quantized layers' weights; without it, the model's state_dict. With
      ``export="wush"`` (the default, and where the library's fp_quant export refuses this
      model) each quantized layer's ``weight`` is a two-element int64 tensor ``[d_out, d_in]``:
      the layer lives in the checkpoint alone (the weights are stored once), and transformers
      without ``wush`` refuses the folder (a size mismatch) instead of building random layers
      (:mod:`wush.hf`). With ``export="fp_quant"`` the quantized layers in the fp_quant layout
      named after their modules (``<module>.qweight``, ``.scales``,
      ``.forward_hadamard_matrix``, ``.backward_hadamard_matrix``, ``.weight_global_scale``,
      ``.act_global_scale``), or with ``pseudo`` the bf16 ``<module>.dqweight`` instead of
      qweight/scales. ``embeddings="bf16"`` stores the input embedding table in bfloat16;
    - ``config.json``: ``model_dir``'s (else the model's config) with ``quantization_config``:
      ``quant_method`` ``"wush"`` (:func:`wush.hf.folder_config`), or fp_quant's with
      ``modules_to_not_convert`` = exactly the linear layers left unquantized;
    - every other file of ``model_dir`` (tokenizer, generation config, sentence-transformers
      modules such as ``modules.json`` and ``1_Pooling/``), copied; not other serializations of
      the weights (``WEIGHT_FILES``, ``WEIGHT_DIRS``);
    - ``wush_quantization.json``: what was done (format, transform, method, layers, the export).

    A quantized layer that was tied to another tensor (``result.tied``: an LM head tied to the
    input embeddings) is written untied: that tensor stays stored, the layer's own ``weight``
    entry is its ``[d_out, d_in]`` stand-in (or its fp_quant tensors), and config.json says
    ``"tie_word_embeddings": false``.

    Returns that last file's content. Refuses, before writing, what :func:`check_export` and
    :func:`check_out_dir` refuse (``out_dir`` the model folder, inside it or containing it, a
    folder not written by save_quantized, one that cannot be written).

    The folder appears whole or not at all: it is written beside ``out_dir`` under a temporary
    name (``.wush-`` and 8 hex digits), synced, and renamed to ``out_dir``; an existing
    ``out_dir`` is replaced whole (renamed aside, then deleted), its symbolic links never
    written through. docs/PYTHON.md ("After a crash") lists what a killed process leaves.
    """
    check_out_dir(out_dir, model_dir)
    check_export(result.format, result.transform, export)
    if embeddings not in EMBEDDINGS:
        raise ValueError(f"unknown embeddings {embeddings!r}; choose one of {', '.join(EMBEDDINGS)}")
    with _WholeFolder(out_dir) as tmp:
        return _write_folder(model, result, tmp, model_dir, pseudo, max_shard_bytes, export, embeddings)


def _write_folder(model: nn.Module, result: QuantizationResult, out_dir: str, model_dir: Optional[str],
                  pseudo: bool, max_shard_bytes: int, export: str, embeddings: str) -> Dict[str, Any]:
    """save_quantized's files, into the new folder ``out_dir``."""
    from safetensors.torch import load_file
    ck_path = os.path.join(out_dir, CHECKPOINT_FILE)
    result.checkpoint().write(ck_path)
    fpq: Dict[str, torch.Tensor] = {}
    qcfg: Dict[str, Any] = {}
    refused = None
    if export == "fp_quant":
        with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
            exp, cfg = os.path.join(tmp, "fpq.safetensors"), os.path.join(tmp, "qcfg.json")
            try:
                with Checkpoint.open(ck_path) as ck:
                    ck.export_fp_quant(exp, cfg)
                fpq = load_file(exp)
                with open(cfg) as f:
                    qcfg = json.load(f)["quantization_config"]
            except _core.WushError as e:
                if e.status != _core.Status.ERR_UNSUPPORTED:
                    raise
                # e.g. a search whose guard mixed kinds the export cannot hold: the checkpoint
                # is written and runs; only this layout is refused.
                refused = e.message
                export = "wush"
    modules = result.modules()  # every quantized module (a part of a grouped layer included) -> (d_out, d_in)
    unconverted = sorted(set(n for n in linear_names(model) if n not in modules))
    if model_dir:
        stored = read_folder_tensors(model_dir)
        tensors = dict(stored)
        tied = getattr(result, "tied", {})
        # A tied layer stores no weight of its own: the tensor it shared stays, for its other use.
        prefixes = {name: "" if name in tied else _file_key_prefix(stored, name) for name in modules}
        for name, p in prefixes.items():
            if name not in tied:
                del tensors[p + name + ".weight"]
    else:
        prefixes = {name: "" for name in modules}
        tensors = {k: v for k, v in model.state_dict().items()
                   if not any(k.startswith(n + ".") and not k.endswith(".bias") for n in modules)}
        # Tied weights (lm_head = embeddings) are stored once, as transformers does.
        for k in getattr(model, "_tied_weights_keys", None) or []:
            if isinstance(k, str) and k in tensors and getattr(getattr(model, "config", None), "tie_word_embeddings", False):
                del tensors[k]
    for k, v in fpq.items():
        layer = k.rsplit(".", 1)[0]
        tensors[prefixes.get(layer, "") + k] = v
    if export == "wush":
        for name, shape in modules.items():
            tensors[prefixes[name] + name + ".weight"] = torch.tensor(shape, dtype=torch.int64)
        qcfg = hf.folder_config(result, embeddings)
    if embeddings == "bf16":
        _embeddings_to_bf16(model, tensors)
    if pseudo and fpq:
        qcfg["pseudoquantization"] = True
        for name, (_, q) in result.layers.items():
            # The consumer's pseudo-quantized forward multiplies by dqweight: the dequantized
            # transformed weight (codes x scales x per-tensor factor), stored in bf16.
            p = prefixes[name] + name
            tensors[p + ".dqweight"] = torch.from_numpy(q.dequantize()).to(torch.bfloat16)
            del tensors[p + ".qweight"], tensors[p + ".scales"]
    _shard_and_save(tensors, out_dir, max_shard_bytes)
    if model_dir and os.path.exists(os.path.join(model_dir, "config.json")):
        with open(os.path.join(model_dir, "config.json")) as f:
            config = json.load(f)
    elif hasattr(model, "config"):
        config = model.config.to_dict()
    else:
        config = {}
    if export == "fp_quant":
        qcfg["modules_to_not_convert"] = unconverted
    if getattr(result, "tied", None):
        _untie(config)
    config["quantization_config"] = qcfg
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    copied = _copy_other_files(model_dir, out_dir) if model_dir else []
    info = {"format": result.format, "transform": result.transform, "method": result.method,
            "search": getattr(result, "search", False), "export": export, "fp_quant_refused": refused,
            "untied": sorted(getattr(result, "tied", {})),
            "embeddings": embeddings,
            "layers": {n: t.info()[0].name.lower() for n, (t, _) in result.layers.items()},
            "grouped": {n: [p for p, _ in parts] for n, parts in getattr(result, "parts", {}).items()},
            "modules_to_not_convert": unconverted, "copied_files": copied}
    with open(os.path.join(out_dir, INFO_FILE), "w") as f:
        json.dump(info, f, indent=2)
    return info


def _untie(config: Dict[str, Any]) -> None:
    """The config of a folder whose tied output layer was quantized: the head is a layer of its
    own now (its codes in the checkpoint), the input embeddings a tensor of their own."""
    config["tie_word_embeddings"] = False
    text = config.get("text_config")
    if isinstance(text, dict) and "tie_word_embeddings" in text:
        text["tie_word_embeddings"] = False


def _shard_and_save(tensors: Dict[str, torch.Tensor], out_dir: str, max_shard_bytes: int) -> List[str]:
    from safetensors.torch import save_file
    shards: List[Dict[str, torch.Tensor]] = [{}]
    size = 0
    for k in sorted(tensors):
        t = tensors[k].detach().contiguous()
        nb = t.numel() * t.element_size()
        if shards[-1] and size + nb > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][k] = t
        size += nb
    n = len(shards)
    weight_map, total, files = {}, 0, []
    for i, sh in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        save_file(sh, os.path.join(out_dir, fname), metadata={"format": "pt"})
        files.append(fname)
        for k, t in sh.items():
            weight_map[k] = fname
            total += t.numel() * t.element_size()
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2, sort_keys=True)
    return files


def _copy_other_files(model_dir: str, out_dir: str) -> List[str]:
    copied = []
    for entry in sorted(os.listdir(model_dir)):
        src, dst = os.path.join(model_dir, entry), os.path.join(out_dir, entry)
        if entry in WEIGHT_FILES or entry in (CHECKPOINT_FILE, INFO_FILE):
            continue
        if os.path.isdir(src):
            if entry in WEIGHT_DIRS or entry.startswith("."):
                continue
            shutil.copytree(src, dst, dirs_exist_ok=True)
        elif re.fullmatch(r"(model|pytorch_model)-\d+-of-\d+\.(safetensors|bin)", entry):
            continue  # a shard of the weights
        else:
            shutil.copy2(src, dst)
        copied.append(entry)
    return copied


def _embeddings_to_bf16(model: nn.Module, tensors: Dict[str, torch.Tensor]) -> None:
    """The stored input embedding table of ``model`` (among ``tensors``, the folder's names) in
    bfloat16; ValueError when it cannot be found."""
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    name = next((n for n, m in model.named_modules() if m is emb), None) if emb is not None else None
    key = _stored_key(name + ".weight", getattr(model, "base_model_prefix", "") or "", tensors) if name else None
    if key is None:
        raise ValueError("--embeddings bf16: the model's input embedding table is not among its stored tensors")
    if tensors[key].is_floating_point():
        tensors[key] = tensors[key].to(torch.bfloat16)
