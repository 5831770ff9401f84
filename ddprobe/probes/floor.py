"""Bandwidth floor of a speculative-decoding verify step: the least time physics allows.

floor = max(bytes the step must read / memory bandwidth, FLOPs / tensor rate), per GPU.
With a measured step time: effective bandwidth = bytes / time, gap = time / floor, and
the gap if every one of the ``queries`` verify rows re-read the whole cache (the most
a kernel without row sharing could be excused for).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from ..shapes import DTYPE_BYTES, AttnShape, dtype_name, floor_s
from ..units import DDProbeError

MAX_CTX = 1 << 30  # 1G tokens: far beyond any model; larger is a typo, not a context


@dataclass(frozen=True)
class FloorInput:
    attn: AttnShape
    bw_Bps: float
    queries: int = 9
    tp: int = 1
    kv_dtype: str = "bf16"
    flops_per_s: float | None = None  # None: memory term only
    weights: str | None = None  # a dtype to add the active weights to the bytes read
    active_params: float = 0.0  # parameters one decoded token reads (for ``weights``)

    def __post_init__(self):
        if self.queries < 1:
            raise DDProbeError(f"--queries must be at least 1, got {self.queries}")
        if self.tp < 1:
            raise DDProbeError(f"--tp must be at least 1, got {self.tp}")
        self.attn.check_tp(self.tp)
        if not self.bw_Bps > 0:
            raise DDProbeError("bandwidth must be greater than zero")
        if self.flops_per_s is not None and not self.flops_per_s > 0:
            raise DDProbeError("tensor rate must be greater than zero")
        object.__setattr__(self, "kv_dtype", dtype_name(self.kv_dtype))
        if self.weights is not None:
            object.__setattr__(self, "weights", dtype_name(self.weights))
            if self.active_params <= 0:
                raise DDProbeError("--include-weights needs the model's parameter count")


@dataclass
class FloorRow:
    ctx: int
    kv_B_per_token: float
    kv_GB: float  # latent/KV cache of the context, per GPU
    weights_GB: float
    read_GB: float  # bytes the step must read, per GPU
    attn_GFLOP: float
    mem_floor_ms: float
    compute_floor_ms: float | None
    floor_ms: float
    bound: str  # "memory" or "compute"
    step_ms: float | None = None
    eff_bw_GBps: float | None = None
    gap: float | None = None
    gap_if_rows_reread: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def floor_row(inp: FloorInput, ctx: int, step_ms: float | None = None) -> FloorRow:
    """The floor of one verify step at context ``ctx`` (tokens), per GPU."""
    if ctx < 1:
        raise DDProbeError(f"context must be at least 1 token, got {ctx}")
    if step_ms is not None and step_ms <= 0:
        raise DDProbeError(f"step time must be greater than zero, got {step_ms} ms")
    if ctx > MAX_CTX:
        raise DDProbeError(f"context {ctx} tokens is beyond any model (at most {MAX_CTX})")
    a = inp.attn
    kv_tok = a.kv_bytes_per_token(inp.kv_dtype, inp.tp)
    kv = kv_tok * ctx
    weights = inp.active_params * DTYPE_BYTES[inp.weights] / inp.tp if inp.weights else 0.0
    read = kv + weights
    flops = a.attn_flops_per_token(inp.queries, inp.tp) * ctx
    if inp.weights:
        flops += 2.0 * inp.active_params / inp.tp * inp.queries
    fl, bound = floor_s(read, flops, bw_Bps=inp.bw_Bps, flops_per_s=inp.flops_per_s)
    row = FloorRow(
        ctx=ctx, kv_B_per_token=kv_tok, kv_GB=kv / 1e9, weights_GB=weights / 1e9, read_GB=read / 1e9,
        attn_GFLOP=flops / 1e9, mem_floor_ms=read / inp.bw_Bps * 1e3,
        compute_floor_ms=flops / inp.flops_per_s * 1e3 if inp.flops_per_s else None,
        floor_ms=fl * 1e3, bound=bound,
    )
    if step_ms is not None:
        row.step_ms = step_ms
        row.eff_bw_GBps = read / (step_ms / 1e3) / 1e9
        row.gap = step_ms / row.floor_ms
        reread_s, _ = floor_s(kv * inp.queries + weights, flops, bw_Bps=inp.bw_Bps, flops_per_s=inp.flops_per_s)
        row.gap_if_rows_reread = step_ms / (reread_s * 1e3)
    return row


def floor_table(inp: FloorInput, ctxs: list[int], step_ms: list[float] | None = None) -> list[FloorRow]:
    """One row per context; ``step_ms`` is None, one time for all, or one per context."""
    if step_ms is not None and len(step_ms) not in (1, len(ctxs)):
        raise DDProbeError(f"give one step time or one per context: {len(ctxs)} contexts, {len(step_ms)} times")
    times = [None] * len(ctxs) if step_ms is None else (step_ms * len(ctxs) if len(step_ms) == 1 else step_ms)
    return [floor_row(inp, c, t) for c, t in zip(ctxs, times)]
