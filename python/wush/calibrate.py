"""Calibration with PyTorch: forward pre-hooks that stream each selected layer's inputs into a
libwush calibrator, and running the model over the calibration batches.

Memory: a calibrator keeps moments (d_in*G doubles per layer block-diagonal, d_in^2 full for
GPTQ) and, with the per-block search, bounded token samples (``search_tokens`` and at most
``validation_size`` tokens of d_in floats each), so calibration memory does not grow with the
number of tokens.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch
from torch import nn

from . import _core
from ._core import Calibrator
from .layers import in_features, select_linears


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

    A forward pass given an ``attention_mask`` keyword of shape (batch, seq) (the padded
    sentence batches of an encoder) adds only the rows of real tokens: a padded position's
    activations reach no real token's output, and in a batch of sentences of unequal lengths
    they can be half of the rows, which would then weigh as much as the text in the moments.

    Each sequence (a row of a batch x seq input; a 2-D input is one) is added as a sequence; while
    ``documents`` holds this batch's document ids (one per sequence), as part of that document
    (``Calibrator.add(document=)``): the search's guard then holds out whole documents and scores
    the WUSH layers fit without them (a cross-fit).
    """

    def __init__(self, model: nn.Module, layers: Dict[str, nn.Module], group_size: int,
                 mode: str = "block_diagonal", share_inputs: bool = True,
                 calibrator_args: Optional[Dict[str, int]] = None):
        self.model, self.layers, self.group_size, self.mode = model, layers, group_size, mode
        self.share_inputs = share_inputs
        self.documents: Optional[Sequence[int]] = None  # this batch's document id per sequence
        self.calibrator_args = calibrator_args or {}
        self.validation = False
        self.calibrators: Dict[str, Calibrator] = {}
        self._seen: Dict[Tuple, Tuple[Calibrator, torch.Tensor]] = {}
        self._added: set = set()
        self._handles: List[Any] = []
        self._mask: Optional[torch.Tensor] = None  # this pass's (batch, seq) token mask

    def _reset(self, *_: Any) -> None:
        self._seen.clear()
        self._added.clear()
        self._mask = None

    def _start(self, _module: nn.Module, _args: Tuple, kwargs: Dict[str, Any]) -> None:
        self._reset()
        mask = kwargs.get("attention_mask")
        if isinstance(mask, torch.Tensor) and mask.dim() == 2 and not bool(mask.bool().all()):
            self._mask = mask.bool()

    def _add(self, cal: Calibrator, x: torch.Tensor, d_in: int) -> None:
        """Adds ``x``'s rows without the padded positions of this pass's attention mask; a
        batch x seq x d_in input as whole sequences (the guard's hold-out unit)."""
        x = x.detach()
        mask = self._mask
        padded = mask is not None and x.dim() == 3 and tuple(mask.shape) == tuple(x.shape[:2])
        if self.validation:
            cal.add_validation(x[mask.to(x.device)] if padded else x.reshape(-1, d_in))
        elif padded:  # each sentence's real tokens: one sequence of its own length
            for b, n in enumerate(mask.sum(dim=1).tolist()):
                if n:
                    self._add_sequence(cal, x[b][mask[b].to(x.device)], b)
        elif self.documents is not None:  # each sequence (a 2-D input is one) as part of its document
            seqs = x if x.dim() == 3 else x.reshape(1, -1, d_in)
            for b in range(seqs.shape[0]):
                self._add_sequence(cal, seqs[b], b)
        else:
            cal.add(x.reshape(-1, d_in), sequence_length=x.shape[1] if x.dim() == 3 and x.shape[1] > 0 else None)

    def _add_sequence(self, cal: Calibrator, rows: torch.Tensor, b: int) -> None:
        """Adds one sequence's rows (row ``b`` of this pass's batch): as part of its document, or
        as a sequence."""
        if self.documents is not None:
            if b >= len(self.documents):
                raise ValueError(f"a calibration batch has more sequences than its {len(self.documents)} document ids")
            cal.add(rows, document=int(self.documents[b]))
        else:
            cal.add(rows, sequence_length=rows.shape[0])

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
                    cal = Calibrator(in_features(module), self.group_size, self.mode, **self.calibrator_args)
                self.calibrators[name] = cal
            # The entry holds the tensor so that its storage cannot be freed and reused by a
            # later, different input at the same address during this pass (a false match).
            self._seen.setdefault(key, (cal, x))
            if (id(cal), key) in self._added:
                return  # a layer sharing this calibrator already added this very tensor
            self._added.add((id(cal), key))
            self._add(cal, x, in_features(module))
        return hook

    def __enter__(self) -> "HookCalibration":
        self._handles.append(self.model.register_forward_pre_hook(self._start, with_kwargs=True))
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


class _Stop(Exception):
    pass


def _run_all(model: nn.Module, batches: List, stop_at: Optional[nn.Module] = None,
             before: Optional[Callable[[int], None]] = None) -> None:
    """Runs every batch (``before(i)`` first, if given); with ``stop_at``, each forward pass ends
    after that module (the hooks before it have seen their inputs)."""
    def raise_stop(*_: Any) -> None:
        raise _Stop()
    stop = stop_at.register_forward_hook(raise_stop) if stop_at is not None else None
    try:
        for i, b in enumerate(batches):
            if before is not None:
                before(i)
            try:
                _run(model, b)
            except _Stop:
                pass
    finally:
        if stop is not None:
            stop.remove()
