#!/usr/bin/env python3
"""The Rust declarations (bindings/rust/wush-sys/src/ffi.rs) agree with include/wush/wush.h.

1. ffi.rs equals what bindings/rust/wush-sys/generate.py makes from the header today (a changed
   prototype, enum or version without regenerating fails here);
2. facts read by hand from the header appear in ffi.rs as the rules say they must, so a mapping
   bug in the generator cannot agree with itself;
3. the crate versions (wush-sys, wush) and the Go package's version constant follow the header's
   WUSH_VERSION_* (docs/BINDINGS.md: the packages are versioned with the library);
4. the check can fail: a header with one parameter type changed gives a different ffi.rs;
5. generate.py --header/--out makes the declarations of another header (abi/previous/wush.h, for
   run_bindings.sh's abi-upgrade check).
Needs only python3. Exit 1 on any mismatch.
"""
import importlib.util
import pathlib
import re
import subprocess
import sys
import tempfile

root = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("_wush_rust_gen", root / "bindings/rust/wush-sys/generate.py")
gen = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gen)

failures = []
header = (root / "include/wush/wush.h").read_text()
ffi = (root / "bindings/rust/wush-sys/src/ffi.rs").read_text()

if gen.render(header) != ffi:
    failures.append("bindings/rust/wush-sys/src/ffi.rs is out of date: run python3 bindings/rust/wush-sys/generate.py")

n_funcs = len(re.findall(r"^    pub fn wush_\w+\(", ffi, flags=re.M))
if n_funcs != len(gen.hdr.parse_functions(header)) or n_funcs < 80:
    failures.append(f"ffi.rs declares {n_funcs} functions, the parser finds {len(gen.hdr.parse_functions(header))}")

# Hand-read from the header: one line each, spelled as the mapping rules must spell them.
spot = [
    "pub fn wush_quantize_rows(_: *mut wush_context, _: wush_format, _: wush_dtype, _: *const c_void, _: usize, "
    "_: usize, _: *mut c_void, _: usize, _: *mut c_void, _: usize) -> wush_status;",
    "pub fn wush_last_error() -> *const c_char;",
    "pub fn wush_context_destroy(_: *mut wush_context);",
    "pub fn wush_tensor_file_tensor(_: *const wush_tensor_file, _: usize, _: *mut *const c_char, "
    "_: *mut *const c_char, _: *mut usize, _: *mut *const u64, _: *mut *const c_void, _: *mut usize) -> wush_status;",
    "pub fn wush_context_get_stream(_: *const wush_context, _: *mut *mut c_void) -> wush_status;",
    "pub type wush_progress_fn = Option<unsafe extern \"C\" fn(*mut c_void, f64) -> c_int>;",
    "pub const WUSH_FORMAT_NVFP4: wush_format = 1;",
    "pub const WUSH_ERR_NOT_FOUND: wush_status = 12;",
]
for line in spot:
    if line not in ffi:
        failures.append(f"ffi.rs lacks the hand-checked line: {line}")

major, minor, patch = gen.hdr.parse_version(header)
want = f"{major}.{minor}.{patch}"
for toml in ("bindings/rust/wush-sys/Cargo.toml", "bindings/rust/wush/Cargo.toml"):
    m = re.search(r'^version = "([^"]+)"', (root / toml).read_text(), flags=re.M)
    if not m or m.group(1) != want:
        failures.append(f"{toml}: version {m.group(1) if m else None} != the header's {want}")
go = (root / "bindings/go/wush/version.go").read_text()
m = re.search(r'PackageVersion = "([^"]+)"', go)
if not m or m.group(1) != want:
    failures.append(f"bindings/go/wush/version.go: PackageVersion {m.group(1) if m else None} != the header's {want}")

mutated = header.replace("size_t n_rows, size_t d_in, void* codes", "size_t n_rows, int d_in, void* codes", 1)
if mutated == header or gen.render(mutated) == ffi:
    failures.append("mutation test: a changed parameter type did not change the generated ffi.rs")

# generate.py --header/--out (the abi-upgrade check's wush-sys from abi/previous/wush.h): the file
# it writes declares that header's functions, and --check of the same pair agrees.
with tempfile.TemporaryDirectory() as tmp:
    out = pathlib.Path(tmp) / "ffi.rs"
    args = [sys.executable, str(root / "bindings/rust/wush-sys/generate.py"), "--header",
            str(root / "abi/previous/wush.h"), "--out", str(out)]
    written = subprocess.run(args, capture_output=True, text=True)
    checked = subprocess.run(args + ["--check"], capture_output=True, text=True)
    prev = (root / "abi/previous/wush.h").read_text()
    if written.returncode != 0 or checked.returncode != 0 or not out.is_file():
        failures.append(f"generate.py --header/--out: {written.stdout}{written.stderr}{checked.stdout}")
    else:
        text = out.read_text()
        n_prev = len(re.findall(r"^    pub fn wush_\w+\(", text, flags=re.M))
        if n_prev != len(gen.hdr.parse_functions(prev)) or "from abi/previous/wush.h" not in text.splitlines()[0]:
            failures.append(f"generate.py --header abi/previous/wush.h: {n_prev} functions, first line {text.splitlines()[0]!r}")

for f in failures:
    print("FAIL:", f)
print(f"test_rust_sys_header: {n_funcs} functions, {'FAILED' if failures else 'OK'}")
sys.exit(1 if failures else 0)
