"""Shared host-side checks and flags for the Triton verify paths (no triton import)."""
from __future__ import annotations

import math
import os

import torch

MAX_ROWS = 64  # fast paths take up to 64 query rows (budget 63); larger R goes to reference
MOE_MAX_ROWS = 64  # rows per call of the fused MoE (kernels/moe_fused.py: its padded row tile); more take grouped
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def interpreting() -> bool:
    """True under Triton's CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def is_pow2(x: int) -> bool:
    return x >= 1 and (x & (x - 1)) == 0


def next_pow2(x: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, x))))


def check_rows(r: int, path: str) -> None:
    if r > MAX_ROWS:
        raise ValueError(f"the {path} path takes at most {MAX_ROWS} query rows (budget {MAX_ROWS - 1}), got {r}; use 'reference' for larger R")


def check_dims(q: torch.Tensor, kv: torch.Tensor, v_dim: int, path: str) -> int:
    """Validate dtypes/dims; return rope_dim."""
    d = q.shape[2]
    pe = d - v_dim
    if not (is_pow2(v_dim) and v_dim >= 16 and is_pow2(pe) and pe >= 16):
        raise ValueError(f"the {path} path needs v_dim and rope_dim powers of two >= 16, got {v_dim} + {pe}")
    if q.dtype not in DTYPES or kv.dtype != q.dtype:
        raise ValueError(f"the {path} path needs q and kv of one dtype among fp16/bf16/fp32, got {q.dtype} and {kv.dtype}")
    if q.device != kv.device:
        raise ValueError(f"q on {q.device} but kv on {kv.device}")
    if q.stride(2) != 1 or kv.stride(1) != 1:
        raise ValueError("q and kv need a unit stride on the last dimension")
    return pe


def dot_flags(dtype: torch.dtype) -> tuple[bool, str]:
    """(UPCAST, PREC) constexprs: Triton's CPU interpreter computes a bf16 x bf16 tl.dot wrongly (relative error
    ~1e10, seen with Triton 3.6 and 3.9; fp16 and fp32 are right), so operands go to fp32 there; fp32 inputs use
    exact (ieee) dots on the GPU."""
    upcast = interpreting()
    prec = "ieee" if dtype == torch.float32 else "tf32"
    return upcast, prec


def sm_count(device: torch.device | str | None) -> int:
    if device is not None and torch.device(device).type == "cuda":
        return torch.cuda.get_device_properties(torch.device(device)).multi_processor_count
    return 4  # CPU / interpreter: a few splits so the split logic is exercised


def kernel_meta(compiled) -> dict:
    """Compiler report of a launched Triton kernel (registers, spills, shared memory, wgmma count)."""
    out = {}
    for k in ("n_regs", "n_spills"):
        out[k] = getattr(compiled, k, None)
    md = getattr(compiled, "metadata", None)
    out["shared"] = getattr(md, "shared", None) if md is not None else None
    out["name"] = getattr(md, "name", None) if md is not None else None
    try:
        ptx = compiled.asm.get("ptx", "")
        out["wgmma"] = ptx.count("wgmma.mma_async")
        out["mma_sync"] = ptx.count("mma.sync")
        out["cp_async"] = ptx.count("cp.async")
    except Exception:  # noqa: BLE001
        pass
    return out
