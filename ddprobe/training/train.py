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

from ..engine.drafter import Drafter
from ..engine.rope import apply_rope
from ..engine.target import TargetModel


def target_forward_train(target: TargetModel, tokens: torch.Tensor):
    """tokens [B, T] -> (logits [B, T, V], features [B, T, n_feat * hidden]); causal, positions 0..T-1.
    The engine's own causal forward (``TargetModel.forward_causal``)."""
    hidden, features = target.forward_causal(tokens)
    return target.lm_head(hidden), features


def drafter_forward_train(drafter: Drafter, target: TargetModel, tokens: torch.Tensor, features: torch.Tensor,
                          anchors: torch.Tensor, full_attn: list | None = None) -> torch.Tensor:
    """tokens [B, T], features [B, T, F] (target's, frozen), anchors [B, K] bonus positions
    (1 <= a, a + L < T) -> log-probs [B, K, L, V] of the L tokens after each bonus. full_attn: a list that gets the
    full-attention layer's log attention weights [B, H, K*Lb, T + K*Lb] appended (for a loss on where it looks)."""
    cfg = drafter.cfg
    b, t = tokens.shape
    k_n, lb = anchors.shape[1], cfg.block_size
    dev, dim = tokens.device, target.cfg.hidden_size
    ctx = drafter.hidden_norm(drafter.fc(features))  # [B, T, dim]
    cos_c, sin_c = drafter.rope.cos_sin(torch.arange(t, device=dev), ctx.dtype)
    bonus = target.embed_tokens(tokens.gather(1, anchors))  # [B, K, dim]
    m = drafter.mask_embedding.expand(b, k_n, lb - 1, dim)
    m = m + bonus[:, :, None] if cfg.bonus_all else m  # DrafterConfig.bonus_all: the bonus at every position
    x = torch.cat([bonus[:, :, None], m], 2).reshape(b, k_n * lb, dim)
    pos = (anchors[..., None] + torch.arange(lb, device=dev)).reshape(b, k_n * lb)  # [B, K*Lb]
    cos_b, sin_b = drafter.rope.cos_sin(pos.reshape(-1), ctx.dtype)
    cos_b, sin_b = cos_b.view(b, k_n * lb, -1), sin_b.view(b, k_n * lb, -1)
    qs_full = drafter.full_qs(pos.reshape(-1), ctx.dtype)  # the full layer's query scale, or None
    qs_full = qs_full.view(b, k_n * lb, 1, 1) if qs_full is not None else None
    # masks [B, K*Lb, T + K*Lb]: context before the bonus (windowed or full), then the own block
    a = anchors.repeat_interleave(lb, dim=1)[..., None]  # [B, K*Lb, 1]
    col = torch.arange(t, device=dev)
    before = col < a
    blk = torch.arange(k_n * lb, device=dev) // lb
    own = (blk[:, None] == blk[None, :]).expand(b, -1, -1)
    full_mask = torch.cat([before, own], -1)
    win_mask = torch.cat([before & (col >= a - cfg.sliding_window), own], -1)
    # the full layer's key term from the rows j-1 .. j-history, as the engine computes it
    hist = drafter.history_keys(torch.arange(t, device=dev), ctx) if drafter.hist is not None else None
    qrot = drafter.block_rotation(k_n, ctx.dtype, dev)  # the full layer's queries by block position, or None
    for i, layer in enumerate(drafter.layers):  # the engine's layer, its attention batched with masks
        ck, cv = layer.kv(ctx, cos_c, sin_c, hist if i == drafter.full_layer else None)  # [B, T, H, hd]
        hn = layer.input_layernorm(x)
        q = layer.q(hn, cos_b, sin_b)  # [B, K*Lb, H, hd]
        if i == drafter.full_layer and qs_full is not None:
            q = q * qs_full
        if i == drafter.full_layer and qrot is not None:
            q = apply_rope(q, *qrot)
        bk, bv = layer.kv(hn, cos_b, sin_b)
        keys, vals = torch.cat([ck, bk], 1).transpose(1, 2), torch.cat([cv, bv], 1).transpose(1, 2)
        mask = full_mask if i == drafter.full_layer else win_mask
        if full_attn is not None and i == drafter.full_layer:  # the same attention, its weights kept
            sc = q.transpose(1, 2) @ keys.transpose(-1, -2) * keys.shape[-1] ** -0.5
            logw = torch.log_softmax(sc.float().masked_fill(~mask[:, None], float("-inf")), -1)
            full_attn.append(logw)
            o = (logw.exp().to(vals.dtype) @ vals)
        else:
            o = F.scaled_dot_product_attention(q.transpose(1, 2), keys, vals, attn_mask=mask[:, None])  # [B,H,KLb,hd]
        x = layer.finish(x, o.transpose(1, 2))
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
                 on_log=None, copy_weight: float = 1.0) -> TrainLog:
    """Next-token cross-entropy on the stream's sequences. copy_weight: the weight of the tokens the stream's
    copy mask marks (a passage asked for again, after its cue: ``stream.last_mask``) in a weighted mean; the
    copy signal is rare and a small target forms no induction without it (lab-2026-12-03:benchmarks/induction_sweep.py)."""
    dev = target.lm_head.weight.device
    if copy_weight <= 0:
        raise ValueError(f"copy_weight must be > 0, got {copy_weight}")
    if copy_weight != 1.0 and getattr(stream, "mask", None) is None:
        raise ValueError("copy_weight needs a stream with copy masks (TensorStream over make_dataset(copy_mask=True))")

    def loss_at(step: int) -> torch.Tensor:
        tokens = stream.batch(batch).to(dev)
        logits, _ = target_forward_train(target, tokens)
        ce = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), tokens[:, 1:].reshape(-1),
                             reduction="none")
        if copy_weight == 1.0:
            return ce.mean()
        w = 1.0 + (copy_weight - 1.0) * stream.last_mask[:, 1:].reshape(-1).to(dev, ce.dtype)
        return (ce * w).sum() / w.sum()

    return _fit(target, "target", steps, lr, loss_at, log_every, on_log)


def focus_anchors(tokens: torch.Tensor, anchors: int, n_draft: int, focus: int, gen: torch.Generator,
                  span: int = 64) -> torch.Tensor:
    """[B, anchors] bonus positions (1 <= a < T - n_draft): half drawn uniformly, half within ``span``
    tokens after an occurrence of token ``focus`` (where a rare pattern, such as a passage asked for
    again, starts), falling back to uniform in a sequence without one."""
    b, t = tokens.shape
    anc = torch.randint(1, t - n_draft, (b, anchors), generator=gen)
    half = anchors // 2
    for i in range(b):
        at = (tokens[i, : t - n_draft - 1] == focus).nonzero().flatten()
        if at.numel():
            pick = at[torch.randint(0, at.numel(), (half,), generator=gen)]
            off = torch.randint(1, span + 1, (half,), generator=gen)
            anc[i, :half] = (pick + off).clamp(1, t - n_draft - 1)
    return anc


def train_drafter(drafter: Drafter, target: TargetModel, stream, steps: int, batch: int, anchors: int = 16,
                  lr: float = 3e-3, seed: int = 0, log_every: int = 25, on_log=None,
                  focus: int | None = None) -> TrainLog:
    """Cross-entropy of the drafter's L positions against the stream's next L tokens; target frozen.
    focus: a token id; half of the anchors then fall just after its occurrences (``focus_anchors``)."""
    target.eval().requires_grad_(False)
    gen = torch.Generator().manual_seed(seed)
    n_draft = drafter.cfg.block_size - 1
    dev = target.lm_head.weight.device
    offs = torch.arange(1, n_draft + 1, device=dev)

    def loss_at(step: int) -> torch.Tensor:
        cpu = stream.batch(batch)
        tokens = cpu.to(dev)
        b, t = tokens.shape
        with torch.no_grad():
            _, feats = target_forward_train(target, tokens)
        if focus is None:
            anc = torch.randint(1, t - n_draft, (b, anchors), generator=gen).to(dev)
        else:
            anc = focus_anchors(cpu, anchors, n_draft, focus, gen).to(dev)
        logp = drafter_forward_train(drafter, target, tokens, feats, anc)  # [B, K, L, V]
        labels = tokens.gather(1, (anc[..., None] + offs).reshape(b, -1)).view(b, anchors, -1)
        return F.nll_loss(logp.reshape(-1, logp.shape[-1]), labels.reshape(-1))

    return _fit(drafter, "drafter", steps, lr, loss_at, log_every, on_log)
