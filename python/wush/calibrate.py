"""Calibration with PyTorch: forward pre-hooks that stream each selected layer's inputs into a
libwush calibrator, and running the model over the calibration batches.

Memory: a calibrator keeps moments (d_in*G doubles per layer block-diagonal, d_in^2 full for
GPTQ) and, with the per-block search, bounded token samples (``search_tokens`` and at most
``validation_size`` tokens of d_in floats each), so a calibrator's memory does not grow with the
number of tokens. GPTQ's block-by-block pass also keeps one block's input and output hidden states
for every calibration token (:class:`BlockInputs`).
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
        self.begin_pass(kwargs.get("attention_mask"))

    def begin_pass(self, attention_mask: Any = None) -> None:
        """Starts a forward pass whose (batch, seq) token mask is ``attention_mask`` (the model's
        own keyword; None: every position is a token). The model's forward calls it through a
        hook; :class:`BlockInputs`, which runs blocks without the model, calls it directly."""
        self._reset()
        mask = attention_mask
        if isinstance(mask, torch.Tensor) and mask.dim() == 2 and not bool(mask.bool().all()):
            self._mask = mask.bool()

    def end_pass(self) -> None:
        """Ends a forward pass: drops the inputs held for the pass's shared-input matching."""
        self._reset()

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
        self._handles.append(self.model.register_forward_hook(lambda *_: self.end_pass()))
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


def _run_all(model: nn.Module, batches: List, before: Optional[Callable[[int], None]] = None) -> None:
    """Runs every batch (``before(i)`` first, if given)."""
    for i, b in enumerate(batches):
        if before is not None:
            before(i)
        _run(model, b)


def _is_cache(v: Any) -> bool:
    """A transformers key/value cache (duck-typed: the package need not be imported here)."""
    return hasattr(v, "update") and hasattr(v, "get_seq_length")


def _first(out: Any) -> torch.Tensor:
    """A block's output hidden states: the tensor, or the first element of its tuple."""
    return out[0] if isinstance(out, (tuple, list)) else out


class BlockInputs:
    """The inputs of each transformer block for every batch, kept in memory so that block ``i``
    runs on the outputs of blocks ``0..i-1`` as they are now (quantized, for GPTQ) without a
    forward pass from the embeddings each time: linear in the depth, where re-running the prefix
    is quadratic. Memory: one block's input and output hidden states for all batches (tokens x
    hidden size floats, twice), and references to each block's other arguments.

    One float forward pass of ``model`` over ``batches`` records, per block and batch, the
    arguments besides the hidden states (masks, position embeddings: computed by the model before
    its blocks, the same whatever the hidden states are; a key/value cache is dropped and
    ``use_cache`` turned off, which leaves a single forward pass's result unchanged), and block
    0's hidden states. :meth:`inputs` then advances the hidden states block by block."""

    def __init__(self, model: nn.Module, blocks: nn.ModuleList, batches: List):
        self.blocks, self.n_batches = blocks, len(batches)
        self.masks = [b.get("attention_mask") if isinstance(b, dict) else None for b in batches]
        self.args: List[List[Tuple[Tuple, Dict[str, Any]]]] = [[] for _ in blocks]
        self.hidden: List[torch.Tensor] = []
        self.at = 0  # the block whose inputs ``hidden`` holds

        passed: List[torch.Tensor] = []  # what the previous block returned besides its hidden states

        def record(index: int) -> Any:
            def hook(_m: nn.Module, args: Tuple, kwargs: Dict[str, Any]) -> None:
                if index > 0 and any(v is p for v in (*args[1:], *kwargs.values()) for p in passed):
                    raise ValueError(f"block {index} takes an output of block {index - 1} besides the hidden "
                                     f"states (e.g. a position bias): GPTQ's block-by-block pass does not "
                                     f"support such a model")
                kwargs = {k: (None if _is_cache(v) else v) for k, v in kwargs.items()}
                if "use_cache" in kwargs:
                    kwargs["use_cache"] = False
                if args:
                    hidden, rest = args[0], tuple(None if _is_cache(v) else v for v in args[1:])
                else:
                    hidden, rest = kwargs.pop("hidden_states"), ()
                self.args[index].append((rest, kwargs))
                if index == 0:
                    self.hidden.append(hidden.detach())
            return hook

        def returned(_m: nn.Module, _args: Tuple, out: Any) -> None:
            passed.clear()
            if isinstance(out, (tuple, list)):
                passed.extend(v for v in out[1:] if isinstance(v, torch.Tensor))

        handles = [blk.register_forward_pre_hook(record(i), with_kwargs=True) for i, blk in enumerate(blocks)]
        handles += [blk.register_forward_hook(returned) for blk in blocks]
        try:
            for b in batches:
                _run(model, b)
        finally:
            for h in handles:
                h.remove()
        if any(len(a) != len(batches) for a in self.args):
            raise ValueError("a transformer block did not run exactly once per calibration batch; "
                             "GPTQ's block-by-block pass needs each block once per forward pass")

    def _call(self, index: int, j: int) -> torch.Tensor:
        rest, kwargs = self.args[index][j]
        return _first(self.blocks[index](self.hidden[j], *rest, **kwargs))

    def inputs(self, index: int) -> None:
        """Advances the held hidden states to block ``index``'s inputs, running the blocks in
        between as they are now."""
        if index < self.at:
            raise ValueError(f"block {index}'s inputs were passed already (at block {self.at})")
        while self.at < index:
            self.hidden = [self._call(self.at, j).detach() for j in range(self.n_batches)]
            self.at += 1

    def run(self, index: int, hc: "HookCalibration", lo: int, hi: int,
            before: Optional[Callable[[int], None]] = None) -> None:
        """Runs block ``index`` (its inputs first, :meth:`inputs`) on batches ``lo..hi-1`` with
        ``hc``'s hooks seeing its layers' inputs (``before(i - lo)`` before batch i)."""
        self.inputs(index)
        for j in range(lo, hi):
            if before is not None:
                before(j - lo)
            hc.begin_pass(self.masks[j])
            self._call(index, j)
            hc.end_pass()
