"""Verify-attention paths behind one seam. Never imports the rest of the engine.

Every path is a module (or object) with:
  name:   str
  layout: "paged" (needs the page_size=1 token pool: plan.slots), "contiguous"
          (needs the committed prefix as one run of rows: plan.slots is None) or "any"
  plan(prefix_len, tree_mask, slots=None, v_dim=512, *, tuning=None, heads=None, max_prefix=None)
      -> VerifyPlan                                                    # once per step (or once per request)
  refresh(plan) -> None          # device plans: rebuild derived buffers after the caller rewrote
                                 # prefix_t / tree_mask / slots in place (fixed shapes, capturable)
  run(q [R,H,D], kv [slots,D], plan, sm_scale, *, meta=None) -> out [R,H,v_dim]   # once per layer
prefix_len is an int (host plan) or a [1] int32 device tensor with max_prefix (device plan: the
kernels read the length from memory, so a CUDA graph of the forward replays at any length up to
max_prefix). tuning: the path's frozen dataclass (split.SplitTuning, paged.PagedTuning), held by
the plan; heads (optional): size per-head configs and buffers inside plan(). meta: a dict that
receives the compiled kernels' reports (registers, spills, shared memory, wgmma count).
Triton is imported lazily by the fast paths, so this package imports anywhere.
"""
from __future__ import annotations

import importlib

from ...shapes import VERIFY_PATHS
from .plan import VerifyPlan

# name -> module path (relative): the verify paths (``shapes.VERIFY_PATHS``: reference; paged, SGLang's
# page_size=1 Triton verify; split, split-K over the contiguous prefix + masked tree pass + fused merge;
# split_ws, split with a warp-specialized Gluon prefix kernel, sm_90 only) and the prompt prefill.
_PATHS = {**{name: f".{name}" for name in VERIFY_PATHS},
          "prefill": ".prefill"}  # causal prompt prefill through PyTorch's fused attention (not a verify path)


def available() -> list[str]:
    """Every path, the prompt prefill included."""
    return list(_PATHS)


def verify_paths() -> list[str]:
    """The verify paths (what ``--attn`` takes)."""
    return list(VERIFY_PATHS)


def get_path(name: str):
    """Return the verify-attention path called ``name`` (ValueError lists the known ones)."""
    if name not in _PATHS:
        raise ValueError(f"unknown attention path {name!r}; known: {', '.join(VERIFY_PATHS)}")
    try:
        return importlib.import_module(_PATHS[name], __name__)
    except ImportError as e:  # no Triton, or one too old for the fast paths
        raise ValueError(f"attention path {name!r} needs Triton with tensor descriptors (>= 3.4): {e}") from None


__all__ = ["VerifyPlan", "available", "get_path", "verify_paths"]
