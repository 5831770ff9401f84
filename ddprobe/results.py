"""Result records: dataclasses that save to and load from JSON, with run metadata.

Every probe and benchmark writes a ``Result``: what kind of measurement it is, the
metadata of the run (date, host, versions, GPU, command), the configuration, and rows
(one dict per measured cell, keys carrying their units: ``step_ms``, ``kv_GB``...). Each kind's
rows follow its schema (``schema.KINDS``: type, unit and range of every key), checked when a row is
written (``ResultWriter.add``, ``save``) and when a file is loaded (``from_dict``, which upgrades a
version-1 file first); ``Result.records`` gives the rows typed, as the reports read them.
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
from . import schema as _schema
from .jsonfile import write_text_atomic
from .schema import SCHEMA
from .units import DDProbeError, check_measured


def typed_rows(kind: str, rows: Any, config: Any, source: str) -> list[dict[str, Any]]:
    """Rows of a loaded file in today's keys, each checked against its kind's schema (``schema.parse_row``):
    one line naming the file, the row (1-based) and the field otherwise. An older file's keys are upgraded first."""
    if not isinstance(rows, list):
        raise DDProbeError(f"{source}: 'rows' is not a list")
    rows = [_schema.upgrade_row(kind, r) for r in rows]
    _schema.parse_rows(kind, rows, source, config if isinstance(config, dict) else {})
    return rows


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

    def check(self, where: str = "results") -> None:
        """Every row against its kind's schema (a kind without one is refused): ``DDProbeError`` naming the field."""
        rows = _finite(self.rows)
        for i, row in enumerate(rows, 1):
            _schema.parse_row(self.kind, row, f"{where}: row {i}", self.config)

    def save(self, path: str | os.PathLike) -> Path:
        """Check the rows (``check``), then write atomically (temp file + rename): a reader never sees half a file."""
        self.check(str(path))
        return self._write(path)

    def _write(self, path: str | os.PathLike) -> Path:
        return write_text_atomic(path, self.to_json() + "\n", "results file")

    @property
    def records(self) -> list:
        """The rows as typed rows of this kind's schema (``schema.KINDS``): attributes with units declared,
        e.g. ``r.floor_ms`` for a floor row. Rows were checked when written or loaded."""
        return _schema.parse_rows(self.kind, self.rows, f"{self.kind} result", self.config) or []

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "<dict>") -> "Result":
        """A loaded file: today's schema or an older one (upgraded: keys renamed, ``schema`` today's), every row
        checked against its kind's schema; a file that breaks it is refused in one line naming the field."""
        if not isinstance(d, dict) or d.get("schema") not in (SCHEMA, *_schema.OLD_SCHEMAS):
            raise DDProbeError(f"{source}: not a ddprobe results file (schema {SCHEMA!r} missing)")
        for key in ("meta", "config", "summary"):
            if key in d and not isinstance(d[key], dict):
                raise DDProbeError(f"{source}: {key!r} is not a JSON object (got {type(d[key]).__name__})")
        try:
            meta = RunMeta(**d["meta"])
            kind = d["kind"]
            if not isinstance(kind, str):
                raise DDProbeError(f"{source}: malformed results file ('kind' must be text)")
            _schema.check_source(kind, d.get("config") or {}, d.get("summary") or {}, source)
            rows, config, summary = signals.upgrade(kind, d.get("rows", []), d.get("config", {}), d.get("summary", {}))
            rows = typed_rows(kind, rows, config, source)
            check_measured(kind, rows, source)  # every measured time against a typed one's range
            _schema.check_summary(kind, summary if isinstance(summary, dict) else {}, source)
            return cls(kind=kind, meta=meta, config=config, rows=rows, summary=summary, schema=SCHEMA)
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
        result.check(str(self.path or "results"))
        self.flush()

    def add(self, row: dict[str, Any]) -> None:
        """Append one row, checked against its kind's schema first: a probe that writes a bad row is a bug
        (``DDProbeError`` naming the field; nothing is written and the rows already measured stay saved)."""
        where = f"{self.path or 'results'}: row {len(self.result.rows) + 1}"
        _schema.parse_row(self.result.kind, _finite(row), where, self.result.config, measured=True)
        self.result.rows.append(row)
        self.flush()

    def flush(self) -> None:
        if not (self.result.rows or self.result.summary):
            return
        if self.path:
            self.result._write(self.path)  # rows were checked as they came
        if self.csv_path:
            self.result.to_csv(self.csv_path)
