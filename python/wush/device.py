"""Where the quantized layers run: a torch device checked for libwush, and the libwush context
for it (the CPU contexts shared per thread count, on torch's OpenMP threads where torch uses them).
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch

from . import _core


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
