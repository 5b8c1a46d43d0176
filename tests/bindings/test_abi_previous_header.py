#!/usr/bin/env python3
"""The current header (include/wush/wush.h) is a compatible upgrade of the previous release's
(abi/previous/wush.h), at the level of declarations: no function removed or changed, no
enumerator renumbered or removed, the same major and a version not older
(tests/bindings/abi_upgrade/compare_headers.py). The runtime half, programs built against the
previous header and run on the new library, is run_bindings.sh's abi-upgrade check.

The check can fail: each of a removed function, a changed parameter type, a renumbered
enumerator, a removed enumerator and another major, made in a copy of the current header, must
be reported. Needs only python3. Exit 1 on any failure.
"""
import importlib.util
import pathlib
import re
import sys

root = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("_compare_headers", root / "tests/bindings/abi_upgrade/compare_headers.py")
ch = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ch)

failures = []
previous_path = root / "abi/previous/wush.h"
current_path = root / "include/wush/wush.h"
previous, current = ch.read(previous_path), ch.read(current_path)
problems, added = ch.compare(previous, current)
failures += [f"include/wush/wush.h is not a compatible upgrade of abi/previous/wush.h: {p}" for p in problems]
if len(previous["functions"]) < 80:
    failures.append(f"abi/previous/wush.h declares only {len(previous['functions'])} functions: not the whole API?")

text = current_path.read_text()


def mutated(old, new, count=1):
    out = text.replace(old, new, count)
    if out == text:
        failures.append(f"mutation not applied: {old!r}")
    return out


mutations = {
    "a removed function": re.sub(r"WUSH_API wush_status wush_calibrator_token_count\([^;]*;", "", text),
    "a changed parameter type": mutated("size_t n_rows, size_t d_in, void* codes", "size_t n_rows, int d_in, void* codes"),
    "a renumbered enumerator": mutated("WUSH_FORMAT_NVFP4 = 1,", "WUSH_FORMAT_NVFP4 = 4,"),
    "a removed enumerator": mutated("    WUSH_FORMAT_MXFP4_OCP = 3,\n", ""),
    "another major": re.sub(r"#define WUSH_VERSION_MAJOR \d+", "#define WUSH_VERSION_MAJOR 99", text),
}
for what, header in mutations.items():
    if header == text:
        failures.append(f"mutation '{what}' changed nothing")
        continue
    got, _ = ch.compare(previous, ch.parse(header))
    if not got:
        failures.append(f"mutation test: {what} in the current header was not reported")

for f in failures:
    print("FAIL:", f)
print(f"test_abi_previous_header: previous {'.'.join(map(str, previous['version']))}, "
      f"current {'.'.join(map(str, current['version']))}, added since: {len(added)}; "
      f"{'FAILED' if failures else 'OK'}")
sys.exit(1 if failures else 0)
