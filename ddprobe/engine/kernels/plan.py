"""The frozen per-step plan every verify-attention path receives.

A plan is built once per verify step (``path.plan(...)``) and reused by every layer
(``path.run(q, kv, plan, sm_scale)``): the tree mask, the token-pool slots and any
path-specific metadata do not change between layers.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class VerifyPlan:
    """Metadata of one verify step, shared by all layers.

    prefix_len: committed tokens before the new rows (the tree's context).
    tree_mask:  [R, R] bool on the device; row i may attend to new row j
                (j is i or an ancestor of i). Row 0 is the bonus token (the root).
    slots:      [prefix_len + R] int64 token-pool slot of every column, prefix first,
                then the R new rows (page_size=1 layout); None means the contiguous
                layout: column c lives in cache row c.
    v_dim:      values per row that are V (the latent, 512 for MLA); the rest of the
                576-wide row is the rope part of K.
    extra:      path-specific metadata built at plan time (flat masks, split tables).
    """

    prefix_len: int
    tree_mask: torch.Tensor
    slots: torch.Tensor | None = None
    v_dim: int = 512
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def num_rows(self) -> int:
        return int(self.tree_mask.shape[0])

    @property
    def num_cols(self) -> int:
        return self.prefix_len + self.num_rows


def check_plan_args(prefix_len: int, tree_mask: torch.Tensor, slots: torch.Tensor | None) -> None:
    """Shared argument checks for every path's ``plan``."""
    if prefix_len < 0:
        raise ValueError(f"prefix_len must be >= 0, got {prefix_len}")
    if tree_mask.dim() != 2 or tree_mask.shape[0] != tree_mask.shape[1] or tree_mask.shape[0] < 1:
        raise ValueError(f"tree_mask must be [R, R] with R >= 1, got {tuple(tree_mask.shape)}")
    if tree_mask.dtype != torch.bool:
        raise ValueError(f"tree_mask must be bool, got {tree_mask.dtype}")
    if not bool(tree_mask.diagonal().all()):
        raise ValueError("tree_mask must let every row see itself")
    if slots is not None:
        want = prefix_len + tree_mask.shape[0]
        if slots.dim() != 1 or slots.shape[0] < want:
            raise ValueError(f"slots must be 1-D with at least prefix_len + R = {want} entries, got {tuple(slots.shape)}")


def check_run_args(q: torch.Tensor, kv: torch.Tensor, plan: VerifyPlan) -> None:
    """Shared shape checks for every path's ``run``."""
    if q.dim() != 3 or q.shape[0] != plan.num_rows:
        raise ValueError(f"q must be [R={plan.num_rows}, heads, D], got {tuple(q.shape)}")
    if kv.dim() != 2 or kv.shape[1] != q.shape[2]:
        raise ValueError(f"kv must be [slots, D={q.shape[2]}], got {tuple(kv.shape)}")
    if plan.v_dim > kv.shape[1]:
        raise ValueError(f"v_dim {plan.v_dim} exceeds row width {kv.shape[1]}")
    if plan.slots is None and kv.shape[0] < plan.num_cols:
        raise ValueError(f"contiguous kv holds {kv.shape[0]} rows, the plan needs {plan.num_cols}")
