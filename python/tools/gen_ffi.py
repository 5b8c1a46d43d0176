#!/usr/bin/env python3
"""Regenerates python/wush/_ffi_table.py from include/wush/wush.h.

Run it after changing the header: python3 python/tools/gen_ffi.py
(`--check` exits 1 instead of writing when the table is out of date.)
"""
import importlib.util
import pathlib
import sys

here = pathlib.Path(__file__).resolve().parent
root = here.parent.parent
spec = importlib.util.spec_from_file_location("_wush_header", here.parent / "wush" / "_header.py")
hdr = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hdr)

header = (root / "include" / "wush" / "wush.h").read_text()
table = hdr.render_table(header)
dest = here.parent / "wush" / "_ffi_table.py"
if "--check" in sys.argv:
    if dest.read_text() != table:
        print("gen_ffi: python/wush/_ffi_table.py is out of date with include/wush/wush.h")
        sys.exit(1)
    print("gen_ffi: up to date")
else:
    dest.write_text(table)
    print(f"gen_ffi: wrote {dest.relative_to(root)}")
