#!/usr/bin/env python3
"""The per-ISA translation units of src/ follow docs/ARCHITECTURE.md's rule ("Per-ISA files").

A per-ISA file is one compiled with an ISA's flags (AVX2, AVX-512) so that the library still runs
on any x86-64 CPU and picks its kernels at run time. The rule:
  - it is named <stem>_<isa>.cpp (isa: avx2, avx512) and lives beside the portable code it
    accelerates, with its declarations in <stem>_kernel.h in the same folder; the CPU runtime's
    kernels are the one exception, all in src/cpu/kernels/, declared in kernels/kernels.h;
  - per-ISA headers (<stem>_<isa>.h, included by per-ISA files only) exist in src/cpu/kernels/
    alone;
  - src/CMakeLists.txt gives WUSH_<ISA>_FLAGS to exactly the <stem>_<isa>.cpp files, and no other
    file of src/ uses intrinsics (<immintrin.h>) or target attributes.
Usage: check_isa_files.py [REPO_ROOT]; prints each violation, exits 1 if there is one.
       check_isa_files.py --self-test: shows the check failing on a tree that breaks the rule.
"""
import os
import re
import shutil
import sys
import tempfile

ISAS = ("avx2", "avx512")
PER_ISA = re.compile(r"^(?P<stem>[a-z0-9_]+?)_(?P<isa>avx2|avx512)\.(?P<ext>cpp|h)$")
KERNELS = "cpu/kernels"  # the CPU runtime's kernel folder, declared in kernels.h
INTRINSICS = re.compile(r"#\s*include\s*<immintrin\.h>|__attribute__\s*\(\(\s*target")
FLAGGED = re.compile(r"set_source_files_properties\(([^)]*)\)", re.S)


def flagged_files(cmake_text, isa):
    """The files src/CMakeLists.txt gives WUSH_<ISA>_FLAGS, relative to src/."""
    out = set()
    for block in FLAGGED.findall(cmake_text):
        if "${WUSH_%s_FLAGS}" % isa.upper() in block:
            out.update(t for t in block.split() if t.endswith(".cpp"))
    return out


def check(root):
    src = os.path.join(root, "src")
    problems = []
    per_isa = {isa: set() for isa in ISAS}
    for folder, _, files in os.walk(src):
        rel_folder = os.path.relpath(folder, src).replace(os.sep, "/")
        for name in sorted(files):
            rel = name if rel_folder == "." else rel_folder + "/" + name
            m = PER_ISA.match(name)
            if m is None:
                if name.endswith((".cpp", ".h")):
                    with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as f:
                        if INTRINSICS.search(f.read()):
                            problems.append("src/%s: uses intrinsics or target attributes but is not a "
                                            "per-ISA file (<stem>_<isa>.cpp)" % rel)
                continue
            if m.group("ext") == "h":
                if rel_folder != KERNELS:
                    problems.append("src/%s: a per-ISA header outside src/%s/" % (rel, KERNELS))
                continue
            per_isa[m.group("isa")].add(rel)
            declared = "kernels.h" if rel_folder == KERNELS else m.group("stem") + "_kernel.h"
            if not os.path.isfile(os.path.join(folder, declared)):
                problems.append("src/%s: no %s beside it to declare it (a per-ISA file lives beside the "
                                "portable code it accelerates, declared in <stem>_kernel.h)" % (rel, declared))
    with open(os.path.join(src, "CMakeLists.txt"), encoding="utf-8") as f:
        cmake = f.read()
    for isa in ISAS:
        flagged = flagged_files(cmake, isa)
        for rel in sorted(per_isa[isa] - flagged):
            problems.append("src/%s: not given WUSH_%s_FLAGS in src/CMakeLists.txt" % (rel, isa.upper()))
        for rel in sorted(flagged - per_isa[isa]):
            problems.append("src/CMakeLists.txt: WUSH_%s_FLAGS given to %s, which is not a *_%s.cpp file" %
                            (isa.upper(), rel, isa))
    return problems


def write(path, text=""):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def self_test():
    tmp = tempfile.mkdtemp(prefix="wush_isa_check_")
    try:
        src = os.path.join(tmp, "src")
        write(os.path.join(src, "a", "thing.cpp"))
        write(os.path.join(src, "a", "thing_kernel.h"))
        write(os.path.join(src, "a", "thing_avx2.cpp"), "#include <immintrin.h>\n")
        write(os.path.join(src, "cpu", "kernels", "kernels.h"))
        write(os.path.join(src, "cpu", "kernels", "gemm_avx512.cpp"), "#include <immintrin.h>\n")
        write(os.path.join(src, "cpu", "kernels", "transpose_avx512.h"), "#include <immintrin.h>\n")
        cmake = ('set_source_files_properties(a/thing_avx2.cpp PROPERTIES COMPILE_OPTIONS "${WUSH_AVX2_FLAGS}")\n'
                 'set_source_files_properties(cpu/kernels/gemm_avx512.cpp\n'
                 '                            PROPERTIES COMPILE_OPTIONS "${WUSH_AVX512_FLAGS}")\n')
        write(os.path.join(src, "CMakeLists.txt"), cmake)
        ok = check(tmp) == []
        if not ok:
            print("self-test: a tree that follows the rule failed:", check(tmp))
        # Break the rule four ways: a per-ISA file away from its declarations (and without flags),
        # a per-ISA header outside cpu/kernels/, intrinsics in a portable file, flags on a
        # portable file.
        write(os.path.join(src, "b", "other_avx512.cpp"), "#include <immintrin.h>\n")
        write(os.path.join(src, "a", "thing_avx512.h"))
        write(os.path.join(src, "a", "thing.cpp"), "#include <immintrin.h>\n")
        write(os.path.join(src, "CMakeLists.txt"),
              cmake + 'set_source_files_properties(a/thing.cpp PROPERTIES COMPILE_OPTIONS "${WUSH_AVX2_FLAGS}")\n')
        found = check(tmp)
        if len(found) != 5:
            ok = False
            print("self-test: expected 5 violations, found %d:" % len(found))
        for p in found:
            print("  (expected) " + p)
    finally:
        shutil.rmtree(tmp)
    print("check_isa_files: self-test " + ("PASS: a per-ISA file off the rule fails the check" if ok else "FAIL"))
    return 0 if ok else 1


def main(argv):
    if argv[:1] == ["--self-test"]:
        return self_test()
    root = argv[0] if argv else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    problems = check(root)
    for p in problems:
        print(p)
    print("check_isa_files: %d violation(s)" % len(problems))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
