"""Read a JSON file a user handed us: every way it can be wrong is one line naming the file; write results
files atomically, never over anything but a regular file.

Only regular files are read (a FIFO or a device is refused at once, never opened for a blocking read), and
JSON nested deeper than ``MAX_DEPTH`` is refused (no results file comes near it). ``special_target`` is the one
test of what a write may replace: the output checks (``cli/outputs.py``) and the atomic write both ask it.
"""
from __future__ import annotations

import json
import errno
import os
import stat
import threading
from pathlib import Path
from typing import Any

from .units import DDProbeError

_UMASK_LOCK = threading.Lock()


def _umask() -> int:
    """The process umask (read by setting and restoring it: there is no getter; locked, as writers run in threads)."""
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


MAX_DEPTH = 64  # nesting of JSON read from a file or a server: results files use under 10 levels
SYSTEM_TREES = ("/proc", "/sys", "/dev")  # never written, whatever the path's name (a new file there included)


def _kind(mode: int) -> str:
    return ("a FIFO" if stat.S_ISFIFO(mode) else "a character device" if stat.S_ISCHR(mode) else
            "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else
            "a directory" if stat.S_ISDIR(mode) else "not a regular file")


def read_regular(path: str | os.PathLike, what: str = "file") -> bytes:
    """The bytes of ``path``, a regular file: a FIFO, a device or a socket is refused before any blocking read
    (the open does not wait for a FIFO's writer)."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise DDProbeError(f"cannot read {what} {p}: {e.strerror or e}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise DDProbeError(f"{what} {p} is {_kind(mode)}: give a regular file")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb") as f:
            fd = -1
            return f.read()
    except OSError as e:
        raise DDProbeError(f"cannot read {what} {p}: {e.strerror or e}") from None
    finally:
        if fd >= 0:
            os.close(fd)


def depth(doc: Any) -> int:
    """Nesting depth of parsed JSON (a scalar: 0), walked without recursion."""
    deepest, todo = 0, [(doc, 0)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d + 1)
            todo.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def parse_json(text: str | bytes, where: str) -> Any:
    """``text`` parsed as strict JSON (no NaN/Infinity literals) nested at most ``MAX_DEPTH`` deep;
    DDProbeError naming ``where`` otherwise."""
    def no_constant(name: str):
        raise ValueError(f"{name} is not valid JSON")

    try:
        doc = json.loads(text, parse_constant=no_constant)
    except json.JSONDecodeError as e:
        raise DDProbeError(f"{where}: not valid JSON (line {e.lineno}: {e.msg})") from None
    except RecursionError:
        raise DDProbeError(f"{where}: JSON nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as e:
        raise DDProbeError(f"{where}: {e}") from None
    if depth(doc) > MAX_DEPTH:
        raise DDProbeError(f"{where}: JSON nested deeper than {MAX_DEPTH} levels")
    return doc


def read_json(path: str | os.PathLike, what: str = "file") -> Any:
    """The parsed JSON of ``path``; DDProbeError (one line) when it is not a regular file, cannot be read, is
    not UTF-8 text, is not valid JSON (NaN/Infinity literals included: they are not JSON) or is nested deeper
    than ``MAX_DEPTH``."""
    p = Path(path)
    try:
        text = read_regular(p, what).decode("utf-8")
    except UnicodeDecodeError as e:
        raise DDProbeError(f"{p}: not UTF-8 text (byte {e.start}); is this a JSON {what}?") from None
    return parse_json(text, str(p))


def special_target(path: str | os.PathLike) -> str | None:
    """Why ``path`` must not be written (None: a regular file or a new name): a symbolic link (a loop
    included), a device, FIFO, socket or folder, or a path under /proc, /sys or /dev (once resolved)."""
    p = Path(path)
    try:
        st = os.lstat(p)
    except (FileNotFoundError, NotADirectoryError):  # a new name (a file in its path: the folder check says it)
        st = None
    except OSError as e:  # a loop in a folder of the path, a name too long...
        return f"cannot be looked up ({e.strerror or e})"
    if st is not None and stat.S_ISLNK(st.st_mode):
        try:
            os.stat(p)
        except OSError as e:
            if e.errno == errno.ELOOP:  # it points, through links, back to itself: there is no file to give
                return "is a symbolic link loop (give another name)"
        return "is a symbolic link (give the file it points to, or another name)"
    if st is not None and not stat.S_ISREG(st.st_mode):
        return f"is {_kind(st.st_mode)}, not a regular file"
    try:
        real = os.path.realpath(p)
    except OSError as e:
        return f"cannot be resolved ({e.strerror or e})"
    for tree in SYSTEM_TREES:
        if real == tree or real.startswith(tree + "/"):
            return f"is under {tree} (a system folder, never written)"
    return None


def write_text_atomic(path: str | os.PathLike, text: str, what: str = "file") -> Path:
    """Write ``text`` through a temp file and a rename: a reader never sees half a file, and a run that dies
    mid-write leaves the previous version. Errors are one line naming ``what`` and the path."""
    import tempfile

    path = Path(path)
    why = special_target(path)
    if why:
        raise DDProbeError(f"cannot write {what} {path}: it {why}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise DDProbeError(f"cannot write {what} {path}: {e.strerror or e}") from None
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600 files; these are ordinary files
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except IsADirectoryError:
        Path(tmp).unlink(missing_ok=True)
        raise DDProbeError(f"cannot write {what} {path}: it is a directory") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json_atomic(path: str | os.PathLike, doc: Any) -> Path:
    """``doc`` as JSON, written atomically (``write_text_atomic``)."""
    return write_text_atomic(path, json.dumps(doc, indent=1, default=str) + "\n", "results file")
