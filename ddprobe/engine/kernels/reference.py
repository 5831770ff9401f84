"""Reference verify attention: plain PyTorch in fp32, the oracle for every fast path.

Works on both layouts (token pool with slots, or contiguous rows).
"""
from __future__ import annotations

import torch

from .plan import VerifyPlan, check_plan_args, check_run_args

name = "reference"
layout = "any"


def plan(prefix_len: int, tree_mask: torch.Tensor, slots: torch.Tensor | None = None, v_dim: int = 512) -> VerifyPlan:
    check_plan_args(prefix_len, tree_mask, slots)
    return VerifyPlan(prefix_len=prefix_len, tree_mask=tree_mask, slots=slots, v_dim=v_dim)


def full_mask(p: VerifyPlan) -> torch.Tensor:
    """[R, prefix_len + R] bool: every row sees the whole prefix, then its ancestors."""
    r = p.num_rows
    prefix = torch.ones(r, p.prefix_len, dtype=torch.bool, device=p.tree_mask.device)
    return torch.cat([prefix, p.tree_mask], dim=1)


def run(q: torch.Tensor, kv: torch.Tensor, p: VerifyPlan, sm_scale: float) -> torch.Tensor:
    """q [R, H, D], kv [slots, D] (one layer) -> out [R, H, v_dim] in q's dtype."""
    check_run_args(q, kv, p)
    n = p.num_cols
    rows = kv[p.slots[:n]] if p.slots is not None else kv[:n]  # [n, D]
    k = rows.float()
    v = k[:, : p.v_dim]
    s = torch.einsum("rhd,nd->rhn", q.float(), k) * sm_scale  # [R, H, n]
    s = s.masked_fill(~full_mask(p).to(s.device)[:, None, :], float("-inf"))
    out = torch.einsum("rhn,nv->rhv", torch.softmax(s, dim=-1), v)  # [R, H, v_dim]
    return out.to(q.dtype)
