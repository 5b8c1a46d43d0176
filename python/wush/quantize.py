"""Model-level quantization: RTN or GPTQ over the selected linear layers of a model, each replaced
in place by a :class:`QuantizedLinear`; the result holds the transforms and quantized weights.
"""

from __future__ import annotations

import functools
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch
from torch import nn

from . import _core
from ._core import Calibrator, Checkpoint, Options, QWeight, Transform
from .calibrate import BlockInputs, HookCalibration, _progress, _run_all
from .layers import _block_index, _replace, dense_weight, find_blocks, select_linears, selection_error, tied_to
from .groups import group_name, install_group
from .quantized_linear import QuantizedLinear


def _groups(cals: Dict[str, Calibrator], names: List[str], group_inputs: bool) -> List[List[str]]:
    """``names`` in order, as lists of the layers built as one: with ``group_inputs`` those that
    share a calibrator (the same input), else one each."""
    if not group_inputs:
        return [[n] for n in names]
    by_input: Dict[int, List[str]] = {}
    for n in names:
        by_input.setdefault(id(cals[n]), []).append(n)
    return list(by_input.values())


class QuantizationResult:
    """What :func:`quantize_model` made: per layer name, the (transform, qweight) pair in
    ``layers``, and in ``guard`` what the search's per-layer guard compared and kept
    (:meth:`wush.Transform.guard`: None where no guard ran, e.g. without ``search``)."""

    def __init__(self, fmt: str, transform: str, method: str):
        self.format, self.transform, self.method = fmt, transform, method
        self.layers: Dict[str, Tuple[Transform, QWeight]] = {}
        self.guard: Dict[str, Optional[dict]] = {}
        # Layers whose weight was tied to another parameter (a tied LM head): layer -> that
        # parameter's name. The quantized layer no longer shares it; the parameter stays.
        self.tied: Dict[str, str] = {}
        # Grouped layers (group_inputs): checkpoint name -> its parts (module name, rows) in row order.
        self.parts: Dict[str, List[Tuple[str, int]]] = {}

    def guard_table(self) -> str:
        """The per-layer guard decisions as a text table (one line per guarded layer)."""
        names = ("searched", "plain", "identity", "hadamard", "random", "shrunk")
        lines = [f"{'layer':40s} {'source':10s} {'tokens':>6s} {'kept':9s} " +
                 " ".join(f"{n:>10s}" for n in names) + f" {'diff/se':>8s}"]
        for layer, g in self.guard.items():
            if g is None:
                continue
            c = g["candidates"]
            k = c[g["kept"]]
            ratio = k["difference"] / k["std_error"] if g["kept"] != "searched" and k["std_error"] > 0 else float("nan")
            lines.append(f"{layer:40s} {g['source']:10s} {g['n_tokens']:6d} {g['kept']:9s} " +
                         " ".join(f"{c[n]['loss']:10.4e}" for n in names) + f" {ratio:8.2f}")
        return "\n".join(lines)

    @property
    def undecided(self) -> List[str]:
        """The layers whose guard could not decide (a candidate lower by more than 1% but within
        the noise of the held-out tokens): where validation documents would help."""
        return [layer for layer, g in self.guard.items() if g is not None and g["undecided"]]

    def checkpoint(self) -> Checkpoint:
        ck = Checkpoint()
        for name, (t, q) in self.layers.items():
            if name in self.parts:
                ck.add_grouped_layer(name, t, q, self.parts[name])
            else:
                ck.add_layer(name, t, q)
        return ck

    def modules(self) -> Dict[str, Tuple[int, int]]:
        """Every module the result quantized (a plain layer, or a part of a grouped layer) ->
        its (d_out, d_in)."""
        out: Dict[str, Tuple[int, int]] = {}
        for name, (_, q) in self.layers.items():
            d_out, d_in = q.info()[2:4]
            for part, rows in self.parts.get(name, [(name, d_out)]):
                out[part] = (rows, d_in)
        return out


def quantize_model(model: nn.Module, batches: Iterable, format: str = "mxfp4", transform: str = "wush",
                   method: str = "rtn", layers: Optional[str] = None, damping: Optional[float] = None,
                   share_inputs: bool = True, progress: bool = False, search: bool = False,
                   search_tokens: int = 1024, validation_batches: Optional[Iterable] = None,
                   validation_size: int = 4096, search_guard: bool = True,
                   documents: Optional[Iterable[Sequence[int]]] = None,
                   seed: Optional[int] = None, group_inputs: bool = False) -> QuantizationResult:
    """Quantizes the selected linear layers of ``model`` in place (each becomes a
    :class:`QuantizedLinear`) and returns the transforms and quantized weights.

    - ``method="rtn"``: one calibration pass over ``batches`` for all layers (block-diagonal
      moments), then each layer is quantized independently.
    - ``method="gptq"``: block by block as in the paper, "WUSH: Near-Optimal Adaptive Transforms
      for LLM Quantization": the Hessians of block i are collected with blocks 0..i-1 already
      quantized, so block i sees the inputs the quantized model produces. Each block's inputs
      for every batch are kept in memory (:class:`wush.calibrate.BlockInputs`: tokens x hidden
      size floats, twice) and advanced one block at a time, so the cost is linear in the depth.

    With ``search=True`` (``transform`` "wush" or "wus"; WUSH_OPTION_SEARCH) each block's scale,
    signs and fall-backs are chosen per layer for ``format``, scored on a sample of
    ``search_tokens`` calibration tokens per layer. ``validation_batches`` (documents the
    calibration does not see) feed the search's per-layer guard: a sample of at most
    ``validation_size`` of their tokens per layer, on which the searched layer competes with plain
    WUSH and the I, H and R layers built the same way; an alternative wins only by a margin the
    sample supports (WUSH_OPTION_SEARCH_GUARD in wush.h). They run through the model like the
    calibration batches (with GPTQ, through the blocks already quantized). Without them the guard
    holds out half of each layer's sampled sequences (each row of a batch; ``search_guard=False``:
    no guard then), or with ``documents`` (per batch, the document id of each of its sequences, any
    int in [0, 2**64): the windows of one text share one) half of the documents, and scores the
    WUSH layers as fit without them (a cross-fit: held-out tokens that the moments contain cannot
    show a layer that fits them only; wush_calibrator_add_document). ``seed`` (WUSH_OPTION_SEED;
    the library's default if None) draws the random rotations and the guard's held-out half.

    With ``group_inputs`` the selected layers that read the very same input in a forward pass
    (a block's q/k/v projections, its gate/up pair: those sharing a calibrator) are built as one
    layer each: WUSH from their concatenated weights and the input statistics they share, one
    quantized weight over their rows (:mod:`wush.groups`). Each such layer runs one activation
    transform and quantization and one GEMM for all of them; ``result.parts`` names its parts.
    (It needs ``share_inputs``.)

    A selected layer whose weight is tied to another parameter (an LM head tied to the input
    embeddings: ``layers`` naming it, or :func:`wush.torch.with_output_layer`) is quantized from
    that weight and no longer shares it; the parameter stays for its other use, and
    ``result.tied`` names it (:func:`save_quantized` then writes the folder untied).

    Transforms are stored in bf16 (WUSH_OPTION_TRANSFORM_DTYPE) so the fp_quant export can
    represent them exactly.
    """
    batches = list(batches)
    validation = list(validation_batches) if validation_batches is not None else []
    selected = select_linears(model, layers)
    if not selected:
        raise ValueError(selection_error(model, layers))
    _core.check_search(transform, search)
    if group_inputs and not share_inputs:
        raise ValueError("group_inputs builds the layers that share a calibrator as one: it needs share_inputs=True")
    if validation and not search:
        raise ValueError("validation_batches feed the search's guard: pass search=True")
    doc_ids = [list(d) for d in documents] if documents is not None else None
    if doc_ids is not None and len(doc_ids) != len(batches):
        raise ValueError(f"documents has {len(doc_ids)} entries for {len(batches)} calibration batches: give one "
                         f"list of document ids (one per sequence) per batch")
    opts = Options(damping=damping, seed=seed, transform_dtype="bf16", search=search or None,
                   search_tokens=search_tokens if search else None, search_guard=search_guard if search else None)
    cal_args = {"sample_size": opts.sample_size()} if search else {}
    if validation:
        cal_args["validation_size"] = validation_size
    result = QuantizationResult(format, transform, method)
    result.search = bool(search)
    result.tied = {n: src for n in selected if (src := tied_to(model, n)) is not None}
    g = _core.format_group_size(format)

    def collect(hc: HookCalibration, run: Callable[[int, int, Optional[Callable[[int], None]]], None]) -> None:
        """The calibration batches (each with its documents), then the validation batches;
        ``run(lo, hi, before)`` runs batches lo..hi-1 of calibration + validation."""
        def mark(i: int) -> None:
            hc.documents = doc_ids[i] if doc_ids is not None else None
        run(0, len(batches), mark)
        hc.documents = None
        hc.validation = True
        run(len(batches), len(everything), None)

    everything = batches + validation

    def whole_model(lo: int, hi: int, before: Optional[Callable[[int], None]]) -> None:
        _run_all(model, everything[lo:hi], before)

    def quantize_layers(cals: Dict[str, Calibrator], names: List[str]) -> None:
        for members in _progress(_groups(cals, names, group_inputs), progress, "quantize"):
            lins = [selected[n] for n in members]
            weights = [dense_weight(lin) for lin in lins]
            w = weights[0] if len(weights) == 1 else torch.cat(weights)
            t, q = _core.layer_quantize(cals[members[0]], w, transform, format, method, opts)
            name = members[0] if len(members) == 1 else group_name(members)
            result.layers[name] = (t, q)
            result.guard[name] = t.guard()
            if len(members) == 1:
                _replace(model, name, QuantizedLinear(t, q, lins[0].bias))
                continue
            result.parts[name] = [(n, w.shape[0]) for n, w in zip(members, weights)]
            install_group(model, t, q, result.parts[name])

    with torch.no_grad():
        if method.lower() == "rtn":
            with HookCalibration(model, selected, g, "block_diagonal", share_inputs, cal_args) as hc:
                collect(hc, whole_model)
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
        inputs = BlockInputs(model, blocks, everything) if order[0] is not None else None
        for bi in _progress(order, progress, "blocks"):
            names = groups[bi]
            sub = {n: selected[n] for n in names}
            # A block's layers see its inputs as the blocks before it, quantized, produce them; the
            # layers outside the blocks, the whole quantized model's.
            with HookCalibration(model, sub, g, "full", share_inputs, cal_args) as hc:
                collect(hc, whole_model if bi is None else functools.partial(inputs.run, bi, hc))
            quantize_layers(hc.calibrators, names)
    return result
