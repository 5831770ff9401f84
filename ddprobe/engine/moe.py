"""Mixture of experts at one GPU's share (DeepSeek-V3 / Kimi K2 layout): router, top-k of the local
experts, a shared expert, the routed experts' SwiGLU through a grouped GEMM.

Routing: sigmoid scores of a linear router over the ``n_experts`` local experts, the top-k per row,
normalized to sum to one and scaled by ``routed_scaling`` (Kimi's norm_topk_prob and
routed_scaling_factor). The output is shared(x) + sum_k weight_k expert_k(x).

Expert compute, all static shapes (capturable in a CUDA graph, no host sync):
- ``grouped``: the R x k (row, expert) pairs sorted by expert, counts per expert by one-hot sums,
  offsets by cumsum, then ``torch._grouped_mm`` for gate/up and for down: each touched expert's
  weights read once, untouched ones not at all;
- ``batched``: where ``torch._grouped_mm`` does not run for the device and dtype, every local
  expert over every row in one batched matmul (all experts read), weights zero where not routed.
``reference``: the same function in fp32 plain PyTorch (gathered weights per pair).
The combine is a gather and a sum over k in a fixed order (no atomics): the same result every run.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .layers import SwiGLU

_GROUPED_OK: dict[tuple[str, torch.dtype], bool] = {}


def grouped_mm_works(device: torch.device, dtype: torch.dtype) -> bool:
    """Does ``torch._grouped_mm`` run and agree with a plain matmul for this device and dtype? (cached)"""
    key = (str(device), dtype)
    if key not in _GROUPED_OK:
        ok = hasattr(torch, "_grouped_mm")
        if ok:
            try:
                g = torch.Generator(device="cpu").manual_seed(0)
                a = torch.randn(24, 32, generator=g).to(device, dtype)
                b = torch.randn(2, 16, 32, generator=g).to(device, dtype)  # [experts, out, in]
                offs = torch.tensor([8, 24], dtype=torch.int32, device=device)
                out = torch._grouped_mm(a, b.transpose(-2, -1), offs=offs)
                ref = torch.cat([a[:8] @ b[0].T, a[8:] @ b[1].T])
                ok = bool(torch.allclose(out.float(), ref.float(), rtol=2e-2, atol=2e-1))
            except (RuntimeError, NotImplementedError, TypeError):
                ok = False
        _GROUPED_OK[key] = ok
    return _GROUPED_OK[key]


class Experts(nn.Module):
    """``n`` routed experts' SwiGLU weights, nn.Linear layout: w13 [n, 2 inter, dim] (gate; up), w2 [n, dim, inter]."""

    def __init__(self, n: int, dim: int, inter: int):
        super().__init__()
        self.n, self.dim, self.inter = n, dim, inter
        self.w13 = nn.Parameter(torch.empty(n, 2 * inter, dim))
        self.w2 = nn.Parameter(torch.empty(n, dim, inter))
        self.grouped: bool | None = None  # chosen when the weights move (``_apply``): grouped GEMM or batched

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        self.grouped = grouped_mm_works(self.w13.device, self.w13.dtype)
        return out

    def init_std(self, name: str) -> float:
        """N(0, 1 / fan_in), as the engine initializes nn.Linear (``layers.init_random``)."""
        return 1 / math.sqrt(self.dim if name == "w13" else self.inter)


def route(router: nn.Linear, x: torch.Tensor, k: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x [R, dim] -> (expert ids [R, k] int64, weights [R, k] fp32): sigmoid top-k, normalized, scaled."""
    scores = torch.sigmoid(router(x).float())
    w, ids = torch.topk(scores, k, dim=-1)
    return ids, w / w.sum(-1, keepdim=True) * scale


def experts_grouped(e: Experts, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Routed experts through ``torch._grouped_mm``: x [R, dim], ids/w [R, k] -> [R, dim]."""
    r, k = ids.shape
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)  # pairs sorted by expert
    rows = x.index_select(0, order // k)  # [R k, dim]
    counts = F.one_hot(flat, e.n).sum(0)  # [n] (static shape, unlike bincount)
    offs = torch.cumsum(counts, 0).to(torch.int32)
    gu = torch._grouped_mm(rows, e.w13.transpose(-2, -1), offs=offs)  # [R k, 2 inter]
    h = F.silu(gu[:, :e.inter]) * gu[:, e.inter:]
    y = torch._grouped_mm(h, e.w2.transpose(-2, -1), offs=offs)  # [R k, dim]
    back = torch.empty_like(order)
    back[order] = torch.arange(order.numel(), device=order.device)
    y = y.index_select(0, back).view(r, k, -1)  # pair order again: row-major [R, k]
    return (y.float() * w[..., None]).sum(1).to(x.dtype)


def experts_batched(e: Experts, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Every local expert over every row (one batched matmul each way), weights zero where not routed."""
    gu = torch.einsum("rd,end->ern", x, e.w13)  # [n, R, 2 inter]
    h = F.silu(gu[..., :e.inter]) * gu[..., e.inter:]
    y = torch.einsum("eri,edi->erd", h, e.w2)  # [n, R, dim]
    dense = torch.zeros(x.shape[0], e.n, dtype=torch.float32, device=x.device).scatter(1, ids, w)  # [R, n]
    return torch.einsum("re,erd->rd", dense, y.float()).to(x.dtype)


def experts_reference(e: Experts, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """fp32 plain PyTorch: each (row, expert) pair with its own gathered weights."""
    r, k = ids.shape
    xs = x.float()[:, None, :].expand(r, k, -1)  # [R, k, dim]
    gu = torch.einsum("rkd,rknd->rkn", xs, e.w13.float()[ids])
    h = F.silu(gu[..., :e.inter]) * gu[..., e.inter:]
    y = torch.einsum("rki,rkdi->rkd", h, e.w2.float()[ids])
    return (y * w[..., None]).sum(1)


class MoE(nn.Module):
    """Router + top-k routed experts (``experts`` may be shared between layers) + an optional shared expert."""

    def __init__(self, dim: int, experts: Experts, top_k: int, shared_inter: int = 0, routed_scaling: float = 1.0):
        super().__init__()
        if not 1 <= top_k <= experts.n:
            raise ValueError(f"top-k {top_k} is not within the {experts.n} local experts")
        self.gate = nn.Linear(dim, experts.n, bias=False)  # the router
        self.experts = experts
        self.top_k, self.routed_scaling = top_k, routed_scaling
        self.shared = SwiGLU(dim, shared_inter) if shared_inter else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., dim] -> [..., dim]
        flat = x.reshape(-1, x.shape[-1])
        ids, w = route(self.gate, flat, self.top_k, self.routed_scaling)
        run = experts_grouped if self.experts.grouped else experts_batched
        out = run(self.experts, flat, ids, w)
        out = out + self.shared(flat) if self.shared is not None else out
        return out.view(x.shape)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """The same function in fp32 (routing from the same router): [..., dim] -> [..., dim] fp32."""
        flat = x.reshape(-1, x.shape[-1])
        ids, w = route(self.gate, flat, self.top_k, self.routed_scaling)
        out = experts_reference(self.experts, flat, ids, w)
        if self.shared is not None:
            s, xf = self.shared, flat.float()
            out = out + F.linear(F.silu(F.linear(xf, s.gate_proj.weight.float())) * F.linear(xf, s.up_proj.weight.float()),
                                 s.down_proj.weight.float())
        return out.view(x.shape)
