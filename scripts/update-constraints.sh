#!/usr/bin/env bash
# Moves the Python test environments' lock (scripts/python-constraints.txt) forward:
#   1. installs the newest versions that the ranges in scripts/install-deps.sh allow into fresh
#      venvs under .devdeps/newest (the locked ones in .devdeps/venv* are left alone);
#   2. builds build/newest against them and runs every Python test (ctest -L python);
#   3. when they pass, writes those versions into the constraints file and prints what changed.
# On a failure the constraints file is left as it was, and the failing tests say what the new
# versions broke. Review the printed diff and commit it with the fixes it needed.
#   scripts/update-constraints.sh [--check]   --check: steps 1-2 and the diff only, no write
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
write=1
[ "${1:-}" = --check ] && write=0
new=$root/.devdeps/newest
export WUSH_PYTHON_VENV=$new/venv WUSH_TORCH_VENV=$new/venv-torch WUSH_CUDA_TOOLS_VENV=$new/venv-cudatools
WUSH_DEPS=newest scripts/install-deps.sh
scripts/build.sh build/newest -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWUSH_CUDA=OFF -DWUSH_BUILD_TESTS=ON \
  -DWUSH_BUILD_BENCH=OFF -DWUSH_PYTHON_VENV="$WUSH_PYTHON_VENV" -DWUSH_TORCH_VENV="$WUSH_TORCH_VENV"
ctest --test-dir build/newest -L python --no-tests=error --output-on-failure -j"${JOBS:-$(nproc)}"

lock=scripts/python-constraints.txt
fresh=$(mktemp)
trap 'rm -f "$fresh"' EXIT
{
  sed -n '1,2p' "$lock"
  echo "# Installed with these versions by scripts/update-constraints.sh on $(date -u +%F) ($(. /etc/os-release && echo "$PRETTY_NAME"), $("$WUSH_TORCH_VENV/bin/python3" -V))."
  for v in "$WUSH_TORCH_VENV" "$WUSH_PYTHON_VENV" "$WUSH_CUDA_TOOLS_VENV"; do
    [ -x "$v/bin/python3" ] && "$v/bin/python3" -m pip freeze --disable-pip-version-check
  done | sort -f -u
} >"$fresh"
echo "update-constraints: what the newest versions change (- locked, + newest):"
diff <(grep -v '^#' "$lock") <(grep -v '^#' "$fresh") | grep '^[<>]' | sed 's/^</-/; s/^>/+/' || echo "  nothing"
if [ "$write" = 1 ]; then
  cp "$fresh" "$lock"
  echo "update-constraints: wrote $lock; the next scripts/install-deps.sh brings .devdeps/venv* to it"
fi
