"""`python -m wush` run in this process, for the tests: import after script_setup.setup()."""
import contextlib
import io
import json

from wush.__main__ import main as cli


def cli_run(*args):
    """(exit status, last stdout line as JSON or None, stderr) of the command, in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli([str(a) for a in args])
    lines = out.getvalue().strip().splitlines()
    return rc, (json.loads(lines[-1]) if lines and rc == 0 else None), err.getvalue()
