"""Grouped layers: linear layers that read the same input (a block's q/k/v projections, its
gate/up pair) built as one layer over their concatenated rows, so that a token's activations are
transformed and quantized once and one W4A4 GEMM serves all of them.

A group is one checkpoint layer whose rows are split into named parts
(``wush_checkpoint_add_grouped_layer``); in the model each part's module becomes a
:class:`QuantizedPart`, which returns its rows of the group's output.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from .quantized_linear import QuantizedLinear


def group_name(parts: Sequence[str]) -> str:
    """The checkpoint name of a group of layers: ``block.attn.q_proj+k_proj+v_proj`` when they
    share a parent module, else their full names joined by ``+``."""
    parents = {p.rpartition(".")[0] for p in parts}
    if len(parents) == 1 and next(iter(parents)):
        parent = next(iter(parents))
        return parent + "." + "+".join(p.rpartition(".")[2] for p in parts)
    return "+".join(parts)


class QuantizedGroup:
    """The grouped layer a group's :class:`QuantizedPart` modules share: its :class:`QuantizedLinear`
    (the concatenated bias fused) runs once per input, and each part takes its rows. The output
    is held until every part has taken its rows of that input (or another input arrives), so the
    parts may run in any order; a part called again with the same input recomputes."""

    def __init__(self, layer: QuantizedLinear, parts: Sequence[Tuple[str, int]]):
        self.layer = layer
        self.parts = [(name, rows) for name, rows in parts]
        self._x: Optional[torch.Tensor] = None
        self._version = -1
        self._y: Optional[torch.Tensor] = None
        self._left: set = set()

    def rows(self, x: torch.Tensor, index: int, lo: int, hi: int) -> torch.Tensor:
        if self._x is not x or self._version != x._version or index not in self._left:
            self._y = self.layer(x)
            self._x, self._version = x, x._version
            self._left = set(range(len(self.parts)))
        self._left.discard(index)
        y = self._y[..., lo:hi].contiguous()
        if not self._left:
            self._x = self._y = None  # nothing held between tokens
        return y


class QuantizedPart(nn.Module):
    """Stands for one layer of a group: its rows ``[lo, hi)`` of the group's output, a tensor of
    its own (contiguous). ``bias`` is the layer's own (kept for its state_dict; the group adds
    the concatenated bias inside the library's call)."""

    def __init__(self, group: QuantizedGroup, index: int, bias: Optional[torch.Tensor]):
        super().__init__()
        lo = sum(rows for _, rows in group.parts[:index])
        self.index, self.lo, self.hi = index, lo, lo + group.parts[index][1]
        self.in_features, self.out_features = group.layer.in_features, self.hi - self.lo
        object.__setattr__(self, "group", group)  # shared by the parts: not a submodule of each
        if bias is not None:
            self.bias = nn.Parameter(bias.detach().clone(), requires_grad=False)
        else:
            self.register_parameter("bias", None)

    def extra_repr(self) -> str:
        name = self.group.parts[self.index][0]
        return (f"{name}: rows {self.lo}..{self.hi} of a group of {len(self.group.parts)}, "
                f"in_features={self.in_features}, format={self.group.layer.format}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.rows(x, self.index, self.lo, self.hi)


def concatenated_bias(biases: Sequence[Optional[torch.Tensor]], rows: Sequence[int]) -> Optional[torch.Tensor]:
    """The group's bias: the parts' biases one after another (zeros for a part without one), or
    None when no part has one."""
    if all(b is None for b in biases):
        return None
    like = next(b for b in biases if b is not None)
    return torch.cat([b.detach().to(like.dtype) if b is not None else like.new_zeros(r)
                      for b, r in zip(biases, rows)])


def install_group(model: nn.Module, group: QuantizedLinear, parts: Sequence[Tuple[str, int]],
                  biases: Sequence[Optional[torch.Tensor]], modules: Optional[Sequence[str]] = None) -> None:
    """Replaces each part's module of ``model`` (``modules``, default the part names) by a
    :class:`QuantizedPart` of ``group``."""
    from .layers import _replace
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


def is_quantized(m: nn.Module) -> bool:
    """A module that runs on libwush: a QuantizedLinear or a part of a grouped layer."""
    return isinstance(m, (QuantizedLinear, QuantizedPart))
