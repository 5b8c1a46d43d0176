"""The ``wush`` console command of the wheel: runs the ``wush`` program bundled next to the
library (``wush/_native/bin/wush``; its rpath finds ``../lib*/libwush.so.N``)."""

import glob
import os
import sys


def program() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    found = glob.glob(os.path.join(here, "_native", "bin", "wush"))
    if not found:
        raise SystemExit("wush: the wush program is not bundled in this installation (a source checkout? "
                         "build it with CMake: target wush_cli)")
    return found[0]


def main() -> None:
    exe = program()
    os.execv(exe, [exe] + sys.argv[1:])


if __name__ == "__main__":
    main()
