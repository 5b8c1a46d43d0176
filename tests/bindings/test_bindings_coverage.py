#!/usr/bin/env python3
"""The safe Rust crate and the Go package cover the whole C API (docs/BINDINGS.md says they do).

Every function the public header declares with WUSH_API (include/wush/wush.h) must be called
(or referenced, e.g. as a function pointer) by

  - the safe Rust crate: `sys::wush_NAME` somewhere in bindings/rust/wush/src/*.rs, and
  - the Go package: `C.wush_NAME` somewhere in bindings/go/wush/*.go (tests excluded), or inside
    the package's cgo preamble (the `// ...` lines right above `import "C"`, where a C helper may
    call a function that takes a C callback).

Comments are stripped first, so a function only named in documentation does not count. The test
fails naming each function a package never calls. It also checks itself:
  1. the header's function list is read by a regex written here and must agree, name for name,
     with the generated raw declarations (bindings/rust/wush-sys/src/ffi.rs, made by another
     parser), so a regex that misses declarations cannot pass;
  2. a copy of the sources with one known call removed must be reported as missing that function.

Needs only python3. Usage: test_bindings_coverage.py [REPO_ROOT]; exit 1 on any gap.
"""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[2]


def strip_c_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def header_functions(header_text):
    """Names of the functions declared `WUSH_API <return type> wush_NAME(` (not the macro itself)."""
    text = strip_c_comments(header_text)
    text = re.sub(r"^\s*#[^\n]*", " ", text, flags=re.M)  # the WUSH_API #define lines
    names = re.findall(r"\bWUSH_API\b[^;{}()]*?\b(wush_\w+)\s*\(", text)
    return names


def rust_calls(texts):
    """Functions the Rust sources name as sys::wush_NAME (calls and function-pointer uses)."""
    found = set()
    for text in texts:
        code = re.sub(r"//[^\n]*", " ", text)  # `//`, `///` and `//!` comments
        code = re.sub(r"/\*.*?\*/", " ", code, flags=re.S)
        found.update(re.findall(r"\bsys::(wush_\w+)\b", code))
    return found


def go_calls(texts):
    """Functions the Go sources call as C.wush_NAME, plus those the cgo preamble calls."""
    found = set()
    for text in texts:
        # The cgo preamble: the comment block immediately above `import "C"`.
        m = re.search(r'((?:^//[^\n]*\n)+)import "C"', text, flags=re.M)
        if m:
            preamble = "\n".join(line[2:] for line in m.group(1).splitlines())
            preamble = re.sub(r"^\s*#\s*include[^\n]*", " ", strip_c_comments(preamble), flags=re.M)
            # Calls only, not the prototypes of helper functions defined there: a name followed by
            # `(` that is not preceded by a type (i.e. inside a function body: after `return`,
            # `=`, `(`, `,`, `;`, `{` or at a statement start).
            for body in re.findall(r"\{(.*?)\}", preamble, flags=re.S):
                found.update(re.findall(r"\b(wush_\w+)\s*\(", body))
        code = re.sub(r"//[^\n]*", " ", text)
        code = re.sub(r"/\*.*?\*/", " ", code, flags=re.S)
        found.update(re.findall(r"\bC\.(wush_\w+)\b", code))
    return found


def missing(declared, rust_texts, go_texts):
    r, g = rust_calls(rust_texts), go_calls(go_texts)
    return [n for n in declared if n not in r], [n for n in declared if n not in g]


failures = []
header = (root / "include/wush/wush.h").read_text()
declared = header_functions(header)
if len(set(declared)) != len(declared):
    failures.append(f"the header declares a function twice? {sorted(n for n in set(declared) if declared.count(n) > 1)}")

# 1. The regex against the generated raw declarations (a different parser).
ffi = (root / "bindings/rust/wush-sys/src/ffi.rs").read_text()
ffi_names = re.findall(r"^    pub fn (wush_\w+)\(", ffi, flags=re.M)
if sorted(declared) != sorted(ffi_names) or len(declared) < 80:
    failures.append(f"the header regex finds {len(declared)} functions, ffi.rs declares {len(ffi_names)}; "
                    f"only in the header: {sorted(set(declared) - set(ffi_names))}, "
                    f"only in ffi.rs: {sorted(set(ffi_names) - set(declared))} (regenerate ffi.rs?)")

rust_files = sorted((root / "bindings/rust/wush/src").glob("*.rs"))
go_files = sorted(p for p in (root / "bindings/go/wush").glob("*.go") if not p.name.endswith("_test.go"))
rust_texts = [p.read_text() for p in rust_files]
go_texts = [p.read_text() for p in go_files]
if not rust_files or not go_files:
    failures.append(f"no sources found: {len(rust_files)} Rust files, {len(go_files)} Go files")

rust_missing, go_missing = missing(declared, rust_texts, go_texts)
for n in rust_missing:
    failures.append(f"the Rust crate (bindings/rust/wush/src/*.rs) never calls sys::{n}")
for n in go_missing:
    failures.append(f"the Go package (bindings/go/wush/*.go) never calls C.{n}")

# 2. The check can fail: remove every use of one function the packages call and it is reported.
probe = "wush_transform_kind_from_name"
if probe in declared and probe not in rust_missing and probe not in go_missing:
    cut_rust = [re.sub(r"\bsys::" + probe + r"\b", "sys::removed_call", t) for t in rust_texts]
    cut_go = [re.sub(r"\bC\." + probe + r"\b", "C.removed_call", t) for t in go_texts]
    mr, mg = missing(declared, cut_rust, cut_go)
    if probe not in mr or probe not in mg:
        failures.append(f"self-check: sources without {probe} were not reported (rust {mr}, go {mg})")
    # A mention in a comment only must not count either.
    commented_rust = [t + f"\n/// calls sys::{probe} (doc only)\n" for t in cut_rust]
    commented_go = [t + f"\n// calls C.{probe} (doc only)\n" for t in cut_go]
    mr, mg = missing(declared, commented_rust, commented_go)
    if probe not in mr or probe not in mg:
        failures.append(f"self-check: a mention of {probe} in a comment counted as a call")
elif probe not in declared:
    failures.append(f"self-check: {probe} is not declared by the header any more; pick another probe")

for f in failures:
    print("FAIL:", f)
print(f"test_bindings_coverage: {len(declared)} functions; Rust misses {len(rust_missing)}, "
      f"Go misses {len(go_missing)}: {'FAILED' if failures else 'OK'}")
sys.exit(1 if failures else 0)
