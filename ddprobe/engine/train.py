"""Training of the ``tiny`` target and its DFlash-style drafter (deterministic from a seed).

Batched, differentiable forwards that compute the same functions as the engine's inference
path (tests compare them): the target over whole sequences with causal attention; the
drafter on K anchor blocks per sequence at once, each block [bonus, L mask tokens] seeing the
target's features of the tokens before its bonus (windowed, except the full-attention layer)
and its own rows (non-causal). The target trains first; the drafter trains against the frozen
target (its embedding, head and features), predicting the L tokens after each bonus.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .drafter import Drafter
from .rope import apply_rope
from .target import TargetModel


def _rope_bt(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, H, d] with cos/sin [T, d] (or [B, T, d]) -> roped x."""
    if cos.dim() == 2:
        cos, sin = cos[None], sin[None]
    return x * cos[:, :, None] + torch.cat([-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]], -1) \
        * sin[:, :, None]


def target_forward_train(target: TargetModel, tokens: torch.Tensor):
    """tokens [B, T] -> (logits [B, T, V], features [B, T, n_feat * hidden]); causal, positions 0..T-1."""
    cfg = target.cfg
    b, t = tokens.shape
    h, nope, c, r, v = cfg.num_heads, cfg.qk_nope_head_dim, cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.v_head_dim
    x = target.embed_tokens(tokens)  # [B, T, hidden]
    cos, sin = target.rope.cos_sin(torch.arange(t, device=tokens.device), x.dtype)  # [T, r]
    feats = {}
    for i, layer in enumerate(target.layers):
        attn = layer.self_attn
        hn = layer.input_layernorm(x)
        kv_a = attn.kv_a_proj_with_mqa(hn)  # [B, T, D]
        rows = torch.cat([attn.kv_a_layernorm(kv_a[..., :c]), _rope_bt(kv_a[..., None, c:], cos, sin)[..., 0, :]], -1)
        q = attn._q(hn.reshape(b * t, -1)).view(b, t, h, nope + r)
        w_b = attn.kv_b_proj.weight.view(h, nope + v, c)
        q_lat = torch.einsum("bthn,hnc->bthc", q[..., :nope], w_b[:, :nope])  # absorbed: [B, T, H, C]
        q_abs = torch.cat([q_lat, _rope_bt(q[..., nope:], cos, sin)], -1).transpose(1, 2)  # [B, H, T, D]
        k = rows[:, None].expand(b, h, t, rows.shape[-1])
        o = F.scaled_dot_product_attention(q_abs, k, k[..., :c], is_causal=True, scale=cfg.sm_scale)  # [B,H,T,C]
        o = torch.einsum("bhtc,hvc->bthv", o, w_b[:, nope:]).reshape(b, t, h * v)
        x = x + attn.o_proj(o)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        if i in cfg.feature_layers:
            feats[i] = x
    features = torch.cat([feats[i] for i in cfg.feature_layers], -1)
    return target.lm_head(target.norm(x)), features


def drafter_forward_train(drafter: Drafter, target: TargetModel, tokens: torch.Tensor, features: torch.Tensor,
                          anchors: torch.Tensor) -> torch.Tensor:
    """tokens [B, T], features [B, T, F] (target's, frozen), anchors [B, K] bonus positions
    (1 <= a, a + L < T) -> log-probs [B, K, L, V] of the L tokens after each bonus."""
    cfg = drafter.cfg
    b, t = tokens.shape
    k_n, lb, hh, hd = anchors.shape[1], cfg.block_size, cfg.num_heads, cfg.head_dim
    dev, dim = tokens.device, target.cfg.hidden_size
    ctx = drafter.hidden_norm(drafter.fc(features))  # [B, T, dim]
    cos_c, sin_c = drafter.rope.cos_sin(torch.arange(t, device=dev), ctx.dtype)
    bonus = target.embed_tokens(tokens.gather(1, anchors))  # [B, K, dim]
    x = torch.cat([bonus[:, :, None], drafter.mask_embedding.expand(b, k_n, lb - 1, dim)], 2).reshape(b, k_n * lb, dim)
    pos = (anchors[..., None] + torch.arange(lb, device=dev)).reshape(b, k_n * lb)  # [B, K*Lb]
    cos_b, sin_b = drafter.rope.cos_sin(pos.reshape(-1), ctx.dtype)
    cos_b, sin_b = cos_b.view(b, k_n * lb, -1), sin_b.view(b, k_n * lb, -1)
    # masks [B, K*Lb, T + K*Lb]: context before the bonus (windowed or full), then the own block
    a = anchors.repeat_interleave(lb, dim=1)[..., None]  # [B, K*Lb, 1]
    col = torch.arange(t, device=dev)
    before = col < a
    blk = torch.arange(k_n * lb, device=dev) // lb
    own = (blk[:, None] == blk[None, :]).expand(b, -1, -1)
    full_mask = torch.cat([before, own], -1)
    win_mask = torch.cat([before & (col >= a - cfg.sliding_window), own], -1)
    for i, layer in enumerate(drafter.layers):
        ck = _rope_bt(layer.k_proj(ctx).view(b, t, hh, hd), cos_c, sin_c)
        cv = layer.v_proj(ctx).view(b, t, hh, hd)
        hn = layer.input_layernorm(x)
        q = _rope_bt(layer.q_proj(hn).view(b, k_n * lb, hh, hd), cos_b, sin_b)
        bk = _rope_bt(layer.k_proj(hn).view(b, k_n * lb, hh, hd), cos_b, sin_b)
        bv = layer.v_proj(hn).view(b, k_n * lb, hh, hd)
        keys, vals = torch.cat([ck, bk], 1).transpose(1, 2), torch.cat([cv, bv], 1).transpose(1, 2)
        mask = full_mask if i == drafter.full_layer else win_mask
        o = F.scaled_dot_product_attention(q.transpose(1, 2), keys, vals, attn_mask=mask[:, None])  # [B,H,KLb,hd]
        x = x + layer.o_proj(o.transpose(1, 2).reshape(b, k_n * lb, hh * hd))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    logits = target.lm_head(drafter.norm(x.view(b, k_n, lb, dim)[:, :, 1:]))  # [B, K, L, V]
    return torch.log_softmax(logits.float(), -1)


@dataclass
class TrainLog:
    step: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    seconds: float = 0.0


def _lr(step: int, steps: int, peak: float, warmup: int = 50) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


def _fit(module: torch.nn.Module, name: str, steps: int, lr: float, loss_at, log_every: int, on_log) -> TrainLog:
    """AdamW with warm-up + cosine and gradient clipping; ``loss_at(step)`` returns the batch loss."""
    module.train().requires_grad_(True)
    opt = torch.optim.AdamW(module.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.95))
    log, t0 = TrainLog(), time.perf_counter()
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = _lr(step, steps, lr)
        loss = loss_at(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        opt.step()
        if step % log_every == 0 or step == steps - 1:
            log.step.append(step)
            log.loss.append(loss.item())
            if on_log:
                on_log(name, step, log.loss[-1])
    log.seconds = time.perf_counter() - t0
    module.eval().requires_grad_(False)
    return log


def train_target(target: TargetModel, stream, steps: int, batch: int, lr: float = 3e-3, log_every: int = 25,
                 on_log=None) -> TrainLog:
    """Next-token cross-entropy on the stream's sequences."""
    dev = target.lm_head.weight.device

    def loss_at(step: int) -> torch.Tensor:
        tokens = stream.batch(batch).to(dev)
        logits, _ = target_forward_train(target, tokens)
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), tokens[:, 1:].reshape(-1))

    return _fit(target, "target", steps, lr, loss_at, log_every, on_log)


def train_drafter(drafter: Drafter, target: TargetModel, stream, steps: int, batch: int, anchors: int = 16,
                  lr: float = 3e-3, seed: int = 0, log_every: int = 25, on_log=None) -> TrainLog:
    """Cross-entropy of the drafter's L positions against the stream's next L tokens; target frozen."""
    target.eval().requires_grad_(False)
    gen = torch.Generator().manual_seed(seed)
    n_draft = drafter.cfg.block_size - 1
    dev = target.lm_head.weight.device
    offs = torch.arange(1, n_draft + 1, device=dev)

    def loss_at(step: int) -> torch.Tensor:
        tokens = stream.batch(batch).to(dev)
        b, t = tokens.shape
        with torch.no_grad():
            _, feats = target_forward_train(target, tokens)
        anc = torch.randint(1, t - n_draft, (b, anchors), generator=gen).to(dev)
        logp = drafter_forward_train(drafter, target, tokens, feats, anc)  # [B, K, L, V]
        labels = tokens.gather(1, (anc[..., None] + offs).reshape(b, -1)).view(b, anchors, -1)
        return F.nll_loss(logp.reshape(-1, logp.shape[-1]), labels.reshape(-1))

    return _fit(drafter, "drafter", steps, lr, loss_at, log_every, on_log)
