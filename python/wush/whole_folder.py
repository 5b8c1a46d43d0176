"""Writing the output folder whole or not at all: the checks on the output path made before any
work, and the staging folder renamed into place.
"""

from __future__ import annotations

import os
import shutil
from typing import Any, List, Optional

from . import _core
from .folder import CHECKPOINT_FILE, INFO_FILE


def _ancestors(path: str) -> List[str]:
    """``path`` (absolute, symlinks resolved) and every folder above it."""
    out, p = [], os.path.realpath(path)
    while True:
        out.append(p)
        parent = os.path.dirname(p)
        if parent == p:
            return out
        p = parent


def _same(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)  # also a bind mount or another path to the same folder
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def check_out_dir(out_dir: str, model_dir: Optional[str] = None) -> None:
    """Raises ValueError, before anything is read or written, for an output folder that cannot
    be written without damaging something: one that exists and is not a folder (a file, a FIFO,
    /proc/version, a dangling link), one that holds files but was not written by
    :func:`save_quantized` (the new folder replaces it whole), one whose folder cannot take a
    new entry (tried: permission bits say nothing for root), or, with ``model_dir``, one that is
    the model folder, lies inside it or contains it, symlinks and other paths to the same folder
    included."""
    shown = _core.printable(out_dir)
    if not os.fspath(out_dir):  # os.path takes "" for a missing path, realpath for the current folder
        raise ValueError("the output folder is an empty string; give a folder")
    if os.path.lexists(out_dir) and not os.path.isdir(out_dir):
        what = "a dangling symbolic link" if not os.path.exists(out_dir) else "not a folder"
        raise ValueError(f"the output folder {shown} exists and is {what}; give a new or existing folder")
    if model_dir and os.path.exists(model_dir):
        for a in _ancestors(out_dir):
            if os.path.exists(a) and _same(a, model_dir):
                where = "is the model folder" if a == os.path.realpath(out_dir) else "is inside the model folder"
                raise ValueError(f"the output folder {shown} {where} {_core.printable(model_dir)}: writing it would "
                                 f"change the model being read; give a folder outside it")
        if os.path.exists(out_dir):
            for a in _ancestors(model_dir):
                if _same(a, out_dir):
                    raise ValueError(f"the output folder {shown} contains the model folder "
                                     f"{_core.printable(model_dir)}: writing it would change the model being "
                                     f"read; give a folder outside it")
    if os.path.isdir(out_dir) and os.listdir(out_dir) and not any(
            os.path.lexists(os.path.join(out_dir, f)) for f in (INFO_FILE, CHECKPOINT_FILE)):
        raise ValueError(f"the output folder {shown} holds files and is not a folder written by quantize-model "
                         f"(no {INFO_FILE}); the new folder would replace it whole: give a new or empty folder")
    _check_writable(out_dir)


# The output folder is written whole or not at all (docs/PYTHON.md, "After a crash"): into a new
# folder beside it, synced, then renamed into place, so that a process killed at any point never
# leaves a partly written folder under the output's name, and no file of an existing output folder
# (or one its symbolic links point to) is ever opened for writing. The temporary names are short
# and fixed-length: the output's own name may take all of NAME_MAX (255 bytes).
_STAGING_PREFIX = ".wush-"


def _target(out_dir: str) -> str:
    """The path the output folder is renamed to: ``out_dir`` with symbolic links resolved (a link
    to a folder keeps pointing to it; the folder it names is replaced)."""
    return os.path.realpath(out_dir)


def _check_writable(out_dir: str) -> None:
    """Raises ValueError unless a folder can be created beside the output folder (in the nearest
    existing folder above it: the missing ones are created) and, when the output folder exists,
    it can be renamed (a folder without write permission cannot: its ``..`` changes)."""
    target = _target(out_dir)
    parent = os.path.dirname(target)
    while not os.path.lexists(parent):  # the folders to be made, up to the first that exists
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ValueError(f"the output folder {_core.printable(out_dir)} cannot be made: {_core.printable(parent)} "
                         f"is not a folder")
    try:
        os.rmdir(_new_staging(parent))
        if os.path.isdir(target) and not os.access(target, os.W_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as e:
        raise ValueError(f"the output folder {_core.printable(out_dir)} cannot be written: cannot create a folder "
                         f"in {_core.printable(parent)}: {e.strerror}") from None


def _new_staging(parent: str) -> str:
    """A new, empty folder in ``parent`` with a short random name (the process's umask applies,
    as to any folder it makes)."""
    while True:
        path = os.path.join(parent, _STAGING_PREFIX + os.urandom(4).hex())
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            continue


def _fsync_path(path: str, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: str) -> None:
    """Every file and folder under ``root`` on disk: before the rename makes the folder visible,
    so that after a power loss its name never points to files whose data were not written."""
    for dirpath, _dirs, files in os.walk(root, topdown=False):
        for fn in files:
            p = os.path.join(dirpath, fn)
            if not os.path.islink(p):
                _fsync_path(p)
        _fsync_path(dirpath, directory=True)


class _WholeFolder:
    """``with _WholeFolder(out_dir) as tmp:`` write the folder's files into ``tmp``; on a normal
    exit it replaces ``out_dir`` (synced, renamed into place; an existing folder renamed aside
    first and then deleted), on an exception it is deleted and ``out_dir`` is left as it was."""

    def __init__(self, out_dir: str):
        self.target = _target(out_dir)
        self.parent = os.path.dirname(self.target)
        self.tmp = ""

    def __enter__(self) -> str:
        os.makedirs(self.parent, exist_ok=True)
        self.tmp = _new_staging(self.parent)
        return self.tmp

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return
        old, moved = None, False
        try:
            _fsync_tree(self.tmp)
            if os.path.lexists(self.target):
                # rename(2) replaces an empty folder: the old one takes a fresh empty one's name.
                old = _new_staging(self.parent)
                os.rename(self.target, old)
                moved = True
            os.rename(self.tmp, self.target)
        except BaseException:
            if moved:
                os.rename(old, self.target)  # the previous folder back under its name
            elif old is not None:
                os.rmdir(old)
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise
        _fsync_path(self.parent, directory=True)  # the renames themselves
        if old is not None:
            # The new folder is in place: a file of the old one that cannot be deleted is left
            # (under the .wush- name), not an error.
            shutil.rmtree(old, ignore_errors=True)
