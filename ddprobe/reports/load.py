"""Read results files for reports and the gate: files or folders, every error naming its file.

Besides ddprobe results files (``ddprobe.result/2``, and version 1, upgraded on load) this reads the raw JSON that
``ddprobe bench verify`` (probes/bench/verify.py) writes (``meta``, ``ceilings``, ``results``) as a
``bench-verify`` result, so a benchmark run can be reported before it is converted.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Iterable

from ..jsonfile import read_json
from ..results import Result, RunMeta
from ..schema import OLD_SCHEMAS, SCHEMA
from ..units import DDProbeError


def _from_raw_bench(d: dict[str, Any], source: str) -> Result:
    """`ddprobe bench verify`'s own document -> Result(kind="bench-verify")."""
    m, ceil = d.get("meta") or {}, d.get("ceilings") or {}
    if not isinstance(m, dict) or not isinstance(ceil, dict) or not isinstance(d.get("results"), list):
        raise DDProbeError(f"{source}: malformed benchmark file (meta, ceilings and results expected)")
    gpu = m.get("gpu")
    meta = RunMeta(date_utc=str(m.get("date", "?")), host=str(m.get("host", "?")), ddprobe_version="?",
                   git_sha=m.get("git_sha"), python=str(m.get("python", "?")), torch=m.get("torch"),
                   triton=m.get("triton"), platform=str(m.get("platform", "?")),
                   gpus=[{"index": 0, "name": gpu, "driver": m.get("driver")}] if gpu else [],
                   command=str(m.get("command", "?")))
    summary = {"copy_GBps": ceil.get("copy_GBps"),
               "matmul_TFLOPs": ceil.get("matmul_TFLOPs", ceil.get("bf16_mm_TFLOPs"))}
    config = {k: v for k, v in m.items() if k not in ("date", "gpu", "torch", "triton", "python", "command")}
    return Result.from_dict({"schema": SCHEMA, "kind": "bench-verify", "meta": dataclasses.asdict(meta),
                             "config": {**config, **summary}, "rows": list(d["results"]), "summary": summary},
                            source)


def load_one(path: str | os.PathLike) -> Result:
    """One results file; a ``DDProbeError`` naming the file when it is missing, not JSON or not a results file."""
    path = Path(path)
    try:
        os.stat(path)
    except (FileNotFoundError, ValueError):  # ValueError: a NUL byte in the name
        raise DDProbeError(f"results file {path} not found") from None
    except OSError as e:  # a symbolic link loop, a folder that cannot be searched...
        raise DDProbeError(f"cannot read results file {path}: {e.strerror or e}") from None
    return from_data(read_json(path, "results file"), str(path))  # regular files only, strict JSON, a depth limit


def from_data(d, source: str) -> Result:
    """A results file's parsed JSON as a Result: a raw ``bench verify`` document converted, anything else through
    Result.from_dict (every row, measured time and summary part checked; one line naming the field)."""
    if isinstance(d, dict) and d.get("schema") not in (SCHEMA, *OLD_SCHEMAS) and "results" in d and "ceilings" in d:
        return _from_raw_bench(d, source)
    return Result.from_dict(d, source=source)


def looks_like_results(d) -> bool:
    """Whether parsed JSON claims to be a ddprobe results file (a schema key, or a raw ``bench verify`` document):
    what a folder of baselines holds, as against notes or other JSON kept beside them."""
    return isinstance(d, dict) and ("schema" in d or {"results", "ceilings"} <= d.keys())


def expand(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """Files as given; a folder means every ``*.json`` in it (sorted, not recursive)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(q for q in p.glob("*.json") if q.is_file() and not q.name.startswith("."))
            if not found:
                raise DDProbeError(f"{p}: folder holds no results files (*.json)")
            out += found
        else:
            out.append(p)
    if not out:
        raise DDProbeError("no results files given")
    seen: dict[str, Path] = {}
    for p in out:  # one file twice (named twice, or named and in a folder given) would be reported twice
        real = os.path.realpath(p)
        if real in seen:
            raise DDProbeError(f"{p}: given twice (as {seen[real]} too): give each results file once")
        seen[real] = p
    return out


def load_all(paths: Iterable[str | os.PathLike]) -> list[tuple[Path, Result]]:
    """Every results file under ``paths``, in order, each loaded or an error naming it."""
    return [(p, load_one(p)) for p in expand(paths)]
