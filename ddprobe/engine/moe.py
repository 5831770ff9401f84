"""Mixture of experts at one GPU's share (DeepSeek-V3 / Kimi K2 layout): router, top-k of the local
experts, a shared expert, the routed experts' SwiGLU.

Routing: sigmoid scores of a linear router over the ``n_experts`` local experts, the top-k per row,
normalized to sum to one and scaled by ``routed_scaling`` (Kimi's norm_topk_prob and
routed_scaling_factor). The output is shared(x) + sum_k weight_k expert_k(x).

Expert compute, all static shapes (capturable in a CUDA graph, no host sync); ``Experts.kernel`` says
which runs, chosen when the weights move (``_apply``):
- ``fused`` (CUDA, where ``fused_moe_works``; up to 64 rows): the routing epilogue in one Triton kernel
  and the experts in two (``kernels/moe_fused.py``): no sort, each touched expert's weights read once,
  untouched ones not at all; more rows take the next path;
- ``grouped``: the R x k (row, expert) pairs sorted by expert, counts per expert by one-hot sums,
  offsets by cumsum, then ``torch._grouped_mm`` for gate/up and for down: each touched expert's
  weights read once, untouched ones not at all;
- ``batched``: where ``torch._grouped_mm`` does not run for the device and dtype, every local
  expert over every row in one batched matmul (all experts read), weights zero where not routed.
``reference``: the same function in fp32 plain PyTorch (gathered weights per pair).
The combine is a sum over k in a fixed order (no atomics): the same result every run.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .kernels._common import MOE_MAX_ROWS
from .layers import SwiGLU, frozen, join_linears

_GROUPED_OK: dict[tuple[str, torch.dtype], bool] = {}
_FUSED_OK: dict[tuple[str, torch.dtype], bool] = {}


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


def fused_moe_works(device: torch.device, dtype: torch.dtype) -> bool:
    """Do the fused Triton MoE kernels run on this CUDA device and dtype and agree with ``experts_reference``
    and ``route`` on a small random problem? (cached; False off CUDA and without Triton)"""
    key = (str(device), dtype)
    if key not in _FUSED_OK:
        _FUSED_OK[key] = False  # while checking: the check's own Experts moving to the device takes another path
        if torch.device(device).type == "cuda":
            try:
                _FUSED_OK[key] = fused_moe_agrees(torch.device(device), dtype)
            except Exception:  # noqa: BLE001  no Triton, a compile error, too little shared memory: not fused
                pass
    return _FUSED_OK[key]


def fused_moe_agrees(device: torch.device, dtype: torch.dtype) -> bool:
    """The fused kernels against ``experts_reference`` and sigmoid top-k on small random problems (any device
    Triton runs on: CUDA, or the CPU under TRITON_INTERPRET=1): 5 rows, and MOE_MAX_ROWS rows with several tiles
    along both GEMMs' K (the widest row tile and the pipelined loop the engine runs)."""
    g = torch.Generator(device="cpu").manual_seed(0)
    ok = True
    for rows, dim, inter in ((5, 64, 48), (MOE_MAX_ROWS, 288, 272)):
        e = Experts(6, dim, inter)
        with torch.no_grad():
            e.w13.copy_(torch.randn(e.w13.shape, generator=g) / dim ** 0.5)
            e.w2.copy_(torch.randn(e.w2.shape, generator=g) / inter ** 0.5)
        e = e.to(device, dtype)
        x = torch.randn(rows, dim, generator=g).to(device, dtype)
        logits = torch.randn(rows, 6, generator=g).to(device)
        ids, w = route_fused(logits, 3, 2.0)
        want_w, want_ids = torch.topk(torch.sigmoid(logits), 3, dim=-1)
        ok &= torch.equal(ids, want_ids) and torch.allclose(w, want_w / want_w.sum(-1, keepdim=True) * 2, rtol=1e-5)
        ref = experts_reference(e, x, ids, w)
        err = (experts_fused(e, x, ids, w).float() - ref).norm() / ref.norm()
        ok &= bool(err < (1e-4 if dtype == torch.float32 else 2e-2))
    return bool(ok)


class Experts(nn.Module):
    """``n`` routed experts' SwiGLU weights, nn.Linear layout: w13 [n, 2 inter, dim] (gate; up), w2 [n, dim, inter]."""

    def __init__(self, n: int, dim: int, inter: int):
        super().__init__()
        self.n, self.dim, self.inter = n, dim, inter
        self.w13 = nn.Parameter(torch.empty(n, 2 * inter, dim))
        self.w2 = nn.Parameter(torch.empty(n, dim, inter))
        self.kernel: str | None = None  # chosen when the weights move (``_apply``): fused, grouped or batched
        self.grouped_ok = False  # torch._grouped_mm runs here (what more than MOE_MAX_ROWS rows take after fused)

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        dev, dt = self.w13.device, self.w13.dtype
        self.grouped_ok = grouped_mm_works(dev, dt)
        self.kernel = "fused" if fused_moe_works(dev, dt) else "grouped" if self.grouped_ok else "batched"
        return out

    def init_std(self, name: str) -> float:
        """N(0, 1 / fan_in), as the engine initializes nn.Linear (``layers.init_random``)."""
        return 1 / math.sqrt(self.dim if name == "w13" else self.inter)


def route(router: nn.Linear, x: torch.Tensor, k: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x [R, dim] -> (expert ids [R, k] int64, weights [R, k] fp32): sigmoid top-k, normalized, scaled."""
    return route_logits(router(x), k, scale)


def route_logits(logits: torch.Tensor, k: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``route`` from the router's logits [R, n]."""
    scores = torch.sigmoid(logits.float())
    w, ids = torch.topk(scores, k, dim=-1)
    return ids, w / w.sum(-1, keepdim=True) * scale


def route_fused(logits: torch.Tensor, k: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``route``'s epilogue in one Triton kernel: router logits [R, n] -> (ids [R, k] int64, weights [R, k] fp32)."""
    from .kernels.moe_fused import moe_route

    return moe_route(logits, k, float(scale))


def experts_fused(e: Experts, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Routed experts through the fused Triton kernels (up to MOE_MAX_ROWS rows): x [R, dim], ids/w [R, k] -> [R, dim]."""
    from .kernels.moe_fused import moe_experts

    return moe_experts(x, ids, w, e.w13, e.w2).sum(1).to(x.dtype)  # [R, k, dim] fp32: the k slots summed in order


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
        self.register_buffer("joined", None, persistent=False)  # join_projections: [router; shared gate; up]

    def join_projections(self) -> None:
        """The router and the shared expert's gate and up projections as one GEMM (layers.join_linears; a no-op
        while already joined; nothing to join without a shared expert)."""
        if self.shared is not None:
            self.joined = join_linears(self.joined, self.gate, self.shared.gate_proj, self.shared.up_proj)

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        if self.joined is not None:  # a real move gave every tensor its own storage: join the moved weights again
            self.join_projections()
        return out

    def _logits_and_shared(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The router's logits [R, n] and the shared expert's output (None without one): three GEMMs and the
        down projection, or two once joined (and the weights frozen: the joined tensor carries no gradient)."""
        if self.joined is None or not frozen(self.gate, self.shared.gate_proj, self.shared.up_proj):
            return self.gate(flat), self.shared(flat) if self.shared is not None else None
        n, si = self.experts.n, self.shared.down_proj.in_features
        logits, g, u = nn.functional.linear(flat, self.joined).split((n, si, si), -1)
        return logits, self.shared.down_proj(F.silu(g) * u)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., dim] -> [..., dim]
        flat = x.reshape(-1, x.shape[-1])
        ex = self.experts
        logits, shared = self._logits_and_shared(flat)
        if ex.kernel == "fused" and flat.shape[0] <= MOE_MAX_ROWS:
            ids, w = route_fused(logits, self.top_k, self.routed_scaling)
            out = experts_fused(ex, flat, ids, w)
        else:
            ids, w = route_logits(logits, self.top_k, self.routed_scaling)
            grouped = ex.kernel == "grouped" or (ex.kernel == "fused" and ex.grouped_ok)
            out = (experts_grouped if grouped else experts_batched)(ex, flat, ids, w)
        out = out + shared if shared is not None else out
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
