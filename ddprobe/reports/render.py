"""Write a report from results files: one self-contained HTML file, or markdown with its images beside it.

``write_report(paths, out)`` picks the format from ``out``'s suffix (.html/.htm or .md).
HTML embeds every plot as a data URI and needs no network at view time; markdown puts
its PNGs in ``<stem>_files/`` next to the .md. Templates are Jinja2, under templates/.
"""
from __future__ import annotations

import base64
import datetime as _dt
import hashlib
import os
import re
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
    """Whether ``path`` holds a report ddprobe wrote (its HTML generator tag or its Markdown header line), edited
    since or not (``rewritable`` tells those apart)."""
    try:
        with open(path, "rb") as f:
            head = f.read(2048).decode("utf-8", "replace")
    except OSError:
        return False
    return '<meta name="generator" content="ddprobe ' in head or \
        any(line.startswith("Generated ") and " by ddprobe " in line for line in head.splitlines()[:4])


# The report's last line: the SHA-256 of the whole file as written with this line's digest left blank. A report
# whose content still hashes to it is ddprobe's own, rendered again in place; one that does not was edited (notes
# appended, a table fixed by hand) and is the user's: replaced only with --force.
DIGEST_LINE = "<!-- ddprobe report sha256:{} (ddprobe renders this file again only while this matches it) -->\n"
_DIGEST_RE = re.compile(r"<!-- ddprobe report sha256:([0-9a-f]{64}) \(")
MAX_REPORT_BYTES = 256 << 20  # larger than any report ddprobe writes (plots embedded): not hashed, not ours


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def sealed(text: str) -> str:
    """``text`` with its digest line appended (``DIGEST_LINE``)."""
    text = text if text.endswith("\n") else text + "\n"
    return text + DIGEST_LINE.format(_digest(text + DIGEST_LINE.format("")))


def rewritable(path: str | os.PathLike) -> str | None:
    """None when ``report -o`` may write ``path`` without --force (no file there, an empty one, or a report ddprobe
    wrote and nobody edited since: its digest matches its content); else what the file holds, said in a few words."""
    p = Path(path)
    try:
        if not p.exists() or p.stat().st_size == 0:
            return None
        if p.stat().st_size > MAX_REPORT_BYTES or not is_report(p):
            return "a file that is not a ddprobe report"
        text = p.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return "a file that is not a ddprobe report"
    found = list(_DIGEST_RE.finditer(text))
    if not found:
        return "a ddprobe report without its digest line (an older ddprobe's, or edited since): it may hold notes"
    m = found[-1]
    blank = text[:m.start(1)] + text[m.end(1):]
    if _digest(blank) != m.group(1):
        return "a ddprobe report edited since ddprobe wrote it (notes added or changed: its digest no longer matches)"
    return None


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


def write_report(paths: Iterable[str | os.PathLike], out: str | os.PathLike, command: str = "",
                 force: bool = False) -> list[Path]:
    """Build and write the report; returns the files written (the report first, then any images)."""
    _format(Path(out))  # before any work: a bad -o fails fast
    return write(build(paths, command), out, force=force)


_IMAGE_RE = re.compile(r"^!\[[^\]\n]*\]\(([^)/\n]+)/([^)/\n]+\.png)\)$", re.M)


def _own_images(out: Path, folder: Path) -> set[str]:
    """The images in ``folder`` that the report now at ``out`` links to, where that file is a report ddprobe wrote
    and nobody edited (``rewritable``): those are the report's own, replaced or removed when it is rendered again."""
    if not out.is_file() or rewritable(out) is not None:
        return set()
    try:
        text = out.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return set()
    return {name for d, name in _IMAGE_RE.findall(text) if d == folder.name}


def write(report: Report, out: str | os.PathLike, force: bool = False) -> list[Path]:
    """Write ``report`` to ``out`` (.html: one file; .md: its images as PNGs in ``<stem>_files/`` beside it). An
    image file there that the report at ``out`` did not write is kept (a one-line DDProbeError, nothing written)
    unless ``force``; the images of the earlier render that this one no longer has are removed."""
    out = Path(out)
    fmt = _format(out)
    written = [out]
    image_dir = ""
    images = []
    if fmt == "md":
        folder = out.with_name(f"{out.stem}_files")
        own = _own_images(out, folder)
        images = [(folder / f"{f.name}.png", f.png) for s in report.sections for f in s.figures]
        if folder.exists() and not folder.is_dir():
            raise DDProbeError(f"cannot write report {out}: its image folder {folder} is a file (give another --out)")
        theirs = [p for p, _ in images if (p.exists() or p.is_symlink()) and p.name not in own]
        if theirs and not force:
            raise DDProbeError(f"report {out}: {theirs[0]} is there and no earlier render of this report wrote it "
                               "(give another --out, or --force to replace it)")
        odd = [p for p, _ in images if p.is_symlink() or (p.exists() and not p.is_file())]
        if odd:  # never written through, --force or not
            raise DDProbeError(f"cannot write report {out}: {odd[0]} is not a regular file (give another --out)")
        image_dir = folder.name
    out.parent.mkdir(parents=True, exist_ok=True)
    for p, png in images:
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(png)
        written.append(p)
    if fmt == "md":
        for name in own - {p.name for p, _ in images}:  # the earlier render's images this one no longer has
            (folder / name).unlink(missing_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        tmp.write_text(sealed(render(report, fmt, image_dir)), encoding="utf-8")
        os.replace(tmp, out)
    except OSError as e:  # the error names the report, never its temporary file
        tmp.unlink(missing_ok=True)
        raise DDProbeError(f"cannot write report {out}: {'it is a directory' if out.is_dir() else e.strerror or e}") \
            from None
    return written
