#!/usr/bin/env python3
"""Declaration-level half of the abi-upgrade check: is the NEW wush.h a compatible upgrade of the
PREVIOUS release's (abi/previous/wush.h)?

    python3 tests/bindings/abi_upgrade/compare_headers.py PREVIOUS_HEADER NEW_HEADER

Compatible (abi/README.md): the same major, a version not older, every function of the previous
header still declared with the same return and parameter types, every enum member with the same
value, every handle and callback type still there. Additions are listed, not refused. The
headers are read by the parser the Python and Rust bindings use (python/wush/_header.py).
tests/bindings/run_bindings.sh runs this before building programs against both headers; the
runtime half (the same programs built against each header, run against the new library) is
there too. Exit 0 when compatible, 1 with one line per incompatibility.
"""
import importlib.util
import pathlib
import sys

root = pathlib.Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("_wush_header", root / "python" / "wush" / "_header.py")
hdr = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hdr)


def read(path):
    return parse(pathlib.Path(path).read_text())


def parse(text):
    return {
        "version": hdr.parse_version(text),
        "functions": hdr.parse_functions(text),
        "enums": hdr.parse_enums(text),
        "handles": set(hdr.parse_handles(text)),
        "callbacks": hdr.parse_function_pointers(text),
    }


def compare(old, new):
    """(problems, additions) of NEW against OLD."""
    problems, added = [], []
    (omaj, omin, opat), (nmaj, nmin, npat) = old["version"], new["version"]
    if nmaj != omaj:
        problems.append(f"major {nmaj} != the previous release's {omaj} (a new SONAME: not an upgrade)")
    elif (nmaj, nmin, npat) < (omaj, omin, opat):
        problems.append(f"version {nmaj}.{nmin}.{npat} is older than the previous release's {omaj}.{omin}.{opat}")
    for name, proto in sorted(old["functions"].items()):
        if name not in new["functions"]:
            problems.append(f"function {name} removed")
        elif new["functions"][name] != proto:
            problems.append(f"function {name} changed: {proto} -> {new['functions'][name]}")
    added += [f"function {n}" for n in sorted(set(new["functions"]) - set(old["functions"]))]
    for enum, members in sorted(old["enums"].items()):
        if enum not in new["enums"]:
            problems.append(f"enum {enum} removed")
            continue
        for member, value in members.items():
            got = new["enums"][enum].get(member)
            if got is None:
                problems.append(f"enumerator {member} removed")
            elif got != value:
                problems.append(f"enumerator {member} changed value: {value} -> {got}")
        added += [f"enumerator {m}" for m in new["enums"][enum] if m not in members]
    added += [f"enum {e}" for e in sorted(set(new["enums"]) - set(old["enums"]))]
    for h in sorted(old["handles"] - new["handles"]):
        problems.append(f"handle type {h} removed")
    for name, sig in sorted(old["callbacks"].items()):
        if new["callbacks"].get(name) != sig:
            problems.append(f"callback type {name} changed or removed: {sig} -> {new['callbacks'].get(name)}")
    return problems, added


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    old, new = read(sys.argv[1]), read(sys.argv[2])
    problems, added = compare(old, new)
    ov, nv = ".".join(map(str, old["version"])), ".".join(map(str, new["version"]))
    print(f"compare_headers: previous {ov} ({len(old['functions'])} functions), new {nv} "
          f"({len(new['functions'])} functions); added: {', '.join(added) if added else 'nothing'}")
    for p in problems:
        print(f"INCOMPATIBLE: {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
