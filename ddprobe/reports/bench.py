"""Benchmark rows in one shape, whichever writer made them (`ddprobe bench verify` raw or converted).

``entries(result)`` gives one ``Entry`` per typed bench-verify row (``schema.BenchVerifyRow``): kind "layer"
(one verify-attention call, ``us``) or "step" (the whole multi-layer verify step, ``step_ms``), path, context,
heads, GPU, time, kernel floor (``floor_us``), effective bandwidth. Older files' keys (``time_us``, a step's
``floor_ms``) are upgraded when the file is loaded (``schema.upgrade_row``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from ..results import Result
from ..physics.gpus import GpuSpec, gpu_spec_for
from ..physics.step_model import kernel_floor
from ..timing import within_noise
from ..units import fmt_bandwidth, fmt_time, fmt_tokens

BENCH_KINDS = ("bench-verify",)


@dataclass(frozen=True)
class Entry:
    kind: str  # "layer" or "step"
    path: str
    ctx: int
    heads: int | None
    gpu: str | None
    time_us: float | None  # None: the path failed (see error)
    floor_us: float | None
    GBps: float | None
    TFLOPs: float | None
    rel_err: float | None
    error: str | None
    bytes: float | None = None
    flops: float | None = None
    ok: bool | None = None  # the row's output check against the reference (None: not recorded)
    kernel: str | None = None  # the kernel the path ran (split_ws: "cuda" or "tail"), where the row names one

    @property
    def key(self) -> tuple:
        return (self.kind, self.path, self.ctx, self.heads, self.gpu)

    @property
    def fraction_of_floor(self) -> float | None:
        """kernel floor / time: 1.0 is at the kernel floor, 0.01 is 100x off it."""
        if self.time_us and self.floor_us:
            return self.floor_us / self.time_us
        return None

    @property
    def gap(self) -> float | None:
        f = self.fraction_of_floor
        return 1.0 / f if f else None


def _num(v: Any) -> float | None:
    """A finite number, else None (NaN and infinities count as missing)."""
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None


def _first(row: dict, *keys: str, scale: float = 1.0) -> float | None:
    for k in keys:
        v = _num(row.get(k))
        if v is not None:
            return v * scale
    return None


def ceilings(result: Result) -> tuple[float | None, float | None]:
    """Measured (copy GB/s, bf16 matmul TFLOP/s) from the summary, else the config."""
    out = []
    for keys in (("copy_GBps",), ("matmul_TFLOPs", "bf16_mm_TFLOPs")):
        v = None
        for where in (result.summary, result.config, result.config.get("ceilings") or {}):
            v = v if v is not None else (_first(where, *keys) if isinstance(where, dict) else None)
        out.append(v)
    return out[0], out[1]


def bound(e: Entry, copy_GBps: float | None, matmul_TFLOPs: float | None) -> str | None:
    """"bandwidth-bound" or "compute-bound": which term of this entry's kernel floor is larger, over the measured
    ceilings (``physics.step_model.kernel_floor``); None without them or without its bytes and FLOPs."""
    if not (e.bytes and e.flops and copy_GBps and matmul_TFLOPs):
        return None
    return kernel_floor(e.bytes, e.flops, copy_Bps=copy_GBps * 1e9, matmul_flops=matmul_TFLOPs * 1e12).bound


def floor_basis(copy_GBps: float | None, matmul_TFLOPs: float | None) -> str:
    """What a bench file's kernel floors are over, said beside them: its measured ceilings, else (no datasheet to
    recompute them over: ``Floors``) the file's own floor_us, its basis not recorded."""
    if copy_GBps:
        return f"over the measured ceilings, copy {copy_GBps:,.0f} GB/s" + (f" and matmul {matmul_TFLOPs:,.0f} TFLOP/s"
                                                                   if matmul_TFLOPs else "")
    return "the file's own floor_us, its basis not recorded (no ceilings measured in this file)"


@dataclass(frozen=True)
class Floors:
    """Over what a bench file's kernel floors are, said with them (``said``): its measured ceilings (the file's own
    floor_us); without them, the datasheet of the file's GPU (``gpu``), each entry's floor recomputed from its bytes
    and FLOPs by ``physics.step_model.kernel_floor``; without a known GPU, the file's own floor_us, its basis not
    recorded (and no bound named)."""

    copy_GBps: float | None
    matmul_TFLOPs: float | None
    gpu: GpuSpec | None
    said: str

    def entry(self, e: Entry) -> Entry:
        """``e`` with its kernel floor over this basis."""
        if self.copy_GBps or self.gpu is None or not e.bytes:
            return e
        return replace(e, floor_us=kernel_floor(e.bytes, e.flops, bw_Bps=self.gpu.bw_Bps,
                                                flops_per_s=self.gpu.bf16_flops).us)

    def bound(self, e: Entry) -> str | None:
        if self.copy_GBps or self.gpu is None:
            return bound(e, self.copy_GBps, self.matmul_TFLOPs)
        if not (e.bytes and e.flops):
            return None
        return kernel_floor(e.bytes, e.flops, bw_Bps=self.gpu.bw_Bps, flops_per_s=self.gpu.bf16_flops).bound


def floors(result: Result) -> Floors:
    """The kernel floors' basis of a bench file (``Floors``): its ceilings, else its GPU's datasheet, else none."""
    copy, mm = ceilings(result)
    if copy:
        return Floors(copy, mm, None, floor_basis(copy, mm))
    g = gpu_spec_for(gpu_name(result))
    es = entries(result)
    if g is None or not es or not all(e.bytes for e in es if e.time_us):
        return Floors(None, None, None, floor_basis(None, None))
    return Floors(None, None, g, f"over the datasheet ({g.name}: {g.bw_Bps / 1e12:.3g} TB/s, {g.bf16_flops / 1e12:.0f} "
                                 "TFLOP/s; no ceilings measured in this file: recomputed from its bytes and FLOPs)")


def gpu_name(result: Result) -> str | None:
    return result.meta.gpus[0].get("name") if result.meta.gpus else None


def entries(result: Result) -> list[Entry]:
    gpu = gpu_name(result)
    out = []
    for row in result.records:  # typed bench-verify rows: times in us (a whole step in ms), floors in us
        step = (row.kind or "").startswith("step")
        t = row.us if row.us is not None else (row.step_ms * 1e3 if row.step_ms is not None else None)
        t = t or None  # a zero time is no time
        bw = row.GBps
        if bw is None and t and row.bytes:
            bw = row.bytes / (t * 1e-6) / 1e9
        out.append(Entry(kind="step" if step else "layer", path=row.path, ctx=row.ctx, heads=row.heads,
                         gpu=str(row.gpu or gpu or "?"), time_us=t, floor_us=row.floor_us, GBps=bw,
                         TFLOPs=row.TFLOPs, rel_err=row.rel_err,
                         error=row.error or (None if t else "no time recorded"),
                         bytes=row.bytes, flops=row.flops, ok=row.ok, kernel=row.kernel))
    return out


@dataclass(frozen=True)
class Fit:
    """A path's time per layer as a fixed part and a marginal cost, read between the two longest contexts it ran
    with one kernel (split_ws changes kernel with context; the grid fills only from a few thousand tokens, so the
    longest two are where the cost per token is the kernel's own): time(ctx) = fixed + ctx x marginal cost. The
    **fixed part** (``fixed_us``) is that line at no context (``intercept_us``, none where it is below zero):
    launches, the pipeline filling and draining, partials written and merged. The **marginal KV bandwidth**
    (``marginal_GBps``) is the KV bytes of the extra context over the extra time (``marginal_TFLOPs`` its FLOPs over
    it): the rate the kernel streams at, against the copy ceiling (the matmul rate where the kernel floor is
    compute-bound: ``rate_share``). ``note`` says why no line was read (times within the noise of each other, or
    falling with context). Two times 2x apart, each within 2% noise, put the slope within about 10% and the fixed
    part within a few us: loose figures, for finding what dominates."""

    path: str
    heads: int | None
    kernel: str | None
    ctx0: int
    ctx1: int
    time1_us: float  # at ctx1
    floor1_us: float | None  # the kernel floor at ctx1
    bound: str | None  # the kernel floor's bound at ctx1
    intercept_us: float | None = None
    marginal_GBps: float | None = None
    marginal_TFLOPs: float | None = None
    note: str = ""

    @property
    def fixed_us(self) -> float | None:
        return None if self.intercept_us is None else max(0.0, self.intercept_us)


def fits(result: Result) -> list[Fit]:
    """One ``Fit`` per (path, heads, kernel) that ran at two or more contexts (layer entries with a time and bytes
    whose output was not found wrong)."""
    fl = floors(result)
    groups: dict[tuple, list[Entry]] = {}
    for e in entries(result):
        if e.kind == "layer" and e.time_us and e.bytes and e.ok is not False:
            groups.setdefault((e.path, e.heads, e.kernel), []).append(fl.entry(e))
    out = []
    for (path, heads, kernel), es in groups.items():
        by_ctx = {e.ctx: e for e in es}
        if len(by_ctx) < 2:
            continue
        a, b = (by_ctx[c] for c in sorted(by_ctx)[-2:])
        f = Fit(path, heads, kernel, a.ctx, b.ctx, b.time_us, b.floor_us, fl.bound(b))
        dt = b.time_us - a.time_us
        flat = within_noise(a.time_us, b.time_us)
        if flat or dt < 0:
            what = "within the noise of each other" if flat else "falling with context"
            out.append(replace(f, note=f"no fixed part read: its times at {fmt_tokens(a.ctx)} and "
                                       f"{fmt_tokens(b.ctx)} are {what}"))
            continue
        out.append(replace(f, intercept_us=b.time_us - dt * b.ctx / (b.ctx - a.ctx),
                           marginal_GBps=(b.bytes - a.bytes) / (dt * 1e-6) / 1e9,
                           marginal_TFLOPs=((b.flops - a.flops) / (dt * 1e-6) / 1e12
                                            if a.flops and b.flops else None)))
    return sorted(out, key=lambda f: (f.heads or 0, f.path, f.ctx1))


def pct(x: float) -> str:
    """A share as a whole percent, "under 1%" below half a percent."""
    return "under 1%" if x < 0.005 else f"{x:.0%}"


def rate_share(f: Fit, fl: Floors) -> tuple[float, str] | None:
    """The fit's marginal rate over its ceiling and that ceiling's name: TFLOP/s over the matmul rate where its
    kernel floor is compute-bound, else KV bandwidth over copy; the measured ceilings, else the datasheet's (named
    so); None without either."""
    compute = f.bound == "compute-bound" and f.marginal_TFLOPs
    if fl.copy_GBps:
        if compute and fl.matmul_TFLOPs:
            return f.marginal_TFLOPs / fl.matmul_TFLOPs, "matmul"
        return (f.marginal_GBps / fl.copy_GBps, "copy") if f.marginal_GBps and not compute else None
    if fl.gpu is None:
        return None
    if compute:
        return f.marginal_TFLOPs * 1e12 / fl.gpu.bf16_flops, f"the {fl.gpu.name} datasheet's " \
                                                              f"{fl.gpu.bf16_flops / 1e12:.0f} TFLOP/s"
    return f.marginal_GBps * 1e9 / fl.gpu.bw_Bps, f"the {fl.gpu.name} datasheet's {fl.gpu.bw_Bps / 1e12:.3g} TB/s"


def describe(f: Fit, fl: Floors) -> str:
    """One fit in one line: the fixed part, the marginal rate against its ceiling, and which of the two the time
    over the kernel floor is mostly made of."""
    kern = f" ({f.kernel} kernel)" if f.kernel and f.kernel != f.path.split("[")[0] else ""
    head = f"{f.heads} heads, {f.path}{kern}, {fmt_tokens(f.ctx0)} -> {fmt_tokens(f.ctx1)}: "
    if f.fixed_us is None:
        return head + f.note
    share = rate_share(f, fl)
    of = f" ({pct(share[0])} of {share[1]})" if share else ""
    rate = (f"marginal rate {f.marginal_TFLOPs:,.0f} TFLOP/s{of}" if f.bound == "compute-bound" and f.marginal_TFLOPs
            else f"marginal KV bandwidth {fmt_bandwidth(f.marginal_GBps * 1e9)}{of}")
    fixed = (f"fixed part {fmt_time(f.fixed_us * 1e-6)} ({pct(f.fixed_us / f.time1_us)} of its "
             f"{fmt_time(f.time1_us * 1e-6)} at {fmt_tokens(f.ctx1)})" if f.fixed_us > 0 else
             f"no fixed part (the line through both times is {fmt_time(f.intercept_us * 1e-6)} at no context)")
    line = f"{fixed}, {rate}"
    if f.floor1_us and f.time1_us > f.floor1_us:
        over = f.time1_us - f.floor1_us
        streaming = max(0.0, over - f.fixed_us)
        most = "the fixed part" if f.fixed_us >= streaming else "the marginal rate"
        line += f"; of its {fmt_time(over * 1e-6)} over the kernel floor, most is {most}"
    return head + line


def fit_lines(result: Result) -> list[str]:
    """``describe`` of every fit of a bench file (what ``bench verify`` prints after its table)."""
    fl = floors(result)
    return [describe(f, fl) for f in fits(result)]
