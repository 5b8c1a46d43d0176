#!/usr/bin/env python3
"""The include graph follows docs/ARCHITECTURE.md, so the floors cannot drift.

Rules (each include `#include "folder/file"` is an arrow from the including file's folder):
  - src/ folders in their documented order: a folder includes only itself and folders listed
    before it, in the order of ARCHITECTURE.md's table of src/ folders (read from it, so the
    page and the check cannot disagree; every src/ folder must be in it). cpu/ comes last: the
    CPU backend is a leaf, which eval/ and pipeline/ never include;
  - nothing in src/ includes cuda/, capi/ or tools/ (src/ is the bottom of the house);
  - capi/ includes src/ folders other than cpu/, except its backend registry, the one place
    that names every backend (and cuda/ never: it opens the CUDA module at run time);
  - cuda/ (a backend) does not include cpu/ (another backend), nor capi/;
  - tools/ (the `wush` program, a client of the C API) includes only the public header and its
    own files;
  - include/wush/wush.h includes no project header;
  - every source file under cuda/ (its subfolders too) is in exactly one row of ARCHITECTURE.md's
    table of cuda/ parts, named by its path from cuda/ (`gemm/gemm_decode.cu`), and every file a
    row names exists.
Usage: check_include_graph.py [REPO_ROOT]; prints each violation, exits 1 if there is one.
"""
import os
import re
import sys

ROW = re.compile(r"^\| `([a-z_]+)/` \|", re.M)


def documented_order(root):
    """The src/ folders of ARCHITECTURE.md's table, bottom up."""
    with open(os.path.join(root, "docs", "ARCHITECTURE.md"), encoding="utf-8") as f:
        text = f.read()
    table = text[text.index("| folder | concern |"):]
    table = table[:table.index("\n\n")]
    return ROW.findall(table)


CUDA_FILE = re.compile(r"`([A-Za-z0-9_./]+)`")


def cuda_rows(root):
    """{file: [rows naming it]} from ARCHITECTURE.md's table of cuda/ parts."""
    with open(os.path.join(root, "docs", "ARCHITECTURE.md"), encoding="utf-8") as f:
        text = f.read()
    if "| `cuda/` part | files |" not in text:
        return None
    table = text[text.index("| `cuda/` part | files |"):]
    table = table[:table.index("\n\n")] if "\n\n" in table else table
    named = {}
    for line in table.splitlines()[2:]:
        cells = line.split("|")
        if len(cells) < 3:
            continue
        for name in CUDA_FILE.findall(cells[2]):
            named.setdefault(name, []).append(cells[1].strip())
    return named


def cuda_table_violations(root):
    if not os.path.isdir(os.path.join(root, "cuda")):
        return []
    named = cuda_rows(root)
    if named is None:
        return ["docs/ARCHITECTURE.md: no table of cuda/ parts"]
    out = []
    # Paths from cuda/, subfolders included: a file moved into a folder must move in the table too.
    present = sorted(os.path.relpath(os.path.join(base, n), os.path.join(root, "cuda"))
                     for base, _, names in os.walk(os.path.join(root, "cuda"))
                     for n in names if SOURCE.search(n) or n.endswith(".map"))
    for n in present:
        rows = named.get(n, [])
        if len(rows) != 1:
            out.append("cuda/%s: in %d rows of ARCHITECTURE.md's table of cuda/ parts (one wanted)" % (n, len(rows)))
    for n in sorted(set(named) - set(present)):
        out.append("cuda/%s: named in ARCHITECTURE.md's table of cuda/ parts, but not there" % n)
    return out


REGISTRY = "capi/backend_registry.cpp"
SOURCE = re.compile(r"\.(h|hpp|cpp|cc|cu|cuh)$")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def includes(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return INCLUDE.findall(f.read())


def files(root, top):
    for base, _, names in os.walk(os.path.join(root, top)):
        for n in sorted(names):
            if SOURCE.search(n):
                yield os.path.relpath(os.path.join(base, n), root)


def target_folder(root, inc, including):
    """The top-level home of an include: 'src/<folder>', 'cuda', 'capi', 'tools' or None."""
    first = inc.split("/")[0]
    if "/" in inc and os.path.isdir(os.path.join(root, "src", first)):
        return "src/" + first
    if "/" in inc and first == "wush":
        return "include"
    # A bare name: resolved beside the including file, or in cuda/ or capi/ (their include dirs).
    here = os.path.dirname(including)
    if os.path.exists(os.path.join(root, here, inc)):
        return here.split("/")[0] if not here.startswith("src/") else "src/" + here.split("/")[1]
    for top in ("cuda", "capi", "tools"):
        if os.path.exists(os.path.join(root, top, inc)):
            return top
    return None


def violations(root):
    out = cuda_table_violations(root)
    ORDER = documented_order(root)
    for folder in sorted(os.listdir(os.path.join(root, "src"))):
        if os.path.isdir(os.path.join(root, "src", folder)) and folder not in ORDER:
            out.append("src/%s/: not in ARCHITECTURE.md's table of src/ folders" % folder)
    for top in ("src", "capi", "cuda", "include", "tools"):
        for path in files(root, top):
            parts = path.split("/")
            origin = "src/" + parts[1] if top == "src" else top
            for inc in includes(os.path.join(root, path)):
                to = target_folder(root, inc, path)
                if to is None or to == origin:
                    continue
                bad = None
                if top == "src":
                    if to in ("cuda", "capi", "tools"):
                        bad = "src/ includes " + to + "/"
                    elif to.startswith("src/") and (parts[1] not in ORDER or to[4:] not in ORDER):
                        bad = "a src/ folder missing from the documented order"
                    elif to.startswith("src/"):
                        a, b = ORDER.index(parts[1]), ORDER.index(to[4:])
                        if b > a:
                            bad = "%s/ is below %s/ in the documented order" % (origin, to)
                elif top == "capi":
                    if to == "src/cpu" and path != REGISTRY:
                        bad = "capi/ reaches into the CPU backend"
                    elif to in ("cuda", "tools"):
                        bad = "capi/ includes " + to + "/"
                elif top == "cuda":
                    if to == "src/cpu":
                        bad = "a backend (cuda/) includes another (cpu/)"
                    elif to in ("capi", "tools"):
                        bad = "cuda/ includes " + to + "/"
                elif top == "tools" and to != "include":
                    bad = "tools/ (a client of the C API) includes " + to + "/"
                elif top == "include" and to != "include":
                    bad = "the public header includes a project header"
                if bad:
                    out.append('%s: #include "%s": %s' % (path, inc, bad))
    return out


def self_test(repo):
    """A small tree with ARCHITECTURE.md's table and three violations; each must be reported."""
    import shutil
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(os.path.join(tmp, "docs"))
        shutil.copy(os.path.join(repo, "docs", "ARCHITECTURE.md"), os.path.join(tmp, "docs"))
        bad = {
            "src/cpu/kernel.h": "",
            "src/eval/loss.cpp": '#include "cpu/kernel.h"\n',          # eval/ reaching into the leaf
            "src/attic/old.h": "",                                     # a folder the table lacks
            "tools/cmd.cpp": '#include "wush/wush.h"\n#include "eval/loss.cpp"\n',  # tools/ past the C API
            "cuda/stray_kernel.cu": "",                                # in no row of the cuda/ table
            "cuda/gemm/stray_gemm.cu": "",                             # so in a subfolder
        }
        for rel, text in bad.items():
            os.makedirs(os.path.dirname(os.path.join(tmp, rel)), exist_ok=True)
            with open(os.path.join(tmp, rel), "w") as f:
                f.write(text)
        found = violations(tmp)
    # The copied table names files the small tree lacks: those rows are reported too.
    wanted = ["src/eval/loss.cpp", "src/attic/", "tools/cmd.cpp", "cuda/stray_kernel.cu", "cuda/gemm/stray_gemm.cu",
              "cuda/gemm/gemm_table.h"]
    missed = [w for w in wanted if not any(v.startswith(w) for v in found)]
    print("check_include_graph: self-test %s (%d violations found%s)" %
          ("FAILED" if missed else "passed", len(found), ", missed " + ", ".join(missed) if missed else ""))
    return 1 if missed else 0


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--self-test":
        return self_test(os.path.abspath(sys.argv[2] if len(sys.argv) > 2 else
                                         os.path.join(os.path.dirname(__file__), "..", "..")))
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
    found = violations(os.path.abspath(root))
    for v in found:
        print(v)
    print("check_include_graph: %s" % ("%d violation(s)" % len(found) if found else "the include graph follows ARCHITECTURE.md"))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
