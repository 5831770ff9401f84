"""Small building blocks shared by the target and the drafter: RMSNorm, SwiGLU MLP, seeded init."""
from __future__ import annotations

import math

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., dim] -> [..., dim]
        # fp16 ends at 65504: the square of a residual value above 256 is inf there, and the row's norm
        # would be 0 (the tiny preset's residual reaches thousands). Its variance is taken in fp32;
        # the other dtypes (fp32's range) keep their own.
        xv = x.float() if x.dtype == torch.float16 else x
        var = xv.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(var + self.eps).to(x.dtype) * self.weight


@torch.no_grad()
def join_linears(joined: torch.Tensor | None, *linears: nn.Linear) -> torch.Tensor:
    """The weights of bias-free Linears that read the same input as one tensor [sum of out_features, in] whose row
    blocks the Linears' weights are (views: an in-place load or update of a weight reaches it), so one GEMM
    (F.linear with it) replaces one launch per Linear. Returns ``joined`` while the weights are still its views;
    else (first call, a move, a load with assign=True, a deepcopy: each gives the weights their own tensors) a new
    joined tensor, the same Parameter objects pointed at its rows (optimizers and hooks keep them)."""
    if joined is not None and _views_of(joined, linears):
        return joined
    w = torch.cat([lin.weight.detach() for lin in linears])
    i = 0
    for lin in linears:
        lin.weight.data = w[i:i + lin.out_features]
        i += lin.out_features
    return w


def _views_of(joined: torch.Tensor, linears) -> bool:
    """Whether the Linears' weights are the consecutive row blocks of ``joined``."""
    i, row = 0, joined.stride(0) * joined.element_size()
    for lin in linears:
        w = lin.weight
        if w.device != joined.device or w.dtype != joined.dtype or w.shape[1:] != joined.shape[1:] \
                or not w.is_contiguous() or w.data_ptr() != joined.data_ptr() + i * row:
            return False
        i += w.shape[0]
    return i == joined.shape[0]


def frozen(*linears: nn.Linear) -> bool:
    """No weight of these Linears takes a gradient (a joined GEMM would carry none to them)."""
    return not any(lin.weight.requires_grad for lin in linears)


class SwiGLU(nn.Module):
    """Dense gated MLP (also the k2 preset's cheap stand-in for the MoE)."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, dim] -> [T, dim]
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


@torch.no_grad()
def init_random(module: nn.Module, seed: int) -> None:
    """Seeded random weights with O(1) activations: Linear ~ N(0, 1/fan_in) (and modules with
    ``init_std(param name)``: N(0, that std)), Embedding ~ N(0, 1),
    norms = 1, other parameters (mask embedding) ~ N(0, 1). Same seed -> same weights on any device."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in module.named_parameters():
        leaf = name.rsplit(".", 1)[0]
        sub = module.get_submodule(leaf) if "." in name else module
        if isinstance(sub, RMSNorm):
            w = torch.ones(p.shape, dtype=torch.float32)
        elif isinstance(sub, nn.Linear):
            w = torch.randn(p.shape, generator=gen, dtype=torch.float32) / math.sqrt(p.shape[1])
        elif hasattr(sub, "init_std"):  # stacked weights that know their fan-in (moe.Experts)
            w = torch.randn(p.shape, generator=gen, dtype=torch.float32) * sub.init_std(name.rsplit(".", 1)[1])
        else:
            w = torch.randn(p.shape, generator=gen, dtype=torch.float32)
        p.copy_(w.to(p.dtype))
