"""QuantizedLinear: the nn.Linear replacement that runs a quantized layer on libwush's runtime,
the CPU scratch buffer its layers share per thread, and the parts of a grouped layer
(QuantizedPart: the modules of layers built as one, :mod:`wush.groups`).
"""

from __future__ import annotations

import ctypes
import threading
from typing import Optional, Sequence, Tuple

import torch
from torch import nn

from . import _core
from ._core import QWeight, Transform
from .device import cpu_context


class _ThreadWorkspace(threading.local):
    """The scratch buffer of the CPU layers that run on this thread. A layer's workspace is dead
    once its call returns, so every CPU layer of a thread shares one, grown to the largest call
    seen: per layer, a model's buffers added up to the sum over all its layers (146 MiB for
    MiniLM's 36 layers at 4,096 tokens; gigabytes for a 7B model's long prefill). Per thread,
    because threads may run layers at the same time."""

    def __init__(self) -> None:
        self.buffer: Optional[torch.Tensor] = None
        # wush_linear_workspace_size's output, made once per thread (forward's fast path)
        self.need = ctypes.c_size_t()
        self.need_ref = ctypes.byref(self.need)

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
        self._out_shape: tuple = (None, None)  # (input shape, output shape) of the last fast call

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
        if x.is_cuda != self._cuda:
            raise ValueError(f"a {'CUDA' if self._cuda else 'CPU'} wush layer got a tensor on {x.device}")
        dtype = x.dtype
        if not self._cuda and (dtype is torch.float32 or dtype is torch.bfloat16) and x.is_contiguous():
            # The common case (a decode step: one token), the C calls made here on ctypes functions
            # looked up at construction: the library reads x where it lies and writes y in x's
            # dtype (bf16: the same bits as converting its float32 result afterwards), allocated
            # in the output's shape, so no reshape, detach, copy or conversion on either side.
            shape = x.shape
            cached = self._out_shape
            if cached[0] != shape:
                cached = self._out_shape = (shape, shape[:-1] + (self.out_features,))
            y = x.new_empty(cached[1])
            n = x.numel() // self.in_features
            if n:
                rt = self.runtime
                ctx_ptr, layer_ptr = rt.ctx.ptr, rt.ptr  # ValueError for a closed handle, as before
                tw = _CPU_WORKSPACE
                status = rt._workspace_fn(ctx_ptr, layer_ptr, n, tw.need_ref)
                if status:
                    _core._check("wush_linear_workspace_size", status)
                ws = tw.get(tw.need.value or 1)
                code = _FAST_DTYPE[dtype]
                # The bias as it is at this call (a replaced parameter or .data is seen): read
                # where it lies when the library takes it as stored, else _library_bias's copy.
                b = self._parameters.get("bias", _core)
                if b is not None and (b is _core or b.dtype not in _TORCH_DTYPES or not b.is_contiguous()):
                    b = self._library_bias()
                if b is None:
                    status = rt._run_fn(ctx_ptr, layer_ptr, code, x.data_ptr(), n, code, y.data_ptr(), y.numel(),
                                        ws.data_ptr(), ws.numel())
                    if status:
                        _core._check("wush_linear_run", status)
                else:
                    status = rt._run_bias_fn(ctx_ptr, layer_ptr, code, x.data_ptr(), n, _TORCH_DTYPES[b.dtype],
                                             b.data_ptr(), self.out_features, code, y.data_ptr(), y.numel(),
                                             ws.data_ptr(), ws.numel())
                    if status:
                        _core._check("wush_linear_run_bias", status)
            return y
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


def is_quantized(m: nn.Module) -> bool:
    """A module that runs on libwush: a QuantizedLinear or a part of a grouped layer."""
    return isinstance(m, (QuantizedLinear, QuantizedPart))


_TORCH_DTYPES = {torch.float32: _core.DType.F32, torch.float16: _core.DType.F16, torch.bfloat16: _core.DType.BF16}
# forward's fast path: the dtypes the library both reads and writes, as plain ints
_FAST_DTYPE = {torch.float32: int(_core.DType.F32), torch.bfloat16: int(_core.DType.BF16)}
