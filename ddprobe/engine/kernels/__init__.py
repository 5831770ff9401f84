"""Verify-attention paths behind one seam. Never imports the rest of the engine. (``moe_fused`` beside them is the
fused MoE's kernels, called by engine/moe.py, not a path.)

Every path is a module (or object) with:
  name:   str
  layout: "paged" (needs the page_size=1 token pool: plan.slots), "contiguous"
          (needs the committed prefix as one run of rows: plan.slots is None) or "any"
  plan(prefix_len, tree_mask, slots=None, v_dim=512, *, tuning=None, heads=None, max_prefix=None)
      -> VerifyPlan                                                    # once per step (or once per request)
  refresh(plan) -> None          # device plans: rebuild derived buffers after the caller rewrote
                                 # prefix_t / tree_mask / slots in place (fixed shapes, capturable)
  run(q [R,H,D], kv [slots,D], plan, sm_scale, *, meta=None) -> out [R,H,v_dim]   # once per layer
  device_plans: bool             # plan() takes a device prefix length (ddprobe.verify_paths: one table)
  check_available() -> None      # optional: raises PathUnavailable (one line: what to install) where the
                                 # path's library is missing; get_path calls it
prefix_len is an int (host plan) or a [1] int32 device tensor with max_prefix (device plan: the
kernels read the length from memory, so a CUDA graph of the forward replays at any length up to
max_prefix). tuning: the path's frozen dataclass (split.SplitTuning, paged.PagedTuning), held by
the plan; heads (optional): size per-head configs and buffers inside plan(). meta: a dict that
receives the compiled kernels' reports (registers, spills, shared memory, wgmma count).
Triton is imported lazily by the fast paths, so this package imports anywhere.
"""
from __future__ import annotations

import importlib

from ... import verify_paths
from .plan import PathUnavailable, VerifyPlan


def available() -> list[str]:
    """Every path behind the seam (the verify paths of ddprobe.verify_paths, and prefill)."""
    return [p.name for p in verify_paths.PATHS]


def get_path(name: str):
    """Return the verify-attention path called ``name`` (ValueError lists the known ones)."""
    row = verify_paths.BY_NAME.get(name)
    if row is None:
        raise ValueError(f"unknown attention path {name!r}; known: {', '.join(available())}")
    try:
        mod = importlib.import_module(row.module, __name__)
    except ImportError as e:  # no Triton, or one too old for the fast paths
        raise ValueError(f"attention path {name!r} needs Triton with tensor descriptors (>= 3.6): {e}") from None
    check = getattr(mod, "check_available", None)
    if check is not None:
        check()  # PathUnavailable: the library the path runs (sglang) is missing or takes other arguments
    return mod


__all__ = ["PathUnavailable", "VerifyPlan", "available", "get_path"]
