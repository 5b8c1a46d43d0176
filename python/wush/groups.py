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

from .layers import _replace
from .quantized_linear import QuantizedGroup, QuantizedLinear, QuantizedPart, concatenated_bias, is_quantized

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


def install_group(model: nn.Module, group: QuantizedLinear, parts: Sequence[Tuple[str, int]],
                  biases: Sequence[Optional[torch.Tensor]], modules: Optional[Sequence[str]] = None) -> None:
    """Replaces each part's module of ``model`` (``modules``, default the part names) by a
    :class:`QuantizedPart` of ``group``."""
    shared = QuantizedGroup(group, parts)
    for i, name in enumerate(modules or [p for p, _ in parts]):
        _replace(model, name, QuantizedPart(shared, i, biases[i]))


def checkpoint_modules(ck: Any) -> Dict[str, List[Tuple[str, int]]]:
    """Checkpoint layer -> its parts as (module name, rows); a plain layer is its own single part
    with rows 0 (the checkpoint's layer ``ck``: :class:`wush.Checkpoint`)."""
    out: Dict[str, List[Tuple[str, int]]] = {}
    for layer in ck.layer_names():
        parts = ck.layer_parts(layer)
        out[layer] = [(name, rows) for name, _, rows in parts] if parts else [(layer, 0)]
    return out
