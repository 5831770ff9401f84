"""Read a JSON file a user handed us: every way it can be wrong is one line naming the file."""
from __future__ import annotations

import json
import os
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


def read_json(path: str | os.PathLike, what: str = "file") -> Any:
    """The parsed JSON of ``path``; DDProbeError (one line) when it cannot be read, is not UTF-8
    text, or is not valid JSON (NaN/Infinity literals included: they are not JSON)."""
    p = Path(path)
    try:
        text = p.read_bytes().decode("utf-8")
    except OSError as e:
        raise DDProbeError(f"cannot read {what} {p}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise DDProbeError(f"{p}: not UTF-8 text (byte {e.start}); is this a JSON {what}?") from None

    def no_constant(name: str):
        raise ValueError(f"{name} is not valid JSON")

    try:
        return json.loads(text, parse_constant=no_constant)
    except json.JSONDecodeError as e:
        raise DDProbeError(f"{p}: not valid JSON (line {e.lineno}: {e.msg})") from None
    except ValueError as e:
        raise DDProbeError(f"{p}: {e}") from None


def write_text_atomic(path: str | os.PathLike, text: str, what: str = "file") -> Path:
    """Write ``text`` through a temp file and a rename: a reader never sees half a file, and a run that dies
    mid-write leaves the previous version. Errors are one line naming ``what`` and the path."""
    import tempfile

    path = Path(path)
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
