"""Write a report from results files: one self-contained HTML file, or markdown with its images beside it.

``write_report(paths, out)`` picks the format from ``out``'s suffix (.html/.htm or .md).
HTML embeds every plot as a data URI and needs no network at view time; markdown puts
its PNGs in ``<stem>_files/`` next to the .md. Templates are Jinja2, under templates/.
"""
from __future__ import annotations

import base64
import datetime as _dt
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from jinja2 import Environment, PackageLoader, StrictUndefined

from .. import __version__
from ..units import DDProbeError
from . import diagnosis, load, sections

FORMATS = {".html": "html", ".htm": "html", ".md": "md"}


@dataclass
class Report:
    title: str
    generated_utc: str
    command: str
    sections: list[sections.Section]
    diagnosis: list[diagnosis.Claim] = field(default_factory=list)  # diagnose's first screen; empty otherwise


def build(paths: Iterable[str | os.PathLike], command: str = "", title: str = "ddprobe report",
          with_diagnosis: bool = False) -> Report:
    loaded = [(p, _current(r)) for p, r in load.load_all(paths)]
    built = [sections.build(p, r, i) for i, (p, r) in enumerate(loaded)]
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    claims = diagnosis.diagnose([r for _, r in loaded]) if with_diagnosis else []
    return Report(title=title, generated_utc=now, command=command, sections=built, diagnosis=claims)


def is_report(path: str | os.PathLike) -> bool:
    """Whether ``path`` holds a report ddprobe wrote (its HTML generator tag or its Markdown header line): one that
    ``report -o`` may write again without ``--force``, a derived file, unlike results or anything else."""
    try:
        with open(path, "rb") as f:
            head = f.read(2048).decode("utf-8", "replace")
    except OSError:
        return False
    return '<meta name="generator" content="ddprobe ' in head or \
        any(line.startswith("Generated ") and " by ddprobe " in line for line in head.splitlines()[:4])


def _current(r):
    """A gpu-util file's verdicts by today's rules, from its samples (``gpu_verdict.reanalyzed``), as replay gives."""
    if r.kind == "gpu-util" and r.rows:
        from ..gpu_verdict import reanalyzed  # plain Python, no torch

        r.summary = reanalyzed(r.summary, r.rows, r.config.get("sources"))
    return r


def _env(fmt: str) -> Environment:
    env = Environment(loader=PackageLoader("ddprobe.reports", "templates"), autoescape=fmt == "html",
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters["b64"] = lambda data: base64.b64encode(data).decode("ascii")
    env.filters["mdcell"] = lambda s: str(s).replace("|", "\\|").replace("\n", " ")
    return env


def _format(out: Path) -> str:
    fmt = FORMATS.get(out.suffix.lower())
    if fmt is None:
        raise DDProbeError(f"report {out}: unknown format {out.suffix or '(no suffix)'!r}; use .html or .md")
    return fmt


def render(report: Report, fmt: str, image_dir: str = "") -> str:
    return _env(fmt).get_template(f"report.{fmt}.j2").render(report=report, version=__version__,
                                                             image_dir=image_dir)


def write_report(paths: Iterable[str | os.PathLike], out: str | os.PathLike, command: str = "") -> list[Path]:
    """Build and write the report; returns the files written (the report first, then any images)."""
    _format(Path(out))  # before any work: a bad -o fails fast
    return write(build(paths, command), out)


def write(report: Report, out: str | os.PathLike) -> list[Path]:
    out = Path(out)
    fmt = _format(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    written = [out]
    image_dir = ""
    if fmt == "md":
        folder = out.with_name(f"{out.stem}_files")
        folder.mkdir(exist_ok=True)
        image_dir = folder.name
        for s in report.sections:
            for f in s.figures:
                (folder / f"{f.name}.png").write_bytes(f.png)
                written.append(folder / f"{f.name}.png")
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        tmp.write_text(render(report, fmt, image_dir), encoding="utf-8")
        os.replace(tmp, out)
    except OSError as e:  # the error names the report, never its temporary file
        tmp.unlink(missing_ok=True)
        raise DDProbeError(f"cannot write report {out}: {'it is a directory' if out.is_dir() else e.strerror or e}") \
            from None
    return written
