#!/usr/bin/env python3
"""`pip install ./python` from the checkout works: scikit-build-core builds libwush with CMake
and the wheel bundles libwush.so, which the installed package then loads by itself.

Offline (CI has no network at test time): --no-build-isolation --no-index, with
scikit-build-core already in the interpreter's venv (scripts/install-deps.sh). Run with the
interpreter of that venv. Takes a few minutes on 2 cores (a full Release build).
"""
import os
import pathlib
import subprocess
import sys
import tempfile

root = pathlib.Path(__file__).resolve().parents[2]
with tempfile.TemporaryDirectory(prefix="wush-pipinstall-") as target:
    env = dict(os.environ, CMAKE_BUILD_PARALLEL_LEVEL=os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2"))
    env.pop("WUSH_LIBRARY", None)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    "--no-build-isolation", "--no-deps", "--no-index", "--target", target, str(root / "python")],
                   check=True, env=env)
    probe = (
        "import numpy as np, wush, wush._ffi as f\n"
        "c, s = wush.quantize_rows(np.full((1, 32), 1.5, np.float32), 'mxfp4')\n"
        # 1.5 = 2^0 x 1.5: E8M0 scale byte 127, E2M1 code of 1.5*3/1 -> 4.5 rounds to 4 (0b0110)
        "assert s.tolist() == [[127]], s\n"
        "assert c[0, 0] == 0x66, hex(c[0, 0])\n"
        "print(f.library_path)\n")
    out = subprocess.run([sys.executable, "-c", probe], check=True, env=dict(env, PYTHONPATH=target),
                         capture_output=True, text=True, cwd=target).stdout.strip()
    if not out.startswith(os.path.join(target, "wush", "_native")):
        sys.exit(f"FAIL: the installed package loaded {out}, not its bundled library")
    print(f"test_python_install: OK ({out[len(target) + 1:]})")
