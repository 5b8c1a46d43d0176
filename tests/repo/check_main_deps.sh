#!/usr/bin/env bash
# The main job's command installs only what the main job needs (issue 29, "the README's first
# command"): scripts/run.sh calls `scripts/install-deps.sh main`, which installs Debian packages
# only, never the Python test environments (about 7 GB with torch's nvidia wheels). Checked
# without installing anything: dpkg-query is faked to report every package present, and the
# Python venv variables point at a directory that is not a venv, which makes any attempt to set
# one up fail at once.
#
#   tests/repo/check_main_deps.sh REPO
set -euo pipefail
repo=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "check_main_deps: FAIL: $*"; exit 1; }

grep -Eq '^[^#]*scripts/install-deps\.sh main' "$repo/scripts/run.sh" || fail "scripts/run.sh does not call 'scripts/install-deps.sh main'"

mkdir -p "$tmp/bin" "$tmp/not-a-venv"
printf '#!/bin/sh\necho "install ok installed"\n' >"$tmp/bin/dpkg-query"
printf '#!/bin/sh\necho "apt-get must not run" >&2\nexit 1\n' >"$tmp/bin/apt-get"
chmod +x "$tmp/bin/dpkg-query" "$tmp/bin/apt-get"
run() {
  PATH="$tmp/bin:$PATH" WUSH_PYTHON_VENV="$tmp/not-a-venv" WUSH_TORCH_VENV="$tmp/not-a-venv" \
    bash "$repo/scripts/install-deps.sh" "$@" >"$tmp/out" 2>&1
}
run main || fail "install-deps.sh main touched the Python test environments or failed: $(cat "$tmp/out")"
# The full set does set them up (and so fails here, at the first venv): the split is real.
if run all; then fail "install-deps.sh all did not try to set up the Python test environments"; fi
grep -q "not a Python venv" "$tmp/out" || fail "install-deps.sh all failed for another reason: $(cat "$tmp/out")"
echo "check_main_deps: PASS"
