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
import threading
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from . import _core
from ._core import Calibrator, Checkpoint, Options, QWeight, Transform

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


class _ThreadWorkspace(threading.local):
    """The scratch buffer of the CPU layers that run on this thread. A layer's workspace is dead
    once its call returns, so every CPU layer of a thread shares one, grown to the largest call
    seen: per layer, a model's buffers added up to the sum over all its layers (146 MiB for
    MiniLM's 36 layers at 4,096 tokens; gigabytes for a 7B model's long prefill). Per thread,
    because threads may run layers at the same time."""

    def __init__(self) -> None:
        self.buffer: Optional[torch.Tensor] = None

    def get(self, nbytes: int) -> torch.Tensor:
        if self.buffer is None or self.buffer.numel() < nbytes:
            self.buffer = None  # the old one goes before the larger one is allocated
            self.buffer = torch.empty(nbytes, dtype=torch.uint8)
        return self.buffer


_CPU_WORKSPACE = _ThreadWorkspace()


def release_cpu_workspace() -> None:
    """Frees the calling thread's CPU scratch buffer (QuantizedLinear's); the next CPU layer call
    on this thread allocates it again."""
    _CPU_WORKSPACE.buffer = None


class QuantizedLinear(nn.Module):
    """nn.Linear replacement computed by libwush's runtime: a prepared layer (``wush_linear``)
    that transforms and quantizes the activations on the fly and runs the W4A4 GEMM.

    On a CPU context it takes CPU tensors; on a CUDA context (``Context("cuda", i)``) CUDA
    tensors of that device, and the work is enqueued on torch's current stream. Input float32,
    float16 or bfloat16 (others are converted to float32); the output has the input's dtype. The
    library accumulates in float32 and adds the bias (``wush_linear_run_bias``, fused into its
    store) in float32 before the rounding to the output dtype."""

    def __init__(self, transform: Transform, qweight: QWeight, bias: Optional[torch.Tensor],
                 ctx: Optional[_core.Context] = None):
        super().__init__()
        self.ctx = ctx or cpu_context()
        self.runtime = _core.Linear(transform, qweight, self.ctx)
        self.in_features, self.out_features = self.runtime.d_in, self.runtime.d_out
        self.format = qweight.info()[0].name.lower()
        self.transform_kind = transform.info()[0].name.lower()
        self._cuda = self.ctx.backend == _core.Backend.CUDA
        if bias is not None:
            b = bias.detach().clone()
            self.bias = nn.Parameter(b.cuda() if self._cuda else b, requires_grad=False)
        else:
            self.register_parameter("bias", None)
        self._ws: Optional[torch.Tensor] = None
        self._ws_tokens = 0

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, format={self.format}, "
                f"transform={self.transform_kind}, bias={self.bias is not None}")

    def _workspace(self, n: int, device: torch.device) -> torch.Tensor:
        if not self._cuda:
            return _CPU_WORKSPACE.get(max(self.runtime.workspace_size(n), 1))
        # CUDA: the layer's own buffer (a shared one would need the streams' order as well).
        if self._ws is None or n > self._ws_tokens or self._ws.device != device:
            # grown for the largest batch seen; smaller ones reuse it
            self._ws = torch.empty(max(self.runtime.workspace_size(n), 1), dtype=torch.uint8, device=device)
            self._ws_tokens = n
        return self._ws

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"input width {x.shape[-1]} != in_features {self.in_features}")
        if (x.device.type == "cuda") != self._cuda:
            raise ValueError(f"a {'CUDA' if self._cuda else 'CPU'} wush layer got a tensor on {x.device}")
        shape = x.shape
        x2 = x.detach().reshape(-1, shape[-1])
        if x2.dtype not in _TORCH_DTYPES:
            x2 = x2.float()
        x2 = x2.contiguous()
        n = x2.shape[0]
        # bf16 in: the library writes bf16 (its F32 result, bias included, rounded to nearest
        # even: the same bits as converting afterwards) and the conversion pass is saved.
        y_dtype = torch.bfloat16 if x2.dtype == torch.bfloat16 else torch.float32
        y = torch.empty((n, self.out_features), dtype=y_dtype, device=x.device)
        if n:
            ws = self._workspace(n, x.device)
            bias = self._library_bias()
            if self._cuda:
                self.ctx.set_stream(torch.cuda.current_stream(x.device).cuda_stream)
            self.runtime.run_raw(_TORCH_DTYPES[x2.dtype], x2.data_ptr(), n, _TORCH_DTYPES[y_dtype], y.data_ptr(),
                                 y.numel(), ws.data_ptr(), ws.numel(),
                                 *((_TORCH_DTYPES[bias.dtype], bias.data_ptr()) if bias is not None else ()))
        return y.to(x.dtype).reshape(*shape[:-1], self.out_features)

    def _library_bias(self) -> Optional[torch.Tensor]:
        """The bias as the library takes it: contiguous, float32, float16 or bfloat16 (as stored:
        no copy for an nn.Linear's bias of those dtypes)."""
        if self.bias is None:
            return None
        b = self.bias.detach()
        if b.dtype not in _TORCH_DTYPES:
            b = b.float()
        return b.contiguous()


_TORCH_DTYPES = {torch.float32: _core.DType.F32, torch.float16: _core.DType.F16, torch.bfloat16: _core.DType.BF16}


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
    """What :func:`quantize_model` made: per layer name, the (transform, qweight) pair in
    ``layers``, and in ``guard`` what the search's per-layer guard compared and kept
    (:meth:`wush.Transform.guard`: None where no guard ran, e.g. without ``search``)."""

    def __init__(self, fmt: str, transform: str, method: str):
        self.format, self.transform, self.method = fmt, transform, method
        self.layers: Dict[str, Tuple[Transform, QWeight]] = {}
        self.guard: Dict[str, Optional[dict]] = {}

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
            ck.add_layer(name, t, q)
        return ck


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


def quantize_model(model: nn.Module, batches: Iterable, format: str = "mxfp4", transform: str = "wush",
                   method: str = "rtn", layers: Optional[str] = None, damping: Optional[float] = None,
                   share_inputs: bool = True, progress: bool = False, search: bool = False,
                   search_tokens: int = 1024, validation_batches: Optional[Iterable] = None,
                   validation_size: int = 4096, search_guard: bool = True,
                   documents: Optional[Iterable[Sequence[int]]] = None,
                   seed: Optional[int] = None) -> QuantizationResult:
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

    Transforms are stored in bf16 (WUSH_OPTION_TRANSFORM_DTYPE) so the fp_quant export can
    represent them exactly.
    """
    batches = list(batches)
    validation = list(validation_batches) if validation_batches is not None else []
    selected = select_linears(model, layers)
    if not selected:
        raise ValueError(selection_error(model, layers))
    _core.check_search(transform, search)
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
    g = _core.format_group_size(format)

    def collect(hc: HookCalibration, stop_at: Optional[nn.Module] = None) -> None:
        def mark(i: int) -> None:
            hc.documents = doc_ids[i] if doc_ids is not None else None
        _run_all(model, batches, stop_at, mark)
        hc.documents = None
        hc.validation = True
        _run_all(model, validation, stop_at)

    def quantize_layers(cals: Dict[str, Calibrator], names: List[str]) -> None:
        for name in _progress(names, progress, "quantize"):
            lin = selected[name]
            t, q = _core.layer_quantize(cals[name], dense_weight(lin), transform, format, method, opts)
            result.layers[name] = (t, q)
            result.guard[name] = t.guard()
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

# Files of a model folder that hold its weights: the quantized folder writes its own tensors
# instead. Other serializations of the same weights (TensorFlow, Flax, ONNX, ...) would be an
# unquantized copy of what was quantized, so they are not copied either; everything else is.
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack", "rust_model.ot",
                "model.onnx", "config.json")
WEIGHT_DIRS = ("onnx", "openvino")
CHECKPOINT_FILE = "wush_checkpoint.safetensors"
INFO_FILE = "wush_quantization.json"

# Kept for callers that used it; the folder now copies every file that is not a weight file.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "vocab.txt", "added_tokens.json", "generation_config.json")

EXPORTS = ("fp_quant", "wush")
EMBEDDINGS = ("keep", "bf16")  # the input embedding table as stored, or in bfloat16


def _ancestors(path: str) -> List[str]:
    """``path`` (absolute, symlinks resolved) and every folder above it."""
    out, p = [], os.path.realpath(path)
    while True:
        out.append(p)
        parent = os.path.dirname(p)
        if parent == p:
            return out
        p = parent


def _same(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)  # also a bind mount or another path to the same folder
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def check_out_dir(out_dir: str, model_dir: Optional[str] = None) -> None:
    """Raises ValueError, before anything is read or written, for an output folder that cannot
    be written without damaging something: one that exists and is not a folder (a file, a FIFO,
    /proc/version, a dangling link), one that holds files but was not written by
    :func:`save_quantized` (the new folder replaces it whole), one whose folder cannot take a
    new entry (tried: permission bits say nothing for root), or, with ``model_dir``, one that is
    the model folder, lies inside it or contains it, symlinks and other paths to the same folder
    included."""
    shown = _core.printable(out_dir)
    if not os.fspath(out_dir):  # os.path takes "" for a missing path, realpath for the current folder
        raise ValueError("the output folder is an empty string; give a folder")
    if os.path.lexists(out_dir) and not os.path.isdir(out_dir):
        what = "a dangling symbolic link" if not os.path.exists(out_dir) else "not a folder"
        raise ValueError(f"the output folder {shown} exists and is {what}; give a new or existing folder")
    if model_dir and os.path.exists(model_dir):
        for a in _ancestors(out_dir):
            if os.path.exists(a) and _same(a, model_dir):
                where = "is the model folder" if a == os.path.realpath(out_dir) else "is inside the model folder"
                raise ValueError(f"the output folder {shown} {where} {_core.printable(model_dir)}: writing it would "
                                 f"change the model being read; give a folder outside it")
        if os.path.exists(out_dir):
            for a in _ancestors(model_dir):
                if _same(a, out_dir):
                    raise ValueError(f"the output folder {shown} contains the model folder "
                                     f"{_core.printable(model_dir)}: writing it would change the model being "
                                     f"read; give a folder outside it")
    if os.path.isdir(out_dir) and os.listdir(out_dir) and not any(
            os.path.lexists(os.path.join(out_dir, f)) for f in (INFO_FILE, CHECKPOINT_FILE)):
        raise ValueError(f"the output folder {shown} holds files and is not a folder written by quantize-model "
                         f"(no {INFO_FILE}); the new folder would replace it whole: give a new or empty folder")
    _check_writable(out_dir)


# The output folder is written whole or not at all (docs/PYTHON.md, "After a crash"): into a new
# folder beside it, synced, then renamed into place, so that a process killed at any point never
# leaves a partly written folder under the output's name, and no file of an existing output folder
# (or one its symbolic links point to) is ever opened for writing. The temporary names are short
# and fixed-length: the output's own name may take all of NAME_MAX (255 bytes).
_STAGING_PREFIX = ".wush-"


def _target(out_dir: str) -> str:
    """The path the output folder is renamed to: ``out_dir`` with symbolic links resolved (a link
    to a folder keeps pointing to it; the folder it names is replaced)."""
    return os.path.realpath(out_dir)


def _check_writable(out_dir: str) -> None:
    """Raises ValueError unless a folder can be created beside the output folder (in the nearest
    existing folder above it: the missing ones are created) and, when the output folder exists,
    it can be renamed (a folder without write permission cannot: its ``..`` changes)."""
    target = _target(out_dir)
    parent = os.path.dirname(target)
    while not os.path.lexists(parent):  # the folders to be made, up to the first that exists
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ValueError(f"the output folder {_core.printable(out_dir)} cannot be made: {_core.printable(parent)} "
                         f"is not a folder")
    try:
        os.rmdir(_new_staging(parent))
        if os.path.isdir(target) and not os.access(target, os.W_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as e:
        raise ValueError(f"the output folder {_core.printable(out_dir)} cannot be written: cannot create a folder "
                         f"in {_core.printable(parent)}: {e.strerror}") from None


def _new_staging(parent: str) -> str:
    """A new, empty folder in ``parent`` with a short random name (the process's umask applies,
    as to any folder it makes)."""
    while True:
        path = os.path.join(parent, _STAGING_PREFIX + os.urandom(4).hex())
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            continue


def _fsync_path(path: str, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: str) -> None:
    """Every file and folder under ``root`` on disk: before the rename makes the folder visible,
    so that after a power loss its name never points to files whose data were not written."""
    for dirpath, _dirs, files in os.walk(root, topdown=False):
        for fn in files:
            p = os.path.join(dirpath, fn)
            if not os.path.islink(p):
                _fsync_path(p)
        _fsync_path(dirpath, directory=True)


class _WholeFolder:
    """``with _WholeFolder(out_dir) as tmp:`` write the folder's files into ``tmp``; on a normal
    exit it replaces ``out_dir`` (synced, renamed into place; an existing folder renamed aside
    first and then deleted), on an exception it is deleted and ``out_dir`` is left as it was."""

    def __init__(self, out_dir: str):
        self.target = _target(out_dir)
        self.parent = os.path.dirname(self.target)
        self.tmp = ""

    def __enter__(self) -> str:
        os.makedirs(self.parent, exist_ok=True)
        self.tmp = _new_staging(self.parent)
        return self.tmp

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return
        old, moved = None, False
        try:
            _fsync_tree(self.tmp)
            if os.path.lexists(self.target):
                # rename(2) replaces an empty folder: the old one takes a fresh empty one's name.
                old = _new_staging(self.parent)
                os.rename(self.target, old)
                moved = True
            os.rename(self.tmp, self.target)
        except BaseException:
            if moved:
                os.rename(old, self.target)  # the previous folder back under its name
            elif old is not None:
                os.rmdir(old)
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise
        _fsync_path(self.parent, directory=True)  # the renames themselves
        if old is not None:
            # The new folder is in place: a file of the old one that cannot be deleted is left
            # (under the .wush- name), not an error.
            shutil.rmtree(old, ignore_errors=True)


def _probe_export(fmt: str, transform: str) -> Optional[str]:
    """Asks the C library whether it exports a model of ``fmt`` and ``transform`` layers in the
    fp_quant layout, by exporting a one-layer model of that kind (milliseconds): None if it does,
    else its message."""
    g = _core.format_group_size(fmt)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4 * g, g)).astype(np.float32)
    w = rng.standard_normal((g, g)).astype(np.float32)
    with tempfile.TemporaryDirectory() as tmp, Calibrator(g, g) as cal:
        cal.add(x)
        t, q = _core.layer_quantize(cal, w, transform, fmt, "rtn", Options(transform_dtype="bf16"))
        ck = Checkpoint()
        ck.add_layer("probe", t, q)
        path = os.path.join(tmp, "probe.safetensors")
        ck.write(path)
        try:
            with Checkpoint.open(path) as opened:
                opened.export_fp_quant(os.path.join(tmp, "fpq.safetensors"))
        except _core.WushError as e:
            if e.status != _core.Status.ERR_UNSUPPORTED:
                raise
            return e.message
    return None


def resolve_export(fmt: str, transform: str, export: str = "auto") -> Tuple[str, Optional[str]]:
    """The export to write and, when "auto" passed over fp_quant, why: "auto" is fp_quant where
    the library writes that layout for ``fmt`` and ``transform`` (and a consumer of it loads the
    result), else "wush", which holds every format x transform. Other values are returned as
    they are (check_export judges them)."""
    if export != "auto":
        return export, None
    refusal = _probe_export(fmt, transform)
    return ("fp_quant", None) if refusal is None else ("wush", refusal)


def check_export(fmt: str, transform: str, export: str = "fp_quant") -> None:
    """Raises ValueError, before any work, when a model quantized with ``fmt`` and ``transform``
    cannot be written with ``export``: "wush" (the libwush checkpoint and the model's other
    tensors) always can; "fp_quant" when the library's export takes it and a consumer of that
    layout can load it."""
    if export not in EXPORTS:
        raise ValueError(f"unknown export {export!r}; choose one of {', '.join(EXPORTS)}")
    if export == "wush":
        return
    refusal = _probe_export(fmt, transform)  # the C library owns every rule of the export
    if refusal is not None:
        others = ", mxfp4, or transform hadamard/identity" if _probe_export(fmt, "hadamard") is None else ""
        raise ValueError(f"{fmt} with {transform} transforms cannot be written in the fp_quant layout: {refusal}; "
                         f"use export 'wush' (--export wush: the libwush checkpoint, loaded by wush.load_quantized)"
                         f"{others}")


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


def read_folder_tensors(model_dir: str) -> Dict[str, torch.Tensor]:
    """Every tensor of a model folder under its stored name and dtype: the safetensors files
    (``model.safetensors`` or the shards of its index), else ``pytorch_model.bin`` (or its
    shards)."""
    from safetensors.torch import load_file

    def files(single: str, index: str) -> List[str]:
        if os.path.exists(os.path.join(model_dir, index)):
            with open(os.path.join(model_dir, index)) as f:
                return sorted(set(json.load(f)["weight_map"].values()))
        return [single] if os.path.exists(os.path.join(model_dir, single)) else []

    out: Dict[str, torch.Tensor] = {}
    st = files("model.safetensors", "model.safetensors.index.json")
    for fn in st:
        out.update(load_file(os.path.join(model_dir, fn)))
    if not st:
        for fn in files("pytorch_model.bin", "pytorch_model.bin.index.json"):
            out.update(torch.load(os.path.join(model_dir, fn), map_location="cpu", weights_only=True))
    if not out:
        raise ValueError(f"{_core.printable(model_dir)}: no model.safetensors(.index.json) or "
                         f"pytorch_model.bin(.index.json)")
    return out


def _file_key_prefix(stored: Dict[str, torch.Tensor], module: str) -> str:
    """The prefix the folder's key of ``module``'s weight has relative to the module name (""
    usually; e.g. "bert." for a BertModel loaded from a BertForPreTraining folder)."""
    if module + ".weight" in stored:
        return ""
    cands = [k for k in stored if k.endswith("." + module + ".weight")]
    if len(cands) != 1:
        raise ValueError(f"cannot tell which stored tensor is the weight of layer {module} "
                         f"({len(cands)} candidates); pass model_dir=None to write the model's own state_dict")
    return cands[0][: -len(module + ".weight")]


def _copy_other_files(model_dir: str, out_dir: str) -> List[str]:
    copied = []
    for entry in sorted(os.listdir(model_dir)):
        src, dst = os.path.join(model_dir, entry), os.path.join(out_dir, entry)
        if entry in WEIGHT_FILES or entry in (CHECKPOINT_FILE, INFO_FILE):
            continue
        if os.path.isdir(src):
            if entry in WEIGHT_DIRS or entry.startswith("."):
                continue
            shutil.copytree(src, dst, dirs_exist_ok=True)
        elif re.fullmatch(r"(model|pytorch_model)-\d+-of-\d+\.(safetensors|bin)", entry):
            continue  # a shard of the weights
        else:
            shutil.copy2(src, dst)
        copied.append(entry)
    return copied


def _embeddings_to_bf16(model: nn.Module, tensors: Dict[str, torch.Tensor]) -> None:
    """The stored input embedding table of ``model`` (among ``tensors``, the folder's names) in
    bfloat16; ValueError when it cannot be found."""
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    name = next((n for n, m in model.named_modules() if m is emb), None) if emb is not None else None
    key = _stored_key(name + ".weight", getattr(model, "base_model_prefix", "") or "", tensors) if name else None
    if key is None:
        raise ValueError("--embeddings bf16: the model's input embedding table is not among its stored tensors")
    if tensors[key].is_floating_point():
        tensors[key] = tensors[key].to(torch.bfloat16)


def linear_names(model: nn.Module) -> List[str]:
    return [n for n, m in model.named_modules() if is_linear(m) or isinstance(m, QuantizedLinear)]


def save_quantized(model: nn.Module, result: QuantizationResult, out_dir: str, model_dir: Optional[str] = None,
                   pseudo: bool = False, max_shard_bytes: int = 2 << 30, export: str = "wush",
                   embeddings: str = "keep") -> Dict[str, Any]:
    """Writes the complete output folder:

    - ``wush_checkpoint.safetensors``: the libwush checkpoint (transforms + packed weights),
      written first and always; :func:`load_quantized` runs the model from it;
    - ``model-0000i-of-0000n.safetensors`` + ``model.safetensors.index.json``: with
      ``model_dir``, every tensor stored in that folder, under its stored name and dtype, bit for
      bit, except the quantized layers' weights; without it, the model's state_dict. With
      ``export="wush"`` (the default, and where the library's fp_quant export refuses this
      model) each quantized layer's ``weight`` is a two-element int64 tensor ``[d_out, d_in]``:
      the layer lives in the checkpoint alone (the weights are stored once), and transformers
      without ``wush`` refuses the folder (a size mismatch) instead of building random layers
      (:mod:`wush.hf`). With ``export="fp_quant"`` the quantized layers in the fp_quant layout
      named after their modules (``<module>.qweight``, ``.scales``,
      ``.forward_hadamard_matrix``, ``.backward_hadamard_matrix``, ``.weight_global_scale``,
      ``.act_global_scale``), or with ``pseudo`` the bf16 ``<module>.dqweight`` instead of
      qweight/scales. ``embeddings="bf16"`` stores the input embedding table in bfloat16;
    - ``config.json``: ``model_dir``'s (else the model's config) with ``quantization_config``:
      ``quant_method`` ``"wush"`` (:func:`wush.hf.folder_config`), or fp_quant's with
      ``modules_to_not_convert`` = exactly the linear layers left unquantized;
    - every other file of ``model_dir`` (tokenizer, generation config, sentence-transformers
      modules such as ``modules.json`` and ``1_Pooling/``), copied; not other serializations of
      the weights (``WEIGHT_FILES``, ``WEIGHT_DIRS``);
    - ``wush_quantization.json``: what was done (format, transform, method, layers, the export).

    Returns that last file's content. Refuses, before writing, what :func:`check_export` and
    :func:`check_out_dir` refuse (``out_dir`` the model folder, inside it or containing it, a
    folder not written by save_quantized, one that cannot be written).

    The folder appears whole or not at all: it is written beside ``out_dir`` under a temporary
    name (``.wush-`` and 8 hex digits), synced, and renamed to ``out_dir``; an existing
    ``out_dir`` is replaced whole (renamed aside, then deleted), its symbolic links never
    written through. docs/PYTHON.md ("After a crash") lists what a killed process leaves.
    """
    check_out_dir(out_dir, model_dir)
    check_export(result.format, result.transform, export)
    if embeddings not in EMBEDDINGS:
        raise ValueError(f"unknown embeddings {embeddings!r}; choose one of {', '.join(EMBEDDINGS)}")
    with _WholeFolder(out_dir) as tmp:
        return _write_folder(model, result, tmp, model_dir, pseudo, max_shard_bytes, export, embeddings)


def _write_folder(model: nn.Module, result: QuantizationResult, out_dir: str, model_dir: Optional[str],
                  pseudo: bool, max_shard_bytes: int, export: str, embeddings: str) -> Dict[str, Any]:
    """save_quantized's files, into the new folder ``out_dir``."""
    from safetensors.torch import load_file
    from . import hf
    ck_path = os.path.join(out_dir, CHECKPOINT_FILE)
    result.checkpoint().write(ck_path)
    fpq: Dict[str, torch.Tensor] = {}
    qcfg: Dict[str, Any] = {}
    refused = None
    if export == "fp_quant":
        with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
            exp, cfg = os.path.join(tmp, "fpq.safetensors"), os.path.join(tmp, "qcfg.json")
            try:
                with Checkpoint.open(ck_path) as ck:
                    ck.export_fp_quant(exp, cfg)
                fpq = load_file(exp)
                with open(cfg) as f:
                    qcfg = json.load(f)["quantization_config"]
            except _core.WushError as e:
                if e.status != _core.Status.ERR_UNSUPPORTED:
                    raise
                # e.g. a search whose guard mixed kinds the export cannot hold: the checkpoint
                # is written and runs; only this layout is refused.
                refused = e.message
                export = "wush"
    unconverted = sorted(set(n for n in linear_names(model) if n not in result.layers))
    if model_dir:
        stored = read_folder_tensors(model_dir)
        tensors = dict(stored)
        prefixes = {name: _file_key_prefix(stored, name) for name in result.layers}
        for name, p in prefixes.items():
            del tensors[p + name + ".weight"]
    else:
        prefixes = {name: "" for name in result.layers}
        tensors = {k: v for k, v in model.state_dict().items()
                   if not any(k.startswith(n + ".") and not k.endswith(".bias") for n in result.layers)}
        # Tied weights (lm_head = embeddings) are stored once, as transformers does.
        for k in getattr(model, "_tied_weights_keys", None) or []:
            if isinstance(k, str) and k in tensors and getattr(getattr(model, "config", None), "tie_word_embeddings", False):
                del tensors[k]
    for k, v in fpq.items():
        layer = k.rsplit(".", 1)[0]
        tensors[prefixes.get(layer, "") + k] = v
    if export == "wush":
        for name, (_, q) in result.layers.items():
            tensors[prefixes[name] + name + ".weight"] = torch.tensor(q.info()[2:4], dtype=torch.int64)
        qcfg = hf.folder_config(result, embeddings)
    if embeddings == "bf16":
        _embeddings_to_bf16(model, tensors)
    if pseudo and fpq:
        qcfg["pseudoquantization"] = True
        for name, (_, q) in result.layers.items():
            # The consumer's pseudo-quantized forward multiplies by dqweight: the dequantized
            # transformed weight (codes x scales x per-tensor factor), stored in bf16.
            p = prefixes[name] + name
            tensors[p + ".dqweight"] = torch.from_numpy(q.dequantize()).to(torch.bfloat16)
            del tensors[p + ".qweight"], tensors[p + ".scales"]
    _shard_and_save(tensors, out_dir, max_shard_bytes)
    if model_dir and os.path.exists(os.path.join(model_dir, "config.json")):
        with open(os.path.join(model_dir, "config.json")) as f:
            config = json.load(f)
    elif hasattr(model, "config"):
        config = model.config.to_dict()
    else:
        config = {}
    if export == "fp_quant":
        qcfg["modules_to_not_convert"] = unconverted
    config["quantization_config"] = qcfg
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    copied = _copy_other_files(model_dir, out_dir) if model_dir else []
    info = {"format": result.format, "transform": result.transform, "method": result.method,
            "search": getattr(result, "search", False), "export": export, "fp_quant_refused": refused,
            "embeddings": embeddings,
            "layers": {n: t.info()[0].name.lower() for n, (t, _) in result.layers.items()},
            "modules_to_not_convert": unconverted, "copied_files": copied}
    with open(os.path.join(out_dir, INFO_FILE), "w") as f:
        json.dump(info, f, indent=2)
    return info


def load_quantized_layers(model: nn.Module, checkpoint_path: str, ctx: Optional[_core.Context] = None,
                          mmap: bool = False) -> List[str]:
    """Replaces the layers named in a libwush checkpoint by :class:`QuantizedLinear` (prepared on
    ``ctx``, default the CPU); biases are taken from the model. Returns the replaced names.

    By default the file is read into memory once (``WUSH_CHECKPOINT_COPY``) and the layers never
    touch it again. ``mmap=True`` maps it instead (``wush_checkpoint_open``): no copy of the file
    in memory, but a layer prepared on the CPU keeps reading its codes from the mapping, so
    truncating the file under a running model kills the process (SIGBUS) and rewriting it in
    place changes the model's outputs (replace such a file by rename)."""
    with Checkpoint.open(checkpoint_path, copy=not mmap) as ck:
        names = ck.layer_names()
        for name in names:
            t, q = ck.load_layer(name)
            old = model.get_submodule(name)
            _replace(model, name, QuantizedLinear(t, q, getattr(old, "bias", None), ctx))
            # The prepared layer copies the transform; its weights' bytes stay shared with the
            # checkpoint's memory (the copy, or the mapping with mmap=True), kept alive by it.
            t.close()
            q.close()
    return names


def parse_device(device: Any) -> torch.device:
    """``device`` as a torch.device; ValueError (one line) for one libwush cannot run on."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"device {device!r}: not a device; libwush runs on 'cpu' or 'cuda[:i]'") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device {device}: libwush runs on 'cpu' or 'cuda[:i]'")
    return dev


def torch_runs_openmp() -> bool:
    """Whether torch's CPU operations run on OpenMP threads (its default parallel backend)."""
    return "parallel backend: OpenMP" in torch.__config__.parallel_info()


_cpu_contexts: Dict[Optional[int], _core.Context] = {}


def cpu_context(threads: Optional[int] = None) -> _core.Context:
    """The CPU context the layers of this module run on by default, one per ``threads`` value
    (None: OpenMP's default, which follows ``torch.set_num_threads``). When torch runs its
    operations on OpenMP threads, the context runs the library's parallel work on them too
    (``WUSH_CONTEXT_OPENMP_TEAM``): torch's workers keep spinning for a while after each of its
    operations, and beside them a pool of the library's own lost its cores (docs/PYTHON.md)."""
    if threads is not None and threads < 0:
        raise ValueError(f"threads={threads}: must be >= 0 (0: OpenMP's default)")
    ctx = _cpu_contexts.get(threads)
    if ctx is None:
        ctx = _cpu_contexts[threads] = _core.Context("cpu", threads=threads, openmp_team=torch_runs_openmp())
    return ctx


def _context_for(device: Any, threads: Optional[int] = None) -> Tuple[_core.Context, torch.device]:
    dev = parse_device(device)
    if dev.type == "cpu":
        return cpu_context(threads), dev
    if dev.type == "cuda":
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        try:
            return _core.Context("cuda", index, threads=threads), torch.device("cuda", index)
        except _core.WushError as e:
            raise ValueError(f"device {device}: libwush has no CUDA backend here ({e.message}); "
                             f"the CUDA module libwush-cuda.so is looked for next to libwush.so or at "
                             f"$WUSH_CUDA_MODULE") from None
    raise ValueError(f"device {device}: libwush runs on 'cpu' or 'cuda'")


def _dtype_kwarg(dtype: Any) -> Dict[str, Any]:
    # transformers 4.56 renamed from_pretrained's torch_dtype to dtype (5.x warns on the old name).
    import transformers
    major, minor = (int(v) for v in transformers.__version__.split(".")[:2])
    return {"dtype" if (major, minor) >= (4, 56) else "torch_dtype": dtype}


# The largest safetensors header read: the C library's limit (kMaxHeaderBytes in
# src/storage/safetensors.h), so that both refuse the same files.
MAX_SAFETENSORS_HEADER = 100_000_000


def _safetensors_shapes(path: str) -> Dict[str, Tuple[int, ...]]:
    """The tensor names and shapes of a safetensors file from its header, after checking that the
    file is complete (ValueError naming the file otherwise: truncated, not safetensors, a header
    longer than :data:`MAX_SAFETENSORS_HEADER`)."""
    shown = _core.printable(path)
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if n > MAX_SAFETENSORS_HEADER:  # read whole below: a hostile length must not claim gigabytes
                raise ValueError(f"{shown}: not a safetensors file (header length {n} exceeds the "
                                 f"{MAX_SAFETENSORS_HEADER:,}-byte limit)")
            if n < 2 or 8 + n > size:
                raise ValueError(f"{shown}: not a complete safetensors file (its header does not fit its "
                                 f"{size} bytes: truncated?)")
            header = json.loads(f.read(n))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{shown}: cannot read a safetensors header: {e}") from None
    if not isinstance(header, dict):
        raise ValueError(f"{shown}: not a safetensors file (its header is not a JSON object)")
    shapes, end = {}, 0
    for k, v in header.items():
        if k == "__metadata__":
            continue
        try:
            shapes[k] = tuple(int(d) for d in v["shape"])
            end = max(end, int(v["data_offsets"][1]))
        except (TypeError, KeyError, IndexError, ValueError):
            raise ValueError(f"{shown}: not a safetensors file (bad header entry {k!r})") from None
    if 8 + n + end > size:
        raise ValueError(f"{shown}: truncated: its tensors need {8 + n + end} bytes, the file has {size}")
    return shapes


def stored_tensor_shapes(model_dir: str) -> Optional[Dict[str, Tuple[int, ...]]]:
    """Name -> shape of every tensor stored in a model folder, without reading the data (the
    safetensors headers; pytorch_model.bin is memory-mapped). None when the folder holds neither
    format. ValueError naming the file for a shard that is missing, truncated or not readable."""
    def files(single: str, index: str) -> List[str]:
        ipath = os.path.join(model_dir, index)
        if os.path.exists(ipath):
            try:
                with open(ipath) as f:
                    return sorted(set(json.load(f)["weight_map"].values()))
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
                raise ValueError(f"{_core.printable(ipath)}: not a weight index ({e})") from None
        return [single] if os.path.exists(os.path.join(model_dir, single)) else []

    out: Dict[str, Tuple[int, ...]] = {}
    st = files("model.safetensors", "model.safetensors.index.json")
    for fn in st:
        out.update(_safetensors_shapes(os.path.join(model_dir, fn)))
    if st:
        return out
    bins = files("pytorch_model.bin", "pytorch_model.bin.index.json")
    for fn in bins:
        path = os.path.join(model_dir, fn)
        try:
            try:
                sd = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError:
                # Files of the legacy (pre-zip) serialization cannot be mapped: read them whole.
                sd = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - torch raises many kinds for a damaged file
            why = _core.printable(" ".join(str(e).split())[:300], backslash=False)
            raise ValueError(f"{_core.printable(path)}: cannot read it: {why}") from None
        out.update({k: tuple(v.shape) for k, v in sd.items()})
    return out if bins else None


def _meta_model(cls: Any, config: Any) -> nn.Module:
    """``cls`` built from ``config`` on the meta device (shapes only, no memory, milliseconds)."""
    import transformers
    if cls is transformers.AutoModel:
        with torch.device("meta"):
            return transformers.AutoModel.from_config(config)
    with torch.device("meta"):
        return cls(config)


def _stored_key(key: str, prefix: str, stored: Dict[str, Any]) -> Optional[str]:
    """The stored name of the model's state_dict ``key``: itself, or with the base model's
    ``prefix`` added or removed (a bare model from a folder of the full model, or the reverse)."""
    if key in stored:
        return key
    if prefix:
        if prefix + "." + key in stored:
            return prefix + "." + key
        if key.startswith(prefix + ".") and key[len(prefix) + 1:] in stored:
            return key[len(prefix) + 1:]
    return None


def _head_keys(model: nn.Module) -> List[str]:
    """The state_dict keys of ``model`` outside its base model (the task head), less those tied
    to a base model parameter (an output embedding tied to the input one is not stored)."""
    prefix = getattr(model, "base_model_prefix", "") or ""
    if not prefix or not isinstance(getattr(model, prefix, None), nn.Module):
        return []
    base_ids = {id(p) for n, p in model.named_parameters(remove_duplicate=False) if n.startswith(prefix + ".")}
    tied = {n for n, p in model.named_parameters(remove_duplicate=False) if id(p) in base_ids}
    return [k for k in model.state_dict() if not k.startswith(prefix + ".") and k not in tied]


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
                        stored: Optional[Dict[str, Tuple[int, ...]]] = None) -> None:
    """Raises ValueError naming every selected layer (name -> module) whose weight the folder
    does not store under the module's name (a base model prefix such as ``bert.`` allowed) with
    the module's shape: such a layer would be quantized from transformers' random initialization,
    and :func:`save_quantized` could not place it. Call it before calibrating (seconds)."""
    if stored is None:
        stored = stored_tensor_shapes(model_dir)
    if stored is None:
        return  # no readable weight files: from_pretrained has already said so
    unmapped = []
    for name, m in layers.items():
        cands = [k for k in stored if k == name + ".weight" or k.endswith("." + name + ".weight")]
        if len(cands) != 1 or tuple(stored[cands[0]]) != tuple(m.weight.shape):
            unmapped.append(name if len(cands) != 1 else f"{name} (stored {list(stored[cands[0]])}, "
                            f"the model's {list(m.weight.shape)})")
    if unmapped:
        shown = ", ".join(unmapped[:8]) + (f", ... ({len(unmapped)} in all)" if len(unmapped) > 8 else "")
        raise ValueError(f"{_core.printable(model_dir)}: the selected layers {shown} have no stored weight of "
                         f"their shape in the folder; select others with --layers (layers=)")


def model_class(config: Any) -> Any:
    """The class named by ``config.architectures`` (e.g. LlamaForCausalLM, BertModel), else
    AutoModel's choice for the config."""
    import transformers
    for arch in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, arch, None)
        if cls is not None:
            return cls
    return transformers.AutoModel


def require_model_folder(path: str, quantized: bool = False) -> None:
    """Raises FileNotFoundError naming ``path`` when it is not a local model folder (with
    ``quantized``: one written by :func:`save_quantized`). transformers, given a path that does
    not exist, takes it for a Hub name and reports a failed download instead."""
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{_core.printable(path)}: no such folder (a local Hugging Face model folder is "
                                f"expected)")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise FileNotFoundError(f"{_core.printable(path)}: no config.json, so not a Hugging Face model folder")
    if quantized and not os.path.isfile(os.path.join(path, CHECKPOINT_FILE)):
        raise FileNotFoundError(f"{_core.printable(path)}: no {CHECKPOINT_FILE}, so not a folder written by "
                                f"quantize-model or save_quantized")


def _read_config(folder: str) -> Any:
    from transformers import AutoConfig
    try:
        return AutoConfig.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:  # e.g. "quantization_config": 5
        why = _core.printable(" ".join(str(e).split())[:300], backslash=False)
        raise ValueError(f"{_core.printable(folder)}/config.json: {why}") from None


def load_float_model(model_dir: str, dtype: Any = torch.float32, config: Any = None) -> nn.Module:
    """A local Hugging Face folder as :func:`folder_model_class` says (the class its config
    names, or the bare model for a folder that stores no head), in ``dtype``, eval mode; nothing
    downloaded. Raises FileNotFoundError when the folder or its config.json is missing,
    ValueError (naming the file) for a weight file that is missing, truncated or unreadable and
    for stored shapes that differ from the config's. The model's ``wush_missing_keys`` lists
    what transformers initialized at random (tensors the folder lacks)."""
    from transformers.utils import logging as hf_logging
    require_model_folder(model_dir)
    config = config or _read_config(model_dir)
    stored = stored_tensor_shapes(model_dir)
    cls = folder_model_class(model_dir, config, stored)
    if stored:
        check_weights_match(model_dir, cls, config, stored)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # missing tensors are reported by the caller (wush_missing_keys)
    try:
        model, info = cls.from_pretrained(model_dir, config=config, local_files_only=True, output_loading_info=True,
                                          **_dtype_kwarg(dtype))
    finally:
        hf_logging.set_verbosity(verbosity)
    model.wush_missing_keys = sorted(info.get("missing_keys", []))
    return model.eval()


def load_quantized(out_dir: str, device: Any = "cpu", dtype: Any = None, mmap: bool = False,
                   threads: Optional[int] = None) -> nn.Module:
    """Loads a folder written by :func:`save_quantized` to run on libwush's runtime: the model
    class named by the folder's config, every tensor but the quantized weights from the folder's
    safetensors, and each quantized layer (``wush_checkpoint.safetensors``) as a
    :class:`QuantizedLinear` prepared on ``device`` ("cpu", or "cuda[:i]" when libwush's CUDA
    backend is present: its layers then run on torch's current stream). ``dtype``: the
    non-quantized parameters' dtype (default the config's ``torch_dtype``, else float32).
    Nothing is downloaded. Raises FileNotFoundError when the folder, its config.json or its
    checkpoint is missing, ValueError (naming them) when it lacks a tensor the model needs or
    holds one the model does not have.

    The checkpoint is read into memory (the model does not depend on the file afterwards: it may
    be deleted, truncated or rewritten). ``mmap=True`` maps it instead, saving that copy, at a
    risk: truncating the file under the running model kills the process (SIGBUS) and rewriting it
    in place silently changes the outputs (:func:`load_quantized_layers`).

    ``threads``: the CPU threads of the quantized layers (``WUSH_CONTEXT_NUM_THREADS``; default
    None: OpenMP's default, which follows ``torch.set_num_threads``). On the CPU the layers run
    their parallel work on torch's OpenMP threads (:func:`cpu_context`)."""
    from transformers.utils import logging as hf_logging
    require_model_folder(out_dir, quantized=True)
    ctx, dev = _context_for(device, threads)
    config = _read_config(out_dir)
    qc = getattr(config, "quantization_config", None)
    wush_folder = _quant_method(qc) == "wush"
    if wush_folder:
        # wush.hf's quantizer builds the quantized layers while transformers loads the folder.
        from . import hf
        hf.register()
        config.quantization_config = dict(_as_dict(qc), device=str(dev), mmap=mmap, threads=threads)
    elif qc is not None:
        # The folder's fp_quant config would send transformers to its own quantizer (GPU-only);
        # the quantized layers are loaded from the libwush checkpoint instead.
        delattr(config, "quantization_config")
    if dtype is None:
        dtype = getattr(config, "dtype", None)
        if dtype is None and "dtype" not in _dtype_kwarg(None):  # older transformers' name
            dtype = getattr(config, "torch_dtype", None)
        dtype = dtype or torch.float32
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    with Checkpoint.open(os.path.join(out_dir, CHECKPOINT_FILE)) as ck:
        qnames = ck.layer_names()
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the quantized weights are "missing" on purpose
    try:
        stored = stored_tensor_shapes(out_dir)
        if stored and wush_folder:  # the quantized layers' [d_out, d_in] stand-ins are the quantizer's
            stored = {k: v for k, v in stored.items()
                      if not any(k == n + ".weight" or k.endswith("." + n + ".weight") for n in qnames)}
        cls = folder_model_class(out_dir, config, stored)  # as quantize-model built it
        if stored:
            check_weights_match(out_dir, cls, config, stored)
        model, info = cls.from_pretrained(out_dir, config=config, local_files_only=True,
                                          output_loading_info=True, **_dtype_kwarg(dtype))
    finally:
        hf_logging.set_verbosity(verbosity)
    # transformers reports keys in the model's namespace: only the quantized weights may miss.
    expected = {n + ".weight" for n in qnames}
    if wush_folder:
        expected = set()  # every tensor, the quantized layers' [d_out, d_in] included, is stored
    missing = [k for k in info.get("missing_keys", []) if not any(k == e or k.endswith("." + e) for e in expected)]
    if missing:
        raise ValueError(f"{_core.printable(out_dir)}: tensors missing from the folder: "
                         f"{', '.join(sorted(missing)[:10])}")
    # Nor may one be left over (transformers drops a tensor the model has no place for, e.g. a
    # bias the config does not give a layer, with a warning): the folder is not this model's.
    # An fp_quant folder's quantized layers are read from the checkpoint, their tensors unused.
    extra = [k for k in info.get("unexpected_keys", [])
             if wush_folder or not any(k.startswith(n + ".") or f".{n}." in k for n in qnames)]
    if extra:
        raise ValueError(f"{_core.printable(out_dir)}: tensors in the folder that the model "
                         f"({type(model).__name__}) does not have: {', '.join(sorted(extra)[:10])}")
    if not wush_folder:
        load_quantized_layers(model, os.path.join(out_dir, CHECKPOINT_FILE), ctx, mmap=mmap)
    return model.to(dev).eval()


def _as_dict(qc: Any) -> Dict[str, Any]:
    return dict(qc) if isinstance(qc, dict) else qc.to_dict()


def _quant_method(qc: Any) -> Optional[str]:
    """The ``quant_method`` of a config's quantization_config (a dict or transformers' object)."""
    if qc is None:
        return None
    m = qc.get("quant_method") if isinstance(qc, dict) else getattr(qc, "quant_method", None)
    return getattr(m, "value", m)


# ----------------------------------------------------------------------------------------------
# Running a loaded model: generation, sentence embeddings
# ----------------------------------------------------------------------------------------------

def pooling_config(folder: str) -> Dict[str, Any]:
    """The sentence-transformers pooling of a folder (``modules.json`` + its Pooling module's
    config.json): {"mode": "mean"|"cls"|"max", "normalize": bool}; mean pooling, no
    normalization when the folder has no such files."""
    mode, normalize = "mean", False
    modules_path = os.path.join(folder, "modules.json")
    if os.path.exists(modules_path):
        with open(modules_path) as f:
            modules = json.load(f)
        for m in modules:
            kind = m.get("type", "")
            if kind.endswith("Pooling"):
                cfg_path = os.path.join(folder, m.get("path", ""), "config.json")
                if os.path.exists(cfg_path):
                    with open(cfg_path) as f:
                        pc = json.load(f)
                    if pc.get("pooling_mode_cls_token"):
                        mode = "cls"
                    elif pc.get("pooling_mode_max_tokens"):
                        mode = "max"
            elif kind.endswith("Normalize"):
                normalize = True
    return {"mode": mode, "normalize": normalize}


def embed(model: nn.Module, tokenizer: Any, sentences: List[str], pooling: Optional[Dict[str, Any]] = None,
          batch_size: int = 32, max_length: int = 256) -> torch.Tensor:
    """Sentence embeddings (float32, one row per sentence) of an encoder: its last hidden states
    pooled as ``pooling`` (:func:`pooling_config`) says."""
    pooling = pooling or {"mode": "mean", "normalize": False}
    device = next(model.parameters()).device
    out = []
    with torch.no_grad():
        for i in range(0, len(sentences), batch_size):
            enc = tokenizer(sentences[i:i + batch_size], padding=True, truncation=True, max_length=max_length,
                            return_tensors="pt").to(device)
            h = model(**enc)[0].float()
            mask = enc["attention_mask"].unsqueeze(-1).to(h.dtype)
            if pooling["mode"] == "cls":
                e = h[:, 0]
            elif pooling["mode"] == "max":
                e = h.masked_fill(mask == 0, float("-inf")).amax(1)
            else:
                e = (h * mask).sum(1) / mask.sum(1).clamp(min=1)
            if pooling["normalize"]:
                e = torch.nn.functional.normalize(e, dim=-1)
            out.append(e.cpu())
    return torch.cat(out)


def is_causal(model: nn.Module) -> bool:
    """Whether the model generates text (a causal language model head)."""
    try:
        return bool(model.can_generate())
    except Exception:  # noqa: BLE001 - older/other models: no can_generate
        return False
