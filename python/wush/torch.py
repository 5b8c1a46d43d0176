"""Model-level quantization with PyTorch: calibration by forward hooks, RTN/GPTQ over a whole
model, and the output folder (fp_quant layout + libwush checkpoint).

Memory: a calibrator keeps moments (d_in*G doubles per layer block-diagonal, d_in^2 full for
GPTQ) and, with the per-block search, bounded token samples (``search_tokens`` and at most
``validation_size`` tokens of d_in floats each), so calibration memory does not grow with the
number of tokens.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from typing import Any, Dict, Iterable, List, Optional, Tuple

import numpy as np
import torch
from torch import nn

from . import _core
from ._core import Calibrator, Checkpoint, Options, QWeight, Transform

# Linear layers inside the transformer blocks (Llama/Mistral/Qwen "layers.N.", GPT-2 "h.N.",
# others "blocks.N."): embeddings and lm_head sit outside and are left alone.
DEFAULT_PATTERN = r"(^|\.)(layers|h|blocks)\.\d+\."


def select_linears(model: nn.Module, pattern: Optional[str] = None) -> Dict[str, nn.Linear]:
    """The nn.Linear modules whose qualified name matches ``pattern`` (regex, searched)."""
    rx = re.compile(pattern or DEFAULT_PATTERN)
    return {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear) and rx.search(n)}


def _progress(it: Iterable, enabled: bool, desc: str, total: Optional[int] = None) -> Iterable:
    if not enabled:
        return it
    try:
        from tqdm.auto import tqdm  # optional: a plain loop without it
    except ImportError:
        return it
    return tqdm(it, desc=desc, total=total)


class HookCalibration:
    """Forward pre-hooks on ``layers`` streaming each layer's inputs into a calibrator.

    Layers that receive the very same input tensor in a forward pass (q/k/v, gate/up) share one
    calibrator when ``share_inputs`` (decided on the first pass, by tensor identity: storage
    pointer, shape and version). Use as a context manager; ``calibrators`` maps layer name to
    its (possibly shared) :class:`Calibrator`, created with ``calibrator_args`` (e.g.
    ``sample_size``, ``validation_size``). While ``validation`` is set, the hooks offer the inputs
    to the existing calibrators' validation samples (:meth:`Calibrator.add_validation`) instead of
    their moments.
    """

    def __init__(self, model: nn.Module, layers: Dict[str, nn.Linear], group_size: int,
                 mode: str = "block_diagonal", share_inputs: bool = True,
                 calibrator_args: Optional[Dict[str, int]] = None):
        self.model, self.layers, self.group_size, self.mode = model, layers, group_size, mode
        self.share_inputs = share_inputs
        self.calibrator_args = calibrator_args or {}
        self.validation = False
        self.calibrators: Dict[str, Calibrator] = {}
        self._seen: Dict[Tuple, Tuple[Calibrator, torch.Tensor]] = {}
        self._added: set = set()
        self._handles: List[Any] = []

    def _reset(self, *_: Any) -> None:
        self._seen.clear()
        self._added.clear()

    def _hook(self, name: str) -> Any:
        def hook(module: nn.Module, inputs: Tuple) -> None:
            x = inputs[0]
            key = (x.data_ptr(), tuple(x.shape), x._version, x.dtype)
            cal = self.calibrators.get(name)
            if cal is None:
                cal = self._seen[key][0] if self.share_inputs and key in self._seen else None
                if cal is None:
                    if self.validation:
                        raise ValueError(f"layer {name} ran for validation but never for calibration")
                    cal = Calibrator(module.in_features, self.group_size, self.mode, **self.calibrator_args)
                self.calibrators[name] = cal
            # The entry holds the tensor so that its storage cannot be freed and reused by a
            # later, different input at the same address during this pass (a false match).
            self._seen.setdefault(key, (cal, x))
            if (id(cal), key) in self._added:
                return  # a layer sharing this calibrator already added this very tensor
            self._added.add((id(cal), key))
            rows = x.detach().reshape(-1, module.in_features)
            if self.validation:
                cal.add_validation(rows)
            else:
                cal.add(rows)
        return hook

    def __enter__(self) -> "HookCalibration":
        self._handles.append(self.model.register_forward_pre_hook(self._reset))
        self._handles.append(self.model.register_forward_hook(self._reset))  # drop the held inputs
        for n, m in self.layers.items():
            self._handles.append(m.register_forward_pre_hook(self._hook(n)))
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


def _run(model: nn.Module, batch: Any) -> Any:
    if isinstance(batch, dict):
        return model(**batch)
    return model(batch)


def calibrate(model: nn.Module, batches: Iterable, layers: Optional[Dict[str, nn.Linear]] = None,
              fmt: str = "mxfp4", mode: str = "block_diagonal", share_inputs: bool = True,
              progress: bool = False) -> Dict[str, Calibrator]:
    """Runs ``model`` on ``batches`` (tensors of token ids, or dicts of keyword arguments) and
    returns one calibrator per selected layer."""
    layers = select_linears(model) if layers is None else layers
    with torch.no_grad(), HookCalibration(model, layers, _core.format_group_size(fmt), mode, share_inputs) as hc:
        for b in _progress(batches, progress, "calibration"):
            _run(model, b)
    return hc.calibrators


class QuantizedLinear(nn.Module):
    """nn.Linear replacement computed by libwush's CPU runtime (W4A4: activations transformed
    and quantized on the fly, packed GEMM)."""

    def __init__(self, transform: Transform, qweight: QWeight, bias: Optional[torch.Tensor]):
        super().__init__()
        self.transform, self.qweight = transform, qweight
        self.runtime = _core.Linear(transform, qweight)
        self.in_features, self.out_features = self.runtime.d_in, self.runtime.d_out
        if bias is not None:
            self.bias = nn.Parameter(bias.detach().clone(), requires_grad=False)
        else:
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = torch.from_numpy(self.runtime(x.detach().reshape(-1, shape[-1]).float().contiguous()))
        y = y.reshape(*shape[:-1], self.out_features)
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(x.dtype)


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


class _Stop(Exception):
    pass


def _block_index(name: str, blocks_prefix: str) -> Optional[int]:
    m = re.match(re.escape(blocks_prefix) + r"\.(\d+)\.", name)
    return int(m.group(1)) if m else None


def find_blocks(model: nn.Module) -> Tuple[str, nn.ModuleList]:
    """The transformer blocks: the longest nn.ModuleList of the model, with its name."""
    best = max(((n, m) for n, m in model.named_modules() if isinstance(m, nn.ModuleList)),
               key=lambda nm: len(nm[1]), default=None)
    if best is None:
        raise ValueError("no nn.ModuleList of blocks found in the model")
    return best


class QuantizationResult:
    """What :func:`quantize_model` made: per layer name, the (transform, qweight) pair."""

    def __init__(self, fmt: str, transform: str, method: str):
        self.format, self.transform, self.method = fmt, transform, method
        self.layers: Dict[str, Tuple[Transform, QWeight]] = {}

    def checkpoint(self) -> Checkpoint:
        ck = Checkpoint()
        for name, (t, q) in self.layers.items():
            ck.add_layer(name, t, q)
        return ck


def _run_all(model: nn.Module, batches: List, stop_at: Optional[nn.Module] = None) -> None:
    """Runs every batch; with ``stop_at``, each forward pass ends after that module (the hooks
    before it have seen their inputs)."""
    def raise_stop(*_: Any) -> None:
        raise _Stop()
    stop = stop_at.register_forward_hook(raise_stop) if stop_at is not None else None
    try:
        for b in batches:
            try:
                _run(model, b)
            except _Stop:
                pass
    finally:
        if stop is not None:
            stop.remove()


def quantize_model(model: nn.Module, batches: Iterable, format: str = "mxfp4", transform: str = "wush",
                   method: str = "rtn", layers: Optional[str] = None, damping: Optional[float] = None,
                   share_inputs: bool = True, progress: bool = False, search: bool = False,
                   search_tokens: int = 1024, validation_batches: Optional[Iterable] = None,
                   validation_size: int = 4096) -> QuantizationResult:
    """Quantizes the selected linear layers of ``model`` in place (each becomes a
    :class:`QuantizedLinear`) and returns the transforms and quantized weights.

    - ``method="rtn"``: one calibration pass over ``batches`` for all layers (block-diagonal
      moments), then each layer is quantized independently.
    - ``method="gptq"``: block by block as in the paper, "WUSH: Near-Optimal Adaptive Transforms
      for LLM Quantization": the Hessians of block i are collected with blocks 0..i-1 already
      quantized, so block i sees the inputs the quantized model produces. The forward pass is
      re-run from the embeddings for every block and stopped after block i (quadratic in the
      depth, but nothing but moments is kept in memory).

    With ``search=True`` (``transform`` "wush" or "wus"; WUSH_OPTION_SEARCH) each block's scale,
    signs and fall-backs are chosen per layer for ``format``, scored on a sample of
    ``search_tokens`` calibration tokens per layer. ``validation_batches`` (documents the
    calibration does not see) then feed the search's per-layer guard: a sample of at most
    ``validation_size`` of their tokens per layer, on which the searched layer competes with the
    I, H and R layers built the same way, the lowest loss winning. They run through the model
    like the calibration batches (with GPTQ, through the blocks already quantized).

    Transforms are stored in bf16 (WUSH_OPTION_TRANSFORM_DTYPE) so the fp_quant export can
    represent them exactly.
    """
    batches = list(batches)
    validation = list(validation_batches) if validation_batches is not None else []
    selected = select_linears(model, layers)
    if not selected:
        raise ValueError("no linear layer matches the selection")
    if search and _core.parse_transform(transform) not in (_core.TransformKind.WUS, _core.TransformKind.WUSH):
        raise ValueError(f"the search chooses WUS/WUSH blocks; transform {transform!r} has nothing to search")
    if validation and not search:
        raise ValueError("validation_batches feed the search's guard: pass search=True")
    opts = Options(damping=damping, transform_dtype="bf16", search=search or None,
                   search_tokens=search_tokens if search else None)
    cal_args = {"sample_size": search_tokens} if search else {}
    if validation:
        cal_args["validation_size"] = validation_size
    result = QuantizationResult(format, transform, method)
    g = _core.format_group_size(format)

    def collect(hc: HookCalibration, stop_at: Optional[nn.Module] = None) -> None:
        _run_all(model, batches, stop_at)
        hc.validation = True
        _run_all(model, validation, stop_at)

    def quantize_layers(cals: Dict[str, Calibrator], names: List[str]) -> None:
        for name in _progress(names, progress, "quantize"):
            lin = selected[name]
            t, q = _core.layer_quantize(cals[name], lin.weight.detach().float().contiguous(), transform, format,
                                        method, opts)
            result.layers[name] = (t, q)
            _replace(model, name, QuantizedLinear(t, q, lin.bias))

    with torch.no_grad():
        if method.lower() == "rtn":
            with HookCalibration(model, selected, g, "block_diagonal", share_inputs, cal_args) as hc:
                collect(hc)
            cals = hc.calibrators
            missing = [n for n in selected if n not in cals]
            if missing:
                raise ValueError(f"layers never ran during calibration: {missing[:5]}")
            quantize_layers(cals, list(selected))
            return result
        prefix, blocks = find_blocks(model)
        groups: Dict[Optional[int], List[str]] = {}
        for name in selected:
            groups.setdefault(_block_index(name, prefix), []).append(name)
        order = sorted(k for k in groups if k is not None) + ([None] if None in groups else [])
        for bi in _progress(order, progress, "blocks"):
            names = groups[bi]
            sub = {n: selected[n] for n in names}
            with HookCalibration(model, sub, g, "full", share_inputs, cal_args) as hc:
                collect(hc, blocks[bi] if bi is not None else None)
            quantize_layers(hc.calibrators, names)
    return result


# ----------------------------------------------------------------------------------------------
# The output folder
# ----------------------------------------------------------------------------------------------

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "vocab.txt", "added_tokens.json", "generation_config.json")


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


def save_quantized(model: nn.Module, result: QuantizationResult, out_dir: str, model_dir: Optional[str] = None,
                   pseudo: bool = False, max_shard_bytes: int = 2 << 30) -> None:
    """Writes the complete output folder:

    - ``model-0000i-of-0000n.safetensors`` + ``model.safetensors.index.json``: every tensor of the
      model; quantized layers in the fp_quant layout named after their modules
      (``<module>.qweight``, ``.scales``, ``.forward_hadamard_matrix``,
      ``.backward_hadamard_matrix``, ``.weight_global_scale``, ``.act_global_scale``), or with
      ``pseudo`` the bf16 ``<module>.dqweight`` instead of qweight/scales; biases and all other
      tensors copied;
    - ``config.json`` with ``quantization_config`` merged (from ``model_dir`` or the model's config);
    - the tokenizer files of ``model_dir``;
    - ``wush_checkpoint.safetensors``: the libwush checkpoint (transforms + packed weights).

    Refuses NVFP4 with per-block WUSH matrices: no fp_quant consumer can load those.
    """
    from safetensors.torch import load_file
    if result.format.lower() == "nvfp4" and result.transform.lower() in ("wush", "wus"):
        raise ValueError("NVFP4 with per-block WUSH transforms cannot be loaded by any fp_quant consumer "
                         "(QuTLASS/fp_quant apply one shared (G, G) rotation for NVFP4); use mxfp4, or "
                         "transform=hadamard/identity for nvfp4")
    os.makedirs(out_dir, exist_ok=True)
    ck_path = os.path.join(out_dir, "wush_checkpoint.safetensors")
    result.checkpoint().write(ck_path)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        exp, cfg = os.path.join(tmp, "fpq.safetensors"), os.path.join(tmp, "qcfg.json")
        with Checkpoint.open(ck_path) as ck:
            ck.export_fp_quant(exp, cfg)
        fpq = load_file(exp)
        with open(cfg) as f:
            qcfg = json.load(f)["quantization_config"]
    tensors = {k: v for k, v in model.state_dict().items()
               if not any(k.startswith(n + ".") and not k.endswith(".bias") for n in result.layers)}
    for k, v in fpq.items():
        tensors[k] = v
    if pseudo:
        qcfg["pseudoquantization"] = True
        for name, (_, q) in result.layers.items():
            # The consumer's pseudo-quantized forward multiplies by dqweight: the dequantized
            # transformed weight (codes x scales x per-tensor factor), stored in bf16.
            tensors[name + ".dqweight"] = torch.from_numpy(q.dequantize()).to(torch.bfloat16)
            del tensors[name + ".qweight"], tensors[name + ".scales"]
    # Tied weights (lm_head = embeddings) are stored once, as transformers does.
    for k in getattr(model, "_tied_weights_keys", None) or []:
        if isinstance(k, str) and k in tensors and getattr(getattr(model, "config", None), "tie_word_embeddings", False):
            del tensors[k]
    _shard_and_save(tensors, out_dir, max_shard_bytes)
    if model_dir and os.path.exists(os.path.join(model_dir, "config.json")):
        with open(os.path.join(model_dir, "config.json")) as f:
            config = json.load(f)
    elif hasattr(model, "config"):
        config = model.config.to_dict()
    else:
        config = {}
    config["quantization_config"] = qcfg
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    if model_dir:
        for fn in TOKENIZER_FILES:
            if os.path.exists(os.path.join(model_dir, fn)):
                shutil.copy2(os.path.join(model_dir, fn), os.path.join(out_dir, fn))


def load_quantized_layers(model: nn.Module, checkpoint_path: str) -> List[str]:
    """Replaces the layers named in a libwush checkpoint by :class:`QuantizedLinear` (CPU
    runtime); biases are taken from the model. Returns the replaced names."""
    ck = Checkpoint.open(checkpoint_path)
    names = ck.layer_names()
    for name in names:
        t, q = ck.load_layer(name)
        old = model.get_submodule(name)
        _replace(model, name, QuantizedLinear(t, q, getattr(old, "bias", None)))
    return names
