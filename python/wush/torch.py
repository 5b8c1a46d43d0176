"""Model-level quantization with PyTorch: calibration by forward hooks, RTN/GPTQ over a whole
model, and the output folder (fp_quant layout + libwush checkpoint).

This module gathers the names of the modules that hold them, so that ``import wush.torch as wt``
reaches the whole model-level flow:

- :mod:`wush.layers`: the linear layers to quantize (selection, weights, blocks);
- :mod:`wush.calibrate`: forward hooks feeding libwush calibrators;
- :mod:`wush.quantize`: :func:`quantize_model` (RTN, GPTQ) and its :class:`QuantizationResult`;
- :mod:`wush.quantized_linear`: :class:`QuantizedLinear`, the layer on libwush's runtime;
- :mod:`wush.device`: torch devices and libwush contexts;
- :mod:`wush.folder`: the folder's file names; :mod:`wush.whole_folder`: writing it whole;
  :mod:`wush.export`: its layout (fp_quant or wush); :mod:`wush.save`: :func:`save_quantized`;
- :mod:`wush.stored`: a folder's stored tensors; :mod:`wush.model_class`: the class to build;
  :mod:`wush.load`: :func:`load_float_model`, :func:`load_quantized`;
- :mod:`wush.embed`: sentence embeddings.
"""

from __future__ import annotations

from ._core import Calibrator, Checkpoint, Options, QWeight, Transform
from .calibrate import HookCalibration, calibrate
from .device import cpu_context, parse_device, torch_runs_openmp
from .embed import embed, pooling_config
from .export import EXPORTS, check_export, resolve_export
from .folder import CHECKPOINT_FILE, INFO_FILE, TOKENIZER_FILES, WEIGHT_DIRS, WEIGHT_FILES, require_model_folder
from .layers import (DEFAULT_PATTERN, compile_pattern, default_pattern, dense_weight, find_blocks, in_features,
                     is_linear, linear_names, output_layer_name, repeated_blocks, select_linears, selection_error,
                     tied_to, with_output_layer)
from .load import load_float_model, load_quantized, load_quantized_layers
from .model_class import check_stored_layers, check_weights_match, folder_model_class, is_causal, model_class
from .quantize import QuantizationResult, quantize_model
from .quantized_linear import QuantizedLinear, release_cpu_workspace
from .save import EMBEDDINGS, save_quantized
from .stored import MAX_SAFETENSORS_HEADER, read_folder_tensors, stored_tensor_shapes
from .whole_folder import check_out_dir

# Private names that callers reached through this module before it was split (the tests use the
# first four); kept so that they still work.
from .calibrate import _run  # noqa: F401
from .layers import _replace  # noqa: F401
from .quantized_linear import _CPU_WORKSPACE, _TORCH_DTYPES  # noqa: F401
from .device import _context_for  # noqa: F401
from .load import _dtype_kwarg  # noqa: F401
from .stored import _safetensors_shapes, _stored_key  # noqa: F401

__all__ = [
    # calibration and quantization
    "HookCalibration", "QuantizationResult", "QuantizedLinear", "calibrate", "quantize_model",
    "release_cpu_workspace",
    # the layer selection
    "DEFAULT_PATTERN", "compile_pattern", "default_pattern", "dense_weight", "find_blocks", "in_features",
    "is_linear", "linear_names", "output_layer_name", "repeated_blocks", "select_linears", "selection_error",
    "tied_to", "with_output_layer",
    # devices
    "cpu_context", "parse_device", "torch_runs_openmp",
    # the output folder
    "CHECKPOINT_FILE", "EMBEDDINGS", "EXPORTS", "INFO_FILE", "TOKENIZER_FILES", "WEIGHT_DIRS", "WEIGHT_FILES",
    "check_export", "check_out_dir", "resolve_export", "save_quantized",
    # reading and loading folders
    "MAX_SAFETENSORS_HEADER", "check_stored_layers", "check_weights_match", "folder_model_class",
    "load_float_model", "load_quantized", "load_quantized_layers", "model_class", "read_folder_tensors",
    "require_model_folder", "stored_tensor_shapes",
    # running a loaded model
    "embed", "is_causal", "pooling_config",
    # wush's classes, as this module imported them
    "Calibrator", "Checkpoint", "Options", "QWeight", "Transform",
]
