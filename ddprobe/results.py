"""Result records: dataclasses that save to and load from JSON, with run metadata.

Every probe and benchmark writes a ``Result``: what kind of measurement it is, the
metadata of the run (date, host, versions, GPU, command), the configuration, and rows
(one dict per measured cell, keys carrying their units: ``step_ms``, ``kv_GB``...).
``ResultWriter`` rewrites the file atomically after every row, so an interrupted run
keeps everything it measured, and writes nothing until there is a row (a run that fails
before its first cell leaves no empty file behind). Files get the user's umask, like any
file the shell creates. ``load(path).frame()`` gives the rows as a pandas DataFrame when
pandas is installed (it is not a dependency). Nothing here imports torch.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import platform
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from . import __version__, signals
from .jsonfile import write_text_atomic
from .step_model import upgrade_floor_row
from .units import DDProbeError

SCHEMA = "ddprobe.result/1"
# keys a row of these kinds must carry, with the JSON types allowed (None: null allowed)
ROW_KEYS: dict[str, dict[str, tuple]] = {
    "gpu-util": {"t_s": (int, float), "gpu": (int,)},
    "commit": {"ctx": (int,), "text": (str,), "commit_len": (int, float, type(None))},
    "allreduce": {"bytes": (int,), "us": (int, float, type(None))},
}


def check_rows(rows: Any, kind: str, source: str) -> list[dict[str, Any]]:
    """Rows must be JSON objects, and rows of a known kind must carry its keys with the right types;
    otherwise one line naming the file and the row (1-based)."""
    if not isinstance(rows, list):
        raise DDProbeError(f"{source}: 'rows' is not a list")
    need = ROW_KEYS.get(kind, {})
    for i, row in enumerate(rows, 1):
        if not isinstance(row, dict):
            raise DDProbeError(f"{source}: row {i} is not an object (got {type(row).__name__}: {str(row)[:40]!r})")
        for key, types in need.items():
            v = row.get(key, ...)
            if v is ... or isinstance(v, bool) or not isinstance(v, types):
                got = "missing" if v is ... else f"{type(v).__name__} {str(v)[:40]!r}"
                raise DDProbeError(f"{source}: row {i} of this {kind} file has a bad {key!r} ({got})")
        why = impossible(row) if kind == "commit" else None
        if why:
            raise DDProbeError(f"{source}: row {i} of this {kind} file: {why}: not believed")
    return rows


# counts and times of a commit row that cannot be negative (NaN and infinities are not JSON: refused when read)
NON_NEGATIVE = ("prompt_tokens", "completion_tokens", "verify_steps", "max_new_tokens", "prefill_s", "decode_s",
                "e2e_s", "decode_ms_per_step", "tokens_per_s", "drafts_per_step", "reused_tokens")


def impossible(row: dict[str, Any]) -> str | None:
    """What a commit row says that no measurement can (None: nothing): a negative count or time, a commit length
    below 1 or above max_new_tokens, more verify steps than tokens. The reports and ``floor --steps-from`` read
    rows through this (``Result.from_dict``)."""
    for key in NON_NEGATIVE:
        v = row.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0):
            return f"{key} is {v!r}"
    c, n = row.get("commit_len"), row.get("max_new_tokens")
    if c is not None and not (1.0 - 1e-9 <= c <= (n if isinstance(n, int) and n >= 1 else float("inf")) + 1e-9):
        return f"commit length {c:g} outside [1, {n if isinstance(n, int) else 'max_new_tokens'}]"
    steps, done = row.get("verify_steps"), row.get("completion_tokens")
    if isinstance(steps, int) and isinstance(done, int) and steps > max(done, 1):
        return f"{steps} verify steps for {done} tokens"
    return None


def _pkg_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _git_sha() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _gpus() -> list[dict[str, Any]]:
    """Name and driver of every NVIDIA GPU through NVML; [] where there is none."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver, no GPU: NVMLError_LibraryNotFound and friends
        return []
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            gpus.append({"index": i, "name": name.decode() if isinstance(name, bytes) else name,
                         "driver": driver.decode() if isinstance(driver, bytes) else driver})
        return gpus
    except Exception:
        return []
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _finite(obj: Any) -> Any:
    """NaN and infinities become null: JSON has no such numbers, and a missing value is not a number."""
    if isinstance(obj, float) and (obj != obj or obj in (float("inf"), float("-inf"))):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


@dataclass
class RunMeta:
    date_utc: str
    host: str
    ddprobe_version: str
    git_sha: str | None
    python: str
    torch: str | None
    triton: str | None
    platform: str
    gpus: list[dict[str, Any]]
    command: str

    @property
    def gpu_name(self) -> str | None:
        return self.gpus[0]["name"] if self.gpus else None

    @property
    def gpu_driver(self) -> str | None:
        return self.gpus[0]["driver"] if self.gpus else None

    @classmethod
    def collect(cls, command: str | None = None, probe_gpu: bool = True) -> "RunMeta":
        return cls(
            date_utc=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            host=socket.gethostname(),
            ddprobe_version=__version__,
            git_sha=_git_sha(),
            python=platform.python_version(),
            torch=_pkg_version("torch"),
            triton=_pkg_version("triton"),
            platform=platform.platform(),
            gpus=_gpus() if probe_gpu else [],
            command=command if command is not None else " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        )


@dataclass
class Result:
    """One results file: ``kind`` names the probe ("floor", "commit", "bench-verify", ...)."""

    kind: str
    meta: RunMeta
    config: dict[str, Any] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    schema: str = SCHEMA

    def to_dict(self) -> dict[str, Any]:
        return _finite(dataclasses.asdict(self))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str, allow_nan=False)

    def save(self, path: str | os.PathLike) -> Path:
        """Write atomically (temp file + rename): a reader never sees half a file."""
        return write_text_atomic(path, self.to_json() + "\n", "results file")

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "<dict>") -> "Result":
        if not isinstance(d, dict) or d.get("schema") != SCHEMA:
            raise DDProbeError(f"{source}: not a ddprobe results file (schema {SCHEMA!r} missing)")
        for key in ("meta", "config", "summary"):
            if key in d and not isinstance(d[key], dict):
                raise DDProbeError(f"{source}: {key!r} is not a JSON object (got {type(d[key]).__name__})")
        try:
            meta = RunMeta(**d["meta"])
            kind = d["kind"]
            rows = check_rows(d.get("rows", []), kind, source)
            step = (d.get("summary") or {}).get("decode_step_ms") if kind == "gpu-util" else None
            if step is not None and (isinstance(step, bool) or not isinstance(step, (int, float)) or step <= 0):
                raise DDProbeError(f"{source}: this gpu-util file's decode_step_ms is {step!r}: not believed")
            rows, config, summary = signals.upgrade(kind, list(rows), d.get("config", {}), d.get("summary", {}))
            if kind == "floor":  # an older file's whole-step floor under today's name
                rows = [upgrade_floor_row(r) for r in rows]
            return cls(kind=kind, meta=meta, config=config, rows=rows, summary=summary, schema=d["schema"])
        except (KeyError, TypeError) as e:
            raise DDProbeError(f"{source}: malformed results file ({e})") from None

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Result":
        from .jsonfile import read_json  # one reader of user-given JSON: non-UTF-8, bad JSON -> one line

        return cls.from_dict(read_json(path, "results file"), source=str(Path(path)))

    def frame(self):
        """The rows as a pandas DataFrame (one column per key; ``attrs`` holds kind, meta and config).
        Needs pandas, which ddprobe does not depend on."""
        try:
            import pandas as pd
        except ImportError:
            raise DDProbeError("Result.frame() needs pandas (pip install pandas); the rows are in .rows") from None
        df = pd.DataFrame(self.rows)
        df.attrs.update(kind=self.kind, meta=dataclasses.asdict(self.meta), config=self.config)
        return df

    def to_csv(self, path: str | os.PathLike) -> Path:
        """The rows as CSV, written atomically like the JSON (``write_text_atomic``)."""
        import csv
        import io

        keys: list[str] = []
        for row in self.rows:
            keys += [k for k in row if k not in keys]
        buf = io.StringIO(newline="")
        w = csv.DictWriter(buf, fieldnames=keys)
        w.writeheader()
        for row in self.rows:
            w.writerow({k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in row.items()})
        return write_text_atomic(path, buf.getvalue(), "CSV file")


def load(path: str | os.PathLike) -> Result:
    """A saved results file: ``ddprobe.results.load("commit.json").frame()`` for pandas."""
    return Result.load(path)


class ResultWriter:
    """Append rows to a Result and rewrite its file after each one (write as you go).

    ``path`` may be None (keep in memory only). A ``.csv`` twin is written too when
    ``csv_path`` is given. Nothing is written while the result has neither rows nor a
    summary: a run that fails before measuring anything leaves no file.
    """

    def __init__(self, result: Result, path: str | os.PathLike | None = None,
                 csv_path: str | os.PathLike | None = None):
        self.result = result
        self.path = Path(path) if path else None
        self.csv_path = Path(csv_path) if csv_path else None
        self.flush()

    def add(self, row: dict[str, Any]) -> None:
        self.result.rows.append(row)
        self.flush()

    def flush(self) -> None:
        if not (self.result.rows or self.result.summary):
            return
        if self.path:
            self.result.save(self.path)
        if self.csv_path:
            self.result.to_csv(self.csv_path)
