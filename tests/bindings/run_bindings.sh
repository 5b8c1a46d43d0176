#!/usr/bin/env bash
# Builds and runs the bindings (C, Python and MPI examples; the Rust and Go packages with their
# tests and examples) against an INSTALLED libwush, found
# only through its pkg-config file.
#
#   tests/bindings/run_bindings.sh PREFIX
#
# PREFIX is what `cmake --install <build> --prefix PREFIX` (or CMAKE_INSTALL_PREFIX) was; the
# script finds wush.pc under it (lib/, lib64/, lib/<multiarch>/ ...). Works from any directory.
#
# Checks, each counted once:
#   pkg-config  `pkg-config --cflags --libs wush` works, and the libdir/includedir it names hold
#               libwush.so.<major> and wush/wush.h (i.e. the .pc file really describes PREFIX)
#   readme      the README's "Using it" lines, verbatim: its app.c built with its `cc ... $(pkg-config
#               --cflags --libs wush)` line, run WITHOUT LD_LIBRARY_PATH (the .pc file's rpath
#               must make it find libwush)
#   c           example.c compiles with -std=c99 -pedantic -Wall -Wextra -Werror and runs
#   rust        bindings/rust: `cargo test` of the wush / wush-sys crates (offline, Debian's crate
#               registry) and the model example on a checkpoint written by the installed `wush
#               quantize` (bindings/examples/tiny_model.py makes its inputs)
#   go          bindings/go/wush: `go test` of the package (cgo, `#cgo pkg-config: wush`) and the
#               model example on the same checkpoint
#   coverage    tests/bindings/test_bindings_coverage.py: every WUSH_API function of the repository's
#               include/wush/wush.h is called by the safe Rust crate (sys::wush_*) and by the Go
#               package (C.wush_*); it names each one a package never calls
#   abi-upgrade the Rust and Go programs of tests/bindings/abi_upgrade built against the previous
#               release's header (abi/previous/wush.h) and against the installed one, all run
#               against the installed library: their checks pass and their reports agree (and
#               compare_headers.py finds no removed/changed declaration)
#   python      ctypes example
#   mpi         bindings_examples/mpi: distributed calibration with mpirun -np 1, 2 and 4 gives
#               the same checkpoint as one process (compare_checkpoints), and a failing rank
#               makes every rank report the error and the job exit non-zero (no hang)
# A failing check does not stop the others. The last line is exactly
#   bindings: N passed, M failed
# and the exit status is 0 when M is 0, 1 otherwise (2 for a usage error).
#
# Environment:
#   WUSH_BINDINGS_SKIP  space-separated checks not to run (e.g. "rust go abi-upgrade" on a machine
#                       without those toolchains); skipped checks are listed but not counted.
#   CC                  C compiler (default: cc)
#   CARGO_TARGET_DIR    where cargo builds (default: a temporary directory)
# The check_* functions are called indirectly through run_check:
# shellcheck disable=SC2317
set -euo pipefail

if [[ $# -ne 1 ]]; then
    echo "usage: $0 PREFIX   (the install prefix of libwush)" >&2
    exit 2
fi

script_dir=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
repo_root=$(cd -- "$script_dir/../.." && pwd)
examples="$repo_root/bindings_examples"
prefix=$(cd -- "$1" 2>/dev/null && pwd) || { echo "run_bindings: no such directory: $1" >&2; exit 2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/wush-bindings.XXXXXX")
trap 'rm -rf -- "$work"' EXIT
# A Go build cache of this run only: go's cache key for a cgo package covers neither the
# pkg-config output nor the C headers, so a cache kept from a run against another prefix links
# against that prefix's (deleted) library ("cannot find -lwush"), and a changed header is not seen.
export GOCACHE="$work/go-cache"

passed=0
failed=0
failed_names=()
skip=" ${WUSH_BINDINGS_SKIP:-} "

summary_and_exit() {
    if [[ ${#failed_names[@]} -gt 0 ]]; then
        echo "failed: ${failed_names[*]}"
    fi
    echo "bindings: $passed passed, $failed failed"
    if [[ $failed -ne 0 ]]; then
        exit 1
    fi
    exit 0
}

# ---- locate wush.pc ----------------------------------------------------------------------------
pc_file=""
for candidate in lib/pkgconfig lib64/pkgconfig share/pkgconfig; do
    if [[ -f "$prefix/$candidate/wush.pc" ]]; then
        pc_file="$prefix/$candidate/wush.pc"
        break
    fi
done
if [[ -z "$pc_file" ]]; then # e.g. lib/x86_64-linux-gnu/pkgconfig
    pc_file=$(find "$prefix" -maxdepth 4 -path '*/pkgconfig/wush.pc' -print -quit 2>/dev/null || true)
fi
if [[ -z "$pc_file" ]]; then
    echo "run_bindings: no pkgconfig/wush.pc under $prefix (was libwush installed there?)" >&2
    failed=1
    failed_names+=(pkg-config)
    summary_and_exit
fi
export PKG_CONFIG_PATH
PKG_CONFIG_PATH=$(dirname -- "$pc_file")
export PKG_CONFIG="${PKG_CONFIG:-pkg-config}"
echo "== using $pc_file"

run_check() { # run_check NAME FUNCTION: runs FUNCTION in a subshell with errexit, counts it
    local name=$1 fn=$2 rc
    if [[ "$skip" == *" $name "* ]]; then
        echo "== $name: SKIPPED (WUSH_BINDINGS_SKIP)"
        return 0
    fi
    echo "== $name"
    # Not `( ... ) || ...`: errexit is ignored inside a command whose status is tested.
    set +e
    (set -euo pipefail; "$fn")
    rc=$?
    set -e
    if [[ $rc -eq 0 ]]; then
        echo "== $name: PASS"
        passed=$((passed + 1))
    else
        echo "== $name: FAIL (exit $rc)"
        failed=$((failed + 1))
        failed_names+=("$name")
    fi
}

need() { # need PROGRAM...: fail the current check with a message when a tool is missing
    local p
    for p in "$@"; do
        command -v "$p" >/dev/null 2>&1 || { echo "required program not found: $p" >&2; return 1; }
    done
}

# ---- pkg-config --------------------------------------------------------------------------------
check_pkg_config() {
    need "$PKG_CONFIG"
    "$PKG_CONFIG" --exists --print-errors wush
    local flags libdir includedir version major
    flags=$("$PKG_CONFIG" --cflags --libs wush)
    echo "pkg-config --cflags --libs wush: $flags"
    [[ " $flags " == *" -lwush "* ]] || { echo "--libs does not name -lwush" >&2; return 1; }
    version=$("$PKG_CONFIG" --modversion wush)
    major=${version%%.*}
    libdir=$("$PKG_CONFIG" --variable=libdir wush)
    includedir=$("$PKG_CONFIG" --variable=includedir wush)
    local ok=1
    [[ -e "$libdir/libwush.so.$major" ]] || { echo "libdir $libdir has no libwush.so.$major" >&2; ok=0; }
    [[ -e "$libdir/libwush.so" ]] || { echo "libdir $libdir has no libwush.so (link name)" >&2; ok=0; }
    [[ -f "$includedir/wush/wush.h" ]] || { echo "includedir $includedir has no wush/wush.h" >&2; ok=0; }
    if [[ $ok -eq 0 ]]; then
        echo "wush.pc names prefix '$("$PKG_CONFIG" --variable=prefix wush)' but was found under" \
             "$prefix: it was installed with a --prefix other than CMAKE_INSTALL_PREFIX and is" \
             "not relocatable" >&2
        return 1
    fi
}
run_check pkg-config check_pkg_config

# A wush.pc with a stale prefix (see check_pkg_config) fails that check; to still exercise the
# examples against the library under PREFIX, fall back to pkg-config's --define-prefix, which
# derives the prefix from where the .pc file lies.
if ! libdir=$("$PKG_CONFIG" --variable=libdir wush 2>/dev/null) || [[ ! -d "$libdir" ]] ||
   ! compgen -G "$libdir/libwush.so.*" >/dev/null; then
    if "$PKG_CONFIG" --define-prefix --exists wush 2>/dev/null; then
        echo "== pkg-config: continuing with '$PKG_CONFIG --define-prefix' so the examples can run"
        cat > "$work/pkg-config" <<EOF
#!/bin/sh
exec "$(command -v "$PKG_CONFIG")" --define-prefix "\$@"
EOF
        chmod +x "$work/pkg-config"
        export PKG_CONFIG="$work/pkg-config"
        libdir=$("$PKG_CONFIG" --variable=libdir wush)
    fi
fi

# ---- README ------------------------------------------------------------------------------------
# Before LD_LIBRARY_PATH is set below: a user following the README has none.
check_readme() {
    need "${CC:-cc}" awk
    local readme="$repo_root/README.md" line
    mkdir -p "$work/readme" && cd "$work/readme"
    # The first ```c block after "## Using it" is app.c; the `cc ` line of the ```sh block before
    # it is the build command.
    awk '/^## Using it/{u=1} u&&/^```c$/{c=1;next} c&&/^```$/{exit} c{print}' "$readme" > app.c
    line=$(awk '/^## Using it/{u=1} u&&/^cc .*pkg-config/{print; exit}' "$readme")
    [[ -s app.c && -n $line ]] || { echo "README has no app.c block or cc line under '## Using it'" >&2; return 1; }
    echo "$line"
    [[ -z ${CC:-} ]] || line="${CC}${line#cc}"
    env -u LD_LIBRARY_PATH bash -c "$line"
    env -u LD_LIBRARY_PATH ./a.out
}
run_check readme check_readme

export LD_LIBRARY_PATH="${libdir:-}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# ---- C -----------------------------------------------------------------------------------------
check_c() {
    local cc=${CC:-cc}
    need "$cc"
    # shellcheck disable=SC2046 # pkg-config output is meant to be word-split
    "$cc" -std=c99 -pedantic -Wall -Wextra -Werror -o "$work/example_c" "$examples/c/example.c" \
        $("$PKG_CONFIG" --cflags --libs wush)
    "$work/example_c"
}
run_check c check_c

# ---- Rust and Go packages -------------------------------------------------------------------------
# The model examples' inputs: a two-layer model quantized by the installed `wush` program.
prepare_model() {
    [[ -s "$work/model/checkpoint.safetensors" ]] && return 0
    need python3
    local wush_bin="$prefix/bin/wush"
    [[ -x "$wush_bin" ]] || { echo "no $wush_bin (the wush program is installed with the library)" >&2; return 1; }
    python3 "$repo_root/bindings/examples/tiny_model.py" "$work/model"
    "$wush_bin" quantize --weights "$work/model/weights.safetensors" \
        --activations "$work/model/activations.safetensors" --format mxfp4 --transform wush \
        --out "$work/model/checkpoint.safetensors" >/dev/null
}
model_args() { echo "$work/model/checkpoint.safetensors $work/model/weights.safetensors $work/model/activations.safetensors"; }

check_rust() {
    need cargo
    prepare_model
    cd "$repo_root/bindings/rust"
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$work/rust-target}"
    # Offline, from Debian's crate registry (bindings/rust/.cargo/config.toml). Without
    # LD_LIBRARY_PATH: the wush crate's tests and examples carry an rpath to pkg-config's libdir.
    env -u LD_LIBRARY_PATH cargo test --offline --quiet
    # shellcheck disable=SC2046
    env -u LD_LIBRARY_PATH cargo run --offline --quiet --example model -- $(model_args)
}
run_check rust check_rust

check_go() {
    need go
    prepare_model
    cd "$repo_root/bindings/go/wush"
    # No network and no module downloads: the package has no dependencies.
    export GOPROXY=off GOTOOLCHAIN=local CGO_ENABLED=1 GOFLAGS=-count=1
    if [[ -z "${HOME:-}" || ! -w "${HOME:-/nonexistent}" ]]; then
        export GOPATH="$work/go-path"
    fi
    # Without LD_LIBRARY_PATH: cgo links with wush.pc's rpath.
    env -u LD_LIBRARY_PATH go test ./...
    go build -o "$work/model_go" ./examples/model
    # shellcheck disable=SC2046
    env -u LD_LIBRARY_PATH "$work/model_go" $(model_args)
}
run_check go check_go

# ---- coverage: the safe packages call every function of the header (docs/BINDINGS.md) ------------
check_coverage() {
    need python3
    python3 "$repo_root/tests/bindings/test_bindings_coverage.py" "$repo_root"
}
run_check coverage check_coverage

# ---- ABI upgrade: programs built against the previous release's header, run on this library ------
# abi/previous/wush.h is the previous release's public header (abi/README.md). The Rust and Go
# programs in tests/bindings/abi_upgrade use only its calls; each is built twice, against that
# header (wush-sys generated from it; cgo compiling it) and against the installed one, and all
# four run against the installed (new) library. Each checks its results against float64 formulas,
# the header's MXFP4 rule and documented names and sizes, and the four reports must be identical.
# Before that, compare_headers.py checks the declarations (no function removed or changed, no
# enumerator renumbered). No git history is needed.
check_abi_upgrade() {
    need python3 cargo go "$PKG_CONFIG"
    local src="$repo_root/tests/bindings/abi_upgrade" up="$work/abi-upgrade"
    local previous="$repo_root/abi/previous/wush.h" installed which header rd gd ok=1
    installed="$("$PKG_CONFIG" --variable=includedir wush)/wush/wush.h"
    [[ -f "$previous" ]] || { echo "no $previous (abi/README.md says how to record it)" >&2; return 1; }
    # On a declaration-level break, still build and run the programs: their reports show what
    # the break does to programs built against the previous release.
    python3 "$src/compare_headers.py" "$previous" "$installed" || ok=0
    mkdir -p "$up/out"
    export GOPROXY=off GOTOOLCHAIN=local CGO_ENABLED=1
    if [[ -z "${HOME:-}" || ! -w "${HOME:-/nonexistent}" ]]; then
        export GOPATH="$work/go-path"
    fi
    for which in previous installed; do
        header=$previous
        [[ $which == installed ]] && header=$installed
        # Rust: a copy of wush-sys whose ffi.rs and version come from $header, the program beside it.
        rd="$up/rust-$which"
        mkdir -p "$rd/wush-sys/src" "$rd/check/src" "$rd/.cargo"
        cp "$repo_root/bindings/rust/.cargo/config.toml" "$rd/.cargo/"
        cp "$repo_root/bindings/rust/wush-sys/build.rs" "$repo_root/bindings/rust/wush-sys/Cargo.toml" "$rd/wush-sys/"
        cp "$repo_root/bindings/rust/wush-sys/src/lib.rs" "$rd/wush-sys/src/"
        python3 "$repo_root/bindings/rust/wush-sys/generate.py" --header "$header" --out "$rd/wush-sys/src/ffi.rs"
        local version
        version=$(sed -n 's/^#define WUSH_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\).*/\2/p' "$header" | paste -sd.)
        sed -i "s/^version = \".*\"/version = \"$version\"/" "$rd/wush-sys/Cargo.toml"
        cp "$src/rust/Cargo.toml" "$rd/check/"
        cp "$src/rust/src/main.rs" "$rd/check/src/"
        if ! (cd "$rd/check" && CARGO_TARGET_DIR="$rd/target" cargo build --offline --quiet); then
            echo "abi-upgrade: the Rust program does not build against the $which header" >&2
            ok=0
        elif ! "$rd/target/debug/wush-upgrade-check" "$up/out" > "$up/rust-$which.txt"; then
            echo "abi-upgrade: the Rust program built against the $which header failed its checks" >&2
            ok=0
        fi
        # Go: the program with $header beside it as wush.h; the library from pkg-config's --libs.
        gd="$up/go-$which"
        mkdir -p "$gd"
        cp "$src/go/main.go" "$src/go/go.mod" "$gd/"
        cp "$header" "$gd/wush.h"
        if ! (cd "$gd" && CGO_LDFLAGS="$("$PKG_CONFIG" --libs wush)" go build -o "$gd/check" .); then
            echo "abi-upgrade: the Go program does not build against the $which header" >&2
            ok=0
        elif ! "$gd/check" "$up/out" > "$up/go-$which.txt"; then
            echo "abi-upgrade: the Go program built against the $which header failed its checks" >&2
            ok=0
        fi
        echo "abi-upgrade: built and ran the programs against the $which header ($version)"
    done
    local report
    touch "$up/rust-previous.txt"
    for report in rust-installed go-previous go-installed; do
        if ! cmp -s "$up/rust-previous.txt" "$up/$report.txt" 2>/dev/null; then
            echo "abi-upgrade: the report of $report differs from rust-previous's:" >&2
            diff "$up/rust-previous.txt" "$up/$report.txt" >&2 || true  # (a missing report: diff says so)
            ok=0
        fi
    done
    [[ $ok -eq 1 ]] || return 1
    echo "abi-upgrade: 4 identical reports ($(grep -c '^check\.' "$up/rust-previous.txt") checks each)"
}
run_check abi-upgrade check_abi_upgrade

# ---- Python ------------------------------------------------------------------------------------
check_python() {
    need python3
    python3 "$examples/python/example.py"
}
run_check python check_python

# ---- MPI ---------------------------------------------------------------------------------------
check_mpi() {
    need mpicc mpirun timeout
    # shellcheck disable=SC2046
    mpicc -std=c99 -pedantic -Wall -Wextra -Werror -o "$work/calibrate_mpi" "$examples/mpi/calibrate_mpi.c" \
        $("$PKG_CONFIG" --cflags --libs wush)
    # shellcheck disable=SC2046
    "${CC:-cc}" -std=c99 -pedantic -Wall -Wextra -Werror -o "$work/compare_checkpoints" \
        "$examples/mpi/compare_checkpoints.c" $("$PKG_CONFIG" --cflags --libs wush) -lm
    local run=(timeout 300 mpirun --oversubscribe -x OMP_NUM_THREADS=1 -x LD_LIBRARY_PATH) n
    [[ $(id -u) -ne 0 ]] || run+=(--allow-run-as-root)
    for n in 1 2 4; do
        "${run[@]}" -np "$n" "$work/calibrate_mpi" --out "$work/ck$n.safetensors"
    done
    for n in 2 4; do
        "$work/compare_checkpoints" "$work/ck1.safetensors" "$work/ck$n.safetensors"
    done
    if "${run[@]}" -np 4 "$work/calibrate_mpi" --out "$work/bad.safetensors" --fail-rank 2 2>"$work/fail.log"; then
        echo "a failing rank did not fail the job" >&2
        return 1
    fi
    local reported
    reported=$(grep -c "calibration failed on rank 2" "$work/fail.log" || true)
    echo "failing rank 2: reported by $reported of 4 ranks"
    [[ $reported -eq 4 ]] || { cat "$work/fail.log" >&2; return 1; }
    [[ ! -e "$work/bad.safetensors" ]] || { echo "a failed job left a checkpoint" >&2; return 1; }
}
run_check mpi check_mpi

summary_and_exit
