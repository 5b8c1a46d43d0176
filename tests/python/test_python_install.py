#!/usr/bin/env python3
"""`pip install ./python` from the checkout works, and the wheel is what a user expects:

- scikit-build-core builds libwush with CMake into a wheel tagged py3-none-<platform> (the
  bindings are ctypes: no interpreter ABI), holding one copy of the library (libwush.so.N) and
  no development files, with a `wush` console command;
- installed, the package loads its bundled library by itself and `wush` runs the bundled program.

Offline (CI has no network at test time): --no-build-isolation --no-index, with
scikit-build-core already in the interpreter's venv (scripts/install-deps.sh). Run with the
interpreter of that venv. Takes a few minutes on 2 cores (a full Release build).
"""
import glob
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import zipfile

root = pathlib.Path(__file__).resolve().parents[2]
with tempfile.TemporaryDirectory(prefix="wush-pipinstall-") as tmp:
    wheels, target = os.path.join(tmp, "wheels"), os.path.join(tmp, "target")
    env = dict(os.environ, CMAKE_BUILD_PARALLEL_LEVEL=os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2"))
    env.pop("WUSH_LIBRARY", None)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    subprocess.run(pip + ["wheel", "--quiet", "--no-build-isolation", "--no-deps", "--no-index", "-w", wheels,
                          str(root / "python")], check=True, env=env)
    (whl,) = glob.glob(os.path.join(wheels, "*.whl"))
    bad = []
    if not re.fullmatch(r"wush-[^-]+-py3-none-[a-z0-9_]+\.whl", os.path.basename(whl)):
        bad.append(f"wheel tag: {os.path.basename(whl)} is not py3-none-<platform>")
    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
        libs = [n for n in names if re.search(r"/libwush\.so", n)]
        if len(libs) != 1 or not re.search(r"/libwush\.so\.\d+$", libs[0]):
            bad.append(f"the wheel should hold one libwush.so.N, holds {libs}")
        if [n for n in names if n.endswith((".h", ".pc", ".cmake"))]:
            bad.append("development files in the wheel")
        ep = [n for n in names if n.endswith("entry_points.txt")]
        if not ep or "wush = wush._cli:main" not in z.read(ep[0]).decode():
            bad.append("no `wush` console command in entry_points.txt")
    subprocess.run(pip + ["install", "--quiet", "--no-deps", "--no-index", "--target", target, whl], check=True,
                   env=env)
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
        bad.append(f"the installed package loaded {out}, not its bundled library")
    cmd = os.path.join(target, "bin", "wush")
    r = subprocess.run([sys.executable, cmd, "--help"], env=dict(env, PYTHONPATH=target), capture_output=True,
                       text=True)
    if "usage: wush" not in r.stdout + r.stderr:
        bad.append(f"`wush --help` through the console command: {r.returncode} {r.stderr[-300:]}")
    if bad:
        sys.exit("FAIL: " + "; ".join(bad))
    print(f"test_python_install: OK ({os.path.basename(whl)}, {out[len(target) + 1:]})")
