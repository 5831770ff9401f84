"""Reference verify attention: plain PyTorch in fp32, the oracle for every fast path.

Works on both layouts (token pool with slots, or contiguous rows) and on host and device
plans (plan.py): with a device plan it attends over all ``max_prefix + R`` columns and masks
by the prefix length read from ``prefix_t``, so the same code replays in a CUDA graph.
"""
from __future__ import annotations

import torch

from ... import verify_paths
from .plan import VerifyPlan, check_diagonal, check_plan_args, check_run_args, split_prefix_arg

name = "reference"
layout = verify_paths.BY_NAME[name].layout
device_plans = verify_paths.BY_NAME[name].device_plans


def plan(prefix_len, tree_mask: torch.Tensor, slots: torch.Tensor | None = None, v_dim: int = 512, *,
         tuning=None, heads: int | None = None, max_prefix: int | None = None) -> VerifyPlan:
    """prefix_len: int (host plan) or a [1] int32 device tensor with ``max_prefix`` (device plan).
    ``tuning`` and ``heads`` are accepted for a uniform seam; the reference has no knobs."""
    bound, prefix_t, dynamic = split_prefix_arg(prefix_len, max_prefix, tree_mask.device)
    check_plan_args(bound, tree_mask, slots)
    if not dynamic:
        check_diagonal(tree_mask)
    return VerifyPlan(prefix_len=bound, tree_mask=tree_mask, slots=slots, v_dim=v_dim, prefix_t=prefix_t,
                      dynamic=dynamic)


def refresh(p: VerifyPlan) -> None:
    """Nothing derived to rebuild: run() reads prefix_t, tree_mask and slots directly."""


def full_mask(p: VerifyPlan) -> torch.Tensor:
    """[R, num_cols] bool: every row sees the whole prefix, then its ancestors (device plans:
    columns at or past prefix_t + R are masked out)."""
    r, dev = p.num_rows, p.tree_mask.device
    if not p.dynamic:
        prefix = torch.ones(r, p.prefix_len, dtype=torch.bool, device=dev)
        return torch.cat([prefix, p.tree_mask], dim=1)
    col = torch.arange(p.num_cols, device=dev)
    pre = p.prefix_t.to(torch.int64)
    rel = col - pre  # column relative to the first new row
    tree = p.tree_mask[:, rel.clamp(0, r - 1)] & ((rel >= 0) & (rel < r))[None, :]
    return tree | (col < pre)[None, :]


def run(q: torch.Tensor, kv: torch.Tensor, p: VerifyPlan, sm_scale: float, *, meta: dict | None = None) -> torch.Tensor:
    """q [R, H, D], kv [slots, D] (one layer) -> out [R, H, v_dim] in q's dtype."""
    check_run_args(q, kv, p)
    n = p.num_cols
    if p.slots is not None:
        idx = p.slots[:n].clamp(0, kv.shape[0] - 1) if p.dynamic else p.slots[:n]
        rows = kv[idx]
    else:
        rows = kv[:n]  # [n, D]
    mask = full_mask(p).to(q.device)  # [R, n]
    k = rows.float()
    if p.dynamic:  # columns outside the plan may hold anything (NaN-poisoned rows): zero them
        k = torch.where(mask.any(0)[:, None], k, torch.zeros((), dtype=k.dtype, device=k.device))
    v = k[:, : p.v_dim]
    s = torch.einsum("rhd,nd->rhn", q.float(), k) * sm_scale  # [R, H, n]
    s = s.masked_fill(~mask[:, None, :], float("-inf"))
    out = torch.einsum("rhn,nv->rhv", torch.softmax(s, dim=-1), v)  # [R, H, v_dim]
    return out.to(q.dtype)
