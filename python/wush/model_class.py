"""Which class a folder's model is built as (the one its config names, or the bare model), the
checks of its stored weights against that class, and what kind of model it is.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn

from . import _core
from .stored import _stored_key, stored_tensor_shapes


def model_class(config: Any) -> Any:
    """The class named by ``config.architectures`` (e.g. LlamaForCausalLM, BertModel), else
    AutoModel's choice for the config."""
    import transformers
    for arch in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, arch, None)
        if cls is not None:
            return cls
    return transformers.AutoModel


def folder_model_class(model_dir: str, config: Any, stored: Optional[Dict[str, Any]] = None) -> Any:
    """The class to build a folder's model as: the one its config's ``architectures`` names
    (:func:`model_class`), unless the folder holds the bare model: a sentence-transformers folder
    (``modules.json``: its Transformer module is the bare model, whatever config.json names) or
    stored weights without any of that class's head tensors (e.g. ``BertForMaskedLM`` named,
    ``cls.predictions.*`` absent). Then AutoModel's bare model for the config."""
    import transformers
    cls = model_class(config)
    if cls is transformers.AutoModel:
        return cls
    if os.path.isfile(os.path.join(model_dir, "modules.json")):
        return transformers.AutoModel
    if stored is None:
        stored = stored_tensor_shapes(model_dir)
    if not stored:
        return cls
    meta = _meta_model(cls, config)
    head = _head_keys(meta)
    prefix = getattr(meta, "base_model_prefix", "") or ""
    if head and not any(_stored_key(k, prefix, stored) for k in head):
        return transformers.AutoModel
    return cls


def check_weights_match(model_dir: str, cls: Any, config: Any, stored: Dict[str, Tuple[int, ...]]) -> None:
    """Raises ValueError (one line) when a stored tensor's shape differs from the one the config
    gives the model's tensor of that name (e.g. config.json's hidden size edited)."""
    meta = _meta_model(cls, config)
    prefix = getattr(meta, "base_model_prefix", "") or ""
    bad = []
    for k, t in meta.state_dict().items():
        sk = _stored_key(k, prefix, stored)
        if sk is not None and tuple(stored[sk]) != tuple(t.shape):
            bad.append(f"{sk} is stored {list(stored[sk])}, the config makes it {list(t.shape)}")
    if bad:
        more = f" (and {len(bad) - 2} more)" if len(bad) > 2 else ""
        raise ValueError(f"{_core.printable(model_dir)}: the weights do not match config.json: "
                         f"{'; '.join(bad[:2])}{more}")


def check_stored_layers(model_dir: str, layers: Dict[str, nn.Module],
                        stored: Optional[Dict[str, Tuple[int, ...]]] = None, model: Optional[nn.Module] = None) -> None:
    """Raises ValueError naming every selected layer (name -> module) whose weight the folder
    does not store under the module's name (a base model prefix such as ``bert.`` allowed) with
    the module's shape: such a layer would be quantized from transformers' random initialization,
    and :func:`save_quantized` could not place it. With ``model`` (the modules' model), a layer
    whose weight is tied to another stored parameter of its shape (a tied LM head: the input
    embeddings) passes too. Call it before calibrating (seconds)."""
    from .layers import tied_to
    if stored is None:
        stored = stored_tensor_shapes(model_dir)
    if stored is None:
        return  # no readable weight files: from_pretrained has already said so
    prefix = getattr(model, "base_model_prefix", "") or "" if model is not None else ""
    unmapped = []
    for name, m in layers.items():
        cands = [k for k in stored if k == name + ".weight" or k.endswith("." + name + ".weight")]
        if not cands and model is not None:
            source = tied_to(model, name)
            key = _stored_key(source, prefix, stored) if source else None
            cands = [key] if key is not None else []
        if len(cands) != 1 or tuple(stored[cands[0]]) != tuple(m.weight.shape):
            unmapped.append(name if len(cands) != 1 else f"{name} (stored {list(stored[cands[0]])}, "
                            f"the model's {list(m.weight.shape)})")
    if unmapped:
        shown = ", ".join(unmapped[:8]) + (f", ... ({len(unmapped)} in all)" if len(unmapped) > 8 else "")
        raise ValueError(f"{_core.printable(model_dir)}: the selected layers {shown} have no stored weight of "
                         f"their shape in the folder; select others with --layers (layers=)")


def _meta_model(cls: Any, config: Any) -> nn.Module:
    """``cls`` built from ``config`` on the meta device (shapes only, no memory, milliseconds)."""
    import transformers
    if cls is transformers.AutoModel:
        with torch.device("meta"):
            return transformers.AutoModel.from_config(config)
    with torch.device("meta"):
        return cls(config)


def _head_keys(model: nn.Module) -> List[str]:
    """The state_dict keys of ``model`` outside its base model (the task head), less those tied
    to a base model parameter (an output embedding tied to the input one is not stored)."""
    prefix = getattr(model, "base_model_prefix", "") or ""
    if not prefix or not isinstance(getattr(model, prefix, None), nn.Module):
        return []
    base_ids = {id(p) for n, p in model.named_parameters(remove_duplicate=False) if n.startswith(prefix + ".")}
    tied = {n for n, p in model.named_parameters(remove_duplicate=False) if id(p) in base_ids}
    return [k for k in model.state_dict() if not k.startswith(prefix + ".") and k not in tied]


def is_causal(model: nn.Module) -> bool:
    """Whether the model generates text (a causal language model head)."""
    try:
        return bool(model.can_generate())
    except Exception:  # noqa: BLE001 - older/other models: no can_generate
        return False
