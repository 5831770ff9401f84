"""Verify-attention paths behind one seam. Never imports the rest of the engine.

Every path is a module (or object) with:
  name:   str
  layout: "paged" (needs the page_size=1 token pool: plan.slots), "contiguous"
          (needs the committed prefix as one run of rows: plan.slots is None) or "any"
  plan(prefix_len, tree_mask, slots=None, v_dim=512) -> VerifyPlan   # once per step
  run(q [R,H,D], kv [slots,D], plan, sm_scale) -> out [R,H,v_dim]      # once per layer
Triton is imported lazily by the fast paths, so this package imports anywhere.
"""
from __future__ import annotations

import importlib

from .plan import VerifyPlan

# name -> module path (relative); fast paths register here as they land.
_PATHS = {
    "reference": ".reference",
    "paged": ".paged",  # SGLang's page_size=1 Triton verify, faithfully rendered (needs triton)
    "split": ".split",  # split-K over the contiguous prefix + masked tree pass + fused merge (needs triton)
}


def available() -> list[str]:
    return list(_PATHS)


def get_path(name: str):
    """Return the verify-attention path called ``name`` (ValueError lists the known ones)."""
    if name not in _PATHS:
        raise ValueError(f"unknown attention path {name!r}; known: {', '.join(_PATHS)}")
    try:
        return importlib.import_module(_PATHS[name], __name__)
    except ImportError as e:  # no Triton, or one too old for the fast paths
        raise ValueError(f"attention path {name!r} needs Triton with tensor descriptors (>= 3.4): {e}") from None


__all__ = ["VerifyPlan", "available", "get_path"]
