"""Loading model folders with transformers: a float model (:func:`load_float_model`), and a
quantized folder whose layers run on libwush's runtime (:func:`load_quantized`).
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

import torch
from torch import nn

from . import _core, hf
from ._core import Checkpoint
from .device import _context_for
from .folder import CHECKPOINT_FILE, require_model_folder
from .groups import checkpoint_modules, install_group
from .layers import _replace
from .model_class import check_weights_match, folder_model_class
from .quantized_linear import QuantizedLinear
from .stored import stored_tensor_shapes


def _read_config(folder: str) -> Any:
    from transformers import AutoConfig
    try:
        return AutoConfig.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:  # e.g. "quantization_config": 5
        why = _core.printable(" ".join(str(e).split())[:300], backslash=False)
        raise ValueError(f"{_core.printable(folder)}/config.json: {why}") from None


def load_float_model(model_dir: str, dtype: Any = torch.float32, config: Any = None) -> nn.Module:
    """A local Hugging Face folder as :func:`folder_model_class` says (the class its config
    names, or the bare model for a folder that stores no head), in ``dtype``, eval mode; nothing
    downloaded. Raises FileNotFoundError when the folder or its config.json is missing,
    ValueError (naming the file) for a weight file that is missing, truncated or unreadable and
    for stored shapes that differ from the config's. The model's ``wush_missing_keys`` lists
    what transformers initialized at random (tensors the folder lacks)."""
    from transformers.utils import logging as hf_logging
    require_model_folder(model_dir)
    config = config or _read_config(model_dir)
    stored = stored_tensor_shapes(model_dir)
    cls = folder_model_class(model_dir, config, stored)
    if stored:
        check_weights_match(model_dir, cls, config, stored)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # missing tensors are reported by the caller (wush_missing_keys)
    try:
        model, info = cls.from_pretrained(model_dir, config=config, local_files_only=True, output_loading_info=True,
                                          **_dtype_kwarg(dtype))
    finally:
        hf_logging.set_verbosity(verbosity)
    model.wush_missing_keys = sorted(info.get("missing_keys", []))
    return model.eval()


def load_quantized(out_dir: str, device: Any = "cpu", dtype: Any = None, mmap: bool = False,
                   threads: Optional[int] = None) -> nn.Module:
    """Loads a folder written by :func:`save_quantized` to run on libwush's runtime: the model
    class named by the folder's config, every tensor but the quantized weights from the folder's
    safetensors, and each quantized layer (``wush_checkpoint.safetensors``) as a
    :class:`QuantizedLinear` prepared on ``device`` ("cpu", or "cuda[:i]" when libwush's CUDA
    backend is present: its layers then run on torch's current stream). ``dtype``: the
    non-quantized parameters' dtype (default the config's ``torch_dtype``, else float32).
    Nothing is downloaded. Raises FileNotFoundError when the folder, its config.json or its
    checkpoint is missing, ValueError (naming them) when it lacks a tensor the model needs or
    holds one the model does not have.

    The checkpoint is read into memory (the model does not depend on the file afterwards: it may
    be deleted, truncated or rewritten). ``mmap=True`` maps it instead, saving that copy, at a
    risk: truncating the file under the running model kills the process (SIGBUS) and rewriting it
    in place silently changes the outputs (:func:`load_quantized_layers`).

    ``threads``: the CPU threads of the quantized layers (``WUSH_CONTEXT_NUM_THREADS``; default
    None: OpenMP's default, which follows ``torch.set_num_threads``). On the CPU the layers run
    their parallel work on torch's OpenMP threads (:func:`cpu_context`)."""
    from transformers.utils import logging as hf_logging
    require_model_folder(out_dir, quantized=True)
    ctx, dev = _context_for(device, threads)
    config = _read_config(out_dir)
    qc = getattr(config, "quantization_config", None)
    wush_folder = _quant_method(qc) == "wush"
    if wush_folder:
        # wush.hf's quantizer builds the quantized layers while transformers loads the folder.
        hf.register()
        config.quantization_config = dict(_as_dict(qc), device=str(dev), mmap=mmap, threads=threads)
    elif qc is not None:
        # The folder's fp_quant config would send transformers to its own quantizer (GPU-only);
        # the quantized layers are loaded from the libwush checkpoint instead.
        delattr(config, "quantization_config")
    if dtype is None:
        dtype = getattr(config, "dtype", None)
        if dtype is None and "dtype" not in _dtype_kwarg(None):  # older transformers' name
            dtype = getattr(config, "torch_dtype", None)
        dtype = dtype or torch.float32
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    with Checkpoint.open(os.path.join(out_dir, CHECKPOINT_FILE)) as ck:
        qnames = [p for parts in checkpoint_modules(ck).values() for p, _ in parts]  # the modules they replace
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the quantized weights are "missing" on purpose
    try:
        stored = stored_tensor_shapes(out_dir)
        cls = folder_model_class(out_dir, config, stored)  # as quantize-model built it (a quantized head counts)
        if stored and wush_folder:  # the quantized layers' [d_out, d_in] stand-ins are the quantizer's
            stored = {k: v for k, v in stored.items()
                      if not any(k == n + ".weight" or k.endswith("." + n + ".weight") for n in qnames)}
        if stored:
            check_weights_match(out_dir, cls, config, stored)
        model, info = cls.from_pretrained(out_dir, config=config, local_files_only=True,
                                          output_loading_info=True, **_dtype_kwarg(dtype))
    finally:
        hf_logging.set_verbosity(verbosity)
    # transformers reports keys in the model's namespace: only the quantized weights may miss.
    expected = {n + ".weight" for n in qnames}
    if wush_folder:
        expected = set()  # every tensor, the quantized layers' [d_out, d_in] included, is stored
    missing = [k for k in info.get("missing_keys", []) if not any(k == e or k.endswith("." + e) for e in expected)]
    if missing:
        raise ValueError(f"{_core.printable(out_dir)}: tensors missing from the folder: "
                         f"{', '.join(sorted(missing)[:10])}")
    # Nor may one be left over (transformers drops a tensor the model has no place for, e.g. a
    # bias the config does not give a layer, with a warning): the folder is not this model's.
    # An fp_quant folder's quantized layers are read from the checkpoint, their tensors unused.
    extra = [k for k in info.get("unexpected_keys", [])
             if wush_folder or not any(k.startswith(n + ".") or f".{n}." in k for n in qnames)]
    if extra:
        raise ValueError(f"{_core.printable(out_dir)}: tensors in the folder that the model "
                         f"({type(model).__name__}) does not have: {', '.join(sorted(extra)[:10])}")
    if not wush_folder:
        load_quantized_layers(model, os.path.join(out_dir, CHECKPOINT_FILE), ctx, mmap=mmap)
    return model.to(dev).eval()


def _as_dict(qc: Any) -> Dict[str, Any]:
    return dict(qc) if isinstance(qc, dict) else qc.to_dict()


def _quant_method(qc: Any) -> Optional[str]:
    """The ``quant_method`` of a config's quantization_config (a dict or transformers' object)."""
    if qc is None:
        return None
    m = qc.get("quant_method") if isinstance(qc, dict) else getattr(qc, "quant_method", None)
    return getattr(m, "value", m)


def load_quantized_layers(model: nn.Module, checkpoint_path: str, ctx: Optional[_core.Context] = None,
                          mmap: bool = False, split_groups: bool = False) -> List[str]:
    """Replaces the layers named in a libwush checkpoint by :class:`QuantizedLinear` (prepared on
    ``ctx``, default the CPU); biases are taken from the model. Returns the replaced names (the
    parts of a grouped layer: the modules they replace). A grouped layer's parts become
    :class:`wush.groups.QuantizedPart` modules sharing one prepared layer, or with
    ``split_groups`` each a QuantizedLinear of its own (the group's transform, the part's rows:
    the same outputs, with an activation quantization per part).

    By default the file is read into memory once (``WUSH_CHECKPOINT_COPY``) and the layers never
    touch it again. ``mmap=True`` maps it instead (``wush_checkpoint_open``): no copy of the file
    in memory, but a layer prepared on the CPU keeps reading its codes from the mapping, so
    truncating the file under a running model kills the process (SIGBUS) and rewriting it in
    place changes the model's outputs (replace such a file by rename)."""
    names: List[str] = []
    with Checkpoint.open(checkpoint_path, copy=not mmap) as ck:
        for layer, parts in checkpoint_modules(ck).items():
            grouped = len(parts) > 1
            for name in ([p for p, _ in parts] if split_groups or not grouped else [layer]):
                t, q = ck.load_layer(name)
                if name == layer and grouped:
                    install_group(model, t, q, parts, ctx)
                else:
                    _replace(model, name, QuantizedLinear(t, q, getattr(model.get_submodule(name), "bias", None), ctx))
                # The prepared layer copies the transform; its weights' bytes stay shared with the
                # checkpoint's memory (the copy, or the mapping with mmap=True), kept alive by it.
                t.close()
                q.close()
            names += [p for p, _ in parts]
    return names


def _dtype_kwarg(dtype: Any) -> Dict[str, Any]:
    # transformers 4.56 renamed from_pretrained's torch_dtype to dtype (5.x warns on the old name).
    import transformers
    major, minor = (int(v) for v in transformers.__version__.split(".")[:2])
    return {"dtype" if (major, minor) >= (4, 56) else "torch_dtype": dtype}
