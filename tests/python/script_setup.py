"""The shared start of the Python test scripts that import the repository's `wush` package:
python/ (and python/tools/) first on sys.path, and `--library PATH` taken out of sys.argv into
WUSH_LIBRARY, before `wush` is imported."""
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def setup():
    sys.path[:0] = [str(ROOT / "python"), str(ROOT / "python" / "tools")]
    for i, a in enumerate(sys.argv):
        if a == "--library":
            os.environ["WUSH_LIBRARY"] = sys.argv[i + 1]
            del sys.argv[i:i + 2]
            break
