"""Every file a command will write, checked before anything is measured: one checker for all commands.

``check_outputs({"--json": path, "--csv": other, ...})`` raises one ``DDProbeError`` naming the option when a
path is a directory, sits under something that is not a directory, cannot be written (the file, or the nearest
folder that exists when the file or its folders are still to be made), or is the same file as another output.
It creates nothing: a run refused later leaves no folder behind. ``check_folder`` does the same for an output
folder (``diagnose --out-dir``).

Outputs never harm what they name: only a regular file or a new name is written. A symbolic link (a loop
included), a device, a FIFO or a socket, and any path under /proc, /sys or /dev are refused
(``jsonfile.special_target``, which the atomic write asks again). An output that is also one of the command's
inputs (``floor --steps-from s.json --out s.json``), or a measuring command's output that would replace a file
already there (``commit --json earlier.json``, ``diagnose --out-dir`` holding an earlier ``commit.json``), is
refused unless ``--force``: the choice made here is to refuse, never to write under another name.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Mapping, Optional

from ..jsonfile import SYSTEM_TREES, special_target
from ..units import DDProbeError

FORCE_HINT = "give another path, or --force to replace it"


def _nearest_existing(p: Path) -> Path:
    for q in (p, *p.parents):
        if q.exists() or q.is_symlink():
            return q
    return Path(".")


def _writable_folder(p: Path, flag: str, shown: Path) -> None:
    """``p`` (to be) a folder we can create files in; ``shown``: the path the user typed."""
    base = _nearest_existing(p)
    if not base.is_dir():
        raise DDProbeError(f"{flag} {shown}: {base} is not a directory")
    if not os.access(base, os.W_OK | os.X_OK):
        raise DDProbeError(f"{flag} {shown}: cannot write in {base} (permission denied)")


def check_file(flag: str, path: Path, *, force: bool = False, inputs: Iterable[tuple[str, Path]] = (),
               keep_existing: bool = False, holds: str = "results measured earlier") -> Path:
    """One output file: not a directory, its folder writable (or creatable), the file writable if present; never
    a special file (``special_target``); unless ``force``, not one of ``inputs`` ((flag, path) pairs) and, with
    ``keep_existing`` (results, a report), not a file that is already there (``holds``: what it is said to hold)."""
    p = Path(path).expanduser()
    if str(path) == "":
        raise DDProbeError(f"{flag}: empty path (give a file name)")
    if p.is_dir() and not p.is_symlink():
        raise DDProbeError(f"{flag} {path}: is a directory (give a file name)")
    why = special_target(p)
    if why:
        raise DDProbeError(f"{flag} {path}: {why}")
    for in_flag, q in inputs:
        if q is not None and not force and _same(p, Path(q).expanduser()):
            raise DDProbeError(f"{flag} {path} is also the input {in_flag}: writing it would replace what is "
                               f"read ({FORCE_HINT})")
    if keep_existing and not force and p.exists() and p.stat().st_size > 0:
        raise DDProbeError(f"{flag} {path}: {_holds(p, holds)} ({FORCE_HINT})")
    if p.exists():
        if not os.access(p, os.W_OK):
            raise DDProbeError(f"{flag} {path}: cannot write it (permission denied)")
    _writable_folder(p.parent if str(p.parent) else Path("."), flag, path)
    return p


RESULTS_READ_LIMIT = 256 << 20  # a larger file is not read to say what it holds


def _holds(p: Path, holds: str) -> str:
    """What the file at ``p`` is said to hold when it is kept: ``holds`` where that is not about results (a report)
    or the file is a ddprobe results file (a JSON object with a ``ddprobe.result`` schema, or a kind or raw results
    beside its meta); otherwise that it holds something else (a table, another program's file)."""
    import json

    if "results" not in holds:
        return f"already holds {holds}"
    if p.suffix.lower() == ".csv":
        return "already holds a file (a table written earlier, or another program's)"
    try:
        if p.stat().st_size > RESULTS_READ_LIMIT:
            return "already holds a file too large to tell whether it is a ddprobe results file"
        d = json.loads(p.read_bytes())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        d = None
    ours = isinstance(d, dict) and (str(d.get("schema") or "").startswith("ddprobe.result")
                                    or ("meta" in d and ("kind" in d or "results" in d)))
    return f"already holds {holds}" if ours else "holds a file that is not a ddprobe results file"


def check_folder(flag: str, path: Path, *, names: Iterable[str] = (), force: bool = False) -> Path:
    """An output folder: a directory (or creatable under one) we can write in, not a link nor under /proc, /sys,
    /dev; unless ``force``, holding none of the files ``names`` the command will write (earlier results)."""
    p = Path(path).expanduser()
    if str(path) == "":
        raise DDProbeError(f"{flag}: empty path (give a folder name)")
    if p.is_symlink():
        raise DDProbeError(f"{flag} {path}: is a symbolic link (give the folder it points to)")
    if p.exists() and not p.is_dir():
        raise DDProbeError(f"{flag} {path}: is a file, not a folder")
    real = os.path.realpath(p)
    tree = next((t for t in SYSTEM_TREES if real == t or real.startswith(t + "/")), None)
    if tree:
        raise DDProbeError(f"{flag} {path}: is under {tree} (a system folder, never written)")
    _writable_folder(p, flag, path)
    there = [n for n in names if (p / n).exists() or (p / n).is_symlink()] if p.is_dir() else []
    if there and not force:
        raise DDProbeError(f"{flag} {path}: already holds {', '.join(there)} from an earlier run ({FORCE_HINT})")
    for n in names:  # what is there (with --force) must be a regular file still
        why = special_target(p / n) if p.is_dir() else None
        if why:
            raise DDProbeError(f"{flag} {path}: {n} {why}")
    return p


def _same(a: Path, b: Path) -> bool:
    """Whether two paths name one file: the same inode where both exist, else the same path once resolved as far as
    it resolves (``os.path.realpath`` stops at a loop where ``Path.resolve`` raises RuntimeError; an unreadable part
    leaves the path as given)."""
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
    except OSError:
        pass
    return _real(a) == _real(b)


def _real(p: Path) -> str:
    try:
        return os.path.realpath(p)
    except (OSError, RuntimeError, ValueError):  # ValueError: a NUL byte in the name
        return os.path.abspath(p)


def check_outputs(paths: Mapping[str, Optional[Path]], *, force: bool = False,
                  inputs: Mapping[str, Optional[Path]] | None = None, keep_existing: bool = False) -> None:
    """Check every output file (flag -> path; None: not written; ``check_file``) and that no two are the same
    file."""
    seen: list[tuple[str, Path]] = []
    for flag, path in paths.items():
        if path is None:
            continue
        p = check_file(flag, path, force=force, inputs=list((inputs or {}).items()), keep_existing=keep_existing)
        for other_flag, other in seen:
            if _same(p, other):
                raise DDProbeError(f"{flag} {path} is the same file as {other_flag}: give each output its own file")
        seen.append((flag, p))
