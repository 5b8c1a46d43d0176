#!/usr/bin/env python3
"""The test scripts cannot pass by running nothing.

scripts/run.sh used to configure build/release with the tests off (it has build/main now);
scripts/test.sh builds build/release, and CMake's cache kept the tests off, so its first stage ran
0 tests and passed.
Two rules keep that from coming back:

1. every `ctest` call in scripts/ and .ci/ carries `--no-tests=error` (a stage that finds no
   tests fails);
2. every build folder that a script configures and later hands to ctest is configured with
   `-DWUSH_BUILD_TESTS=ON` (a script forces the options it relies on, whatever the cache says).

    tests/repo/check_test_scripts.py REPO           checks the repository
    tests/repo/check_test_scripts.py --self-test    shows that each rule fails on a bad script
"""
import pathlib
import re
import sys
import tempfile


def logical_lines(text):
    """Lines with backslash continuations joined and comments dropped."""
    out, cur = [], ""
    for raw in text.splitlines():
        line = raw.split("#", 1)[0] if not raw.lstrip().startswith("#!") else ""
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1] + " "
            continue
        out.append(cur + line)
        cur = ""
    if cur:
        out.append(cur)
    return out


CONFIGURE = re.compile(r"(?:scripts/build\.sh\s+|cmake\s+-S\s+\S+\s+-B\s+)(\"?[\w./$-]+\"?)")


def problems_in(path):
    found = []
    lines = logical_lines(path.read_text())
    configured = []  # (folder, line) of each configure step
    for line in lines:
        m = CONFIGURE.search(line)
        if m:
            configured.append((m.group(1).strip('"'), line))
    for line in lines:
        if not re.search(r"(^|[\s;(&|])ctest\s", line):
            continue
        if "--no-tests=error" not in line:
            found.append(f"{path}: ctest without --no-tests=error: {line.strip()}")
        for folder, conf in configured:
            if folder in line and "-DWUSH_BUILD_TESTS=ON" not in conf:
                found.append(f"{path}: {folder} is tested but configured without -DWUSH_BUILD_TESTS=ON: "
                             f"{conf.strip()}")
    return found


def check(repo):
    repo = pathlib.Path(repo)
    scripts = sorted((repo / "scripts").glob("*.sh")) + [repo / ".ci" / "run"]
    found = [p for s in scripts if s.exists() for p in problems_in(s)]
    for p in found:
        print("check_test_scripts: FAIL:", p)
    return not found


def self_test():
    bad = {
        "no_flag": "scripts/build.sh build/x -DWUSH_BUILD_TESTS=ON\nctest --test-dir build/x\n",
        "cache": "scripts/build.sh build/x -DCMAKE_BUILD_TYPE=Release\nctest --test-dir build/x --no-tests=error\n",
        "continued": "cmake -S . -B build/y \\\n  -DWUSH_CUDA=ON\n(cd build/y && ctest --no-tests=error -L gpu)\n",
    }
    good = "scripts/build.sh build/x -DWUSH_BUILD_TESTS=ON\nctest --test-dir build/x --no-tests=error -j2\n"
    with tempfile.TemporaryDirectory() as tmp:
        ok = True
        for name, text in bad.items():
            p = pathlib.Path(tmp) / name
            p.write_text(text)
            if not problems_in(p):
                print(f"check_test_scripts: self-test FAIL: {name} was not caught")
                ok = False
        p = pathlib.Path(tmp) / "good"
        p.write_text(good)
        if problems_in(p):
            print("check_test_scripts: self-test FAIL: a good script was refused:", problems_in(p))
            ok = False
    print("check_test_scripts: self-test", "passed" if ok else "FAILED")
    return ok


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1] == "--self-test":
        sys.exit(0 if self_test() else 1)
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    ok = check(sys.argv[1])
    print("check_test_scripts:", "every ctest call fails on no tests; tested folders force their tests on" if ok
          else "FAILED")
    sys.exit(0 if ok else 1)
