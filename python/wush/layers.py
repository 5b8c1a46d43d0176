"""The linear layers of a torch model: which ones to quantize (the selection), their weights in
nn.Linear's layout, the repeated blocks they sit in, and putting another module in a layer's place.
"""

from __future__ import annotations

import re
from typing import Dict, List, Optional, Tuple

import torch
from torch import nn

from .quantized_linear import is_quantized


def _is_conv1d(m: nn.Module) -> bool:
    # transformers' Conv1D (GPT-2 and relatives): a linear layer whose weight is stored (d_in, d_out).
    return type(m).__name__ == "Conv1D" and type(m).__module__.startswith("transformers")


def is_linear(m: nn.Module) -> bool:
    """A layer :func:`quantize_model` can quantize: nn.Linear or transformers' Conv1D."""
    return isinstance(m, nn.Linear) or _is_conv1d(m)


def in_features(m: nn.Module) -> int:
    return m.weight.shape[0] if _is_conv1d(m) else m.in_features


def dense_weight(m: nn.Module) -> torch.Tensor:
    """The layer's weight as a contiguous float32 (d_out, d_in) tensor (nn.Linear's layout)."""
    w = m.weight.detach()
    return (w.t() if _is_conv1d(m) else w).float().contiguous()


def repeated_blocks(model: nn.Module) -> List[str]:
    """Names of the lists of repeated transformer blocks: every nn.ModuleList of two or more
    modules of one class holding a linear layer, not nested in another such list (Llama's
    ``model.layers``, GPT-2's ``transformer.h``, BERT's ``encoder.layer``, T5's two ``block``
    lists). Experts lists inside a block are covered by the block."""
    found: List[str] = []
    for n, m in model.named_modules():
        if not isinstance(m, nn.ModuleList) or len(m) < 2 or len({type(c) for c in m}) != 1:
            continue
        if not any(is_linear(x) for x in m[0].modules()):
            continue
        if any(n.startswith(f + ".") for f in found):
            continue
        found.append(n)
    return found


def default_pattern(model: nn.Module) -> str:
    """The default selection: the linear layers inside the repeated blocks, whatever their names
    (embeddings, heads and poolers sit outside and are left alone)."""
    blocks = repeated_blocks(model)
    if not blocks:
        return r"(^|\.)(layers|h|blocks|layer|block)\.\d+\."
    return "^(" + "|".join(re.escape(b) for b in blocks) + r")\.\d+\."


# Kept for callers that used it: the default for models whose blocks sit under these names.
DEFAULT_PATTERN = r"(^|\.)(layers|h|blocks)\.\d+\."


def select_linears(model: nn.Module, pattern: Optional[str] = None) -> Dict[str, nn.Module]:
    """The linear layers (:func:`is_linear`) whose qualified name matches ``pattern`` (regex,
    searched; default :func:`default_pattern`)."""
    rx = compile_pattern(pattern) if pattern else re.compile(default_pattern(model))
    return {n: m for n, m in model.named_modules() if is_linear(m) and rx.search(n)}


def compile_pattern(pattern: str) -> "re.Pattern[str]":
    """``pattern`` compiled; ValueError (one line) for one that is not a regular expression."""
    try:
        return re.compile(pattern)
    except re.error as e:
        raise ValueError(f"the layer selection {pattern!r} is not a regular expression: {e}") from None


def selection_error(model: nn.Module, pattern: Optional[str]) -> str:
    """The message for an empty selection: the pattern and the linear layers there are."""
    names = [n for n, m in model.named_modules() if is_linear(m)]
    shown = ", ".join(names[:12]) + (f", ... ({len(names)} in all)" if len(names) > 12 else "")
    return (f"no linear layer matches the selection {pattern or default_pattern(model)!r}; "
            f"the model's linear layers: {shown or 'none'}")


def tied_to(model: nn.Module, name: str) -> Optional[str]:
    """The name of the model parameter that layer ``name``'s weight is tied to (the same tensor
    under another module: the input embeddings of a tied LM head), or None when the weight is the
    layer's own."""
    w = getattr(model.get_submodule(name), "weight", None)
    if w is None:
        return None
    return next((n for n, p in model.named_parameters(remove_duplicate=False)
                 if p is w and n != name + ".weight"), None)


def output_layer_name(model: nn.Module) -> str:
    """The module name of the model's output layer (``get_output_embeddings()``: the LM head);
    ValueError when the model has none that :func:`quantize_model` can quantize."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    name = next((n for n, m in model.named_modules() if m is head), None) if head is not None else None
    if name is None or not is_linear(head):
        raise ValueError(f"{type(model).__name__} has no linear output layer (LM head) to quantize")
    return name


def with_output_layer(model: nn.Module, pattern: Optional[str]) -> str:
    """``pattern`` (default :func:`default_pattern`) widened to select the output layer too."""
    base = pattern or default_pattern(model)
    return f"(?:{base})|^{re.escape(output_layer_name(model))}$"


def linear_names(model: nn.Module) -> List[str]:
    return [n for n, m in model.named_modules() if is_linear(m) or is_quantized(m)]


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


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)
