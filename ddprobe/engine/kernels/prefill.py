"""Prefill attention: causal rows over the cache through PyTorch's fused attention, never a score buffer.

The engine's prompt prefill goes through this path (``Engine(prefill_attn="prefill")``, the default);
the verify paths never do. A prefill chunk is R new rows at positions P..P+R-1, each seeing the whole
prefix and the chunk's rows up to itself (``tree_mask`` must be the causal [R, R] mask). The absorbed
MLA form is used as is: every head's query is a D-wide latent row, the keys are the cache rows shared
by all heads, and the values are the same rows (the first ``v_dim`` output columns are the latent
output), so queries, keys and values have one width and the fused kernels apply.

- CUDA: one ``scaled_dot_product_attention`` call over [prefix + chunk] with the causal mask aligned to
  the bottom right (``causal_lower_right``), which the flash / memory-efficient kernels take natively.
- CPU: the chunk against the prefix with no mask (all heads folded into the query rows: one GEMM-shaped
  call) and the chunk against itself with ``is_causal``, merged by their log-sum-exps; both calls are
  PyTorch's flash kernel for CPU, which returns the log-sum-exp. Without that operator: one call with
  an explicit lower-right boolean mask [R, P + R] (slower, still no score buffer).

Host plans only (the engine prefills outside CUDA graphs).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ... import verify_paths
from .plan import VerifyPlan, check_diagonal, check_plan_args, check_run_args

name = "prefill"
layout = verify_paths.BY_NAME[name].layout
device_plans = verify_paths.BY_NAME[name].device_plans


def plan(prefix_len, tree_mask: torch.Tensor, slots: torch.Tensor | None = None, v_dim: int = 512, *,
         tuning=None, heads: int | None = None, max_prefix: int | None = None) -> VerifyPlan:
    """prefix_len: int (a host plan; device plans are refused). tree_mask: the causal [R, R] mask."""
    if isinstance(prefix_len, torch.Tensor) or max_prefix is not None:
        raise ValueError("the prefill path takes host plans only (prefill runs outside CUDA graphs)")
    prefix_len = int(prefix_len)
    check_plan_args(prefix_len, tree_mask, slots)
    check_diagonal(tree_mask)
    r = tree_mask.shape[0]
    if not torch.equal(tree_mask, torch.ones(r, r, dtype=torch.bool, device=tree_mask.device).tril_()):
        raise ValueError("the prefill path takes a causal mask only (each row sees the rows before it)")
    return VerifyPlan(prefix_len=prefix_len, tree_mask=tree_mask, slots=slots, v_dim=v_dim,
                      prefix_t=None, dynamic=False)


def refresh(p: VerifyPlan) -> None:
    """Nothing derived to rebuild."""


def _lse_cpu():
    return getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def run(q: torch.Tensor, kv: torch.Tensor, p: VerifyPlan, sm_scale: float, *, meta: dict | None = None) -> torch.Tensor:
    """q [R, H, D], kv [slots, D] (one layer) -> out [R, H, v_dim] in q's dtype."""
    check_run_args(q, kv, p)
    r, h, d = q.shape
    n, pre = p.num_cols, p.prefix_len
    rows = kv[p.slots[:n]] if p.slots is not None else kv[:n]  # [P + R, D]
    rows = rows.to(q.dtype)
    qh = q.transpose(0, 1).unsqueeze(0)  # [1, H, R, D]
    op = _lse_cpu() if q.device.type != "cuda" else None
    if pre == 0 or op is None:  # one call: causal, bottom-right aligned (CUDA), or the mask written out (CPU)
        k = rows.expand(1, h, n, d)  # one row for all heads
        if pre == 0:
            o = F.scaled_dot_product_attention(qh, k, k, is_causal=True, scale=sm_scale)
        elif q.device.type == "cuda":
            from torch.nn.attention.bias import causal_lower_right

            o = F.scaled_dot_product_attention(qh, k.contiguous(), k.contiguous(), attn_mask=causal_lower_right(r, n),
                                               scale=sm_scale)
        else:  # no log-sum-exp from PyTorch on this CPU build
            mask = torch.ones(r, n, dtype=torch.bool, device=q.device).tril_(pre)
            o = F.scaled_dot_product_attention(qh, k, k, attn_mask=mask, scale=sm_scale)
        return o[0, :, :, : p.v_dim].transpose(0, 1).contiguous()
    # the prefix, no mask: heads folded into the rows (the keys are shared), [1, 1, R * H, D]
    qa = q.reshape(1, 1, r * h, d)
    ka = rows[:pre].view(1, 1, pre, d)
    o_a, lse_a = op(qa, ka, ka, 0.0, False, scale=sm_scale)
    o_a = o_a.reshape(r, h, d)
    lse_a = lse_a.reshape(r, h)
    # the chunk against itself, causal: [1, H, R, D]
    kb = rows[pre:].expand(1, h, r, d)
    o_b, lse_b = op(qh, kb, kb, 0.0, True, scale=sm_scale)
    o_b = o_b[0].transpose(0, 1)  # [R, H, D]
    lse_b = lse_b[0].transpose(0, 1)  # [R, H]
    m = torch.maximum(lse_a, lse_b)
    w_a, w_b = torch.exp(lse_a - m).unsqueeze(-1), torch.exp(lse_b - m).unsqueeze(-1)
    o = (o_a.float() * w_a + o_b.float() * w_b) / (w_a + w_b)
    return o[:, :, : p.v_dim].to(q.dtype).contiguous()
