"""The quantized model folder's layout: the names of the files it holds, the files of a model
folder that hold its weights, and the check that a path is a (quantized) model folder.

Needs neither torch nor transformers (:mod:`wush.hf` imports it with ``import wush``).
"""

from __future__ import annotations

import os

from . import _core


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
