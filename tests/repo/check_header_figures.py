#!/usr/bin/env python3
"""The public headers state contracts, not measurements: no measured figure in their comments.

A measured figure (a time, a speed-up, a bandwidth, a percentage) is true of one machine on one
day; in a header it goes stale and reads as a promise. Figures live in docs/PERFORMANCE.md and
docs/EVAL.md; the header says what a function does and what it costs in O-terms.

Rule: inside the comments (// and /* */; string literals and code are not looked at) of every
file under include/, a number (integer or decimal, or a range such as 1.8-2.4) followed by
  - `x` written against it and ending the word: 2.1x, 1.8-2.4x, 16x
    (not 2x2 or 0x1F, where the x continues the word; not `4 x 4096` or `d_out x d_in`, where
    the x stands apart: those are shapes);
  - `%`: 60%, 1.5 %;
  - a time unit, with or without a space: ns, us, µs, ms, s (3 us, 12ms, 0.5 s);
  - a rate: GB/s, MB/s, TB/s, GFLOP/s, tok/s (35.7 GB/s).
A number inside a dotted version (1.2.3) or an identifier (sm_90, int4) is not a figure. A
contract threshold that would read as a figure is written as a factor instead ("below 0.99
times the searched loss", not "1% lower").

Usage:
  check_header_figures.py [PATH ...]   scan PATHs (files or folders; default: include/ of the
                                       repository holding this script); prints file:line: text
                                       for each figure, exits 1 if there is one, else 0
  check_header_figures.py --self-test  shows the check can fail: a copy of wush.h with a figure
                                       injected must fail, and contract text must pass
"""
import os
import re
import sys
import tempfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

NUMBER = r"(?<![\w.])\d+(?:\.\d+)?(?:\s*[-\u2013]\s*\d+(?:\.\d+)?)?(?![\w.]*\.\d)"
FIGURE = re.compile(
    NUMBER
    + r"(?:"
    + r"x(?!\w)"  # 2.1x, 1.8-2.4x; not 2x2, 0x1F
    + r"|\s?%"  # 60%
    + r"|\s?(?:ns|us|\u00b5s|ms|s)(?![\w/])"  # 3 us, 12 ms, 0.5 s
    + r"|\s?(?:[GMT]B|GFLOP|tok)/s(?!\w)"  # 35.7 GB/s
    + r")"
)


def comments(text):
    """Yields (line number, comment text) for each line of each comment in C/C++ source."""
    i, n, line = 0, len(text), 1
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            yield line, text[i + 2:end]
            i = end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end
            for k, part in enumerate(text[i + 2:end].split("\n")):
                yield line + k, part
            line += text.count("\n", i, end)
            i = end + 2
        elif c in "\"'":  # a string or character literal: skip it, escapes included
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            i = j + 1
        else:
            i += 1


def figures_in(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    for line, comment in comments(text):
        if FIGURE.search(comment):
            yield line, comment.strip()


def files(paths):
    for p in paths:
        if os.path.isdir(p):
            for base, dirs, names in os.walk(p):
                dirs.sort()
                for name in sorted(names):
                    yield os.path.join(base, name)
        else:
            yield p


def shown(path):
    """A path as printed: relative to the repository when inside it."""
    rel = os.path.relpath(path, ROOT)
    return path if rel.startswith("..") else rel


def check(paths):
    """Prints every figure found; returns the number found."""
    found = 0
    for path in files(paths):
        for line, text in figures_in(path):
            print(f"{shown(path)}:{line}: measured figure in a comment: {text}")
            found += 1
    return found


def self_test():
    ok = True
    clean = ["2x2 blocks", "a 0x1F mask", "d_out x d_in", "4 x 4096 layer", "version 1.2.3",
             "sm_90 and int4", "O(d_in^3) time", "256 bytes are always enough", "16 sign patterns",
             "below 0.99 times the loss", "[0, 1e6]", "k = 0, as [0, 0]"]
    bad = ["2.1x", "1.8-2.4x the plain build", "60% of copy bandwidth", "takes 3 us", "12 ms",
           "35.7 GB/s", "16x faster", "0.5 s per layer", "2.4 \u00b5s"]
    for text in clean:
        if FIGURE.search(text):
            print(f"self-test: contract text flagged: {text!r}")
            ok = False
    for text in bad:
        if not FIGURE.search(text):
            print(f"self-test: figure not flagged: {text!r}")
            ok = False
    with open(os.path.join(ROOT, "include", "wush", "wush.h"), encoding="utf-8") as f:
        header = f.read()
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "wush.h")
        with open(copy, "w", encoding="utf-8") as f:
            f.write(header.replace("#define WUSH_WUSH_H\n",
                                   "#define WUSH_WUSH_H\n/* The search makes the build about 2.1x slower. */\n", 1))
        found = check([copy])
        if found != 1:
            print(f"self-test: the injected figure gave {found} findings, expected 1")
            ok = False
        with open(copy, "w", encoding="utf-8") as f:  # a figure in a string literal is not a comment
            f.write('static const char* s = "2.1x"; /* d_out x d_in */\n')
        if check([copy]):
            ok = False
    print("check_header_figures: self-test " + ("PASS: a figure fails the check, contract text passes" if ok
                                                else "FAIL"))
    return 0 if ok else 1


def main(argv):
    if argv == ["--self-test"]:
        return self_test()
    paths = argv or [os.path.join(ROOT, "include")]
    found = check(paths)
    if found:
        print(f"check_header_figures: FAIL: {found} measured figure(s) in header comments; state the contract "
              "(behaviour, O-terms) and put the figure in docs/PERFORMANCE.md or docs/EVAL.md")
        return 1
    print("check_header_figures: PASS: no measured figure in the comments of " + ", ".join(
        shown(p) for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
