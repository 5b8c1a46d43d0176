#!/usr/bin/env bash
# Compares a built libwush against the committed ABI baseline with libabigail's abidiff.
#
#   tests/abi/check_abi.sh LIBRARY BASELINE HEADERS_DIR
#
#   LIBRARY      the built (or installed) libwush.so.<major>, with DWARF (-g; RelWithDebInfo does)
#   BASELINE     abi/libwush.abi (written by abidw, see abi/README.md)
#   HEADERS_DIR  the public header directory, e.g. include/wush or <prefix>/include/wush; only
#                types declared there count as part of the ABI
#
# Verdict, from abidiff's exit status (a bit mask: 1 = tool error, 2 = usage error, 4 = the ABI
# changed, 8 = the change is incompatible):
#   0                 PASS  no ABI change
#   4 (additions)     PASS  compatible additions (listed); regenerate the baseline with the change
#   4 (other change)  FAIL  abidiff only flags removals as "incompatible"; a changed function or
#                           variable (parameter/return type, enumerator value, ...) is treated as
#                           incompatible here too
#   8 (incompatible)  PASS  only when the library's SONAME major differs from the baseline's
#                           (WUSH_VERSION_MAJOR was bumped); otherwise FAIL with the report
#   1 or 2            FAIL  tool error
# The last line printed is the one-line verdict ("check_abi: PASS ..." / "check_abi: FAIL ...").
set -euo pipefail

verdict() { # verdict PASS|FAIL MESSAGE
    echo "check_abi: $1: $2"
    if [[ $1 == PASS ]]; then exit 0; fi
    exit 1
}

if [[ $# -ne 3 ]]; then
    echo "usage: $0 LIBRARY BASELINE HEADERS_DIR" >&2
    exit 2
fi
library=$1 baseline=$2 headers=$3

for tool in abidiff readelf; do
    command -v "$tool" >/dev/null 2>&1 || verdict FAIL "required program not found: $tool (install abigail-tools / binutils)"
done
[[ -f "$library" ]] || verdict FAIL "no such library: $library"
[[ -f "$baseline" ]] || verdict FAIL "no such baseline: $baseline"
[[ -d "$headers" ]] || verdict FAIL "no such headers directory: $headers"

# Without DWARF abidiff sees only symbol names and would miss every signature or type change.
if ! readelf -S --wide "$library" | grep -q '\.debug_info'; then
    verdict FAIL "$library has no DWARF (.debug_info): build with -g (CMAKE_BUILD_TYPE RelWithDebInfo or Debug) and do not strip it"
fi

soname_major() { # libwush.so.3 -> 3; empty when there is no number
    local s=$1
    if [[ $s =~ \.so\.([0-9]+)$ ]]; then echo "${BASH_REMATCH[1]}"; fi
}
lib_soname=$(readelf -d "$library" | sed -n 's/.*Library soname: \[\(.*\)\].*/\1/p')
base_soname=$(grep -o -m1 "soname='[^']*'" "$baseline" | sed "s/soname='\(.*\)'/\1/" || true)

report=$(mktemp "${TMPDIR:-/tmp}/wush-abidiff.XXXXXX")
trap 'rm -f -- "$report"' EXIT

# Same filtering as the abidw command that wrote the baseline (abi/README.md).
set +e
abidiff --headers-dir2 "$headers" --drop-private-types --exported-interfaces-only \
        --fail-no-debug-info --no-show-locs "$baseline" "$library" >"$report" 2>&1
rc=$?
set -e

if (( rc & 3 )); then
    cat "$report"
    verdict FAIL "abidiff failed (tool/usage error, exit $rc)"
fi
if (( rc == 0 )); then
    verdict PASS "no ABI change against $(basename -- "$baseline") ($lib_soname)"
fi

# Counts from abidiff's summary lines, e.g.
#   Functions changes summary: 0 Removed, 1 Changed (2 filtered out), 3 Added functions
#   Variables changes summary: 0 Removed, 0 Changed, 0 Added variable
#   Function symbols changes summary: 0 Removed, 0 Added function symbol not referenced by debug info
summary_count() { # summary_count LINE_PREFIX WORD -> the number before WORD (0 when absent)
    local n
    n=$(grep -E "^ *$1 changes summary:" "$report" | grep -oE "[0-9]+ $2" | head -n1 | grep -oE '^[0-9]+' || true)
    echo "${n:-0}"
}
removed=$(( $(summary_count Functions Removed) + $(summary_count Variables Removed) +
            $(summary_count "Function symbols" Removed) + $(summary_count "Variable symbols" Removed) ))
changed=$(( $(summary_count Functions Changed) + $(summary_count Variables Changed) ))

if (( rc & 8 )) || (( removed > 0 || changed > 0 )); then
    lib_major=$(soname_major "$lib_soname")
    base_major=$(soname_major "$base_soname")
    if [[ -n "$lib_major" && -n "$base_major" && "$lib_major" != "$base_major" ]]; then
        cat "$report"
        verdict PASS "incompatible ABI change with a SONAME bump ($base_soname -> $lib_soname); regenerate abi/libwush.abi (abi/README.md)"
    fi
    cat "$report"
    verdict FAIL "incompatible ABI change (abidiff exit $rc: $removed removed, $changed changed) without bumping WUSH_VERSION_MAJOR (SONAME stays $lib_soname)"
fi

# rc == 4 with only additions.
echo "Added to the ABI:"
grep -E "^ *\[A\]|Added (function|variable)" "$report" || cat "$report"
verdict PASS "compatible additions only ($lib_soname); regenerate abi/libwush.abi together with this change (abi/README.md)"
