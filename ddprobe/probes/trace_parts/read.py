"""Read one torch-profiler (Kineto Chrome) trace, json or json.gz, in bounded memory.

The file is decompressed as a stream and its ``traceEvents`` array decoded one event at a time with the standard
library's ``json.JSONDecoder.raw_decode`` over a sliding window of text (a few MB), so a trace of hundreds of MB
never sits in memory as Python objects: only what the analysis needs is kept, as tuples (the GPU kernels, the
launches that carry a correlation id, the step markers, and with ``cpu_ops`` the CPU operators). The keys before
and after the array (``deviceProperties``, ``distributedInfo``, ``traceName`` ...) are decoded whole.
"""
from __future__ import annotations

import gzip
import json
import re
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from ...units import DDProbeError

CHUNK = 1 << 22  # text read per refill
HEADER_MAX = 64 << 20  # a trace's keys before its traceEvents array are small; beyond this it is not a trace
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
MARKER_CATS = ("user_annotation", "gpu_user_annotation")
_SKIP = re.compile(r"[\s,]*")


@dataclass(slots=True)
class Kernel:
    """One GPU kernel (or memcpy / memset, or with ``cpu_ops`` one top-level CPU operator), in us."""
    name: str
    ts: float
    dur: float
    stream: int
    corr: int
    cat: str
    launch: tuple | None = None  # (grid, block, registers, shared memory B, blocks/SM, warps/SM, occupancy %)


@dataclass
class Trace:
    path: Path
    header: dict = field(default_factory=dict)
    kernels: list[Kernel] = field(default_factory=list)
    launches: dict[int, tuple[float, str]] = field(default_factory=dict)  # correlation -> (CPU ts, runtime call)
    markers: list[tuple[str, float, float, str]] = field(default_factory=list)  # (name, ts, dur, cat)
    cpu_ops: list[tuple[str, float, float, int]] = field(default_factory=list)  # (name, ts, dur, tid)
    events: int = 0

    def device(self) -> dict:
        """The first GPU's properties as the trace records them ({} when it holds none)."""
        props = self.header.get("deviceProperties") or []
        return props[0] if props and isinstance(props[0], dict) else {}


def _open_text(path: Path):
    with open(path, "rb") as f:
        magic = f.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rt", encoding="utf-8", errors="replace")
    return open(path, encoding="utf-8", errors="replace")


def _dims(v) -> tuple:
    """A launch's grid or block: a list of non-negative integers (ValueError otherwise: the event is damaged)."""
    if v is None:
        return ()
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v):
        raise ValueError(f"grid/block {v!r} is not a list of counts")
    return tuple(v)


def _time(v) -> float:
    """A timestamp or duration in us: a finite number (ValueError otherwise; ``_at`` refuses a negative duration)."""
    x = float(v)
    if x != x or x in (float("inf"), float("-inf")):
        raise ValueError(f"{v!r} is not a finite time")
    return x


def _launch_args(args: dict) -> tuple | None:
    if "grid" not in args:
        return None
    return (_dims(args.get("grid")), _dims(args.get("block")), args.get("registers per thread"),
            args.get("shared memory"), args.get("blocks per SM"), args.get("warps per SM"),
            args.get("est. achieved occupancy %"))


def _raw_pos(fh) -> int:
    """Bytes of the file itself read so far (compressed bytes for a gzip file): what a progress bar counts."""
    raw = getattr(fh.buffer, "fileobj", None) or fh.buffer
    try:
        return raw.tell()
    except (OSError, ValueError, AttributeError):
        return 0


class _Stream:
    """The text of one file as a sliding window: ``buf[pos:]`` is what is not decoded yet."""

    def __init__(self, fh, progress: Callable[[int], None] | None):
        self.fh, self.buf, self.pos, self.eof, self.read, self.progress = fh, "", 0, False, 0, progress

    def refill(self, want: int = CHUNK) -> bool:
        if self.eof:
            return False
        text = self.fh.read(want)
        if not text:
            self.eof = True
            return False
        self.read += len(text)
        self.buf = self.buf[self.pos:] + text
        self.pos = 0
        if self.progress:
            self.progress(_raw_pos(self.fh))
        return True


def _header(s: _Stream, path: Path) -> dict:
    while '"traceEvents"' not in s.buf:
        if len(s.buf) > HEADER_MAX or not s.refill():
            raise DDProbeError(f"{path}: not a torch-profiler trace (no \"traceEvents\" array)")
    i = s.buf.index('"traceEvents"')
    while "[" not in s.buf[i:]:
        if not s.refill():
            raise DDProbeError(f"{path}: not a torch-profiler trace (\"traceEvents\" is not an array)")
    head = s.buf[:i].strip().rstrip(",").strip()
    s.pos = s.buf.index("[", i) + 1
    if not head.startswith("{"):
        raise DDProbeError(f"{path}: not a torch-profiler trace (not a JSON object)")
    try:
        return json.loads(head + "}") if head != "{" else {}
    except json.JSONDecodeError:
        return {}


def _events(s: _Stream, path: Path, tail: dict) -> Iterator[dict]:
    dec = json.JSONDecoder()
    while True:
        if len(s.buf) - s.pos < CHUNK // 4:
            s.refill()
        s.pos = _SKIP.match(s.buf, s.pos).end()
        if s.pos >= len(s.buf):
            if not s.refill():
                raise DDProbeError(f"{path}: the trace ends inside its traceEvents array (a truncated file)")
            continue
        if s.buf[s.pos] == "]":
            rest = s.buf[s.pos + 1:] + (s.fh.read() or "")
            tail.update(_tail(rest))
            return
        try:
            ev, end = dec.raw_decode(s.buf, s.pos)
        except json.JSONDecodeError as e:
            if s.refill(max(CHUNK, len(s.buf))):
                continue
            raise DDProbeError(f"{path}: not valid JSON at character {s.read - len(s.buf) + e.pos} "
                               "(a truncated or damaged trace)") from None
        s.pos = end
        if isinstance(ev, dict):
            yield ev


def _tail(rest: str) -> dict:
    body = rest.strip().lstrip(",").strip()
    if not body or body == "}":
        return {}
    try:
        doc = json.loads("{" + body)
        return doc if isinstance(doc, dict) else {}
    except json.JSONDecodeError:
        return {}


def _at(ev: dict, key: str) -> float:
    """The event's ``ts`` or ``dur`` in us (ValueError where it is missing, not finite, or a negative duration)."""
    if key not in ev:
        raise ValueError(f"no {key!r}")
    x = _time(ev[key])
    if key == "dur" and x < 0:
        raise ValueError(f"duration {x:g} us is negative")
    return x


def _take(t: Trace, ev: dict, marker: re.Pattern, cpu_ops: bool) -> None:
    cat, ph = ev.get("cat"), ev.get("ph")
    if ph != "X":
        return
    args = ev.get("args") or {}
    if cat in DEVICE_CATS:
        t.kernels.append(Kernel(str(ev.get("name", "")), _at(ev, "ts"), _at(ev, "dur"),
                                int(args.get("stream", 0) or 0), int(args.get("correlation", -1) or -1), cat,
                                _launch_args(args) if cat == "kernel" else None))
    elif cat in LAUNCH_CATS:
        corr = args.get("correlation")
        if corr is not None:
            t.launches[int(corr)] = (_at(ev, "ts"), sys.intern(str(ev.get("name", ""))))
    elif cat in MARKER_CATS and marker.search(str(ev.get("name", ""))):
        t.markers.append((str(ev["name"]), _at(ev, "ts"), _at(ev, "dur"), cat))
    elif cpu_ops and cat == "cpu_op":
        t.cpu_ops.append((sys.intern(str(ev.get("name", ""))), _at(ev, "ts"), _at(ev, "dur"),
                          int(ev.get("tid", 0) or 0)))


def read_trace(path: str | Path, marker: str = r"^ProfilerStep#\d+$", cpu_ops: bool = False,
               progress: Callable[[int], None] | None = None) -> Trace:
    """The kernels, launches and step markers of the trace at ``path`` (``DDProbeError``, one line, when it is not a
    trace, is truncated or damaged)."""
    path = Path(path)
    t, rx, tail = Trace(path), re.compile(marker), {}
    try:
        with _open_text(path) as fh:
            s = _Stream(fh, progress)
            t.header = _header(s, path)
            for ev in _events(s, path, tail):
                t.events += 1
                try:
                    _take(t, ev, rx, cpu_ops)
                except (TypeError, ValueError) as e:
                    raise DDProbeError(f"{path}: event {t.events} ({str(ev.get('name', ''))[:60]!r}) has a field that "
                                       f"is not a number it can be: {e}") from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise DDProbeError(f"{path}: a damaged or truncated gzip file ({e})") from None
    except OSError as e:
        raise DDProbeError(f"{path}: cannot read ({e.strerror or e})") from None
    t.header.update({k: v for k, v in tail.items() if k not in t.header})
    for k in t.kernels:  # names repeat by the thousand: one string object each
        k.name = sys.intern(k.name)
    return t
