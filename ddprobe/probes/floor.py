"""Bandwidth floor of a speculative-decoding verify step: the least time physics allows.

floor = max(bytes the step must read / memory bandwidth, FLOPs / tensor rate), per GPU.
With a measured step time: effective bandwidth = bytes / time, gap = time / floor, and
the gap if every one of the ``queries`` verify rows re-read the whole cache (the most
a kernel without row sharing could be excused for).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from ..units import DDProbeError
from .models import ModelSpec


@dataclass(frozen=True)
class GpuSpec:
    name: str
    label: str
    bw_Bps: float  # peak memory bandwidth, bytes/s (datasheet)
    bf16_flops: float  # dense bf16 tensor rate, FLOP/s (datasheet, no sparsity)


GPUS: dict[str, GpuSpec] = {g.name: g for g in [
    GpuSpec("rtx-pro-6000", "NVIDIA RTX PRO 6000 Blackwell", 1.792e12, 503.8e12),
    GpuSpec("h100", "NVIDIA H100 SXM", 3.35e12, 989e12),
    GpuSpec("h200", "NVIDIA H200 SXM", 4.8e12, 989e12),
    GpuSpec("b200", "NVIDIA B200", 8.0e12, 2250e12),
    GpuSpec("a100", "NVIDIA A100 80GB SXM", 2.039e12, 312e12),
    GpuSpec("h20", "NVIDIA H20", 4.0e12, 148e12),
    GpuSpec("l40s", "NVIDIA L40S", 0.864e12, 362e12),
    GpuSpec("mi300x", "AMD Instinct MI300X", 5.3e12, 1307e12),
]}

# bytes per parameter for --include-weights
WEIGHT_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5, "fp4": 0.5}
KV_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0}


def get_gpu(name: str) -> GpuSpec:
    key = name.strip().lower()
    if key not in GPUS:
        raise DDProbeError(f"unknown GPU {name!r}; known: {', '.join(GPUS)} (or pass --bw)")
    return GPUS[key]


def gpu_spec_for(name: str | None) -> GpuSpec | None:
    """The preset whose name an NVML device name matches ("NVIDIA H200" -> h200), else None."""
    n = (name or "").lower().replace(" ", "").replace("-", "")
    for key in sorted(GPUS, key=len, reverse=True):  # h200 before h20
        if key.replace("-", "") in n:
            return GPUS[key]
    return None


@dataclass(frozen=True)
class FloorInput:
    model: ModelSpec
    bw_Bps: float
    queries: int = 9
    tp: int = 1
    kv_dtype: str = "bf16"
    flops_per_s: float | None = None  # None: memory term only
    weights: str | None = None  # a WEIGHT_BYTES key to add the active weights to the bytes read

    def __post_init__(self):
        if self.queries < 1:
            raise DDProbeError(f"--queries must be at least 1, got {self.queries}")
        if self.tp < 1:
            raise DDProbeError(f"--tp must be at least 1, got {self.tp}")
        if self.bw_Bps <= 0:
            raise DDProbeError("bandwidth must be greater than zero")
        if self.flops_per_s is not None and self.flops_per_s <= 0:
            raise DDProbeError("tensor rate must be greater than zero")
        if self.kv_dtype not in KV_BYTES:
            raise DDProbeError(f"unknown KV dtype {self.kv_dtype!r}; known: {', '.join(KV_BYTES)}")
        if self.weights is not None and self.weights not in WEIGHT_BYTES:
            raise DDProbeError(f"unknown weight dtype {self.weights!r}; known: {', '.join(WEIGHT_BYTES)}")
        if self.model.attention == "mla" and self.tp > self.model.num_heads:
            raise DDProbeError(f"--tp {self.tp} exceeds the model's {self.model.num_heads} heads")


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
    m = inp.model
    kv_tok = m.kv_bytes_per_token(KV_BYTES[inp.kv_dtype], inp.tp)
    kv = kv_tok * ctx
    weights = m.params(active=True) * WEIGHT_BYTES[inp.weights] / inp.tp if inp.weights else 0.0
    read = kv + weights
    flops = m.attn_flops_per_token(inp.queries, inp.tp) * ctx
    if inp.weights:
        flops += 2.0 * m.params(active=True) / inp.tp * inp.queries
    mem_s = read / inp.bw_Bps
    comp_s = flops / inp.flops_per_s if inp.flops_per_s else None
    floor_s = max(mem_s, comp_s or 0.0)
    row = FloorRow(
        ctx=ctx, kv_B_per_token=kv_tok, kv_GB=kv / 1e9, weights_GB=weights / 1e9, read_GB=read / 1e9,
        attn_GFLOP=flops / 1e9, mem_floor_ms=mem_s * 1e3, compute_floor_ms=None if comp_s is None else comp_s * 1e3,
        floor_ms=floor_s * 1e3, bound="compute" if comp_s and comp_s > mem_s else "memory",
    )
    if step_ms is not None:
        row.step_ms = step_ms
        row.eff_bw_GBps = read / (step_ms / 1e3) / 1e9
        row.gap = step_ms / row.floor_ms
        reread_s = max((kv * inp.queries + weights) / inp.bw_Bps, comp_s or 0.0)
        row.gap_if_rows_reread = step_ms / (reread_s * 1e3)
    return row


def floor_table(inp: FloorInput, ctxs: list[int], step_ms: list[float] | None = None) -> list[FloorRow]:
    """One row per context; ``step_ms`` is None, one time for all, or one per context."""
    if step_ms is not None and len(step_ms) not in (1, len(ctxs)):
        raise DDProbeError(f"give one step time or one per context: {len(ctxs)} contexts, {len(step_ms)} times")
    times = [None] * len(ctxs) if step_ms is None else (step_ms * len(ctxs) if len(step_ms) == 1 else step_ms)
    return [floor_row(inp, c, t) for c, t in zip(ctxs, times)]
