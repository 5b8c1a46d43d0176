#!/usr/bin/env bash
# A venv with llama-cpp-python, built from its source distribution on PyPI (the llama.cpp source
# it carries, compiled for this CPU), for bench/bench_token_loop.py's llama.cpp engine.
#
# NOT part of libwush's build, install or tests: llama.cpp is a reference to compare with, not a
# dependency. The build takes 10-20 minutes on 2 cores.
#
#   bench/token_loop_llama_cpp.sh VENV_DIR [VERSION]
#
# Then: python3 bench/bench_token_loop.py ... --llama-python VENV_DIR/bin/python
set -euo pipefail
venv=${1:?usage: token_loop_llama_cpp.sh VENV_DIR [VERSION]}
version=${2:-}
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --upgrade pip
# GGML_NATIVE: the build machine's ISA (AVX2 or AVX-512), as a user's own build would be.
CMAKE_ARGS="-DGGML_NATIVE=ON" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
  "$venv/bin/pip" install --no-binary llama-cpp-python "llama-cpp-python${version:+==$version}" numpy
"$venv/bin/python" -c 'import llama_cpp; print("llama-cpp-python", llama_cpp.__version__)'
