"""The tensors a model folder stores: read whole, or their names and shapes alone from the files'
headers (checked complete), and the stored name of a model's tensor.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Tuple

import torch

from . import _core


def read_folder_tensors(model_dir: str) -> Dict[str, torch.Tensor]:
    """Every tensor of a model folder under its stored name and dtype: the safetensors files
    (``model.safetensors`` or the shards of its index), else ``pytorch_model.bin`` (or its
    shards)."""
    from safetensors.torch import load_file

    def files(single: str, index: str) -> List[str]:
        if os.path.exists(os.path.join(model_dir, index)):
            with open(os.path.join(model_dir, index)) as f:
                return sorted(set(json.load(f)["weight_map"].values()))
        return [single] if os.path.exists(os.path.join(model_dir, single)) else []

    out: Dict[str, torch.Tensor] = {}
    st = files("model.safetensors", "model.safetensors.index.json")
    for fn in st:
        out.update(load_file(os.path.join(model_dir, fn)))
    if not st:
        for fn in files("pytorch_model.bin", "pytorch_model.bin.index.json"):
            out.update(torch.load(os.path.join(model_dir, fn), map_location="cpu", weights_only=True))
    if not out:
        raise ValueError(f"{_core.printable(model_dir)}: no model.safetensors(.index.json) or "
                         f"pytorch_model.bin(.index.json)")
    return out


def _file_key_prefix(stored: Dict[str, torch.Tensor], module: str) -> str:
    """The prefix the folder's key of ``module``'s weight has relative to the module name (""
    usually; e.g. "bert." for a BertModel loaded from a BertForPreTraining folder)."""
    if module + ".weight" in stored:
        return ""
    cands = [k for k in stored if k.endswith("." + module + ".weight")]
    if len(cands) != 1:
        raise ValueError(f"cannot tell which stored tensor is the weight of layer {module} "
                         f"({len(cands)} candidates); pass model_dir=None to write the model's own state_dict")
    return cands[0][: -len(module + ".weight")]


# The largest safetensors header read: the C library's limit (kMaxHeaderBytes in
# src/storage/safetensors.h), so that both refuse the same files.
MAX_SAFETENSORS_HEADER = 100_000_000


def _safetensors_shapes(path: str) -> Dict[str, Tuple[int, ...]]:
    """The tensor names and shapes of a safetensors file from its header, after checking that the
    file is complete (ValueError naming the file otherwise: truncated, not safetensors, a header
    longer than :data:`MAX_SAFETENSORS_HEADER`)."""
    shown = _core.printable(path)
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if n > MAX_SAFETENSORS_HEADER:  # read whole below: a hostile length must not claim gigabytes
                raise ValueError(f"{shown}: not a safetensors file (header length {n} exceeds the "
                                 f"{MAX_SAFETENSORS_HEADER:,}-byte limit)")
            if n < 2 or 8 + n > size:
                raise ValueError(f"{shown}: not a complete safetensors file (its header does not fit its "
                                 f"{size} bytes: truncated?)")
            header = json.loads(f.read(n))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{shown}: cannot read a safetensors header: {e}") from None
    if not isinstance(header, dict):
        raise ValueError(f"{shown}: not a safetensors file (its header is not a JSON object)")
    shapes, end = {}, 0
    for k, v in header.items():
        if k == "__metadata__":
            continue
        try:
            shapes[k] = tuple(int(d) for d in v["shape"])
            end = max(end, int(v["data_offsets"][1]))
        except (TypeError, KeyError, IndexError, ValueError):
            raise ValueError(f"{shown}: not a safetensors file (bad header entry {k!r})") from None
    if 8 + n + end > size:
        raise ValueError(f"{shown}: truncated: its tensors need {8 + n + end} bytes, the file has {size}")
    return shapes


def stored_tensor_shapes(model_dir: str) -> Optional[Dict[str, Tuple[int, ...]]]:
    """Name -> shape of every tensor stored in a model folder, without reading the data (the
    safetensors headers; pytorch_model.bin is memory-mapped). None when the folder holds neither
    format. ValueError naming the file for a shard that is missing, truncated or not readable."""
    def files(single: str, index: str) -> List[str]:
        ipath = os.path.join(model_dir, index)
        if os.path.exists(ipath):
            try:
                with open(ipath) as f:
                    return sorted(set(json.load(f)["weight_map"].values()))
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
                raise ValueError(f"{_core.printable(ipath)}: not a weight index ({e})") from None
        return [single] if os.path.exists(os.path.join(model_dir, single)) else []

    out: Dict[str, Tuple[int, ...]] = {}
    st = files("model.safetensors", "model.safetensors.index.json")
    for fn in st:
        out.update(_safetensors_shapes(os.path.join(model_dir, fn)))
    if st:
        return out
    bins = files("pytorch_model.bin", "pytorch_model.bin.index.json")
    for fn in bins:
        path = os.path.join(model_dir, fn)
        try:
            try:
                sd = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError:
                # Files of the legacy (pre-zip) serialization cannot be mapped: read them whole.
                sd = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - torch raises many kinds for a damaged file
            why = _core.printable(" ".join(str(e).split())[:300], backslash=False)
            raise ValueError(f"{_core.printable(path)}: cannot read it: {why}") from None
        out.update({k: tuple(v.shape) for k, v in sd.items()})
    return out if bins else None


def _stored_key(key: str, prefix: str, stored: Dict[str, Any]) -> Optional[str]:
    """The stored name of the model's state_dict ``key``: itself, or with the base model's
    ``prefix`` added or removed (a bare model from a folder of the full model, or the reverse)."""
    if key in stored:
        return key
    if prefix:
        if prefix + "." + key in stored:
            return prefix + "." + key
        if key.startswith(prefix + ".") and key[len(prefix) + 1:] in stored:
            return key[len(prefix) + 1:]
    return None
