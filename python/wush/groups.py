"""Grouped layers: linear layers that read the same input (a block's q/k/v projections, its
gate/up pair) built as one layer over their concatenated rows, so that a token's activations are
transformed and quantized once and one W4A4 GEMM serves all of them.

A group is one checkpoint layer whose rows are split into named parts
(``wush_checkpoint_add_grouped_layer``); in the model each part's module becomes a
:class:`QuantizedPart` (defined beside QuantizedLinear), which returns its rows of the group's
output.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from ._core import Context, QWeight, Transform
from .layers import _replace
from .quantized_linear import QuantizedGroup, QuantizedLinear, QuantizedPart, is_quantized

__all__ = ["QuantizedGroup", "QuantizedPart", "checkpoint_modules", "concatenated_bias", "group_name",
           "install_group", "is_quantized"]


def group_name(parts: Sequence[str]) -> str:
    """The checkpoint name of a group of layers: ``block.attn.q_proj+k_proj+v_proj`` when they
    share a parent module, else their full names joined by ``+``."""
    parents = {p.rpartition(".")[0] for p in parts}
    if len(parents) == 1 and next(iter(parents)):
        parent = next(iter(parents))
        return parent + "." + "+".join(p.rpartition(".")[2] for p in parts)
    return "+".join(parts)


def concatenated_bias(biases: Sequence[Optional[torch.Tensor]], rows: Sequence[int]) -> Optional[torch.Tensor]:
    """The group's bias: the parts' biases one after another (zeros for a part without one), or
    None when no part has one."""
    if all(b is None for b in biases):
        return None
    like = next(b for b in biases if b is not None)
    return torch.cat([b.detach().to(like.dtype) if b is not None else like.new_zeros(r)
                      for b, r in zip(biases, rows)])


def install_group(model: nn.Module, transform: Transform, qweight: QWeight, parts: Sequence[Tuple[str, int]],
                  ctx: Optional[Context] = None) -> None:
    """Prepares the grouped layer (``transform``, ``qweight``: the parts' rows one after another,
    on ``ctx``, default the CPU) with the concatenated bias of the modules it replaces, and puts a
    :class:`QuantizedPart` of it in the place of each part's module of ``model`` (``parts``: module
    name, rows, in row order)."""
    biases = [getattr(model.get_submodule(name), "bias", None) for name, _ in parts]
    layer = QuantizedLinear(transform, qweight, concatenated_bias(biases, [rows for _, rows in parts]), ctx)
    shared = QuantizedGroup(layer, parts)
    for i, (name, _) in enumerate(parts):
        _replace(model, name, QuantizedPart(shared, i, biases[i]))


def checkpoint_modules(ck: Any) -> Dict[str, List[Tuple[str, int]]]:
    """Layer of the opened :class:`wush.Checkpoint` ``ck`` -> its parts as (module name, rows); a
    plain layer is its own single part, with rows 0 (its qweight's d_out)."""
    out: Dict[str, List[Tuple[str, int]]] = {}
    for layer in ck.layer_names():
        parts = ck.layer_parts(layer)
        out[layer] = [(name, rows) for name, _, rows in parts] if parts else [(layer, 0)]
    return out
