"""Find the decode / verify steps of one rank's trace, four ways, the first that works:

1. the server's own step labels (``labels``): SGLang's per-forward spans ``step[TARGET_VERIFY bs=1 g_sq=9 ...
   g_sk=N]`` (its detailed annotations; ``step[DECODE bs=..]``, ``step[EXTEND bs=.. toks=..]`` ...) and vLLM's
   ``execute_context_C(...)_generation_G(...)`` (its detailed trace annotation: ``sq``/``sk`` inside the brackets):
   each step's mode, batch and context from its label; the steps of the main mode (verify, else decode, else the
   most frequent) are measured, the others set apart and said.
2. step markers: ``ProfilerStep#N`` (``torch.profiler``'s ``step()``) or the annotations ``--marker`` names. A
   GPU-side marker (``gpu_user_annotation``) bounds the step on the GPU; a CPU-side one takes the kernels whose launch
   (same correlation id) falls inside it.
3. graph launches: under CUDA graphs each ``cudaGraphLaunch`` replays many kernels that share its correlation id;
   the launches are the units, and the repeating sequence of units is the step.
4. the repeating kernel sequence: with neither, the kernels themselves are the units.

For 3 and 4 the period is the distance between the occurrences of the least frequent unit that recurs at one
regular distance (two occurrences are enough), and the windows start after the largest gap between units at that
period: where the GPU waits between steps, whatever point of a step the profile started at (rotation-invariant). A
window holding n x layers launches of the attention kernel (``layers`` given by ``--model``) is n steps: split at
the largest gap between the launches of layer L and layer 1 (said).
"""
from __future__ import annotations

import bisect
import re
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from ...kernel_classes import classify
from ...units import DDProbeError
from .read import Kernel, Trace

GRAPH_LAUNCH = re.compile(r"^cu(?:da)?GraphLaunch")  # cudaGraphLaunch, cudaGraphLaunch_v10000, cuGraphLaunch_v2
MIN_ALIKE = 0.5  # of the windows at the period, at least this share must hold the same sequence
MIN_COVER = 0.5  # and the windows alike must hold at least this share of the trace's kernel time
SGLANG = re.compile(r"^step\[(?P<mode>[A-Z_]+)\s+bs=(?P<bs>\d+)(?P<rest>[^\]]*)\]$")
VLLM = re.compile(r"^execute_context_(?P<c>\d+)\((?P<cin>[^)]*)\)_generation_(?P<g>\d+)\((?P<gin>[^)]*)\)")
VLLM_OLD = re.compile(r"^execute_new_(?P<new>\d+)_cached_(?P<cached>\d+)$")
MAIN_MODES = ("verify", "decode")  # the mode measured when present, in this order


@dataclass
class Steps:
    method: str  # "labels", "markers", "graph launches" or "repeating kernel sequence"
    detail: str  # one line: what the step is
    steps: list[list[Kernel]]  # each step's kernels, in time order
    graphs: bool = False  # the steps' kernels were replayed from CUDA graphs
    mode: str | None = None  # labels: the mode measured ("verify", "decode", "extend", "mixed")
    contexts: list[int] = field(default_factory=list)  # labels: each measured step's context per request
    batch: int | None = None  # labels: requests per step (the median)
    rows: int | None = None  # labels: query rows per request per step (the median: 1 for plain decode, B+1 verify)
    period_ms: float | None = None  # median start-to-start time of consecutive steps


def find_steps(t: Trace, kernels: list[Kernel], layers: int | None = None) -> Steps:
    """The steps of ``kernels`` (a rank's device work, sorted by start), or ``DDProbeError`` (one line)."""
    graphs = _graph_corrs(t, kernels)
    got = by_labels(t, kernels) or by_markers(t, kernels)
    if got is None:
        units = _units(kernels, graphs)
        what = "graph launches" if graphs else "repeating kernel sequence"
        got = by_repetition(units, what, layers)
        if got is None:
            raise DDProbeError(f"{t.path}: no step markers (ProfilerStep#N), no server step labels and no repeating "
                               f"{'sequence of graph launches' if graphs else 'kernel sequence'}: cannot tell its "
                               "steps apart (profile at least two whole decode steps, or give --marker)")
    got.graphs = bool(graphs)
    starts = [min(k.ts for k in s) for s in got.steps if s]
    if len(starts) > 1:
        got.period_ms = statistics.median(b - a for a, b in zip(starts, starts[1:])) / 1e3
    return got


def _graph_corrs(t: Trace, kernels: list[Kernel]) -> set[int]:
    corr = {c for c, (_, name) in t.launches.items() if GRAPH_LAUNCH.match(name)}
    return corr & {k.corr for k in kernels}


def _windows(kernels: list[Kernel], spans: list[tuple[float, float]], when) -> list[list[Kernel]]:
    out: list[list[Kernel]] = [[] for _ in spans]
    starts = [a for a, _ in spans]
    for k in kernels:
        at = when(k)
        if at is None:
            continue
        i = bisect.bisect_right(starts, at) - 1
        if i >= 0 and at <= spans[i][1]:
            out[i].append(k)
    return out


def _marked(t: Trace, kernels: list[Kernel], marks: list[tuple]) -> tuple[list[list[Kernel]], str, list]:
    """Each mark's kernels: GPU-side marks bound them on the GPU, CPU-side ones by their launch."""
    gpu = sorted((m for m in marks if m[3] == "gpu_user_annotation"), key=lambda m: m[1])
    cpu = sorted((m for m in marks if m[3] == "user_annotation"), key=lambda m: m[1])
    if gpu:
        return _windows(kernels, [(m[1], m[1] + m[2]) for m in gpu], lambda k: k.ts), "GPU-side", gpu

    def launched(k: Kernel) -> float | None:
        got = t.launches.get(k.corr)
        return got[0] if got else (k.ts if k.cat == "cpu_op" else None)
    return _windows(kernels, [(m[1], m[1] + m[2]) for m in cpu], launched), "CPU-side", cpu


def by_markers(t: Trace, kernels: list[Kernel]) -> Steps | None:
    if not t.markers:
        return None
    steps, side, names = _marked(t, kernels, t.markers)
    steps = [s for s in steps if s]
    if not steps:
        return None
    return Steps("markers", f"{len(steps)} of {len(names)} {side} step markers ({names[0][0]} ...) hold kernels",
                 steps)


def parse_label(name: str) -> tuple[str, int, int | None]:
    """(mode, batch, context per request or None) of a server's step label; ``DDProbeError`` when it does not
    parse. Modes: "verify" (SGLang's TARGET_VERIFY), "decode", "extend" (prefill), "mixed", or SGLang's own name
    lower-cased (draft_extend, idle ...)."""
    m = SGLANG.match(name)
    if m:
        mode, bs = m["mode"].lower(), int(m["bs"])
        mode = {"target_verify": "verify"}.get(mode, mode)
        keys = dict(kv.split("=", 1) for kv in m["rest"].split() if "=" in kv)
        sk = keys.get("g_sk") if mode in ("verify", "decode") else keys.get("c_sk")
        if sk is not None and not sk.isdigit():
            raise DDProbeError(f"step label {name[:120]!r}: sk={sk!r} is not a token count")
        return mode, bs, (int(sk) // bs if sk is not None and bs else None)
    m = VLLM.match(name)
    if m:
        c, g = int(m["c"]), int(m["g"])
        mode = "decode" if g and not c else "extend" if c and not g else "mixed"
        sk = re.search(r"sk[=_:]?(\d+)", m["gin"] if g else m["cin"])
        n = g if g else c
        return mode, n, (int(sk.group(1)) // n if sk and n else None)
    m = VLLM_OLD.match(name)
    if m:
        new, cached = int(m["new"]), int(m["cached"])
        return ("decode" if not new else "extend" if not cached else "mixed"), new + cached, None
    raise DDProbeError(f"step label {name[:120]!r} does not parse as SGLang's step[MODE bs=N ...] or vLLM's "
                       "execute_context_C(..)_generation_G(..)")


def label_rows(name: str) -> int | None:
    """Query rows per request of a decode or verify step's label (SGLang's g_sq over bs, vLLM's generation sq over
    its requests), or None where the label does not say."""
    m = SGLANG.match(name)
    if m:
        keys = dict(kv.split("=", 1) for kv in m["rest"].split() if "=" in kv)
        sq, bs = keys.get("g_sq"), int(m["bs"])
        return int(sq) // bs if sq and sq.isdigit() and bs and int(sq) >= bs else None
    m = VLLM.match(name)
    if m and int(m["g"]):
        sq = re.search(r"sq[=_:]?(\d+)", m["gin"])
        return int(sq.group(1)) // int(m["g"]) if sq and int(sq.group(1)) >= int(m["g"]) else None
    return None


def by_labels(t: Trace, kernels: list[Kernel]) -> Steps | None:
    labels = getattr(t, "labels", None)
    if not labels:
        return None
    windows, side, marks = _marked(t, kernels, labels)
    parsed = [(parse_label(m[0]), ks) for m, ks in zip(marks, windows) if ks]
    if not parsed:
        return None
    modes = Counter(p[0] for p, _ in parsed)
    mode = next((m for m in MAIN_MODES if m in modes), modes.most_common(1)[0][0])
    keep = [(p, ks) for p, ks in parsed if p[0] == mode]
    apart = ", ".join(f"{n} {m}" for m, n in modes.items() if m != mode)
    ctxs = [p[2] for p, _ in keep if p[2] is not None]
    batch = int(statistics.median(p[1] for p, _ in keep))
    said = (f"{len(keep)} {mode} steps by the server's {side} step labels ({marks[0][0][:60]} ...)"
            + (f", context {min(ctxs):,}-{max(ctxs):,} tokens" if ctxs else ", no context in the labels")
            + f", batch {batch}" + (f"; set apart: {apart} steps" if apart else ""))
    rows = [label_rows(m[0]) for m, ks in zip(marks, windows) if ks]  # aligned with ``parsed``
    kept_rows = [r for (p, _), r in zip(parsed, rows) if p[0] == mode and r]
    return Steps("labels", said, [ks for _, ks in keep], mode=mode, contexts=ctxs, batch=batch,
                 rows=int(statistics.median(kept_rows)) if kept_rows else None)


def _units(kernels: list[Kernel], graph_corr: set[int]) -> list[tuple[str, list[Kernel]]]:
    """The trace's units in launch order: one per graph launch (all its kernels), one per other kernel."""
    groups: dict[int, list[Kernel]] = defaultdict(list)
    units: list[tuple[str, list[Kernel]]] = []
    for k in kernels:
        if k.corr in graph_corr:
            if k.corr not in groups:
                units.append(("", groups[k.corr]))  # named once complete
            groups[k.corr].append(k)
        else:
            units.append((k.name, [k]))
    for i, (name, ks) in enumerate(units):
        if not name:
            units[i] = (f"graph of {len(ks)} kernels from {ks[0].name}", ks)
    return units


def by_repetition(units: list[tuple[str, list[Kernel]]], what: str, layers: int | None = None) -> Steps | None:
    ids: dict[str, int] = {}
    seq = [ids.setdefault(n, len(ids)) for n, _ in units]
    where: dict[int, list[int]] = defaultdict(list)
    for i, u in enumerate(seq):
        where[u].append(i)
    names = {v: k for k, v in ids.items()}
    gaps = _gaps(units)
    tried: set[tuple] = set()
    for u, pos in sorted(where.items(), key=lambda kv: (len(kv[1]), kv[1][0])):
        if len(pos) < 2:
            continue
        period = _period(pos)
        spacing = (period, tuple(b - a for a, b in zip(pos, pos[1:])))  # anchors spaced alike give the same windows
        if period is None or spacing in tried or 2 * period > len(seq):
            continue
        tried.add(spacing)
        starts = _phase(seq, gaps, period, pos)
        if starts is None or _time_cover(units, starts, period) < MIN_COVER:
            continue  # windows of a layer's kernels (a graph cut by the profile's start): not the step
        steps = [[k for _, ks in units[s:s + period] for k in ks] for s in starts]
        unit = "graph launches" if "graph" in what else "kernels"
        detail = (f"a sequence of {period} {unit} repeats {len(starts)} times (period from {names[u][:60]}; each "
                  f"window starts at {units[starts[0]][0][:60]}, after the largest gap between units)")
        steps, split = _split_by_layers(steps, layers)
        return Steps(what, detail + split, steps)
    return None


def _time_cover(units: list[tuple[str, list[Kernel]]], starts: list[int], period: int) -> float:
    """The share of the trace's kernel time the windows hold."""
    total = sum(k.dur for _, ks in units for k in ks) or 1.0
    return sum(k.dur for s in starts for _, ks in units[s:s + period] for k in ks) / total


def _gaps(units: list[tuple[str, list[Kernel]]]) -> list[float]:
    """gaps[i]: the GPU's wait before unit i (its first kernel's start less the latest end before it)."""
    out, end = [], None
    for _, ks in units:
        a = min(k.ts for k in ks)
        out.append(0.0 if end is None else max(0.0, a - end))
        e = max(k.ts + k.dur for k in ks)
        end = e if end is None else max(end, e)
    return out


def _period(pos: list[int]) -> int | None:
    d = [b - a for a, b in zip(pos, pos[1:])]
    period, n = Counter(d).most_common(1)[0]
    if n < 0.6 * len(d):
        return None  # irregular
    return period


def _phase(seq: list[int], gaps: list[float], period: int, pos: list[int]) -> list[int] | None:
    """The window starts: at each occurrence of the anchor (``pos``) plus the offset whose unit waits longest before
    it (the mean over the occurrences), then the windows alike one of the first three, if they cover enough of the
    trace."""
    n = len(seq)
    mean = []
    for o in range(period):  # the unit o after the anchor, or o - period before it: one place in the step
        g = [gaps[p + d] for p in pos for d in (o, o - period) if 0 < p + d < n]
        mean.append(sum(g) / len(g) if g else -1.0)

    def windows(o: int) -> list[int]:
        starts: list[int] = []
        for p in pos:
            s = p + o
            if s >= 0 and s + period <= n and (not starts or s >= starts[-1] + period):
                starts.append(s)
        return starts

    for o in sorted(range(period), key=lambda o: -mean[o])[:3]:
        starts = max(windows(o), windows(o - period), key=len)
        if len(starts) < 2:
            continue
        best: list[int] = []
        for ref in starts[:3]:  # the windows alike one of the first three (a step may differ in a few kernels)
            alike = [s for s in starts if _alike(seq, ref, s, period)]
            best = alike if len(alike) > len(best) else best
        if len(best) >= 2 and len(best) >= MIN_ALIKE * len(starts):
            return best  # (their cover of the trace's time is checked by the caller)
    return None


def _alike(seq: list[int], a: int, b: int, period: int) -> bool:
    """Two windows hold the same units but for at most 2% of them (a kernel whose name carries a size ...)."""
    differ, allowed = 0, period // 50
    for x, y in zip(seq[a:a + period], seq[b:b + period]):
        if x != y:
            differ += 1
            if differ > allowed:
                return False
    return True


def _split_by_layers(steps: list[list[Kernel]], layers: int | None) -> tuple[list[list[Kernel]], str]:
    """A window with n x ``layers`` launches of its attention kernel is n steps: cut before the launch of each
    n-th layer-1 attention, at the largest gap since the previous attention launch."""
    if not layers or not steps:
        return steps, ""
    ks = sorted(steps[0], key=lambda k: k.ts)
    attn = Counter(k.name for k in ks if classify(k.name).cls == "attention" and
                   classify(k.name).role in ("verify", "decode", ""))
    if not attn:
        return steps, ""
    name, count = attn.most_common(1)[0]
    n = count // layers
    if n < 2 or count % layers:
        return steps, ""
    out = []
    for window in steps:
        out += _cut(sorted(window, key=lambda k: k.ts), name, layers)
    return out, (f"; each window held {count} launches of {name[:40]}, {n} x the model's {layers} layers: split "
                 f"into {n} steps")


def _cut(ks: list[Kernel], name: str, layers: int) -> list[list[Kernel]]:
    at = [i for i, k in enumerate(ks) if k.name == name]
    cuts = [0]
    for j in range(layers, len(at), layers):
        lo, hi = at[j - 1] + 1, at[j]
        best = max(range(lo, hi + 1), key=lambda i: ks[i].ts - max(k.ts + k.dur for k in ks[max(0, lo - 1):i]))
        cuts.append(best)
    cuts.append(len(ks))
    return [ks[a:b] for a, b in zip(cuts, cuts[1:]) if b > a]
