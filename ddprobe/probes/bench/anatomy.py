"""Step anatomy: where a verify step's time goes, from step times measured at two or more contexts.

step(ctx) = fixed + marginal x ctx, fitted by least squares with both terms non-negative. The
marginal part is what each extra context token costs (attention over the cache); the fixed part is
what the step costs at no context (weights, MoE experts, launches), to set against the weight floor.
When the per-interval slopes disagree (by more than ``NONLINEAR``) and the points stray from the line by more
than the measurement's noise (``NOISE``) the fit is not linear: the report gives each interval's own marginal cost
and says so. A step time that falls with context by no more than the noise is flat, not an error. The marginal KV bandwidth of an interval =
KV bytes per token x extra tokens / extra time: how fast the step actually reads the added cache.
Stdlib only. Inputs: ``--step-ms`` by hand, commit cells, gpu-util runs (``steps_from_result``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ...schema import parse_rows
from ...timing import NOISE, within_noise
from ...units import DDProbeError, fmt_bandwidth, fmt_tokens

NONLINEAR = 1.25  # largest / smallest interval slope above this: not linear
TOKENS_PER_K = 1024  # "per 1k tokens", as units.py counts 1k


@dataclass
class Interval:
    ctx0: int
    ctx1: int
    ms_per_1k: float  # extra step time per 1k extra tokens
    kv_GBps: float | None  # marginal KV bandwidth (None without KV bytes per token)


@dataclass
class Anatomy:
    ctxs: list[int]
    step_ms: list[float]
    fixed_ms: float  # the fit's intercept (>= 0)
    ms_per_1k: float  # the fit's slope per 1k tokens (>= 0)
    linear: bool
    intervals: list[Interval]
    kv_GBps: float | None  # the fit's marginal KV bandwidth
    bw_GBps: float | None  # the GPU's
    weight_floor_ms: float | None
    longest_ctx: int = 0
    context_ms: float = 0.0  # the fit's context part at the longest context
    dominant: str = ""  # "context" or "fixed"
    verdict: str = ""
    fixed_below_floor: bool = False  # the fit's intercept is below the weight floor: not the fixed cost
    latency_floor_ms: float | None = None  # the step's launches (kernels x least kernel time + syncs): fixed too
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _check(ctxs: list[int], step_ms: list[float]) -> list[tuple[int, float]]:
    if len(ctxs) != len(step_ms):
        raise DDProbeError(f"an anatomy needs one step time per context: {len(ctxs)} contexts, {len(step_ms)} times")
    dup = sorted({c for c in ctxs if ctxs.count(c) > 1})
    if dup:
        raise DDProbeError(f"an anatomy needs one step time per context: {', '.join(fmt_tokens(c) for c in dup)} "
                           "given more than once")
    pts = sorted(zip(ctxs, step_ms))
    if len(pts) < 2:
        raise DDProbeError(f"an anatomy needs step times at two or more contexts, got {len(pts)}")
    for (c0, t0), (c1, t1) in zip(pts, pts[1:]):
        if not within_noise(t0, t1) and t1 < t0:
            raise DDProbeError(f"step times decrease with context ({t0:g} ms at {fmt_tokens(c0)}, {t1:g} ms at "
                               f"{fmt_tokens(c1)}): more than the {NOISE:.0%} a step time moves between runs, so "
                               "not one request's steps, or a measurement went wrong")
    return pts


def fit_line(pts: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares y = a + b x with a, b >= 0 (the two-parameter NNLS: clamp one, refit the other)."""
    n = len(pts)
    sx = sum(x for x, _ in pts)
    sy = sum(y for _, y in pts)
    sxx = sum(x * x for x, _ in pts)
    sxy = sum(x * y for x, y in pts)
    b = (n * sxy - sx * sy) / (n * sxx - sx * sx)
    a = (sy - b * sx) / n
    if a < 0:
        return 0.0, sxy / sxx
    if b < 0:
        return sy / n, 0.0
    return a, b


def _kv_GBps(kv_B_per_token: float | None, ms_per_1k: float) -> float | None:
    if not kv_B_per_token or ms_per_1k <= 0:
        return None
    return kv_B_per_token * TOKENS_PER_K / (ms_per_1k / 1e3) / 1e9


def fit_anatomy(ctxs: list[int], step_ms: list[float], *, kv_B_per_token: float | None = None,
                bw_Bps: float | None = None, weight_floor_ms: float | None = None,
                latency_floor_ms: float | None = None) -> Anatomy:
    """The anatomy of the steps measured at ``ctxs`` (tokens); KV bytes per token per GPU for the
    marginal bandwidth, the GPU's bandwidth, and the step's weight floor and latency floor (its launches) to set
    the fixed part against, when known."""
    pts = _check(list(ctxs), list(step_ms))
    a, b = fit_line(pts)
    ivs = []
    for (c0, t0), (c1, t1) in zip(pts, pts[1:]):
        per_k = max(0.0, (t1 - t0) / (c1 - c0) * TOKENS_PER_K)  # a fall within the noise is flat
        ivs.append(Interval(c0, c1, per_k, _kv_GBps(kv_B_per_token, per_k)))
    slopes = [iv.ms_per_1k for iv in ivs]
    on_line = all(within_noise(t, a + b * c) for c, t in pts)  # every point within the noise of the fit
    linear = len(ivs) == 1 or on_line or (min(slopes) > 0 and max(slopes) / min(slopes) <= NONLINEAR)
    per_k = b * TOKENS_PER_K
    an = Anatomy(ctxs=[c for c, _ in pts], step_ms=[t for _, t in pts], fixed_ms=a, ms_per_1k=per_k, linear=linear,
                 intervals=ivs, kv_GBps=_kv_GBps(kv_B_per_token, per_k), bw_GBps=bw_Bps / 1e9 if bw_Bps else None,
                 weight_floor_ms=weight_floor_ms, latency_floor_ms=latency_floor_ms)
    last_c, last_t = pts[-1]
    an.longest_ctx = last_c
    # at the longest context: the last interval's slope when the fit is not linear (what the step costs there)
    slope = b if linear else ivs[-1].ms_per_1k / TOKENS_PER_K
    an.context_ms = min(last_t, slope * last_c)
    fixed_there = max(0.0, last_t - an.context_ms) if not linear else a
    an.dominant = "context" if an.context_ms >= fixed_there else "fixed"
    if not linear:
        an.notes.append(f"not linear: the marginal cost goes {' -> '.join(f'{s:.3g}' for s in slopes)} ms per 1k "
                        "tokens over the intervals; each interval is reported on its own")
    if weight_floor_ms is not None and a < weight_floor_ms:
        an.fixed_below_floor = True
    an.verdict = _verdict(an, last_t, fixed_there)
    return an


def _verdict(an: Anatomy, last_t: float, fixed_there: float) -> str:
    share = an.context_ms / last_t if last_t else 0.0
    kv = an.intervals[-1].kv_GBps if not an.linear else an.kv_GBps
    bw = (f" at a marginal KV bandwidth of {fmt_bandwidth(kv * 1e9)}"
          + (f", {kv / an.bw_GBps:.2%} of the GPU's {fmt_bandwidth(an.bw_GBps * 1e9)}" if an.bw_GBps else "")
          if kv else "")
    parts = ([f"weight floor {an.weight_floor_ms:.3g} ms"] if an.weight_floor_ms is not None else []) + \
        ([f"launches at least {an.latency_floor_ms:.3g} ms"] if an.latency_floor_ms else [])
    wf = f" ({', '.join(parts)})" if parts else ""
    return _sentence(an, last_t, fixed_there, share, bw, wf) + (
        f" The fitted intercept ({an.fixed_ms:.3g} ms) is below the weight floor ({an.weight_floor_ms:.3g} ms): it is "
        "not the fixed cost (the slope grows with context, or the floor's sharding is wrong: check "
        "--tp/--ep/--weight-dtype/--expert-dtype)." if an.fixed_below_floor else "")


def _sentence(an: Anatomy, last_t: float, fixed_there: float, share: float, bw: str, wf: str) -> str:
    if an.dominant == "context":
        return (f"At {fmt_tokens(an.longest_ctx)} the context-dependent part (attention over the cache) is "
                f"{share:.0%} of the {last_t:.4g} ms step{bw}; the fixed part is {fixed_there:.3g} ms{wf}.")
    return (f"At {fmt_tokens(an.longest_ctx)} the fixed part ({fixed_there:.3g} ms{wf}: weights, experts, launches) "
            f"is {1 - share:.0%} of the {last_t:.4g} ms step; the context-dependent part is "
            f"{an.context_ms:.3g} ms{bw}.")


def steps_from_result(kind: str, rows: list[dict], summary: dict, config: dict) -> list[tuple[int, float]]:
    """(context, step ms) pairs a results file holds: commit cells (``decode_ms_per_step``, novel text first,
    as its steps commit least and read the most per token), a gpu-util run (its decode step at its prompt)."""
    if kind == "commit":  # typed rows (schema.CommitRow): the file's rows were checked when it was loaded
        cells = [r for r in parse_rows(kind, rows, "commit file", config) if r.decode_ms_per_step]
        kinds = {r.text for r in cells}
        pick = "novel" if "novel" in kinds else (sorted(kinds)[:1] or [None])[0]
        return sorted((r.ctx, r.decode_ms_per_step) for r in cells if r.text == pick)
    if kind == "gpu-util" and summary.get("decode_step_ms") and config.get("prompt_len"):
        return [(int(config["prompt_len"]), float(summary["decode_step_ms"]))]
    return []
