#!/usr/bin/env python3
"""The Python bindings' declarations agree with include/wush/wush.h.

1. python/wush/_ffi_table.py equals what the generator makes from the header today (a changed
   prototype or enum without regenerating fails here);
2. every declared function exists in the built library and its ctypes argtypes/restype are the
   rule-mapped C types of the header's prototype (an independent parse of the header, not the
   table);
3. the check itself can fail: a header with one parameter type changed is reported.
Exit 1 on any mismatch (never skips).
"""
import argparse
import ctypes
import os
import pathlib
import sys

root = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(root / "python"))

ap = argparse.ArgumentParser()
ap.add_argument("--library", required=True)
args, _ = ap.parse_known_args()
os.environ["WUSH_LIBRARY"] = args.library

from wush import _ffi, _header, _ffi_table  # noqa: E402

failures = []
header = (root / "include" / "wush" / "wush.h").read_text()

if _header.render_table(header) != (root / "python" / "wush" / "_ffi_table.py").read_text():
    failures.append("python/wush/_ffi_table.py is out of date: run python3 python/tools/gen_ffi.py")

funcs = _header.parse_functions(header)
if set(funcs) != set(_ffi_table.FUNCTIONS):
    failures.append(f"function sets differ: header-only {sorted(set(funcs) - set(_ffi_table.FUNCTIONS))}, "
                    f"bindings-only {sorted(set(_ffi_table.FUNCTIONS) - set(funcs))}")
if len(funcs) < 70:  # the header declares 76 today; a parser that finds few is broken
    failures.append(f"parser found only {len(funcs)} prototypes")

lib = _ffi.lib()
for name, (ret, params) in funcs.items():
    fn = getattr(lib, name, None)
    if fn is None:
        failures.append(f"{name}: not exported by {args.library}")
        continue
    want_args = [_ffi.ctype_of(p) for p in params]
    if list(fn.argtypes or []) != want_args:
        failures.append(f"{name}: argtypes {fn.argtypes} != header {params}")
    if fn.restype != _ffi.ctype_of(ret):
        failures.append(f"{name}: restype {fn.restype} != header {ret}")

# Spot checks against hand-read facts of the header, so a parser bug cannot agree with itself.
spot = {
    "wush_quantize_rows": ("wush_status", ("wush_context*", "wush_format", "wush_dtype", "const void*", "size_t",
                                           "size_t", "void*", "size_t", "void*", "size_t")),
    "wush_last_error": ("const char*", ()),
    "wush_context_destroy": ("void", ("wush_context*",)),
}
for name, sig in spot.items():
    if funcs.get(name) != sig:
        failures.append(f"parser: {name} parsed as {funcs.get(name)}, expected {sig}")
if _ffi_table.ENUMS["wush_format"].get("WUSH_FORMAT_NVFP4") != 1 or \
        _ffi_table.ENUMS["wush_status"].get("WUSH_ERR_NOT_FOUND") != 12:
    failures.append("enum values differ from the header's pinned values")

# The check must be able to fail: change one parameter type and expect a difference.
mutated = header.replace("size_t n_rows, size_t d_in, void* codes", "size_t n_rows, int d_in, void* codes", 1)
if mutated == header or _header.parse_functions(mutated)["wush_quantize_rows"] == funcs["wush_quantize_rows"]:
    failures.append("mutation test: a changed parameter type went unnoticed")
if _header.render_table(mutated) == _header.render_table(header):
    failures.append("mutation test: the generated table did not change")

for f in failures:
    print("FAIL:", f)
print(f"test_python_header: {len(funcs)} prototypes, {len(_ffi_table.ENUMS)} enums checked, "
      f"{'FAILED' if failures else 'OK'}")
sys.exit(1 if failures else 0)
