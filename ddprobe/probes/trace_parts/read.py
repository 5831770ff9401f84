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
LABEL = re.compile(r"^step\[|^execute_(?:context|new)_")  # a server's step label (trace_parts.steps parses it)
MARKER_NAME_MAX = 1000  # characters of an annotation's name the --marker pattern is matched against


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
    labels: list[tuple[str, float, float, str]] = field(default_factory=list)  # the server's step labels, as markers
    cpu_ops: list[tuple[str, float, float, int]] = field(default_factory=list)  # (name, ts, dur, tid)
    events: int = 0
    launch_configs: dict = field(default_factory=dict)  # each distinct launch tuple once (``_shared``)

    def device(self) -> dict:
        """The first GPU's properties as the trace records them ({} when it holds none); a ``deviceProperties``
        that is not a list of objects, a name that is not text, a count that is not a positive integer: one line
        naming the field."""
        props = self.header.get("deviceProperties") or []
        if not isinstance(props, list) or not all(isinstance(d, dict) for d in props):
            raise DDProbeError(f"{self.path}: deviceProperties is not a list of objects "
                               f"({type(props).__name__}): a damaged trace")
        if not props:
            return {}
        d = props[0]
        if "name" in d and not isinstance(d["name"], str):
            raise DDProbeError(f"{self.path}: deviceProperties[0].name is {d['name']!r}, not a GPU's name")
        for key in ("numSms", "sharedMemPerBlock", "sharedMemPerBlockOptin"):
            v = d.get(key)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 0 < v < 1 << 40):
                raise DDProbeError(f"{self.path}: deviceProperties[0].{key} is {v!r}, not a positive count")
        return d


MARKER_MAX = 200  # characters of a --marker pattern


def check_marker(text: str) -> re.Pattern:
    """``--marker``: a regular expression matched against every annotation's name, so bounded in time: at most
    ``MARKER_MAX`` characters, no repetition inside a repetition (``(a+)+`` and ``(a*)*`` nests backtrack
    exponentially: ``^(a+)+$`` against 30 a's and a b takes minutes) and no alternation inside one (``(a|aa)*$``
    likewise); ``bounded_search`` bounds the rest. One line otherwise."""
    from re import _parser as sre  # the standard library's own parse of the pattern

    if len(text) > MARKER_MAX:
        raise DDProbeError(f"{len(text)} characters, at most {MARKER_MAX}")
    try:
        rx = re.compile(text)
        tree = sre.parse(text)
    except (re.error, RecursionError, OverflowError) as e:
        raise DDProbeError(f"not a regular expression ({e})") from None

    def walk(items, inside: bool) -> None:
        for op, av in items:
            if op in (sre.MAX_REPEAT, sre.MIN_REPEAT, getattr(sre, "POSSESSIVE_REPEAT", None)):
                lo, hi, sub = av
                many = hi is sre.MAXREPEAT or hi > 1
                if many and inside:
                    raise DDProbeError(f"{text!r}: a repetition inside a repetition can take exponential "
                                       "time on a long name; write it without the nesting (e.g. ^(a+)+$ is ^a+$)")
                walk(sub, inside or many)
            elif op == sre.SUBPATTERN:
                walk(av[-1], inside)
            elif op == sre.BRANCH:
                if inside:  # (a|aa)* : the ways to split a name multiply as (a+)+'s do
                    raise DDProbeError(f"{text!r}: an alternation inside a repetition can take exponential time on "
                                       "a long name; write it without the repetition around the alternatives")
                for b in av[1]:
                    walk(b, inside)
            elif op in (sre.ASSERT, sre.ASSERT_NOT):
                walk(av[1], inside)
    walk(tree, False)
    return rx


MARKER_S = 5.0  # the most one annotation's name may take to match --marker


class _Late(Exception):
    pass


def bounded_search(rx: re.Pattern, what: str = "--marker") -> Callable[[str], object]:
    """``rx.search`` bounded in time: a pattern that passes ``check_marker`` may still backtrack polynomially
    (``a*a*a*a*b`` against a long name); past ``MARKER_S`` s on one name it is one line naming the pattern. The bound
    is a SIGALRM timer (the regex engine checks signals), so it holds on the main thread; elsewhere the search is
    plain."""
    import signal
    import threading

    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        return rx.search

    def late(signum, frame):
        raise _Late()

    def search(name: str):
        old = signal.signal(signal.SIGALRM, late)
        signal.setitimer(signal.ITIMER_REAL, MARKER_S)
        try:
            return rx.search(name)
        except _Late:
            raise DDProbeError(f"{what} {rx.pattern!r} took over {MARKER_S:g} s on one annotation name "
                               f"({name[:40]!r}...): a pattern that backtracks; write a simpler one") from None
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
    return search


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


MAX_DUR_US = 3.6e9  # one event longer than an hour is no kernel or step of a decode (typed step times: 1 us - 1 h)
MAX_TS_US = 1e17  # microseconds since 1970 until the year 5138: beyond, no clock wrote it


def _time(v) -> float:
    """A timestamp or duration in us: a finite number (ValueError otherwise; ``_at`` checks its range)."""
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise ValueError(f"{v!r} is not a time")
    x = float(v)
    if x != x or x in (float("inf"), float("-inf")):
        raise ValueError(f"{v!r} is not a finite time")
    return x


def _launch_args(args: dict) -> tuple | None:
    if "grid" not in args:
        return None
    def num(key):  # a figure the profiler computed: a finite number >= 0, else not known
        v = args.get(key)
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1e15
        return v if ok else None

    return (_dims(args.get("grid")), _dims(args.get("block")), num("registers per thread"), num("shared memory"),
            num("blocks per SM"), num("warps per SM"), num("est. achieved occupancy %"))


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
        doc = json.loads(head + "}") if head != "{" else {}
    except (json.JSONDecodeError, RecursionError):
        return {}
    return doc if isinstance(doc, dict) else {}


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
        if not isinstance(ev, dict):
            raise DDProbeError(f"{path}: an event of traceEvents is {type(ev).__name__} {str(ev)[:40]!r}, not an "
                               "object (a damaged trace)")
        yield ev


def _tail(rest: str) -> dict:
    body = rest.strip().lstrip(",").strip()
    if not body or body == "}":
        return {}
    try:
        doc = json.loads("{" + body)
        return doc if isinstance(doc, dict) else {}
    except (json.JSONDecodeError, RecursionError):
        return {}


def _at(ev: dict, key: str) -> float:
    """The event's ``ts`` or ``dur`` in us (ValueError where it is missing, not finite, or a negative duration)."""
    if key not in ev:
        raise ValueError(f"no {key!r}")
    x = _time(ev[key])
    if x < 0:
        raise ValueError(f"{key} {x:g} us is negative")
    if key == "dur" and x > MAX_DUR_US:
        raise ValueError(f"dur {x:g} us is longer than an hour")
    if key == "ts" and x > MAX_TS_US:
        raise ValueError(f"ts {x:g} us is beyond any clock")
    return x


def _shared(t: Trace, launch: tuple | None) -> tuple | None:
    """One tuple object per distinct launch configuration: a kernel launched alike thousands of times keeps a
    reference, not a copy (the largest part of a kernel's memory otherwise)."""
    if launch is None:
        return None
    return t.launch_configs.setdefault(launch, launch)


def _text(ev: dict, key: str) -> str:
    """The event's ``name``, ``cat`` or ``ph``: text ("" when absent; ValueError for a number, a list...)."""
    v = ev.get(key, "")
    if not isinstance(v, str):
        raise ValueError(f"{key} is {type(v).__name__} {str(v)[:40]!r}, not text")
    return v


def _id(args: dict, key: str, default: int) -> int:
    """A stream or correlation id: an integer (a decimal string taken), ``default`` when absent or null."""
    v = args.get(key)
    if v is None:
        return default
    digits = isinstance(v, str) and v.strip().lstrip("-").isdigit()
    if isinstance(v, bool) or not (isinstance(v, int) or digits):
        raise ValueError(f"{key} is {type(v).__name__} {str(v)[:40]!r}, not an id")
    return int(v)


def _take(t: Trace, ev: dict, marker, cpu_ops: bool) -> None:
    cat, ph = _text(ev, "cat"), _text(ev, "ph")
    if ph != "X":
        return
    args = ev.get("args") or {}
    if not isinstance(args, dict):
        raise ValueError(f"args is a {type(args).__name__}, not an object")
    if cat in DEVICE_CATS:
        t.kernels.append(Kernel(_text(ev, "name"), _at(ev, "ts"), _at(ev, "dur"), _id(args, "stream", 0),
                                _id(args, "correlation", -1), cat,
                                _shared(t, _launch_args(args)) if cat == "kernel" else None))
    elif cat in LAUNCH_CATS:
        corr = _id(args, "correlation", -1)
        if "correlation" in args and args["correlation"] is not None:
            t.launches[corr] = (_at(ev, "ts"), sys.intern(_text(ev, "name")))
    elif cat in MARKER_CATS and LABEL.match(name := _text(ev, "name")):
        t.labels.append((name, _at(ev, "ts"), _at(ev, "dur"), cat))
    elif cat in MARKER_CATS and marker(name[:MARKER_NAME_MAX]):
        t.markers.append((name, _at(ev, "ts"), _at(ev, "dur"), cat))
    elif cpu_ops and cat == "cpu_op":
        t.cpu_ops.append((sys.intern(_text(ev, "name")), _at(ev, "ts"), _at(ev, "dur"), _id(ev, "tid", 0)))


def read_trace(path: str | Path, marker: str = r"^ProfilerStep#\d+$", cpu_ops: bool = False,
               progress: Callable[[int], None] | None = None) -> Trace:
    """The kernels, launches and step markers of the trace at ``path`` (``DDProbeError``, one line, when it is not a
    trace, is truncated or damaged)."""
    path = Path(path)
    try:
        rx = check_marker(marker)
    except DDProbeError as e:
        raise DDProbeError(f"--marker: {e}") from None
    search = bounded_search(rx)
    t, tail = Trace(path), {}
    try:
        with _open_text(path) as fh:
            s = _Stream(fh, progress)
            t.header = _header(s, path)
            for ev in _events(s, path, tail):
                t.events += 1
                try:
                    _take(t, ev, search, cpu_ops)
                except DDProbeError:
                    raise
                except (TypeError, ValueError, AttributeError, OverflowError) as e:
                    raise DDProbeError(f"{path}: event {t.events} ({str(ev.get('name', ''))[:60]!r}) has a field that "
                                       f"is not what a trace holds: {e}") from None
    except RecursionError:
        raise DDProbeError(f"{path}: event {t.events + 1} is nested deeper than any trace event (a damaged or "
                           "hostile file)") from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise DDProbeError(f"{path}: a damaged or truncated gzip file ({e})") from None
    except OSError as e:
        raise DDProbeError(f"{path}: cannot read ({e.strerror or e})") from None
    t.header.update({k: v for k, v in tail.items() if k not in t.header})
    for k in t.kernels:  # names repeat by the thousand: one string object each
        k.name = sys.intern(k.name)
    return t
