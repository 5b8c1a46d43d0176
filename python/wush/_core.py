"""Pythonic wrappers over the C API: errors, enums, handles, numpy/torch buffers."""

from __future__ import annotations

import ctypes
import enum
import operator
import os
import weakref
from typing import Any, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _ffi
from ._ffi_table import ENUMS

c_size_p = ctypes.POINTER(ctypes.c_size_t)


def _path(path: Any) -> bytes:
    """A file name as the C API takes it: the bytes the OS uses, so names that are not valid UTF-8
    (os.fsencode's surrogateescape round trip), bytes and os.PathLike objects all work."""
    return os.fsencode(os.fspath(path))


def printable(text: Any, backslash: bool = True) -> str:
    """``text`` (a path, or a message holding one) safe to print on one terminal line: control
    characters (C0, DEL, C1) and bytes that are not UTF-8 (os.fsdecode's surrogate escapes) as
    ``\\xNN``, other characters Python does not print as ``\\uNNNN``, and (with ``backslash``) a
    backslash doubled, as the C CLI's printable() writes them. A file name holding ESC or a
    newline then cannot move the cursor, recolor the terminal or forge a line of output. A
    message whose paths are escaped already takes ``backslash=False``."""
    s = os.fsdecode(text) if isinstance(text, (bytes, os.PathLike)) else str(text)
    out = []
    for ch in s:
        c = ord(ch)
        if ch == "\\" and backslash:
            out.append("\\\\")
        elif c < 0x20 or 0x7F <= c <= 0x9F:
            out.append(f"\\x{c:02x}")
        elif 0xDC80 <= c <= 0xDCFF:  # an undecodable byte of the file name
            out.append(f"\\x{c - 0xDC00:02x}")
        elif not ch.isprintable() and ch != " ":
            out.append(f"\\u{c:04x}" if c <= 0xFFFF else f"\\U{c:08x}")
        else:
            out.append(ch)
    return "".join(out)


def _enum(cname: str, prefix: str) -> Any:
    # Members come from the header (through the generated table): FORMAT_MXFP4 -> Format.MXFP4.
    return enum.IntEnum(cname, {k[len(prefix):]: v for k, v in ENUMS[cname].items()})


Status = _enum("wush_status", "WUSH_")
DType = _enum("wush_dtype", "WUSH_DTYPE_")
Format = _enum("wush_format", "WUSH_FORMAT_")
Backend = _enum("wush_backend", "WUSH_BACKEND_")
TransformKind = _enum("wush_transform_kind", "WUSH_TRANSFORM_")
Method = _enum("wush_method", "WUSH_METHOD_")
MomentMode = _enum("wush_moment_mode", "WUSH_MOMENTS_")
Option = _enum("wush_option", "WUSH_OPTION_")
CpuIsa = _enum("wush_cpu_isa", "WUSH_CPU_ISA_")
ContextParameter = _enum("wush_context_parameter", "WUSH_CONTEXT_")
GuardSource = _enum("wush_guard_source", "WUSH_GUARD_")
GuardCandidate = _enum("wush_guard_candidate", "WUSH_GUARD_")


class WushError(RuntimeError):
    """A libwush call failed. ``status`` is the :class:`Status`, ``status_name`` its C name
    (e.g. ``"WUSH_ERR_INVALID_ARGUMENT"``), ``message`` the text of ``wush_last_error()``."""

    def __init__(self, function: str, status: int, message: str):
        try:
            self.status: Any = Status(status)
            self.status_name = "WUSH_" + self.status.name
        except ValueError:
            self.status, self.status_name = status, f"status {status}"
        self.function, self.message = function, message
        super().__init__(f"{function}: {self.status_name}: {message}")


def _check(function: str, status: int) -> None:
    if status != 0:
        msg = _ffi.lib().wush_last_error()
        raise WushError(function, status, msg.decode("utf-8", "replace") if msg else "")


def _call(name: str, *args: Any) -> None:
    _check(name, getattr(_ffi.lib(), name)(*args))


def version() -> str:
    """The library's version string (``wush_version_string``)."""
    return _ffi.lib().wush_version_string().decode()


def _as_enum(cls: Any, v: Union[str, int]) -> Any:
    if isinstance(v, str):
        return cls[v.upper().replace("-", "_")]
    return cls(v)


def parse_format(v: Union[str, int, Any]) -> Any:
    return _as_enum(Format, v)


def parse_transform(v: Union[str, int, Any]) -> Any:
    return _as_enum(TransformKind, v)


def parse_method(v: Union[str, int, Any]) -> Any:
    return _as_enum(Method, v)


def parse_transform_spec(name: str) -> Tuple[Any, bool]:
    """A transform as the tools spell it, "+s" asking for the search ("wush+s"), parsed by the
    library (``wush_transform_spec_from_name``): returns ``(TransformKind, search)``. Raises
    ValueError with the library's reason for an unknown name or a search of I, H or R."""
    kind, search = ctypes.c_int(), ctypes.c_int()
    lib = _ffi.lib()
    if lib.wush_transform_spec_from_name(name.encode(), ctypes.byref(kind), ctypes.byref(search)) != 0:
        raise ValueError(lib.wush_last_error().decode("utf-8", "replace"))
    return TransformKind(kind.value), bool(search.value)


def check_search(transform: Union[str, int, Any], search: bool) -> None:
    """Raises ValueError, before any work, when the library refuses the search of ``transform``
    (only WUS and WUSH have one)."""
    name = _ffi.lib().wush_transform_kind_name(int(parse_transform(transform))).decode()
    parse_transform_spec(name + ("+s" if search else ""))


# ----------------------------------------------------------------------------------------------
# Buffers: numpy arrays and torch tensors, passed by pointer without copies where possible.
# ----------------------------------------------------------------------------------------------

class _Buf:
    """A read-only view of a 2-D host array: pointer, dtype code, rows, cols; keeps the owner."""

    def __init__(self, x: Any, name: str = "x"):
        self.owner = x
        if type(x).__module__.startswith("torch"):
            import torch
            t = x.detach()
            if t.device.type != "cpu":
                t = t.cpu()
            if t.dtype not in (torch.float32, torch.float16, torch.bfloat16):
                t = t.float()
            t = t.contiguous()  # no copy when already contiguous
            self.owner = t
            self.dtype = {torch.float32: DType.F32, torch.float16: DType.F16, torch.bfloat16: DType.BF16}[t.dtype]
            self.ptr = t.data_ptr()
            shape = tuple(t.shape)
        else:
            a = np.asarray(x)
            if a.dtype == np.float16:
                self.dtype = DType.F16
            else:
                if a.dtype != np.float32:
                    a = a.astype(np.float32)
                self.dtype = DType.F32
            a = np.ascontiguousarray(a)
            self.owner = a
            self.ptr = a.ctypes.data
            shape = a.shape
        if len(shape) == 1:
            shape = (1, shape[0])
        if len(shape) < 2:
            raise ValueError(f"{name} must have at least one dimension")
        rows = 1
        for s in shape[:-1]:
            rows *= int(s)
        self.rows, self.cols = rows, int(shape[-1])


def _f64ptr(a: np.ndarray) -> Any:
    return a.ctypes.data_as(ctypes.POINTER(ctypes.c_double))


def _f32ptr(a: np.ndarray) -> Any:
    return a.ctypes.data_as(ctypes.POINTER(ctypes.c_float))


class _Handle:
    """Owns one C handle; released by close(), the context manager, or the finalizer."""

    _destroy = ""

    def __init__(self, ptr: int):
        self._ptr = ctypes.c_void_p(ptr)
        self._finalizer = weakref.finalize(self, getattr(_ffi.lib(), self._destroy), self._ptr)

    @property
    def ptr(self) -> ctypes.c_void_p:
        if not self._finalizer.alive:
            raise ValueError(f"{type(self).__name__} is closed")
        return self._ptr

    def close(self) -> None:
        """Releases the handle now (idempotent)."""
        self._finalizer()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _new(fn: str, *args: Any) -> int:
    out = ctypes.c_void_p()
    _call(fn, *args, ctypes.byref(out))
    return out.value


class Context(_Handle):
    """An execution context (``wush_context``). ``threads=0`` uses OpenMP's default.
    ``openmp_team=True`` runs the CPU runtime's parallel work on the process's OpenMP threads
    (``WUSH_CONTEXT_OPENMP_TEAM``: for a process where PyTorch's OpenMP workers hold the cores;
    :mod:`wush.torch` sets it for its layers)."""

    _destroy = "wush_context_destroy"

    def __init__(self, backend: Union[str, int] = "cpu", device: int = 0, threads: Optional[int] = None,
                 openmp_team: Optional[bool] = None):
        self._backend = _as_enum(Backend, backend)
        super().__init__(_new("wush_context_create", int(self._backend), device))
        if threads is not None:
            self.set_parameter(ContextParameter.NUM_THREADS, int(threads))
        if openmp_team is not None:
            self.set_parameter(ContextParameter.OPENMP_TEAM, int(bool(openmp_team)))

    def set_parameter(self, parameter: Any, value: int) -> None:
        """``wush_context_set_parameter`` (a :class:`ContextParameter` or its name)."""
        _call("wush_context_set_parameter", self.ptr, int(_as_enum(ContextParameter, parameter)), int(value))

    def get_parameter(self, parameter: Any) -> int:
        """``wush_context_get_parameter`` (a :class:`ContextParameter` or its name)."""
        out = ctypes.c_int64()
        _call("wush_context_get_parameter", self.ptr, int(_as_enum(ContextParameter, parameter)), ctypes.byref(out))
        return out.value

    @property
    def backend(self) -> Any:
        """The context's :class:`Backend`."""
        return self._backend

    def set_stream(self, stream: Optional[int]) -> None:
        """The queue of a CUDA context's launches (a ``cudaStream_t`` as an integer; None or 0 =
        the default stream): ``wush_context_set_stream``."""
        _call("wush_context_set_stream", self.ptr, ctypes.c_void_p(stream or None))

    def synchronize(self) -> None:
        """Waits for the context's enqueued launches; reports their deferred errors."""
        _call("wush_context_synchronize", self.ptr)

    @property
    def cpu_isa(self) -> str:
        v = ctypes.c_int()
        _call("wush_context_cpu_isa", self.ptr, ctypes.byref(v))
        return _ffi.lib().wush_cpu_isa_name(v.value).decode()


_default_ctx: Optional[Context] = None
_parent_contexts: List[Context] = []  # a forked child's inherited default contexts, kept, never used


def default_context() -> Context:
    """A process-wide CPU context, created on first use; a child made by ``os.fork()`` (or
    multiprocessing's "fork" start method) gets its own on its first use, since a context whose
    call was in flight in another thread at the fork is refused in the child (wush.h, "Thread safety": fork())."""
    global _default_ctx
    if _default_ctx is None:
        _default_ctx = Context("cpu")
    return _default_ctx


def _after_fork_in_child() -> None:
    global _default_ctx
    if _default_ctx is not None:
        # Kept alive, not destroyed: the parent's thread that was using it is not in the child.
        _parent_contexts.append(_default_ctx)
        _default_ctx = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class Options(_Handle):
    """Options of the long operations: damping, seed, transform dtype, and the per-block search
    (``search=True``: WUSH_OPTION_SEARCH, applied by :func:`layer_quantize`; ``search_tokens``:
    WUSH_OPTION_SEARCH_TOKENS; ``search_guard=False`` turns off the guard's default hold-out,
    WUSH_OPTION_SEARCH_GUARD); ``hessian_damping``: GPTQ's Hessian damping alone
    (WUSH_OPTION_HESSIAN_DAMPING; default: ``damping``)."""

    _destroy = "wush_options_destroy"

    def __init__(self, damping: Optional[float] = None, seed: Optional[int] = None,
                 transform_dtype: Optional[Union[str, int]] = None, search: Optional[bool] = None,
                 search_tokens: Optional[int] = None, search_guard: Optional[bool] = None,
                 hessian_damping: Optional[float] = None):
        super().__init__(_new("wush_options_create"))
        if search_guard is not None:
            _call("wush_options_set_int", self.ptr, int(Option.SEARCH_GUARD), int(bool(search_guard)))
        if search is not None:
            _call("wush_options_set_int", self.ptr, int(Option.SEARCH), int(bool(search)))
        if search_tokens is not None:
            _call("wush_options_set_int", self.ptr, int(Option.SEARCH_TOKENS), int(search_tokens))
        if damping is not None:
            _call("wush_options_set_double", self.ptr, int(Option.DAMPING), float(damping))
        if hessian_damping is not None:
            _call("wush_options_set_double", self.ptr, int(Option.HESSIAN_DAMPING), float(hessian_damping))
        if seed is not None:
            _call("wush_options_set_int", self.ptr, int(Option.SEED), int(seed))
        if transform_dtype is not None:
            _call("wush_options_set_int", self.ptr, int(Option.TRANSFORM_DTYPE),
                  int(_as_enum(DType, transform_dtype)))

    def sample_size(self) -> int:
        """The token sample a calibrator needs for these options (wush_options_sample_size): 0
        without the search, else the search's tokens, doubled for the guard's default hold-out."""
        n = ctypes.c_size_t()
        _call("wush_options_sample_size", self.ptr, ctypes.byref(n))
        return n.value


def format_group_size(fmt: Union[str, int]) -> int:
    g = ctypes.c_size_t()
    _call("wush_format_group_size", int(parse_format(fmt)), ctypes.byref(g))
    return g.value


def _buffer_sizes(fmt: Any, rows: int, cols: int) -> Tuple[int, int]:
    cb, sb = ctypes.c_size_t(), ctypes.c_size_t()
    _call("wush_format_buffer_sizes", int(fmt), rows, cols, ctypes.byref(cb), ctypes.byref(sb))
    return cb.value, sb.value


def quantize_rows(x: Any, fmt: Union[str, int] = "mxfp4", ctx: Optional[Context] = None) -> Tuple[np.ndarray, np.ndarray]:
    """Quantizes the rows of ``x`` (numpy or torch, f32/f16/bf16, last dim = d_in): returns
    (codes uint8 (rows, d_in/2), scales uint8 (rows, bytes of d_in/G scales))."""
    ctx = ctx or default_context()
    f = parse_format(fmt)
    b = _Buf(x)
    cb, sb = _buffer_sizes(f, b.rows, b.cols)
    codes = np.empty((b.rows, cb // max(b.rows, 1)), np.uint8)
    scales = np.empty((b.rows, sb // max(b.rows, 1)), np.uint8)
    _call("wush_quantize_rows", ctx.ptr, int(f), int(b.dtype), ctypes.c_void_p(b.ptr), b.rows, b.cols,
          codes.ctypes.data, cb, scales.ctypes.data, sb)
    return codes, scales


def dequantize_rows(codes: np.ndarray, scales: np.ndarray, d_in: int, fmt: Union[str, int] = "mxfp4",
                    ctx: Optional[Context] = None) -> np.ndarray:
    """Decodes codes + scales from :func:`quantize_rows` into a float32 (rows, d_in) array."""
    ctx = ctx or default_context()
    f = parse_format(fmt)
    codes = np.ascontiguousarray(codes, np.uint8)
    scales = np.ascontiguousarray(scales, np.uint8)
    rows = codes.size * 2 // d_in
    y = np.empty((rows, d_in), np.float32)
    _call("wush_dequantize_rows", ctx.ptr, int(f), codes.ctypes.data, codes.nbytes, scales.ctypes.data,
          scales.nbytes, rows, d_in, _f32ptr(y), y.size)
    return y


def _document_id(document: Any) -> int:
    """A document id as the C API takes it (uint64_t): an integer in [0, 2**64), refused otherwise
    rather than wrapped by ctypes (-1 would become 2**64 - 1 and join another caller's document)."""
    try:
        d = operator.index(document)
    except TypeError:
        raise TypeError(f"a document id must be an integer, not {type(document).__name__}") from None
    if not 0 <= d < 2 ** 64:
        raise ValueError(f"document id {d} is outside [0, 2**64)")
    return d


class Calibrator(_Handle):
    """Streaming float64 second moments of a layer's inputs (``wush_calibrator``). Memory is
    d_in*G doubles (block-diagonal) or d_in^2 (full, needed by GPTQ), whatever the token count,
    plus d_in floats per kept sample or validation token."""

    _destroy = "wush_calibrator_destroy"

    def __init__(self, d_in: int, group_size: int = 32, mode: Union[str, int] = "block_diagonal",
                 sample_size: int = 0, validation_size: int = 0):
        """``sample_size``: tokens kept for the search's scores (wush_calibrator_set_sample_size);
        ``validation_size``: validation tokens kept for its per-layer guard
        (wush_calibrator_set_validation_size; give them with :meth:`add_validation`)."""
        self.d_in, self.group_size = int(d_in), int(group_size)
        self.mode = _as_enum(MomentMode, mode)
        super().__init__(_new("wush_calibrator_create", self.d_in, self.group_size, int(self.mode)))
        if sample_size:
            _call("wush_calibrator_set_sample_size", self.ptr, int(sample_size))
        if validation_size:
            _call("wush_calibrator_set_validation_size", self.ptr, int(validation_size))

    def _offer(self, fn: str, x: Any, ctx: Optional[Context], *extra: int) -> None:
        b = _Buf(x)
        if b.cols != self.d_in:
            raise ValueError(f"activations have width {b.cols}, calibrator expects {self.d_in}")
        if b.rows == 0:
            return
        _call(fn, (ctx or default_context()).ptr, self.ptr, int(b.dtype), ctypes.c_void_p(b.ptr), b.rows, *extra)

    def add(self, x: Any, ctx: Optional[Context] = None, sequence_length: Optional[int] = None,
            document: Optional[int] = None) -> None:
        """Adds activations (numpy/torch, ``(..., d_in)``); a torch CPU tensor is read in place.
        ``sequence_length``: the rows are whole sequences of that many tokens, back to back
        (``wush_calibrator_add_sequences``; e.g. ``x.shape[1]`` of a batch x seq x d_in input), so
        that the search's guard can hold out whole sequences. ``document``: the rows all belong to
        the caller's document of this id (an int in [0, 2**64); ``wush_calibrator_add_document``:
        one document's windows, added in several calls, share it), so that the guard holds out
        whole documents and scores the WUSH layers fit without them (``sequence_length`` is then
        ignored)."""
        if document is not None:
            self._offer("wush_calibrator_add_document", x, ctx, _document_id(document))
        elif sequence_length:
            self._offer("wush_calibrator_add_sequences", x, ctx, int(sequence_length))
        else:
            self._offer("wush_calibrator_add", x, ctx)

    def add_validation(self, x: Any, ctx: Optional[Context] = None) -> None:
        """Offers tokens of held-out documents to the validation sample (not to the moments)."""
        self._offer("wush_calibrator_add_validation", x, ctx)

    @property
    def validation_count(self) -> int:
        n = ctypes.c_size_t()
        _call("wush_calibrator_validation_count", self.ptr, ctypes.byref(n))
        return n.value

    def merge(self, other: "Calibrator") -> None:
        _call("wush_calibrator_merge", self.ptr, other.ptr)

    @property
    def token_count(self) -> int:
        n = ctypes.c_uint64()
        _call("wush_calibrator_token_count", self.ptr, ctypes.byref(n))
        return n.value

    def second_moment(self, block: int) -> np.ndarray:
        """M_X of diagonal block ``block``: (G, G) float64."""
        m = np.empty((self.group_size, self.group_size), np.float64)
        _call("wush_calibrator_second_moment", self.ptr, block, _f64ptr(m), m.size)
        return m

    def export_state(self) -> np.ndarray:
        n = ctypes.c_size_t()
        _call("wush_calibrator_state_size", self.ptr, ctypes.byref(n))
        s = np.empty(n.value, np.float64)
        _call("wush_calibrator_export_state", self.ptr, _f64ptr(s), s.size)
        return s

    def import_state(self, state: np.ndarray) -> None:
        s = np.ascontiguousarray(state, np.float64)
        _call("wush_calibrator_import_state", self.ptr, _f64ptr(s), s.size)


class Transform(_Handle):
    """Per-block transforms of one layer (``wush_transform``)."""

    _destroy = "wush_transform_destroy"

    @classmethod
    def fixed(cls, kind: Union[str, int], d_in: int, group_size: int, options: Optional[Options] = None) -> "Transform":
        return cls(_new("wush_transform_create_fixed", int(parse_transform(kind)), d_in, group_size,
                        options.ptr if options else None))

    @classmethod
    def build(cls, calibrator: Calibrator, weight: Any, kind: Union[str, int] = "wush",
              options: Optional[Options] = None, ctx: Optional[Context] = None) -> "Transform":
        b = _Buf(weight, "weight")
        return cls(_new("wush_transform_build", (ctx or default_context()).ptr, calibrator.ptr, int(b.dtype),
                        ctypes.c_void_p(b.ptr), b.rows, b.cols, int(parse_transform(kind)),
                        options.ptr if options else None))

    def info(self) -> Tuple[Any, int, int]:
        """(kind, d_in, group_size)."""
        k, d, g = ctypes.c_int(), ctypes.c_size_t(), ctypes.c_size_t()
        _call("wush_transform_info", self.ptr, ctypes.byref(k), ctypes.byref(d), ctypes.byref(g))
        return TransformKind(k.value), d.value, g.value

    def matrices(self) -> np.ndarray:
        """Activation-side matrices T_b: (d_in/G, G, G) float32."""
        _, d, g = self.info()
        out = np.empty((d // g, g, g), np.float32)
        _call("wush_transform_matrices", self.ptr, _f32ptr(out), out.size)
        return out

    def guard(self) -> Optional[dict]:
        """What the search's per-layer guard decided for the layer (``wush_transform_guard``):
        None when no guard ran, else a dict with ``source`` ("validation", "hold_out",
        "hold_out_sequences" or "hold_out_documents"), ``n_tokens`` (held-out tokens),
        ``n_sequences`` (held-out sequences or documents under "hold_out_sequences" or
        "hold_out_documents", else 0), ``undecided`` (a candidate lower by more than 1% that
        the held-out tokens could not confirm: ``wush_transform_guard_undecided``) and
        ``undecided_candidate`` (that candidate, else None), ``kept`` (the candidate returned: "searched", "plain",
        "identity", "hadamard", "random" or "shrunk") and ``candidates``: per candidate name a dict with
        ``loss`` (held-out layer loss), ``difference`` and ``std_error`` (mean and standard error
        of the paired per-token differences searched - candidate) and ``replaces`` (met the rule)."""
        src, n, kept = ctypes.c_int(), ctypes.c_size_t(), ctypes.c_int()
        _call("wush_transform_guard", self.ptr, ctypes.byref(src), ctypes.byref(n), ctypes.byref(kept))
        if src.value == int(GuardSource.NONE):
            return None
        candidates = {}
        for c in GuardCandidate:
            loss, diff, se, rep = ctypes.c_double(), ctypes.c_double(), ctypes.c_double(), ctypes.c_int()
            _call("wush_transform_guard_candidate", self.ptr, int(c), ctypes.byref(loss), ctypes.byref(diff),
                  ctypes.byref(se), ctypes.byref(rep))
            candidates[c.name.lower()] = {"loss": loss.value, "difference": diff.value, "std_error": se.value,
                                          "replaces": bool(rep.value)}
        undecided, which, n_seq = ctypes.c_int(), ctypes.c_int(), ctypes.c_size_t()
        _call("wush_transform_guard_undecided", self.ptr, ctypes.byref(undecided), ctypes.byref(which),
              ctypes.byref(n_seq))
        return {"source": GuardSource(src.value).name.lower(), "n_tokens": n.value, "n_sequences": n_seq.value,
                "kept": GuardCandidate(kept.value).name.lower(), "candidates": candidates,
                "undecided": bool(undecided.value),
                "undecided_candidate": GuardCandidate(which.value).name.lower() if undecided.value else None}

    def fallback_blocks(self) -> List[int]:
        n = ctypes.c_size_t()
        _call("wush_transform_fallback_blocks", self.ptr, ctypes.byref(n), None, 0)
        arr = (ctypes.c_size_t * max(n.value, 1))()
        _call("wush_transform_fallback_blocks", self.ptr, ctypes.byref(n), arr, n.value)
        return list(arr[: n.value])


class QWeight(_Handle):
    """A pre-quantized weight (``wush_qweight``)."""

    _destroy = "wush_qweight_destroy"

    @classmethod
    def create(cls, transform: Transform, weight: Any, fmt: Union[str, int] = "mxfp4",
               options: Optional[Options] = None, ctx: Optional[Context] = None) -> "QWeight":
        """RTN quantization of ``weight`` (d_out, d_in) after the weight-side transform."""
        b = _Buf(weight, "weight")
        return cls(_new("wush_qweight_create", (ctx or default_context()).ptr, transform.ptr,
                        int(parse_format(fmt)), int(Method.RTN), int(b.dtype), ctypes.c_void_p(b.ptr),
                        b.rows, b.cols, options.ptr if options else None))

    def info(self) -> Tuple[Any, Any, int, int]:
        """(format, method, d_out, d_in)."""
        f, m, o, i = ctypes.c_int(), ctypes.c_int(), ctypes.c_size_t(), ctypes.c_size_t()
        _call("wush_qweight_info", self.ptr, ctypes.byref(f), ctypes.byref(m), ctypes.byref(o), ctypes.byref(i))
        return Format(f.value), Method(m.value), o.value, i.value

    def data(self) -> Tuple[np.ndarray, np.ndarray]:
        """Copies of (codes (d_out, d_in/2) uint8, scales (d_out, -1) uint8)."""
        _, _, o, _ = self.info()
        c, s = ctypes.c_void_p(), ctypes.c_void_p()
        cb, sb = ctypes.c_size_t(), ctypes.c_size_t()
        _call("wush_qweight_data", self.ptr, ctypes.byref(c), ctypes.byref(cb), ctypes.byref(s), ctypes.byref(sb))
        codes = np.frombuffer((ctypes.c_uint8 * cb.value).from_address(c.value), np.uint8).copy()
        scales = np.frombuffer((ctypes.c_uint8 * sb.value).from_address(s.value), np.uint8).copy()
        return codes.reshape(o, -1), scales.reshape(o, -1)

    def dequantize(self, ctx: Optional[Context] = None) -> np.ndarray:
        """The dequantized transformed weight q(T_xvsh W): (d_out, d_in) float32."""
        f, _, _, d_in = self.info()
        codes, scales = self.data()
        return dequantize_rows(codes, scales, d_in, f, ctx)


def layer_quantize(calibrator: Calibrator, weight: Any, kind: Union[str, int] = "wush",
                   fmt: Union[str, int] = "mxfp4", method: Union[str, int] = "rtn",
                   options: Optional[Options] = None, ctx: Optional[Context] = None) -> Tuple[Transform, QWeight]:
    """Transform + pre-quantized weight of one layer in one call (RTN, or GPTQ with a full-mode
    calibrator): ``wush_layer_quantize``."""
    b = _Buf(weight, "weight")
    t, q = ctypes.c_void_p(), ctypes.c_void_p()
    _call("wush_layer_quantize", (ctx or default_context()).ptr, calibrator.ptr, int(parse_transform(kind)),
          int(parse_format(fmt)), int(parse_method(method)), int(b.dtype), ctypes.c_void_p(b.ptr), b.rows,
          b.cols, options.ptr if options else None, ctypes.byref(t), ctypes.byref(q))
    return Transform(t.value), QWeight(q.value)


def layer_loss(transform: Transform, qweight: QWeight, weight: Any, x: Any, runtime: bool = False,
               ctx: Optional[Context] = None) -> float:
    """Layerwise loss ||Y_q - Y||^2 / (d_out n) on held-out activations ``x``."""
    w, a = _Buf(weight, "weight"), _Buf(x)
    out = ctypes.c_double()
    _call("wush_layer_loss_runtime" if runtime else "wush_layer_loss", (ctx or default_context()).ptr,
          transform.ptr, qweight.ptr, int(w.dtype), ctypes.c_void_p(w.ptr), int(a.dtype), ctypes.c_void_p(a.ptr),
          a.rows, ctypes.byref(out))
    return out.value


class Linear(_Handle):
    """A quantized linear layer prepared once on a context (``wush_linear``): y = x W^T (+ b) with
    the activations transformed and quantized on the fly. The transform and qweight are copied into
    the prepared layer (the CPU backend also packs the weight panels once). A bias, if given to a
    call, is added by the library in float32 before the output's rounding
    (``wush_linear_run_bias``). Close it (or let it be collected) before closing its context."""

    _destroy = "wush_linear_destroy"

    def __init__(self, transform: Transform, qweight: QWeight, ctx: Optional[Context] = None):
        self.ctx = ctx or default_context()
        super().__init__(_new("wush_linear_create", self.ctx.ptr, transform.ptr, qweight.ptr))
        _, _, self.d_out, self.d_in = qweight.info()
        self._ws = np.empty(0, np.uint8)
        # The declared C functions of the per-call path, looked up once (QuantizedLinear calls
        # run_raw for every token of a decode: the lookups were a share of its host time).
        lib = _ffi.lib()
        self._workspace_fn = lib.wush_linear_workspace_size
        self._run_fn, self._run_bias_fn = lib.wush_linear_run, lib.wush_linear_run_bias

    def workspace_size(self, n_tokens: int) -> int:
        """Bytes of workspace :meth:`run_raw` needs for up to ``n_tokens`` tokens (host memory on
        a CPU context, device memory on a CUDA one)."""
        need = ctypes.c_size_t()
        status = self._workspace_fn(self.ctx.ptr, self.ptr, int(n_tokens), ctypes.byref(need))
        if status:
            _check("wush_linear_workspace_size", status)
        return need.value

    def run_raw(self, x_dtype: Any, x_ptr: int, n_tokens: int, y_dtype: Any, y_ptr: int, y_count: int,
                ws_ptr: int, ws_bytes: int, bias_dtype: Any = DType.F32, bias_ptr: int = 0) -> None:
        """``wush_linear_run`` on raw pointers (host pointers on a CPU context, device pointers on
        a CUDA context, where the work is enqueued on the context's stream). With ``bias_ptr``
        (d_out values of ``bias_dtype``, in the same memory as x): ``wush_linear_run_bias``. The
        caller keeps the buffers alive for the call (CPU) or until the stream has run it (CUDA)."""
        # ctypes converts the arguments by the declared argtypes (an int or an IntEnum as is);
        # int() is kept for the callers that pass numpy integers.
        if bias_ptr:
            status = self._run_bias_fn(self.ctx.ptr, self.ptr, int(x_dtype), x_ptr, int(n_tokens), int(bias_dtype),
                                       bias_ptr, self.d_out, int(y_dtype), y_ptr, int(y_count), ws_ptr or None,
                                       int(ws_bytes))
            if status:
                _check("wush_linear_run_bias", status)
            return
        status = self._run_fn(self.ctx.ptr, self.ptr, int(x_dtype), x_ptr, int(n_tokens), int(y_dtype), y_ptr,
                              int(y_count), ws_ptr or None, int(ws_bytes))
        if status:
            _check("wush_linear_run", status)

    def __call__(self, x: Any, out_dtype: str = "f32", bias: Any = None) -> Any:
        """y (n, d_out) float32 for host activations x (n, d_in); ``bias`` (d_out values, float32
        or float16, or a torch tensor of those or bfloat16) is added by the library."""
        b = _Buf(x)
        if b.cols != self.d_in:
            raise ValueError(f"input width {b.cols} != d_in {self.d_in}")
        need = ctypes.c_size_t()
        _call("wush_linear_workspace_size", self.ctx.ptr, self.ptr, b.rows, ctypes.byref(need))
        if self._ws.size < need.value:
            self._ws = np.empty(need.value, np.uint8)  # grown once for the largest batch seen
        y = np.empty((b.rows, self.d_out), np.float32)
        if bias is None:
            _call("wush_linear_run", self.ctx.ptr, self.ptr, int(b.dtype), ctypes.c_void_p(b.ptr), b.rows,
                  int(DType.F32), y.ctypes.data, y.size, self._ws.ctypes.data, self._ws.size)
            return y
        bb = _Buf(bias, "bias")  # its length is checked by the library (bias_count == d_out)
        _call("wush_linear_run_bias", self.ctx.ptr, self.ptr, int(b.dtype), ctypes.c_void_p(b.ptr), b.rows,
              int(bb.dtype), ctypes.c_void_p(bb.ptr), bb.rows * bb.cols, int(DType.F32), y.ctypes.data, y.size,
              self._ws.ctypes.data, self._ws.size)
        return y

    def last_kernels(self) -> str:
        """``wush_linear_last_kernels`` (experimental): the kernels the layer's last call ran, e.g.
        ``"cpu.quantize.avx2 cpu.gemm.avx2"`` or ``"quantize.small_m gemm.decode"``; ``""`` before
        the first call."""
        buf = ctypes.create_string_buffer(64)  # the header: 64 bytes are always enough
        _call("wush_linear_last_kernels", self.ptr, buf, len(buf))
        return buf.value.decode()


class Checkpoint(_Handle):
    """A libwush checkpoint: ``Checkpoint()`` to write, ``Checkpoint.open(path)`` to read."""

    _destroy = "wush_checkpoint_destroy"

    def __init__(self, _ptr: Optional[int] = None):
        super().__init__(_ptr if _ptr is not None else _new("wush_checkpoint_create"))
        self._refs: List[Any] = []  # the C checkpoint references added objects until written

    @classmethod
    def open(cls, path: str, copy: bool = False) -> "Checkpoint":
        """``wush_checkpoint_open``; with ``copy=True`` ``wush_checkpoint_open_mode`` with
        ``WUSH_CHECKPOINT_COPY``: the file is read into memory, nothing stays mapped."""
        if copy:
            return cls(_new("wush_checkpoint_open_mode", _path(path), ENUMS["wush_checkpoint_mode"]["WUSH_CHECKPOINT_COPY"]))
        return cls(_new("wush_checkpoint_open", _path(path)))

    def add_layer(self, name: str, transform: Transform, qweight: QWeight) -> None:
        _call("wush_checkpoint_add_layer", self.ptr, name.encode(), transform.ptr, qweight.ptr)
        self._refs.append((transform, qweight))

    def add_grouped_layer(self, name: str, transform: Transform, qweight: QWeight,
                          parts: Sequence[Tuple[str, int]]) -> None:
        """``wush_checkpoint_add_grouped_layer``: layers that read one input, built as one layer
        over their concatenated rows; ``parts`` the (name, rows) of each, in row order."""
        names = (ctypes.c_char_p * len(parts))(*[n.encode() for n, _ in parts])
        rows = (ctypes.c_size_t * len(parts))(*[int(r) for _, r in parts])
        _call("wush_checkpoint_add_grouped_layer", self.ptr, name.encode(), transform.ptr, qweight.ptr, len(parts),
              names, rows)
        self._refs.append((transform, qweight))

    def layer_parts(self, name: str) -> List[Tuple[str, int, int]]:
        """The parts of layer ``name`` as (part name, first row, rows), in row order (empty for a
        plain layer): ``wush_checkpoint_layer_part_count`` / ``wush_checkpoint_layer_part``."""
        n = ctypes.c_size_t()
        _call("wush_checkpoint_layer_part_count", self.ptr, name.encode(), ctypes.byref(n))
        parts = []
        for i in range(n.value):
            s, begin, rows = ctypes.c_char_p(), ctypes.c_size_t(), ctypes.c_size_t()
            _call("wush_checkpoint_layer_part", self.ptr, name.encode(), i, ctypes.byref(s), ctypes.byref(begin),
                  ctypes.byref(rows))
            parts.append((s.value.decode(), begin.value, rows.value))
        return parts

    def write(self, path: str, options: Optional[Options] = None) -> None:
        _call("wush_checkpoint_write", self.ptr, _path(path), options.ptr if options else None)

    def layer_names(self) -> List[str]:
        n = ctypes.c_size_t()
        _call("wush_checkpoint_layer_count", self.ptr, ctypes.byref(n))
        names = []
        for i in range(n.value):
            s = ctypes.c_char_p()
            _call("wush_checkpoint_layer_name", self.ptr, i, ctypes.byref(s))
            names.append(s.value.decode())
        return names

    def load_layer(self, name: str) -> Tuple[Transform, QWeight]:
        t, q = ctypes.c_void_p(), ctypes.c_void_p()
        _call("wush_checkpoint_load_layer", self.ptr, name.encode(), ctypes.byref(t), ctypes.byref(q))
        return Transform(t.value), QWeight(q.value)

    def export_fp_quant(self, path: str, config_path: Optional[str] = None, options: Optional[Options] = None) -> None:
        """``wush_checkpoint_export_fp_quant`` (an opened checkpoint only)."""
        _call("wush_checkpoint_export_fp_quant", self.ptr, _path(path),
              _path(config_path) if config_path else None, options.ptr if options else None)
