"""GGUF files as the model of ``python -m wush quantize-model`` and ``eval-model``.

transformers reads the file (``from_pretrained(folder, gguf_file=name)``, with the PyPI package
``gguf``): it builds the model class of the file's architecture from its metadata, dequantizes
every tensor to float32, and builds the tokenizer from the file's vocabulary. quantize-model
then writes that model out as an ordinary Hugging Face folder (config.json, generation config,
tokenizer files, model.safetensors) beside ``--out``, quantizes from it, and removes it: the
output is the usual folder, which ``wush.load_quantized`` and, after ``import wush``,
``AutoModelForCausalLM.from_pretrained`` run.

What is refused, in one line, before any work: a file that is empty, lacks the GGUF magic or
cannot be parsed (truncated, damaged); an architecture transformers cannot read from GGUF, or
one that is not a causal language model; a tensor type transformers does not dequantize for the
file's architecture (named, with the types it does); a folder holding several ``.gguf`` files.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import shutil
import tempfile
from collections import Counter
from typing import Any, Dict, Iterator, List, Optional, Tuple

from . import _core

SUFFIX = ".gguf"
MAGIC = b"GGUF"
# Float tensor types (ggml's enum ggml_type): F32, F16, BF16.
_F32, _F16, _BF16 = 0, 1, 30


def _shown(path: str) -> str:
    return _core.printable(path)


def _has_magic(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False


def find_file(path: str) -> Optional[str]:
    """The GGUF file that the model argument ``path`` names, or None when it names something else
    (a Hugging Face folder, a missing path): ``path`` itself when it is a file named ``*.gguf`` or
    starting with GGUF's magic, or the one ``.gguf`` file of a folder that has no config.json.
    Raises ValueError naming them for a folder with several."""
    if os.path.isfile(path):
        return path if path.lower().endswith(SUFFIX) or _has_magic(path) else None
    if not os.path.isdir(path) or os.path.exists(os.path.join(path, "config.json")):
        return None
    files = sorted(f for f in os.listdir(path) if f.lower().endswith(SUFFIX) and os.path.isfile(os.path.join(path, f)))
    if len(files) > 1:
        raise ValueError(f"{_shown(path)} holds {len(files)} GGUF files ({', '.join(_shown(f) for f in files)}); "
                         f"give the one to use as the model")
    return os.path.join(path, files[0]) if files else None


def _transformers_archs() -> Tuple[List[str], List[str]]:
    """The GGUF architectures transformers reads: those its loader keeps whole (dequantized by
    transformers' own torch code) and those of its older loader (dequantized by ``gguf``)."""
    own: List[str] = []
    try:
        from transformers.integrations.gguf.utils import GGUF_ARCHS
        own = sorted(GGUF_ARCHS)
    except ImportError:  # transformers before its own GGUF loader
        pass
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    legacy = sorted(a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer") and a not in own)
    return own, legacy


def _type_name(t: int) -> str:
    from gguf import GGMLQuantizationType
    try:
        return GGMLQuantizationType(t).name
    except ValueError:
        return f"type {t}"


def _gguf_dequantizes(t: int) -> bool:
    """Whether the installed ``gguf`` package dequantizes tensor type ``t`` (asked with one block
    of zeros: its dequantize raises NotImplementedError for the others)."""
    import numpy as np
    import gguf
    if t in (_F32, _F16):
        return True
    try:
        qt = gguf.GGMLQuantizationType(t)
    except ValueError:
        return False
    sizes = gguf.GGML_QUANT_SIZES.get(qt)
    if sizes is None:
        return False
    try:
        gguf.dequantize(np.zeros((1, sizes[1]), dtype=np.uint8), qt)
    except NotImplementedError:
        return False
    return True


def _own_dequantizes(t: int) -> bool:
    """Whether transformers' own GGUF loader (its ``GGUF_ARCHS``) dequantizes tensor type ``t``."""
    from transformers.integrations.gguf.dequant import GGML_BLOCK
    return t in (_F32, _F16, _BF16) or t in GGML_BLOCK


def accepted_types(architecture: str) -> List[str]:
    """The tensor types transformers dequantizes for a GGUF file of ``architecture``."""
    import gguf
    own, _ = _transformers_archs()
    test = _own_dequantizes if architecture in own else _gguf_dequantizes
    return [v.name for v in gguf.GGMLQuantizationType if test(int(v))]


def _versions() -> str:
    import importlib.metadata as md
    import transformers
    return f"transformers {transformers.__version__}, gguf {md.version('gguf')}"


def _one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {_core.printable(' '.join(str(e).split())[:300], backslash=False)}"


def _require_gguf_package() -> None:
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise ValueError("reading a GGUF file needs the PyPI package gguf (pip install gguf), which transformers "
                         "uses to read it") from None


def read_header(path: str) -> Dict[str, Any]:
    """Reads the file's header (metadata and tensor table, not the weights) and refuses, as a
    ValueError naming the file, what the loading would fail on: not a GGUF file, truncated or
    damaged, an architecture transformers does not read from GGUF or that is not a causal
    language model, a tensor type transformers does not dequantize for that architecture.
    Returns the architecture, the config's model type, the tensor types with their counts."""
    _require_gguf_package()
    from gguf import GGUFReader
    shown = _shown(path)
    size = os.path.getsize(path)
    if size == 0:
        raise ValueError(f"{shown}: an empty file, not a GGUF file")
    if not _has_magic(path):
        raise ValueError(f"{shown}: not a GGUF file (it does not start with GGUF's magic bytes)")
    try:
        reader = GGUFReader(path, "r")
    except Exception as e:  # noqa: BLE001 - whatever the reader raises on a damaged file
        raise ValueError(f"{shown}: a damaged or truncated GGUF file ({size} bytes): gguf cannot read it: "
                         f"{_one_line(e)}") from None
    for t in reader.tensors:
        if int(t.data_offset) + int(t.n_bytes) > size:
            raise ValueError(f"{shown}: a truncated GGUF file: tensor {_shown(t.name)} ends at byte "
                             f"{int(t.data_offset) + int(t.n_bytes)}, the file has {size}")
    field = reader.fields.get("general.architecture")
    try:
        arch = field.contents() if field is not None else None
    except Exception:  # noqa: BLE001 - a field of another type
        arch = None
    if not isinstance(arch, str) or not arch:
        raise ValueError(f"{shown}: no general.architecture (a string) in its metadata, so not a model transformers "
                         f"can read")
    types = Counter(int(t.tensor_type) for t in reader.tensors)
    examples = {}
    for t in reader.tensors:
        examples.setdefault(int(t.tensor_type), t.name)
    del reader

    own, legacy = _transformers_archs()
    from transformers import AutoConfig
    folder, name = os.path.split(os.path.abspath(path))
    try:
        config = AutoConfig.from_pretrained(folder, gguf_file=name, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - transformers' refusal, or its reader failing
        if "not supported" in str(e) or arch not in own + legacy:
            raise ValueError(f"{shown}: GGUF architecture {_shown(arch)} is not one transformers reads from GGUF "
                             f"({_versions()}; it reads {', '.join(own + legacy)})") from None
        raise ValueError(f"{shown}: transformers cannot read its metadata ({arch}): {_one_line(e)}") from None
    from transformers import AutoModelForCausalLM
    if type(config) not in AutoModelForCausalLM._model_mapping:
        raise ValueError(f"{shown}: GGUF architecture {_shown(arch)} (transformers' {config.model_type}) is not a "
                         f"causal language model; GGUF input takes decoders")
    test = _own_dequantizes if arch in own else _gguf_dequantizes
    bad = sorted(t for t in types if not test(t))
    if bad:
        which = "transformers" if arch in own else "gguf (which transformers uses for this architecture)"
        listed = ", ".join(f"{_type_name(t)} ({types[t]} tensor{'s' if types[t] > 1 else ''}, e.g. "
                           f"{_shown(examples[t])})" for t in bad)
        raise ValueError(f"{shown}: tensor type{'s' if len(bad) > 1 else ''} {listed} not dequantized by {which} "
                         f"for architecture {_shown(arch)} ({_versions()}); it dequantizes "
                         f"{', '.join(accepted_types(arch))}")
    return {"file": path, "architecture": arch, "model_type": config.model_type,
            "tensor_types": {_type_name(t): types[t] for t in sorted(types)}}


@contextlib.contextmanager
def _quiet_bars() -> Iterator[None]:
    """transformers' GGUF reader shows a tqdm bar of its own, which transformers'
    ``disable_progress_bar()`` does not reach; hushed with it."""
    from transformers.utils import logging as hf_logging
    try:
        mod = importlib.import_module("transformers.modeling_gguf_pytorch_utils")
    except ImportError:
        mod = None
    if hf_logging.is_progress_bar_enabled() or mod is None or not hasattr(mod, "tqdm"):
        yield
        return
    bar = mod.tqdm
    mod.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        mod.tqdm = bar


def load(path: str, dtype: Any = None) -> Tuple[Any, Any]:
    """The GGUF file as (model, tokenizer): transformers' causal model class of its architecture,
    every tensor dequantized (``dtype``, default float32), eval mode; the tokenizer built from
    the file's vocabulary. ValueError naming the file for what transformers cannot load, and for
    parameters the file did not fill (transformers would leave them at random)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging
    from .load import _dtype_kwarg
    _require_gguf_package()
    folder, name = os.path.split(os.path.abspath(path))
    kwargs: Dict[str, Any] = {}
    try:  # dequantized whole: no packed GGUF layers, whatever kernels are installed
        from transformers import GgufConfig
        kwargs["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:
        pass
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with _quiet_bars():
            model, info = AutoModelForCausalLM.from_pretrained(
                folder, gguf_file=name, local_files_only=True, output_loading_info=True,
                **_dtype_kwarg(dtype or torch.float32), **kwargs)
            tok = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - transformers or gguf on a file they cannot take
        raise ValueError(f"{_shown(path)}: transformers cannot load it: {_one_line(e)}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    missing = sorted(info.get("missing_keys", []))
    if missing:
        raise ValueError(f"{_shown(path)}: transformers found no tensor in the file for {len(missing)} parameters of "
                         f"{type(model).__name__} ({', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}); "
                         f"they would be random")
    return model.eval(), tok


def write_folder(path: str, folder: str) -> None:
    """The GGUF file as a Hugging Face folder: model.safetensors (the dequantized tensors, float32),
    config.json and generation_config.json from the file's metadata, the tokenizer's files."""
    model, tok = load(path)
    # Dequantized, the model is a plain one; transformers refuses to save one still marked as
    # loaded through its GGUF quantizer.
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    model.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)


@contextlib.contextmanager
def staged_folder(path: str, out_dir: str) -> Iterator[str]:
    """:func:`write_folder` into a new folder beside ``out_dir`` (``.wush-gguf-*``, in the nearest
    existing folder above it: the disk the output goes to), removed on exit."""
    parent = os.path.dirname(os.path.realpath(out_dir))
    while not os.path.isdir(parent):
        parent = os.path.dirname(parent)
    folder = tempfile.mkdtemp(prefix=".wush-gguf-", dir=parent)
    try:
        write_folder(path, folder)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
