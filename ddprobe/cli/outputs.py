"""Every file a command will write, checked before anything is measured: one checker for all commands.

``check_outputs({"--json": path, "--csv": other, ...})`` raises one ``DDProbeError`` naming the option when a
path is a directory, sits under something that is not a directory, cannot be written (the file, or the nearest
folder that exists when the file or its folders are still to be made), or is the same file as another output.
It creates nothing: a run refused later leaves no folder behind. ``check_folder`` does the same for an output
folder (``diagnose --out-dir``).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Optional

from ..units import DDProbeError


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


def check_file(flag: str, path: Path) -> Path:
    """One output file: not a directory, its folder writable (or creatable), the file writable if present."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise DDProbeError(f"{flag} {path}: is a directory (give a file name)")
    if p.exists():
        if not os.access(p, os.W_OK):
            raise DDProbeError(f"{flag} {path}: cannot write it (permission denied)")
    _writable_folder(p.parent if str(p.parent) else Path("."), flag, path)
    return p


def check_folder(flag: str, path: Path) -> Path:
    """An output folder: a directory (or creatable under one) we can write in."""
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise DDProbeError(f"{flag} {path}: is a file, not a folder")
    _writable_folder(p, flag, path)
    return p


def _same(a: Path, b: Path) -> bool:
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
    except OSError:
        pass
    return a.resolve() == b.resolve()


def check_outputs(paths: Mapping[str, Optional[Path]]) -> None:
    """Check every output file (flag -> path; None: not written) and that no two are the same file."""
    seen: list[tuple[str, Path]] = []
    for flag, path in paths.items():
        if path is None:
            continue
        p = check_file(flag, path)
        for other_flag, other in seen:
            if _same(p, other):
                raise DDProbeError(f"{flag} {path} is the same file as {other_flag}: give each output its own file")
        seen.append((flag, p))
