"""The layout the quantized layers are written in (``export``): fp_quant where the C library's
export takes the model's format and transform, else libwush's own ("wush").
"""

from __future__ import annotations

import os
import tempfile
from typing import Optional, Tuple

import numpy as np

from . import _core
from ._core import Calibrator, Checkpoint, Options


EXPORTS = ("fp_quant", "wush")


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
