"""Floor of a speculative-decoding verify step: the least time physics allows, per GPU.

The attention floor (``floor_ms``, ``bound``, ``gap``): max(KV bytes / bandwidth, attention FLOPs /
tensor rate). With a measured step time: effective bandwidth = KV bytes / time, gap = time / floor,
and the gap if every one of the ``queries`` verify rows re-read the whole cache.
The whole-step floor (``total_floor_ms``, ``binds``), when the input carries the step's weights
(``ddprobe.step_shape.StepWeights``): max((KV + weight bytes) / bandwidth, all FLOPs / tensor rate),
and which term binds: "KV", "weights" or "compute". A measured step below that floor (``below_floor``) means
the floor's sharding or dtypes are not the server's (``step_shape.BELOW_FLOOR``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from ..shapes import AttnShape, dtype_name, floor_s
from ..step_shape import StepWeights
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
    step: StepWeights | None = None  # the step's weights on one GPU; None: the attention floor only

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


@dataclass
class FloorRow:
    ctx: int
    kv_B_per_token: float
    kv_GB: float  # latent/KV cache of the context, per GPU
    read_GB: float  # bytes the attention must read, per GPU (the KV)
    attn_GFLOP: float
    mem_floor_ms: float
    compute_floor_ms: float | None
    floor_ms: float
    bound: str  # "memory" or "compute"
    step_ms: float | None = None
    eff_bw_GBps: float | None = None
    gap: float | None = None
    gap_if_rows_reread: float | None = None
    # the whole step (None without the step's weights)
    weights_GB: float | None = None  # weights read, routed experts expected under uniform routing
    weights_worst_GB: float | None = None  # every row on different experts
    experts_per_layer: float | None = None  # expected distinct local experts per MoE layer
    experts_worst: int | None = None
    kv_floor_ms: float | None = None
    weight_floor_ms: float | None = None
    weight_floor_worst_ms: float | None = None
    step_GFLOP: float | None = None  # attention over the context + 2 x params x rows
    step_compute_floor_ms: float | None = None
    total_floor_ms: float | None = None
    total_floor_worst_ms: float | None = None
    binds: str | None = None  # "KV", "weights" or "compute"
    total_gap: float | None = None  # step / total floor
    below_floor: bool | None = None  # the step took less than the whole-step floor: the floor's inputs are wrong

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
    read = kv
    flops = a.attn_flops_per_token(inp.queries, inp.tp) * ctx
    fl, bound = floor_s(read, flops, bw_Bps=inp.bw_Bps, flops_per_s=inp.flops_per_s)
    row = FloorRow(
        ctx=ctx, kv_B_per_token=kv_tok, kv_GB=kv / 1e9, read_GB=read / 1e9,
        attn_GFLOP=flops / 1e9, mem_floor_ms=read / inp.bw_Bps * 1e3,
        compute_floor_ms=flops / inp.flops_per_s * 1e3 if inp.flops_per_s else None,
        floor_ms=fl * 1e3, bound=bound,
    )
    if step_ms is not None:
        row.step_ms = step_ms
        row.eff_bw_GBps = read / (step_ms / 1e3) / 1e9
        row.gap = step_ms / row.floor_ms
        reread_s, _ = floor_s(kv * inp.queries, flops, bw_Bps=inp.bw_Bps, flops_per_s=inp.flops_per_s)
        row.gap_if_rows_reread = step_ms / (reread_s * 1e3)
    if inp.step is not None:
        _whole_step(row, inp, kv, flops)
    return row


def _whole_step(row: FloorRow, inp: FloorInput, kv: float, attn_flops: float) -> None:
    w, ms = inp.step, 1e3 / inp.bw_Bps
    flops = attn_flops + w.flops
    row.weights_GB, row.weights_worst_GB = w.total_B / 1e9, w.total_worst_B / 1e9
    row.experts_per_layer, row.experts_worst = w.experts_per_layer, w.experts_worst
    row.kv_floor_ms, row.weight_floor_ms, row.weight_floor_worst_ms = kv * ms, w.total_B * ms, w.total_worst_B * ms
    row.step_GFLOP = flops / 1e9
    row.step_compute_floor_ms = flops / inp.flops_per_s * 1e3 if inp.flops_per_s else None
    total, bound = floor_s(kv + w.total_B, flops, bw_Bps=inp.bw_Bps, flops_per_s=inp.flops_per_s)
    worst, _ = floor_s(kv + w.total_worst_B, flops, bw_Bps=inp.bw_Bps, flops_per_s=inp.flops_per_s)
    row.total_floor_ms, row.total_floor_worst_ms = total * 1e3, worst * 1e3
    row.binds = "compute" if bound == "compute" else ("KV" if kv >= w.total_B else "weights")
    if row.step_ms is not None:
        row.total_gap = row.step_ms / row.total_floor_ms
        row.below_floor = row.total_gap < 1


def floor_table(inp: FloorInput, ctxs: list[int], step_ms: list[float] | None = None) -> list[FloorRow]:
    """One row per context; ``step_ms`` is None, one time for all, or one per context."""
    if step_ms is not None and len(step_ms) not in (1, len(ctxs)):
        raise DDProbeError(f"give one step time or one per context: {len(ctxs)} contexts, {len(step_ms)} times")
    times = [None] * len(ctxs) if step_ms is None else (step_ms * len(ctxs) if len(step_ms) == 1 else step_ms)
    return [floor_row(inp, c, t) for c, t in zip(ctxs, times)]
