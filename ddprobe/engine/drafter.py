"""DFlash-style block drafter.

One forward over the block [bonus, L mask tokens] returns L per-position distributions (the
positions after the bonus). Every layer's keys/values are [context, block]: the context is the
target's features of every committed token (outputs of chosen target layers, concatenated,
projected by ``fc`` to the drafter width and RMS-normed), cached per layer as roped K and V in a
``DrafterContext``; the windowed layers see the last ``sliding_window`` context tokens, the one
full-attention layer sees all of them. Non-causal inside the block. The token embedding and the
output head are the target's (passed in, not owned). RoPE with YaRN lets it run far beyond its
trained length.

With ``history`` > 0 the full-attention layer's context key of token j is
k_proj(h_j) + hist([h_(j-1), ..., h_(j-history)]) (rows before 0 read as zeros; h = the normed,
projected features): the key of the token k positions after an occurrence of the bonus carries
that occurrence, so block position k finds it in one hop and reads the token there (a far copy,
drafted a whole block at a time). ``full_attn_nope``: that layer's rows are not rotated, so a
lookup 100k tokens back scores as one 100 tokens back. The context keeps h for the history.
``history_rotation``: the term of distance i is rotated by i * theta (per head-dim pair, as rope rotates) and the
full layer's query at block position k by k * theta, so position k scores the row whose token k back is the bonus
unrotated and the rows with the bonus at other distances rotated away. The rotation of distance i is folded into
the rows of hist's weight (``history_weight``), so the keys cost what they cost without it.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..physics.presets import DrafterConfig, TargetConfig
from .layers import RMSNorm, SwiGLU, init_random
from .rope import Rope, apply_rope, attn_scale


class DrafterContext:
    """Per-layer roped K and V of the context features: k, v [layers, capacity, H, hd]; with ``history``, h
    [capacity, dim]: each row's normed, projected features, which the full layer's keys of the rows after it read."""

    def __init__(self, num_layers: int, capacity: int, heads: int, head_dim: int, dtype, device, dim: int = 0):
        shape = (num_layers, capacity, heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.h = torch.zeros(capacity, dim, dtype=dtype, device=device) if dim else None  # features, for history
        self.n = 0  # context tokens held (= committed tokens of the target)
        self.capacity = capacity


class DrafterLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig, dim: int, nope: bool = False):
        super().__init__()
        self.cfg = cfg
        self.nope = nope  # rows not rotated (the full-attention layer with full_attn_nope)
        h, hd = cfg.num_heads, cfg.head_dim
        self.input_layernorm = RMSNorm(dim, cfg.rms_eps)
        self.q_proj = nn.Linear(dim, h * hd, bias=False)
        self.k_proj = nn.Linear(dim, h * hd, bias=False)
        self.v_proj = nn.Linear(dim, h * hd, bias=False)
        self.o_proj = nn.Linear(h * hd, dim, bias=False)
        self.post_attention_layernorm = RMSNorm(dim, cfg.rms_eps)
        self.mlp = SwiGLU(dim, cfg.intermediate_size)

    def _heads(self, y: torch.Tensor) -> torch.Tensor:  # [..., T, H * hd] -> [..., T, H, hd]
        return y.view(*y.shape[:-1], self.cfg.num_heads, self.cfg.head_dim)

    def _rope(self, x: torch.Tensor, cos, sin) -> torch.Tensor:
        return x if self.nope else apply_rope(x, cos, sin)

    def kv(self, h: torch.Tensor, cos, sin, k_extra: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """h [..., T, dim] (normed) -> roped k, v [..., T, H, hd]; k_extra [..., T, H * hd]: added to the key
        before the rotation (the full layer's history term)."""
        k = self.k_proj(h) if k_extra is None else self.k_proj(h) + k_extra
        return self._rope(self._heads(k), cos, sin), self._heads(self.v_proj(h))

    def q(self, h: torch.Tensor, cos, sin) -> torch.Tensor:
        """h [..., T, dim] (normed) -> roped q [..., T, H, hd]."""
        return self._rope(self._heads(self.q_proj(h)), cos, sin)

    def finish(self, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """Residual after attention (o [..., T, H, hd]) and the MLP."""
        x = x + self.o_proj(o.flatten(-2))
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward(self, x, cos, sin, ctx_k, ctx_v, ctx_ok: torch.Tensor | None = None, qs=None,
                qrot=None) -> torch.Tensor:
        """x [Lb, dim] block; ctx_k/ctx_v [n, H, hd] (already windowed) -> [Lb, dim].
        ctx_ok [n] bool (static step): which context rows count; the others are masked out.
        qs [Lb, 1, 1] or None: the queries' scale (the full-attention layer, ``rope.attn_scale``).
        qrot (cos, sin) [Lb, hd] or None: the queries' rotation by block position (``history_rotation``)."""
        h = self.input_layernorm(x)
        q = self.q(h, cos, sin)  # [Lb, H, hd]
        if qs is not None:
            q = q * qs
        if qrot is not None:
            q = apply_rope(q, *qrot)
        bk, bv = self.kv(h, cos, sin)
        k = torch.cat([ctx_k, bk], dim=0)  # [n + Lb, H, hd]
        v = torch.cat([ctx_v, bv], dim=0)
        s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(self.cfg.head_dim)  # no mask: non-causal block
        if ctx_ok is not None:
            ok = torch.cat([ctx_ok, torch.ones(x.shape[0], dtype=torch.bool, device=ctx_ok.device)])
            s = s.masked_fill(~ok, float("-inf"))
        o = torch.einsum("hqk,khd->qhd", torch.softmax(s.float(), dim=-1).to(v.dtype), v)
        return self.finish(x, o)


class Drafter(nn.Module):
    def __init__(self, cfg: DrafterConfig, target_cfg: TargetConfig):
        super().__init__()
        dim = target_cfg.hidden_size
        self.cfg = cfg
        if not -cfg.num_layers <= cfg.full_attn_layer < cfg.num_layers:
            raise ValueError(f"full_attn_layer {cfg.full_attn_layer} outside the {cfg.num_layers} drafter layers")
        self.full_layer = cfg.full_attn_layer % cfg.num_layers
        self.fc = nn.Linear(len(target_cfg.feature_layers) * dim, dim, bias=False)
        self.hidden_norm = RMSNorm(dim, cfg.rms_eps)
        self.mask_embedding = nn.Parameter(torch.zeros(dim))
        self.layers = nn.ModuleList(DrafterLayer(cfg, dim, cfg.full_attn_nope and i == self.full_layer)
                                    for i in range(cfg.num_layers))
        if cfg.history < 0:
            raise ValueError(f"history must be >= 0, got {cfg.history}")
        self.hist = nn.Linear(cfg.history * dim, cfg.num_heads * cfg.head_dim, bias=False) if cfg.history else None
        if cfg.history_rotation and not cfg.history:
            raise ValueError("history_rotation needs history > 0")
        self.norm = RMSNorm(dim, cfg.rms_eps)
        self.rope = Rope(cfg.head_dim, cfg.rope_theta, cfg.yarn, cfg.rope_max_wavelength)

    def init_weights(self, seed: int) -> None:
        init_random(self, seed)

    def new_context(self, capacity: int) -> DrafterContext:
        p, dim = self.fc.weight, self.fc.weight.shape[0]
        return DrafterContext(self.cfg.num_layers, capacity, self.cfg.num_heads, self.cfg.head_dim, p.dtype, p.device,
                              dim if self.cfg.history else 0)

    def rotation(self, steps: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) [T, hd] of the rotation by steps [T] * theta (``history_rotation``; apply_rope's layout:
        theta_p = pi p / (hd/2 + 1), p = 1..hd/2, for the pair (p, p + hd/2))."""
        half = self.cfg.head_dim // 2
        theta = math.pi * torch.arange(1, half + 1, device=steps.device, dtype=torch.float64) / (half + 1)
        ang = steps.to(torch.float64)[:, None] * theta
        ang = torch.cat([ang, ang], -1)
        return ang.cos().to(dtype), ang.sin().to(dtype)

    def history_weight(self) -> torch.Tensor:
        """hist's weight [H * hd, history * dim], with history_rotation the rows of distance i rotated by i * theta
        (the rotation of a linear map's output is a linear map: folded in, the keys cost nothing more)."""
        w = self.hist.weight
        if not self.cfg.history_rotation:
            return w
        cfg, dim = self.cfg, w.shape[1] // self.cfg.history
        wide = torch.float64 if w.dtype == torch.float64 else torch.float32  # rotated once, then rounded once
        wv = w.to(wide).view(cfg.num_heads, cfg.head_dim, cfg.history, dim).permute(2, 3, 0, 1)  # [history, dim, H, hd]
        cos, sin = self.rotation(torch.arange(1, cfg.history + 1, device=w.device), wide)  # [history, hd]
        wv = apply_rope(wv, cos[:, None], sin[:, None])
        return wv.permute(2, 3, 0, 1).reshape(w.shape).to(w.dtype)

    def block_rotation(self, n_blocks: int, dtype, device) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(cos, sin) [n_blocks * Lb, hd] rotating the full layer's queries by their block position, or None."""
        if not self.cfg.history_rotation:
            return None
        lb = self.cfg.block_size
        return self.rotation(torch.arange(n_blocks * lb, device=device) % lb, dtype)

    def history_keys(self, rows: torch.Tensor, rows_h: torch.Tensor) -> torch.Tensor:
        """The full layer's key term hist([h_(j-1) .. h_(j-history)]) [..., T, H * hd] of context rows [T] (device
        int64), reading the features from rows_h [..., capacity, dim] (rows before 0 as zeros; a leading batch
        axis in training)."""
        back = rows[:, None] - torch.arange(1, self.cfg.history + 1, device=rows.device)  # [T, history]
        h = rows_h.index_select(-2, back.clamp(min=0).flatten()).unflatten(-2, back.shape)  # [..., T, history, dim]
        h = h * (back >= 0)[..., None].to(h.dtype)
        return nn.functional.linear(h.flatten(-2), self.history_weight())

    def _ctx_kv(self, ctx: DrafterContext, h: torch.Tensor, rows: torch.Tensor, cos, sin):
        """(layer index, k, v) of the context rows [T] with features h [T, dim] (ctx.h already holds them)."""
        extra = self.history_keys(rows, ctx.h) if self.hist is not None else None
        for i, layer in enumerate(self.layers):
            yield (i, *layer.kv(h, cos, sin, extra if i == self.full_layer else None))

    def append_context(self, ctx: DrafterContext, features: torch.Tensor, positions: torch.Tensor) -> None:
        """features [k, n_feat * dim] of k newly committed tokens at positions [k]."""
        k = features.shape[0]
        if ctx.n + k > ctx.capacity:
            raise ValueError(f"context beyond the drafter cache: {ctx.n} + {k} > capacity {ctx.capacity}")
        h = self.hidden_norm(self.fc(features.to(self.fc.weight.dtype)))  # [k, dim]
        cos, sin = self.rope.cos_sin(positions, h.dtype)
        rows = torch.arange(ctx.n, ctx.n + k, dtype=torch.int64, device=h.device)
        if ctx.h is not None:
            ctx.h[ctx.n: ctx.n + k] = h
        for i, kk, vv in self._ctx_kv(ctx, h, rows, cos, sin):
            ctx.k[i, ctx.n: ctx.n + k] = kk
            ctx.v[i, ctx.n: ctx.n + k] = vv
        ctx.n += k

    def append_static(self, ctx: DrafterContext, features: torch.Tensor, positions: torch.Tensor,
                      dest: torch.Tensor) -> None:
        """Fixed shapes (a CUDA graph replays it): the K/V of all T rows (features [T, n_feat * dim] at
        positions [T]) go to context rows dest [T] (device int64); the caller keeps ctx.n."""
        h = self.hidden_norm(self.fc(features.to(self.fc.weight.dtype)))  # [T, dim]
        cos, sin = self.rope.cos_sin(positions, h.dtype)
        if ctx.h is not None:  # every row's features first: a row's history may be a row of this call
            ctx.h.index_copy_(0, dest, h)
        for i, kk, vv in self._ctx_kv(ctx, h, dest, cos, sin):
            ctx.k[i].index_copy_(0, dest, kk)
            ctx.v[i].index_copy_(0, dest, vv)

    def _block(self, bonus: torch.Tensor, n, embed: nn.Embedding):
        lb = self.cfg.block_size
        e = embed(bonus.view(1))
        m = self.mask_embedding.expand(lb - 1, -1)
        x = torch.cat([e, m + e if self.cfg.bonus_all else m], dim=0)  # [Lb, dim]
        pos = torch.arange(lb, dtype=torch.int64, device=x.device) + n
        return x, self.rope.cos_sin(pos, x.dtype), self.full_qs(pos, x.dtype), self.block_rotation(1, x.dtype, x.device)

    def full_qs(self, positions: torch.Tensor, dtype) -> torch.Tensor | None:
        """The full-attention layer's query scale [T, 1, 1] at ``positions`` (None when not configured)."""
        f = self.cfg.full_attn_floor
        return attn_scale(positions, f, dtype) if f > 0 else None

    def logprobs(self, x: torch.Tensor, head: nn.Linear) -> torch.Tensor:
        """Block output x [1 + L, dim] -> log-probs [L, V] of the L drafted positions (fp32 or fp64), computed as
        the DDTree reference computes them: ``logits - logsumexp(logits)`` in fp32. ``torch.log_softmax`` can
        differ from it by one ulp, which breaks or makes ties between equal-score paths (the tree's tie rule)."""
        logits = head(self.norm(x[1:]))  # [L, V]
        if logits.dtype != torch.float64:
            logits = logits.float()
        return logits - torch.logsumexp(logits, dim=-1, keepdim=True)

    def forward_static(self, ctx: DrafterContext, n: torch.Tensor, bonus: torch.Tensor, embed: nn.Embedding,
                       head: nn.Linear, k: int, fused=None) -> tuple[torch.Tensor, torch.Tensor]:
        """forward() with fixed shapes for a CUDA graph, then the top-k of the log-probs (values,
        indices [L, k]): n [1] int64 device (context tokens held). Windowed layers gather the last
        sliding_window rows (rows before 0 masked), the full layer attends over the whole capacity
        with rows >= n masked. fused: a fuse.Fused whose compiled layer and head replace the plain calls."""
        from .fuse import drafter_head, drafter_layer

        call, top = (fused.drafter_layer, fused.drafter_head) if fused is not None else (drafter_layer, drafter_head)
        cfg, cap = self.cfg, ctx.capacity
        x, (cos, sin), qs, qrot = self._block(bonus, n, embed)
        w = min(cfg.sliding_window, cap)
        win = torch.arange(w, dtype=torch.int64, device=x.device) + (n - w)
        win_ok, win = win >= 0, win.clamp(min=0)
        full_ok = torch.arange(cap, dtype=torch.int64, device=x.device) < n
        for i, layer in enumerate(self.layers):
            if i == self.full_layer:
                x = call(layer, x, cos, sin, ctx.k[i], ctx.v[i], full_ok, qs, qrot)
            else:
                x = call(layer, x, cos, sin, ctx.k[i].index_select(0, win), ctx.v[i].index_select(0, win), win_ok)
        return top(self, x, head, k)

    def forward(self, ctx: DrafterContext, bonus: torch.Tensor, embed: nn.Embedding, head: nn.Linear) -> torch.Tensor:
        """bonus: 0-d int64 token at position ctx.n -> log-probs [L, V] (float32 or float64) of the
        L positions after it."""
        cfg, n = self.cfg, ctx.n
        x, (cos, sin), qs, qrot = self._block(bonus, n, embed)
        for i, layer in enumerate(self.layers):
            full = i == self.full_layer
            lo = 0 if full else max(0, n - cfg.sliding_window)
            x = layer(x, cos, sin, ctx.k[i, lo:n], ctx.v[i, lo:n], qs=qs if full else None,
                      qrot=qrot if full else None)
        return self.logprobs(x, head)

