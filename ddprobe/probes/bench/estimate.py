"""How long a probe run will take, from a short calibration on the backend itself.

The cost model (fitted on the calibration, then summed over the run's cells):

- **prefill**: the cumulative cost of putting n prompt tokens into the cache is ``T(n) = a*n + b*n**2``.
  The linear term is the per-token work (projections, MLP, the drafter's context); the quadratic term is
  attention, which is quadratic in the prompt: token i attends to the i tokens before it, so n tokens cost
  about n**2 / 2 score rows. A request also pays a fixed ``c`` (launches, the first token's pick). A prompt
  whose first ``kept`` tokens are reused from the previous request (prefix reuse) costs
  ``c + T(n) - T(kept)``: the tokens it prefills attend to the kept ones too.
- **decode**: each verify step costs ``s0 + s1 * ctx``: it reads the whole cache once, so it grows linearly
  with the context; a cell takes ceil((max_new_tokens - 1) / commit) steps (the first token comes from the
  prefill), with the commit length guessed per text kind (``COMMIT_GUESS``).
- **prefix reuse**: the commit probe runs the cells of one text kind in increasing context order, each
  reusing the previous prompt (``commit.cell_order``), so a kind's prefill work adds up to T(longest).

Every coefficient is fitted non-negative (a negative slope from timing noise would promise time back).
The calibration (``calibrate``) runs after the warm-up and outside every measured cell: two requests of a
short novel prompt (n/4 and n tokens, n = ``CALIBRATION_TOKENS`` capped by the run's longest context) and a few
decode steps each; on the CPU the longer one's prefill chunks (the engine's ``on_prefill``) add points. It
took 0.85 s with the tiny preset on this project's 2-core CPU, and `ddprobe commit --ctx 1k,8k,32k` was then
estimated at 67 s (prefill 57 s, decode 11 s) against 69 s measured (58 s, 11 s). It is an extrapolation:
a CPU busy with other work during the calibration (or only during the run) moves it by as much, and far
beyond the calibration (128k from 4k) memory effects the model does not know make long prefills slower than
quadratic. ``Estimate.line`` says it only when the run is expected to take longer than ``SAY_OVER_S`` (30 s):
a short run needs no warning. The results file keeps the estimate (config ``estimate``, with the calibration
points and fits) and what the cells took (summary ``timing``), so it can be checked.

Pure functions (``fit_prefill``, ``fit_decode``, ``estimate_cells``) hold the math; nothing here imports torch.
"""
from __future__ import annotations

import itertools
import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

SAY_OVER_S = 30.0  # the estimate is printed only for runs expected to take longer than this
CALIBRATION_TOKENS = 4096  # the longer calibration prompt (capped by the run's longest context)
CALIBRATION_NEW = 6  # tokens decoded per calibration request (about 5 verify steps on novel text)
# tokens committed per verify step, guessed per text kind; "predictable" commits what a step can (a block).
# novel: about 1.5 with a trained drafter; recall: 4 (a drafter that finds the passage commits 5-6; the tiny
# pair, whose target does not copy it back, commits 1.6-4.6: docs/tiny-model.md).
COMMIT_GUESS = {"novel": 1.5, "recall": 4.0}
CALIBRATION_SEED_OFFSET = 104_729  # calibration text differs from every measured prompt (no shared prefix)

# What a GPU took for the same work, where ddprobe has a recorded run (so a CPU run can say what it would
# cost there): the tiny preset on one H200, bf16, graphs, the prefill path (the script and its results,
# benchmarks/results/tiny_long_h200_2026-12-01/, are on the lab branch at the tag lab-2026-12-03, not on main):
# prefill s per prompt, step s.
GPU_RECORDED = {
    "tiny": {"gpu": "an H200", "prefill": [(1024, 0.01), (16384, 0.06), (65536, 0.07), (131072, 0.21),
                                          (262144, 0.73)], "step_s": 3.0e-3},
}


# ---- the fits (pure) ----------------------------------------------------------------------------
def _solve(a: list[list[float]], y: list[float]) -> list[float] | None:
    """Least squares through the normal equations (a few columns, scaled); None when singular."""
    k = len(a[0])
    scale = [max(abs(r[j]) for r in a) or 1.0 for j in range(k)]
    rows = [[r[j] / scale[j] for j in range(k)] for r in a]
    m = [[sum(r[i] * r[j] for r in rows) for j in range(k)] + [sum(r[i] * v for r, v in zip(rows, y))]
         for i in range(k)]
    for i in range(k):  # Gauss-Jordan with partial pivoting
        p = max(range(i, k), key=lambda r: abs(m[r][i]))
        if abs(m[p][i]) < 1e-12:
            return None
        m[i], m[p] = m[p], m[i]
        for r in range(k):
            if r != i:
                f = m[r][i] / m[i][i]
                m[r] = [x - f * z for x, z in zip(m[r], m[i])]
    return [m[i][k] / m[i][i] / scale[i] for i in range(k)]


def nonneg_lstsq(columns: Sequence[Callable[[float], float]], xs: Sequence[float], ys: Sequence[float]) \
        -> list[float]:
    """Least-squares coefficients of ``y = sum(coef_j * column_j(x))``, every coefficient >= 0: the best
    of the fits over every subset of the columns whose coefficients all come out non-negative (a handful of
    columns: exhaustive is exact and cheap). Columns left out get 0."""
    k, best, best_err = len(columns), [0.0] * len(columns), sum(v * v for v in ys)
    for size in range(1, k + 1):
        for subset in itertools.combinations(range(k), size):
            if len(xs) < size:
                continue
            coef = _solve([[columns[j](x) for j in subset] for x in xs], list(ys))
            if coef is None or min(coef) < 0:
                continue
            full = [0.0] * k
            for j, c in zip(subset, coef):
                full[j] = c
            err = sum((y - sum(c * col(x) for c, col in zip(full, columns))) ** 2 for x, y in zip(xs, ys))
            if err < best_err - 1e-18:
                best, best_err = full, err
    return best


@dataclass(frozen=True)
class PrefillFit:
    """Prefill seconds: ``c`` per request, ``a`` per token, ``b`` per token squared (attention)."""

    c: float
    a: float
    b: float

    def cumulative(self, n: float) -> float:
        """T(n): the work of putting n tokens into an empty cache, fixed cost excluded."""
        return self.a * n + self.b * n * n

    def seconds(self, total: int, kept: int = 0) -> float:
        """One request prefilling ``total`` prompt tokens of which the first ``kept`` are reused."""
        return self.c + self.cumulative(total) - self.cumulative(min(kept, total))


@dataclass(frozen=True)
class DecodeFit:
    """Verify-step seconds: ``s0 + s1 * ctx`` (each step reads the whole cache once)."""

    s0: float
    s1: float

    def step(self, ctx: float) -> float:
        return self.s0 + self.s1 * ctx


def fit_prefill(points: Sequence[tuple[float, float]]) -> PrefillFit:
    """Fit ``seconds = c + a*n + b*n**2`` (all >= 0) to (prompt tokens, prefill seconds) points."""
    if not points:
        raise ValueError("fit_prefill needs at least one (tokens, seconds) point")
    xs, ys = [float(n) for n, _ in points], [float(s) for _, s in points]
    c, a, b = nonneg_lstsq([lambda n: 1.0, lambda n: n, lambda n: n * n], xs, ys)
    return PrefillFit(c=c, a=a, b=b)


def fit_decode(points: Sequence[tuple[float, float]]) -> DecodeFit:
    """Fit ``step seconds = s0 + s1*ctx`` (both >= 0) to (context tokens, step seconds) points."""
    if not points:
        raise ValueError("fit_decode needs at least one (context, step seconds) point")
    xs, ys = [float(n) for n, _ in points], [float(s) for _, s in points]
    s0, s1 = nonneg_lstsq([lambda n: 1.0, lambda n: n], xs, ys)
    return DecodeFit(s0=s0, s1=s1)


def commit_guess(kind: str, max_commit: int) -> float:
    """Tokens a verify step commits, guessed: a whole step's worth on predictable text, COMMIT_GUESS else."""
    return float(max_commit) if kind == "predictable" else min(COMMIT_GUESS.get(kind, 1.5), float(max_commit))


def decode_steps(max_new_tokens: int, commit: float) -> int:
    """Verify steps to decode ``max_new_tokens`` (the first token comes from the prefill)."""
    return max(1, math.ceil((max_new_tokens - 1) / max(commit, 1.0)))


def estimate_cells(cells: Sequence[tuple[str, int, int]], max_new_tokens: int, prefill: PrefillFit,
                   decode: DecodeFit, max_commit: int) -> tuple[float, float]:
    """(prefill seconds, decode seconds) of ``cells``: (kind, prompt tokens, tokens reused from the previous
    request), in run order."""
    pre = dec = 0.0
    for kind, ctx, kept in cells:
        pre += prefill.seconds(ctx, kept)
        steps = decode_steps(max_new_tokens, commit_guess(kind, max_commit))
        # the context grows by the committed tokens while decoding: the mean step sees half of them
        dec += steps * decode.step(ctx + max_new_tokens / 2)
    return pre, dec


def reuse_plan(order: Sequence[tuple[str, int]], reuse: bool = True) -> list[tuple[str, int, int]]:
    """(kind, ctx, kept): with prefix reuse a cell keeps the previous cell's prompt when both are of one
    kind and the previous is shorter (a shorter prompt of a kind is a prefix of a longer one; recall's
    closing request is a few tokens the model does not count)."""
    cells, prev = [], None
    for kind, ctx in order:
        kept = prev[1] if reuse and prev is not None and prev[0] == kind and prev[1] <= ctx else 0
        cells.append((kind, ctx, kept))
        prev = (kind, ctx)
    return cells


# ---- formatting ---------------------------------------------------------------------------------
def fmt_duration(seconds: float) -> str:
    """42 -> '42 s', 754 -> '13 min', 9000 -> '2.5 h' (an estimate: two significant figures at most)."""
    if seconds < 60:
        return f"{max(seconds, 1):.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.2g} h"


# ---- the estimate of one run --------------------------------------------------------------------
@dataclass
class Calibration:
    """What the calibration measured and the fits it gave."""

    prefill_points: list[tuple[int, float]]
    decode_points: list[tuple[int, float]]
    prefill: PrefillFit
    decode: DecodeFit
    seconds: float
    device: str | None = None


@dataclass
class Estimate:
    prefill_s: float
    decode_s: float
    device: str | None = None
    calibration: Calibration | None = None
    cells: list[tuple[str, int, int]] = field(default_factory=list)
    max_new_tokens: int = 0
    gpu_s: float | None = None  # the same run on a recorded GPU, where ddprobe has one (a CPU run's hint)
    gpu_name: str | None = None
    reuse: bool = False  # cells reuse the previous prompt's cache (the estimate counted only the new tokens)
    threads: int | None = None  # CPU threads the calibration ran with (and the run will: the estimate assumes it)

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_s

    def plus(self, other: "Estimate | None") -> "Estimate":
        """This run followed by ``other`` (same device and calibration; cells concatenated)."""
        if other is None:
            return self
        gpu = self.gpu_s + other.gpu_s if self.gpu_s is not None and other.gpu_s is not None else None
        return Estimate(prefill_s=self.prefill_s + other.prefill_s, decode_s=self.decode_s + other.decode_s,
                        device=self.device, calibration=self.calibration, cells=self.cells + other.cells,
                        max_new_tokens=self.max_new_tokens, gpu_s=gpu, gpu_name=self.gpu_name if gpu else None,
                        reuse=self.reuse, threads=self.threads)

    def line(self, threshold_s: float | None = None) -> str | None:
        """One line for the user, or None when the run should take no longer than ``threshold_s`` (default
        ``SAY_OVER_S``, 30 s)."""
        if self.total_s <= (SAY_OVER_S if threshold_s is None else threshold_s):
            return None
        dev = self.device or ""
        threads = f" with {self.threads} thread{'s' if self.threads != 1 else ''}" if self.threads else ""
        where = f"on this CPU{threads}" if dev == "cpu" else "on this GPU" if dev.startswith("cuda") else \
            f"on {dev}" if dev else "here"
        s = (f"estimate: about {fmt_duration(self.total_s)} {where} (prefill {fmt_duration(self.prefill_s)}, "
             f"decode {fmt_duration(self.decode_s)})")
        if self.gpu_s is not None:
            s += (f"; on a GPU about {fmt_duration(self.gpu_s)} ({self.gpu_name}, as recorded)" if self.gpu_s >= 60
                  else f"; a GPU would take under a minute ({self.gpu_name}: about {fmt_duration(self.gpu_s)})")
        return s

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"total_s": self.total_s, "prefill_s": self.prefill_s, "decode_s": self.decode_s,
                             "device": self.device, "printed_over_s": SAY_OVER_S, "reuse_prefix": self.reuse, "commit_guess": dict(COMMIT_GUESS),
                             "cells": [list(c) for c in self.cells], "max_new_tokens": self.max_new_tokens,
                             "threads": self.threads}
        if self.calibration is not None:
            c = self.calibration
            d["calibration"] = {"seconds": c.seconds, "prefill_points": [list(p) for p in c.prefill_points],
                                "decode_points": [list(p) for p in c.decode_points],
                                "prefill_fit": asdict(c.prefill), "decode_fit": asdict(c.decode)}
        if self.gpu_s is not None:
            d["gpu_s"], d["gpu"] = self.gpu_s, self.gpu_name
        return d


def timing_block(actual_s: float | None, est: Estimate | None, **measured: Any) -> dict[str, Any]:
    """A results file's summary ``timing``, one shape for every command: what the run took (``actual_s``, and
    what else the caller ``measured``) next to what the estimate said (None where there was none)."""
    return {"actual_s": actual_s, **measured,
            "estimate_s": est.total_s if est is not None else None,
            "estimate_prefill_s": est.prefill_s if est is not None else None,
            "estimate_decode_s": est.decode_s if est is not None else None}


def _median_step(st) -> float | None:
    times = list(st.step_times_s or [])
    if not times and st.decode_s and st.verify_steps:
        return st.decode_s / st.verify_steps
    return statistics.median(times) if times else None


def calibrate(backend, longest: int, seed: int = 0, tokens: int = CALIBRATION_TOKENS,
              new_tokens: int = CALIBRATION_NEW) -> Calibration | None:
    """Time two short requests on ``backend`` (prompts of n/4 and n novel tokens, n = min(tokens, longest),
    ``new_tokens`` decoded each): prefill points (with, on the CPU, one per prefill chunk of the longer
    request, from the engine's ``on_prefill`` hook) and per-step decode times at both contexts. None for a
    backend that does not report prefill and decode times apart (the HTTP servers)."""
    from ..commit import accepts, prompt_ids

    if not hasattr(backend, "warmup"):  # a server: its prefix cache and other clients make a short run unreliable
        return None
    n = max(16, min(tokens, longest))
    device = str(backend.describe().get("device", "")) or None
    t_start = time.perf_counter()
    prefill_pts: list[tuple[int, float]] = []
    decode_pts: list[tuple[int, float]] = []
    for size in (max(8, n // 4), n):
        ids = prompt_ids(backend, "novel", size, seed + CALIBRATION_SEED_OFFSET)
        marks: list[tuple[int, float]] = []
        kw: dict[str, Any] = {}
        if accepts(backend.generate, "on_prefill"):
            kw["on_prefill"] = lambda done, total: marks.append((done, time.perf_counter()))
        if accepts(backend.generate, "reuse_prefix"):
            kw["reuse_prefix"] = False
        st = backend.generate(ids, new_tokens, **kw)
        if st.prefill_s is None:
            return None
        prefill_pts.append((len(ids), st.prefill_s))
        # per-chunk marks are host times: they are the device's only where the host waits for it (the CPU)
        if device == "cpu" and len(marks) > 2 and marks[0][0] == 0:
            prefill_pts += [(d, t - marks[0][1]) for d, t in marks[1:-1] if 0 < d < len(ids)]
        step = _median_step(st)
        if step is not None:
            decode_pts.append((len(ids), step))
    if not decode_pts:
        return None
    return Calibration(prefill_points=prefill_pts, decode_points=decode_pts, prefill=fit_prefill(prefill_pts),
                       decode=fit_decode(decode_pts), seconds=time.perf_counter() - t_start, device=device)


def gpu_recorded(preset: str | None, cells, max_new_tokens: int, max_commit: int) -> tuple[float, str] | None:
    """(seconds, GPU) the same cells took on a GPU ddprobe has a recorded run of, for this preset."""
    rec = GPU_RECORDED.get(preset or "")
    if rec is None:
        return None
    pre, dec = estimate_cells(cells, max_new_tokens, fit_prefill(rec["prefill"]), DecodeFit(rec["step_s"], 0.0),
                              max_commit)
    return pre + dec, rec["gpu"]


def estimate_run(backend, order: Sequence[tuple[str, int]], max_new_tokens: int, seed: int = 0,
                 reuse: bool | None = None, calibration: Calibration | None = None) -> Estimate | None:
    """The estimate of a run of ``order`` ((kind, ctx) cells in run order) on ``backend``, calibrating it
    first unless ``calibration`` is given; None where the backend cannot be calibrated. ``reuse`` (default:
    what the backend says, ``reuses_prefix``): whether each cell reuses the previous prompt's cache."""
    if not order:
        return None
    if reuse is None:
        reuse = bool(getattr(backend, "reuses_prefix", False))
    cal = calibration or calibrate(backend, max(c for _, c in order), seed)
    if cal is None:
        return None
    max_commit = backend.max_commit() if hasattr(backend, "max_commit") else 1
    cells = reuse_plan(order, reuse)
    pre, dec = estimate_cells(cells, max_new_tokens, cal.prefill, cal.decode, max_commit)
    threads = (backend.describe().get("threads") or {}).get("threads") if cal.device == "cpu" else None
    est = Estimate(prefill_s=pre, decode_s=dec, device=cal.device, calibration=cal, cells=cells,
                   max_new_tokens=max_new_tokens, reuse=reuse, threads=threads)
    if cal.device == "cpu":
        gpu = gpu_recorded(backend.describe().get("preset"), cells, max_new_tokens, max_commit)
        if gpu is not None:
            est.gpu_s, est.gpu_name = gpu
    return est
