"""Loading libwush and declaring every C function to ctypes.

The declarations come from ``_ffi_table.py``, which is generated from include/wush/wush.h; this
module only maps C type spellings to ctypes by rule (no per-function hand-written signature).

Where the library is found, first match wins:
  1. the ``WUSH_LIBRARY`` environment variable (a path to libwush.so*);
  2. the copy bundled in the wheel (``wush/_native/lib*/libwush.so.<major>``);
  3. ``pkg-config --variable=libdir wush`` (an installed copy; PKG_CONFIG_PATH is honoured);
  4. the system's search path (``ctypes.util.find_library("wush")``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import subprocess
from typing import Any, Dict, Optional

from ._ffi_table import ENUMS, FUNCTIONS, HANDLES, HEADER_VERSION

# Opaque handle types of the header: passed as void pointers (full pointer width).
_HANDLES = set(HANDLES)

_SCALARS: Dict[str, Any] = {
    "int": ctypes.c_int, "unsigned": ctypes.c_uint, "size_t": ctypes.c_size_t,
    "uint64_t": ctypes.c_uint64, "int64_t": ctypes.c_int64, "double": ctypes.c_double,
    "float": ctypes.c_float, "char": ctypes.c_char,
}

PROGRESS_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_double)


def ctype_of(c_type: str) -> Any:
    """The ctypes type for a normalized C type spelling of the header (None for void)."""
    t = c_type[len("const "):] if c_type.startswith("const ") else c_type
    t = t.replace("*const", "*")  # a const pointer is the same ctypes type
    stars = len(t) - len(t.rstrip("*"))
    base = t.rstrip("*")
    if base == "void":
        return None if stars == 0 else (ctypes.c_void_p if stars == 1 else ctypes.POINTER(ctypes.c_void_p))
    if base == "char" and stars >= 1:
        ct: Any = ctypes.c_char_p
        stars -= 1
    elif base in _HANDLES and stars >= 1:
        ct = ctypes.c_void_p
        stars -= 1
    elif base in ENUMS or base == "wush_status":
        ct = ctypes.c_int  # C enums with values pinned to int width by *_ENUM_MIN_/MAX_
    elif base == "wush_progress_fn":
        ct = PROGRESS_FN
    elif base in _SCALARS:
        ct = _SCALARS[base]
    else:
        raise TypeError(f"no ctypes mapping for C type {c_type!r}")
    for _ in range(stars):
        ct = ctypes.POINTER(ct)
    return ct


def _candidates() -> list:
    major = HEADER_VERSION[0]
    env = os.environ.get("WUSH_LIBRARY")
    if env:
        return [env]  # an explicit choice: never fall back silently to another copy
    out = []
    here = os.path.dirname(os.path.abspath(__file__))
    out += sorted(glob.glob(os.path.join(here, "_native", "lib*", f"libwush.so.{major}")))
    try:
        libdir = subprocess.run([os.environ.get("PKG_CONFIG", "pkg-config"), "--variable=libdir", "wush"],
                                check=True, capture_output=True, text=True, timeout=30).stdout.strip()
        if libdir:
            out.append(os.path.join(libdir, f"libwush.so.{major}"))
    except (OSError, subprocess.SubprocessError):
        pass
    found = ctypes.util.find_library("wush")
    if found:
        out.append(found)
    return out


def _declare(lib: ctypes.CDLL) -> None:
    for name, (ret, params) in FUNCTIONS.items():
        fn = getattr(lib, name)  # AttributeError names a symbol the library lacks
        fn.restype = ctype_of(ret)
        fn.argtypes = [ctype_of(p) for p in params]


_lib: Optional[ctypes.CDLL] = None
library_path: Optional[str] = None


def lib() -> ctypes.CDLL:
    """The loaded, declared library (loaded on first use)."""
    global _lib, library_path
    if _lib is not None:
        return _lib
    errors = []
    for path in _candidates():
        if not os.path.exists(path) and os.sep in path:
            errors.append(f"{path}: no such file")
            continue
        try:
            cand = ctypes.CDLL(path)
        except OSError as e:
            errors.append(f"{path}: {e}")
            continue
        _declare(cand)
        got = cand.wush_version()
        want = HEADER_VERSION[0] * 10000 + HEADER_VERSION[1] * 100 + HEADER_VERSION[2]
        if got // 10000 != want // 10000 or got < want:
            errors.append(f"{path}: libwush {got} is older than or ABI-incompatible with the bindings' {want}")
            continue
        _lib, library_path = cand, path
        return cand
    raise OSError("libwush not found; set WUSH_LIBRARY to libwush.so, install it where pkg-config finds it, "
                  "or pip install the wush package from a checkout. Tried: " + ("; ".join(errors) or "nothing"))
