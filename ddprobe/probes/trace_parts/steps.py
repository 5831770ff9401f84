"""Find the decode / verify steps of one rank's trace, three ways, the first that works:

1. step markers: ``ProfilerStep#N`` (``torch.profiler``'s ``step()``: ``ddprobe serve`` steps once per verify step;
   SGLang 0.5.14's profiler never calls it, so its traces are read by 2 or 3) or the annotations ``--marker`` names. A GPU-side marker (``gpu_user_annotation``)
   bounds the step on the GPU; a CPU-side one takes the kernels whose launch (same correlation id) falls inside it.
2. graph launches: under CUDA graphs each ``cudaGraphLaunch`` replays many kernels that share its correlation id;
   the launches are the units, and the repeating sequence of units is the step (one graph, or a draft and a verify
   graph per step).
3. the repeating kernel sequence: with neither, the kernels themselves are the units.

For 2 and 3 the step is the window that repeats: the least frequent unit whose occurrences come at one regular
distance, with at least two windows alike that together cover half the trace or more, anchors it.
"""
from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass

from ...units import DDProbeError
from .read import Kernel, Trace

GRAPH_LAUNCH = re.compile(r"^cu(?:da)?GraphLaunch")  # cudaGraphLaunch, cudaGraphLaunch_v10000, cuGraphLaunch_v2
MIN_ALIKE = 0.5  # of the windows at the modal distance, at least this share must hold the same sequence
MIN_COVER = 0.5  # and the windows alike must cover at least this share of the trace's units


@dataclass
class Steps:
    method: str  # "markers", "graph launches" or "repeating kernel sequence"
    detail: str  # one line: what the step is
    steps: list[list[Kernel]]  # each step's kernels, in time order


def find_steps(t: Trace, kernels: list[Kernel]) -> Steps:
    """The steps of ``kernels`` (a rank's device work, sorted by start), or ``DDProbeError`` (one line)."""
    got = by_markers(t, kernels)
    if got is not None:
        return got
    units, graphs = _units(t, kernels)
    what = "graph launches" if graphs else "repeating kernel sequence"
    got = by_repetition(units, what)
    if got is None:
        raise DDProbeError(f"{t.path}: no step markers (ProfilerStep#N) and no repeating "
                           f"{'sequence of graph launches' if graphs else 'kernel sequence'}: cannot tell its steps "
                           "apart (profile at least two decode steps, or give --marker)")
    return got


def by_markers(t: Trace, kernels: list[Kernel]) -> Steps | None:
    gpu = sorted((m for m in t.markers if m[3] == "gpu_user_annotation"), key=lambda m: m[1])
    cpu = sorted((m for m in t.markers if m[3] == "user_annotation"), key=lambda m: m[1])
    if len(gpu) >= 1:
        steps = _windows(kernels, [(m[1], m[1] + m[2]) for m in gpu], lambda k: k.ts)
        side = "GPU-side"
    elif len(cpu) >= 1:
        def launched(k: Kernel) -> float | None:
            got = t.launches.get(k.corr)
            return got[0] if got else (k.ts if k.cat == "cpu_op" else None)
        steps = _windows(kernels, [(m[1], m[1] + m[2]) for m in cpu], launched)
        side = "CPU-side"
    else:
        return None
    steps = [s for s in steps if s]
    if not steps:
        return None
    names = (gpu or cpu)
    return Steps("markers", f"{len(steps)} of {len(names)} {side} step markers ({names[0][0]} ...) hold kernels",
                 steps)


def _windows(kernels: list[Kernel], spans: list[tuple[float, float]], when) -> list[list[Kernel]]:
    out: list[list[Kernel]] = [[] for _ in spans]
    starts = [a for a, _ in spans]
    import bisect

    for k in kernels:
        at = when(k)
        if at is None:
            continue
        i = bisect.bisect_right(starts, at) - 1
        if i >= 0 and at <= spans[i][1]:
            out[i].append(k)
    return out


def _units(t: Trace, kernels: list[Kernel]) -> tuple[list[tuple[str, list[Kernel]]], bool]:
    """The trace's units in launch order: one per graph launch (all its kernels), one per other kernel."""
    groups: dict[int, list[Kernel]] = defaultdict(list)
    graph_corr = {c for c, (_, name) in t.launches.items() if GRAPH_LAUNCH.match(name)}
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
    return units, bool(graph_corr & {k.corr for k in kernels})


def by_repetition(units: list[tuple[str, list[Kernel]]], what: str) -> Steps | None:
    ids: dict[str, int] = {}
    seq = [ids.setdefault(n, len(ids)) for n, _ in units]
    where: dict[int, list[int]] = defaultdict(list)
    for i, u in enumerate(seq):
        where[u].append(i)
    names = {v: k for k, v in ids.items()}
    for u, pos in sorted(where.items(), key=lambda kv: (len(kv[1]), kv[1][0])):
        if len(pos) < 3:  # two windows need three occurrences (the last closes the second)
            continue
        got = _regular(seq, pos)
        if got is None:
            continue
        period, starts = got
        steps = [[k for _, ks in units[s:s + period] for k in ks] for s in starts]
        return Steps(what, f"a sequence of {period} {'graph launches' if 'graph' in what else 'kernels'} repeats "
                           f"{len(starts)} times (anchored at {names[u][:80]})", steps)
    return None


def _regular(seq: list[int], pos: list[int]) -> tuple[int, list[int]] | None:
    gaps = [b - a for a, b in zip(pos, pos[1:])]
    period, n = Counter(gaps).most_common(1)[0]
    if n < 2 or n < 0.6 * len(gaps) or (n + 1) * period < MIN_COVER * len(seq):
        return None  # irregular, or windows too short to be the step: no need to compare them
    starts = [a for a, g in zip(pos, gaps) if g == period]
    if pos[-1] + period <= len(seq):  # the last occurrence opens a window too when the trace holds all of it
        starts.append(pos[-1])
    shapes = Counter(tuple(seq[s:s + period]) for s in starts)
    shape, alike = shapes.most_common(1)[0]
    if alike < 2 or alike < MIN_ALIKE * len(starts) or alike * period < MIN_COVER * len(seq):
        return None  # a local repetition (a layer's few kernels, a burst) is not the step
    return period, [s for s in starts if tuple(seq[s:s + period]) == shape]
