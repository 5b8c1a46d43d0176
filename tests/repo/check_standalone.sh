#!/usr/bin/env bash
# The repository must stand alone: a clone has no design file, notes or paper source beside it,
# and no development machine's directories. Fails on any tracked text file that refers to them.
# Usage: check_standalone.sh [REPO_ROOT]
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$root"
pattern='\.\./shared|shared/notes|shared/seed|wush-paper\.tex|DESIGN\.md|/w[o]rk/|/h[o]me/'

excludes=(":(exclude)tests/repo/check_standalone.sh")

# -I skips binary files; git grep exits 1 when nothing matches, 2+ on error.
status=0
git grep -nIE "$pattern" -- . "${excludes[@]}" || status=$?
case $status in
  0) echo "check_standalone: the lines above refer to files outside the repository" >&2; exit 1 ;;
  1) echo "check_standalone: no references outside the repository" ;;
  *) echo "check_standalone: git grep failed" >&2; exit 2 ;;
esac
