"""The facts every part of ddprobe shares, defined once (stdlib only, imports nothing of ddprobe
but its error type): the attention shape of a model and what it costs per token, bytes per
dtype, GPU specs, and the floor of a step.

- ``AttnShape``: MLA (one latent row of kv_lora_rank + qk_rope_head_dim values per token per
  layer, shared by every head; absorbed decode attends over it) or GQA (keys and values of
  ``num_kv_heads`` heads). KV bytes per token and attention FLOPs per context token follow from it.
- ``DTYPE_BYTES``: the one dtype-size table (KV caches, weights, engine dtypes).
- ``GPUS``: datasheet peak bandwidth, dense bf16 tensor rate and last-level cache (L2) size.
- ``KERNEL_TIMES``: the least time one kernel of a step takes per GPU (graph-replayed, eager, a host
  synchronisation): measured by ``ddprobe bench launch`` where a source says so, else a class bound.
- ``floor_s``: max(bytes / bandwidth, FLOPs / tensor rate) and which term wins.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..units import DDProbeError

DTYPE_BYTES: dict[str, float] = {"fp64": 8.0, "fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0,
                                 "int4": 0.5, "fp4": 0.5}
_DTYPE_ALIASES = {"float64": "fp64", "double": "fp64", "float32": "fp32", "float": "fp32",
                  "bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float8_e4m3fn": "fp8",
                  "float8_e5m2": "fp8"}

def dtype_name(name: object) -> str:
    """Canonical short name of a dtype: "bf16" for "bf16", "bfloat16" or torch.bfloat16."""
    key = str(name).strip().lower().removeprefix("torch.")
    key = _DTYPE_ALIASES.get(key, key)
    if key not in DTYPE_BYTES:
        raise DDProbeError(f"unknown dtype {name!r}; known: {', '.join(DTYPE_BYTES)}")
    return key


def dtype_bytes(name: object) -> float:
    """Bytes per value of a dtype (accepts "bf16", "bfloat16", "torch.bfloat16" or a torch dtype)."""
    return DTYPE_BYTES[dtype_name(name)]


def _positive(value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise DDProbeError(f"{what} must be a positive integer, got {value!r}")
    return value


@dataclass(frozen=True)
class AttnShape:
    """What the attention of a model reads and computes per token; nothing else of the model."""

    kind: str  # "mla" or "gqa"
    num_layers: int
    num_heads: int
    kv_lora_rank: int = 0  # MLA: latent width (V of the absorbed form, first part of K)
    qk_rope_head_dim: int = 0  # MLA: rope part of K, shared by all heads
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    num_kv_heads: int = 0  # GQA
    head_dim: int = 0  # GQA

    def __post_init__(self):
        if self.kind not in ("mla", "gqa"):
            raise DDProbeError(f"attention kind must be 'mla' or 'gqa', got {self.kind!r}")
        _positive(self.num_layers, "num_layers")
        _positive(self.num_heads, "num_heads")
        names = ("kv_lora_rank", "qk_rope_head_dim") if self.kind == "mla" else ("num_kv_heads", "head_dim")
        for n in names:
            _positive(getattr(self, n), n)
        if self.kind == "gqa" and self.num_heads % self.num_kv_heads:
            raise DDProbeError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")

    @property
    def kv_row(self) -> int:
        """Values one token stores per layer: 576 for K2 (512 latent + 64 rope); 2 x kv heads x head_dim for GQA."""
        if self.kind == "mla":
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.num_kv_heads * self.head_dim

    @property
    def v_dim(self) -> int:
        """Values per row that are V in the verify kernels (the latent for MLA)."""
        return self.kv_lora_rank if self.kind == "mla" else self.head_dim

    @property
    def rope_dim(self) -> int:
        return self.qk_rope_head_dim if self.kind == "mla" else 0

    @property
    def sm_scale(self) -> float:
        """Softmax scale before any YaRN correction: 1/sqrt(nope + rope) for MLA, 1/sqrt(head_dim) for GQA."""
        d = self.qk_nope_head_dim + self.qk_rope_head_dim if self.kind == "mla" else self.head_dim
        return 1.0 / math.sqrt(d)

    def check_tp(self, tp: int) -> None:
        """Tensor parallel must split the query heads evenly (and GQA's KV heads, or replicate them)."""
        _positive(tp, "tp")
        if self.num_heads % tp:
            raise DDProbeError(f"tp {tp} does not divide the model's {self.num_heads} attention heads")
        if self.kind == "gqa" and self.num_kv_heads % tp and tp % self.num_kv_heads:
            raise DDProbeError(f"tp {tp} neither divides nor is a multiple of the {self.num_kv_heads} KV heads")

    def kv_bytes_per_token(self, dtype: object = "bf16", tp: int = 1, layers: int | None = None) -> float:
        """KV bytes per token held by ONE GPU under tensor parallel ``tp``, over all layers (or ``layers``).

        MLA's latent row is shared by all heads, so every GPU keeps all of it; GQA splits KV heads
        across GPUs (replicated once tp exceeds them)."""
        per_layer = self.kv_row if self.kind == "mla" else 2 * self.head_dim * max(1, self.num_kv_heads // tp)
        return per_layer * dtype_bytes(dtype) * (self.num_layers if layers is None else layers)

    def heads_per_gpu(self, tp: int = 1) -> int:
        return max(1, self.num_heads // tp)

    def attn_flops_per_token(self, rows: int, tp: int = 1, layers: int | None = None) -> float:
        """FLOPs per context token for ``rows`` query rows on one GPU: MLA absorbed decode does a
        kv_row-wide dot (QK) and a latent-wide accumulate (PV) per head; GQA head_dim each."""
        if self.kind == "mla":
            per_head = 2 * self.kv_row + 2 * self.kv_lora_rank
        else:
            per_head = 4 * self.head_dim
        return per_head * self.heads_per_gpu(tp) * rows * (self.num_layers if layers is None else layers)


# Kimi K2.6 / K2 (DeepSeek-V3 architecture with 64 heads).
KIMI_K2 = AttnShape("mla", num_layers=61, num_heads=64, kv_lora_rank=512, qk_rope_head_dim=64,
                    qk_nope_head_dim=128, v_head_dim=128)


def floor_s(nbytes: float, flops: float = 0.0, *, bw_Bps: float, flops_per_s: float | None = None) -> tuple[float, str]:
    """The least time a step can take: max(bytes / bandwidth, FLOPs / tensor rate) in seconds, and
    which term wins ("memory" or "compute"). Without a tensor rate only the memory term counts."""
    if bw_Bps <= 0:
        raise DDProbeError("bandwidth must be greater than zero")
    if flops_per_s is not None and flops_per_s <= 0:
        raise DDProbeError("tensor rate must be greater than zero")
    mem = nbytes / bw_Bps
    comp = flops / flops_per_s if flops_per_s else 0.0
    return (comp, "compute") if comp > mem else (mem, "memory")
