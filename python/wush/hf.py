"""transformers integration: the quantization method ``"wush"``.

A folder written by ``python -m wush quantize-model`` (the default ``--export wush``) names
``"quant_method": "wush"`` in its config.json's ``quantization_config``, stores the model's
other tensors as they were, and the quantized layers once, in ``wush_checkpoint.safetensors``.
In place of each quantized layer's ``weight`` it stores a two-element int64 tensor, the layer's
``[d_out, d_in]``.

With ``wush`` imported, :func:`register` has told transformers (its public
``register_quantization_config`` / ``register_quantizer``) that ``"wush"`` is
:class:`WushQuantizer`: ``AutoModel.from_pretrained(folder)`` (and ``SentenceTransformer(folder)``,
which calls it) then builds each quantized layer as a :class:`wush.torch.QuantizedLinear` on
libwush's runtime. Without ``wush``, transformers does not know the method, skips it with a
warning, and then refuses the folder: each stored ``[d_out, d_in]`` tensor has the wrong shape
for the layer's weight ("size mismatch", a RuntimeError), so the model never runs with randomly
initialized layers (unless the caller passes ``ignore_mismatched_sizes=True``).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from typing import Any, Dict, List, Optional

from .folder import CHECKPOINT_FILE, require_model_folder  # neither torch nor transformers

# `import wush` imports this module: what needs torch or transformers (wush.layers, wush.device,
# wush.quantized_linear, wush.stored) is imported inside the functions that run while transformers
# loads a folder. None of those modules imports this one, so the imports form no cycle.

QUANT_METHOD = "wush"
LAYOUT_VERSION = 1  # of the folder this module loads: bump when the layout changes
_REGISTRY_MODULE = "transformers.quantizers.auto"


def _registered() -> bool:
    from transformers.quantizers.auto import AUTO_QUANTIZER_MAPPING
    return QUANT_METHOD in AUTO_QUANTIZER_MAPPING


def register() -> None:
    """Registers the ``"wush"`` quantization config and quantizer with transformers (once;
    later calls do nothing). ``import wush`` arranges it when transformers loads its quantizers;
    call it yourself only if your transformers was imported in a way that hook missed."""
    # From the registry module itself: register() also runs while transformers.quantizers (the
    # package) is still being imported, right after this module of it has run.
    from transformers.quantizers.auto import register_quantization_config, register_quantizer
    if _registered():
        return
    config_cls, quantizer_cls = _classes()
    register_quantization_config(QUANT_METHOD)(config_cls)
    register_quantizer(QUANT_METHOD)(quantizer_cls)


class _RegisterOnImport(importlib.abc.MetaPathFinder):
    """Registers the quantizer right after transformers executes its quantizer registry, so that
    ``import wush`` imports neither torch nor transformers (a second or more) by itself."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != _REGISTRY_MODULE:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)  # once
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_then_register(module: Any) -> None:
            run(module)
            register()

        spec.loader.exec_module = exec_then_register  # type: ignore[method-assign]
        return spec


def register_on_import() -> None:
    """What ``import wush`` calls: registers now when transformers' registry is already loaded,
    else when it loads. Never raises (a broken transformers is reported when it is used)."""
    if _REGISTRY_MODULE in sys.modules:
        try:
            register()
        except Exception:  # noqa: BLE001 - import wush must work whatever transformers does
            pass
        return
    if not any(isinstance(f, _RegisterOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterOnImport())


def folder_config(result: Any, embeddings: str) -> Dict[str, Any]:
    """The ``quantization_config`` of a folder written with ``--export wush``."""
    from . import _core
    return {"quant_method": QUANT_METHOD, "layout_version": LAYOUT_VERSION, "checkpoint": CHECKPOINT_FILE,
            "format": result.format, "transform": result.transform, "method": result.method,
            "search": bool(getattr(result, "search", False)), "embeddings": embeddings,
            "wush_version": _core.version()}


def _module_for(model: Any, layer: str) -> Optional[str]:
    """The model's module name of checkpoint layer ``layer``: itself, or with the base model's
    prefix added or removed (a folder quantized as the bare model, loaded with a head, or the
    reverse)."""
    names = dict(model.named_modules())
    if layer in names:
        return layer
    prefix = getattr(model, "base_model_prefix", "") or ""
    if prefix and f"{prefix}.{layer}" in names:
        return f"{prefix}.{layer}"
    if prefix and layer.startswith(prefix + ".") and layer[len(prefix) + 1:] in names:
        return layer[len(prefix) + 1:]
    return None


def _classes() -> Any:
    """The config and quantizer classes (built on first use: they subclass transformers')."""
    import torch
    from torch import nn
    from transformers.quantizers.base import HfQuantizer
    from transformers.utils.quantization_config import QuantizationConfigMixin

    from . import _core
    # torch and numpy only: nothing of transformers that may be mid-import
    from .device import _context_for
    from .groups import checkpoint_modules, install_group
    from .layers import _replace
    from .quantized_linear import QuantizedLinear

    class WushConfig(QuantizationConfigMixin):
        """``quantization_config`` of a wush folder (see the module's doc). ``device``, ``mmap``
        and ``threads`` are loading options (wush.load_quantized passes them), never written."""

        def __init__(self, checkpoint: str = CHECKPOINT_FILE, layout_version: int = LAYOUT_VERSION,
                     format: Optional[str] = None, transform: Optional[str] = None, method: Optional[str] = None,
                     search: bool = False, embeddings: str = "keep", wush_version: Optional[str] = None,
                     device: Optional[str] = None, mmap: bool = False, threads: Optional[int] = None,
                     **kwargs: Any):
            self.quant_method = QUANT_METHOD
            self.layout_version, self.checkpoint = layout_version, checkpoint
            self.format, self.transform, self.method, self.search = format, transform, method, search
            self.embeddings, self.wush_version = embeddings, wush_version
            self._device, self._mmap, self._threads = device, mmap, threads
            if layout_version != LAYOUT_VERSION:
                raise ValueError(f"this folder's wush layout is version {layout_version}; this wush "
                                 f"({_core.version()}) reads version {LAYOUT_VERSION}: use a matching wush")
            if os.path.basename(checkpoint) != checkpoint:
                raise ValueError(f"quantization_config.checkpoint {checkpoint!r}: a file name inside the folder "
                                 f"is expected")

        def to_dict(self) -> Dict[str, Any]:
            return {k: v for k, v in super().to_dict().items() if not k.startswith("_")}

    class _Pending(nn.Module):
        """Stands for a quantized layer while transformers loads the folder: it takes the stored
        ``[d_out, d_in]`` tensor and the bias; :class:`WushQuantizer` then swaps it for the
        runtime layer."""

        def __init__(self, linear: nn.Module):
            super().__init__()
            self.register_buffer("weight", torch.zeros(2, dtype=torch.int64))
            bias = getattr(linear, "bias", None)
            # NaN, not empty_like's leftover memory: a bias the loading missed must not pass for
            # one (WushQuantizer refuses a folder without it before loading).
            self.bias = nn.Parameter(torch.full_like(bias, float("nan")), requires_grad=False) \
                if bias is not None else None

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise RuntimeError("a wush layer was not loaded (the model was built outside from_pretrained)")

    class WushQuantizer(HfQuantizer):
        """Loads a wush folder: each layer of its checkpoint becomes a QuantizedLinear."""

        requires_calibration = True  # only folders written by quantize-model / save_quantized

        def __init__(self, quantization_config: Any, **kwargs: Any):
            super().__init__(quantization_config, **kwargs)
            # checkpoint layer -> its model modules with their rows (one, rows 0, for a plain layer)
            self._layers: Dict[str, List[Any]] = {}
            self._path: Optional[str] = None

        def validate_environment(self, *args: Any, **kwargs: Any) -> None:
            if not self.pre_quantized:
                raise ValueError("quant_method 'wush' loads folders written by `python -m wush quantize-model`; "
                                 "it does not quantize a model in from_pretrained")

        def _process_model_before_weight_loading(self, model: Any, checkpoint_files: Optional[List[str]] = None,
                                                 **kwargs: Any) -> Any:
            if not checkpoint_files:
                raise ValueError("a wush folder is loaded from its files (no checkpoint file was given)")
            folder = os.path.dirname(checkpoint_files[0])
            self._path = os.path.join(folder, self.quantization_config.checkpoint)
            if not os.path.isfile(self._path):
                raise FileNotFoundError(f"{_core.printable(folder)}: no {self.quantization_config.checkpoint}, "
                                        f"which its quantization_config names")
            with _core.Checkpoint.open(self._path) as ck:
                layers = checkpoint_modules(ck)
            parts = [p for ps in layers.values() for p, _ in ps]
            missing = [p for p in parts if _module_for(model, p) is None]
            if missing:
                raise ValueError(f"{_core.printable(folder)}: the checkpoint's layers {', '.join(missing[:5])} are "
                                 f"not modules of {type(model).__name__}")
            _check_layer_tensors(folder, model, [_module_for(model, p) for p in parts], checkpoint_files)
            for layer, ps in layers.items():
                self._layers[layer] = [(_module_for(model, p), rows) for p, rows in ps]
                for name, _ in self._layers[layer]:
                    _replace(model, name, _Pending(model.get_submodule(name)))
            return model

        def _process_model_after_weight_loading(self, model: Any, **kwargs: Any) -> Any:
            cfg = self.quantization_config
            device = cfg._device or str(next(model.parameters()).device)
            ctx, _ = _context_for(device, cfg._threads)
            with _core.Checkpoint.open(self._path, copy=not cfg._mmap) as ck:
                for layer, modules in self._layers.items():
                    t, q = ck.load_layer(layer)
                    d_out, d_in = q.info()[2], q.info()[3]
                    pending = [model.get_submodule(name) for name, _ in modules]
                    for (name, rows), p in zip(modules, pending):
                        if [int(v) for v in p.weight.tolist()] != [rows or d_out, d_in]:
                            raise ValueError(f"{self._path}: layer {name} is {rows or d_out} x {d_in}, the folder's "
                                             f"{name}.weight says {p.weight.tolist()} (files from different runs?)")
                    if len(modules) == 1:
                        _replace(model, modules[0][0], QuantizedLinear(t, q, pending[0].bias, ctx))
                    else:
                        install_group(model, t, q, modules, ctx)
                    t.close()
                    q.close()
            if cfg.embeddings == "bf16":
                _keep_embeddings_bf16(model)
            return model

        def is_serializable(self, *args: Any, **kwargs: Any) -> bool:
            return False  # the folder is written by save_quantized, not save_pretrained

        @property
        def is_trainable(self) -> bool:
            return False

    return WushConfig, WushQuantizer


def _check_layer_tensors(folder: str, model: Any, names: List[str], files: List[str]) -> None:
    """Raises ValueError naming every tensor of the quantized layers ``names`` (modules of
    ``model``) that the folder's safetensors ``files`` lack or hold in excess: each layer's
    ``weight`` (its ``[d_out, d_in]``), and its ``bias`` exactly when the model's layer has one.
    transformers would leave a missing bias as it found it (uninitialized memory: garbage
    outputs) and drop an unexpected one with a warning."""
    from . import _core
    from .stored import _safetensors_shapes, _stored_key
    stored: Dict[str, Any] = {}
    for f in files:
        if f.endswith(".safetensors"):
            stored.update(_safetensors_shapes(f))
    prefix = getattr(model, "base_model_prefix", "") or ""
    problems = []
    for name in names:
        weight = _stored_key(name + ".weight", prefix, stored)
        bias = _stored_key(name + ".bias", prefix, stored)
        if weight is None:
            problems.append(f"{name}.weight is missing")
        if getattr(model.get_submodule(name), "bias", None) is not None:
            if bias is None:
                problems.append(f"{name}.bias is missing (the model's config gives the layer a bias)")
        elif bias is not None:
            problems.append(f"{bias} is not a tensor of the model (its config gives the layer no bias)")
        stem = (weight or bias or name + ".").rsplit(".", 1)[0] + "."
        problems += [f"{k} is not a tensor of the model" for k in stored
                     if k.startswith(stem) and "." not in k[len(stem):] and k not in (weight, bias)]
    if problems:
        more = f" (and {len(problems) - 4} more)" if len(problems) > 4 else ""
        raise ValueError(f"{_core.printable(folder)}: the quantized layers' tensors do not match the model: "
                         f"{'; '.join(problems[:4])}{more}")


def _keep_embeddings_bf16(model: Any) -> None:
    """The input embedding table stays bfloat16 in memory (half of float32's), its output cast to
    the dtype of the model's other parameters. Not when the table is tied to an output layer,
    whose product needs the model's dtype: there only the file is smaller."""
    import torch
    emb = model.get_input_embeddings()
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if emb is None or (out is not None and getattr(out, "weight", None) is emb.weight):
        return
    dtype = next((p.dtype for n, p in model.named_parameters() if p.is_floating_point() and p is not emb.weight),
                 torch.float32)
    emb.weight.data = emb.weight.data.to(torch.bfloat16)
    emb.register_forward_hook(lambda _m, _i, y: y.to(dtype))


def load_sentence_transformer(folder: str, device: str = "cpu", **kwargs: Any) -> Any:
    """``SentenceTransformer(folder)`` of a sentence-transformers folder written by
    quantize-model: its modules (pooling, normalization, ...) as the folder's ``modules.json``
    says, the transformer's quantized layers on libwush's runtime. Needs the package
    sentence-transformers; ``kwargs`` go to SentenceTransformer. Raises FileNotFoundError for a
    folder that is not a quantized folder, ImportError without sentence-transformers."""
    require_model_folder(folder, quantized=True)
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as e:
        raise ImportError(f"wush.load_sentence_transformer needs the package sentence-transformers ({e}); "
                          f"wush.load_quantized loads the transformer alone") from None
    register()
    return SentenceTransformer(folder, device=device, local_files_only=True, **kwargs)
