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
                         bytes=row.bytes, flops=row.flops, ok=row.ok))
    return out
