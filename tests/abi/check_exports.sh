#!/usr/bin/env bash
# Checks what a built libwush exports and what it is called.
#
#   tests/abi/check_exports.sh LIBRARY [HEADER]
#
#   LIBRARY  the built (or installed) libwush shared library
#   HEADER   the header holding WUSH_VERSION_MAJOR; default include/wush/wush.h in this repository
#
# Fails when
#   - the dynamic symbol table defines a symbol that does not start with wush_ (besides the
#     linker's _init, _fini, _edata, _end, __bss_start and symbol-version definitions),
#   - it defines no wush_ symbol at all,
#   - the SONAME is not libwush.so.<WUSH_VERSION_MAJOR>.
# The last line printed is the one-line verdict ("check_exports: PASS ..." / "... FAIL ...").
set -euo pipefail

verdict() { # verdict PASS|FAIL MESSAGE
    echo "check_exports: $1: $2"
    if [[ $1 == PASS ]]; then exit 0; fi
    exit 1
}

if [[ $# -lt 1 || $# -gt 2 ]]; then
    echo "usage: $0 LIBRARY [HEADER]" >&2
    exit 2
fi
script_dir=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
repo_root=$(cd -- "$script_dir/../.." && pwd)
library=$1
header=${2:-$repo_root/include/wush/wush.h}

for tool in nm readelf; do
    command -v "$tool" >/dev/null 2>&1 || verdict FAIL "required program not found: $tool (binutils)"
done
[[ -f "$library" ]] || verdict FAIL "no such library: $library"
[[ -f "$header" ]] || verdict FAIL "no such header: $header"

major=$(sed -n 's/^[[:space:]]*#[[:space:]]*define[[:space:]]\{1,\}WUSH_VERSION_MAJOR[[:space:]]\{1,\}\([0-9]\{1,\}\).*/\1/p' "$header" | head -n1)
[[ -n "$major" ]] || verdict FAIL "no '#define WUSH_VERSION_MAJOR <number>' in $header"

problems=()

# Symbol-version definitions (if the version script ever names a node) show up as absolute
# symbols; they are not code and are allowed.
version_nodes=$(readelf --version-info --wide "$library" |
    sed -n '/Version definition section/,/Version needs section/p' |
    sed -n 's/.*Name: \([^ ]*\).*/\1/p')

nm_out=$(nm -D --defined-only "$library") || verdict FAIL "nm -D failed on $library"
wush_count=0
stray=()
while read -r _addr type name; do
    [[ -n "${name:-}" ]] || { name=$type; type=""; } # lines without an address column
    name=${name%%@*}                                   # drop @VERSION / @@VERSION
    case "$name" in
        _init | _fini | _edata | _end | __bss_start) continue ;;
        wush_*) wush_count=$((wush_count + 1)); continue ;;
    esac
    if [[ "$type" == A ]] && grep -qxF -- "$name" <<<"$version_nodes"; then
        continue
    fi
    stray+=("$name ($type)")
done <<<"$nm_out"

if (( ${#stray[@]} > 0 )); then
    problems+=("${#stray[@]} exported symbol(s) without the wush_ prefix")
    echo "Exported symbols that are not wush_*:"
    printf '  %s\n' "${stray[@]}"
fi
if (( wush_count == 0 )); then
    problems+=("no wush_ symbol is exported")
fi

soname=$(readelf -d "$library" | sed -n 's/.*Library soname: \[\(.*\)\].*/\1/p')
if [[ "$soname" != "libwush.so.$major" ]]; then
    problems+=("SONAME is '${soname:-<none>}', expected libwush.so.$major (WUSH_VERSION_MAJOR in $header)")
fi

if (( ${#problems[@]} > 0 )); then
    joined=$(printf '%s; ' "${problems[@]}")
    verdict FAIL "${joined%; }"
fi
verdict PASS "$wush_count wush_* symbols exported, nothing else; SONAME $soname"
