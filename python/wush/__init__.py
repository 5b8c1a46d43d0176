"""libwush from Python: WUSH block transforms and 4-bit (MXFP4/NVFP4/INT4) quantization.

Bindings over the C API (include/wush/wush.h) with ctypes; the declarations are generated from
the header. See docs/PYTHON.md. Model-level helpers that need torch live in :mod:`wush.torch`
(import it explicitly) and :func:`quantize_model`.
"""

from ._core import (Backend, Calibrator, Checkpoint, Context, CpuIsa, DType, Format, GuardCandidate, GuardSource,
                    Linear, Method,
                    MomentMode, Options, QWeight, Status, Transform, TransformKind, WushError,
                    default_context, dequantize_rows, format_group_size, layer_loss, layer_quantize,
                    quantize_rows, version)

__all__ = ["Backend", "Calibrator", "Checkpoint", "Context", "CpuIsa", "DType", "Format", "GuardCandidate",
           "GuardSource", "Linear", "Method",
           "MomentMode", "Options", "QWeight", "Status", "Transform", "TransformKind", "WushError",
           "default_context", "dequantize_rows", "format_group_size", "layer_loss", "layer_quantize",
           "quantize_rows", "version", "quantize_model", "load_quantized", "load_sentence_transformer"]
__version__ = "0.3.0"


def quantize_model(*args, **kwargs):  # noqa: D401 - thin lazy forwarder, torch is optional
    """See :func:`wush.torch.quantize_model` (imports torch)."""
    from .torch import quantize_model as _qm
    return _qm(*args, **kwargs)


def load_quantized(*args, **kwargs):  # noqa: D401 - thin lazy forwarder, torch is optional
    """See :func:`wush.torch.load_quantized` (imports torch): a folder written by
    ``quantize-model`` / :func:`wush.torch.save_quantized`, its quantized layers on libwush's runtime."""
    from .torch import load_quantized as _lq
    return _lq(*args, **kwargs)


def load_sentence_transformer(*args, **kwargs):  # noqa: D401 - thin lazy forwarder
    """See :func:`wush.hf.load_sentence_transformer`: a quantized sentence-transformers folder as a
    ``SentenceTransformer`` whose transformer runs on libwush's runtime."""
    from .hf import load_sentence_transformer as _lst
    return _lst(*args, **kwargs)


# transformers learns the quantization method "wush" (wush.hf) once it loads its quantizers, so
# that AutoModel.from_pretrained / SentenceTransformer load a quantized folder on the runtime.
from . import hf as _hf  # noqa: E402 - imports neither torch nor transformers

_hf.register_on_import()
