"""The recall curriculum's training pieces (the recipe of the shipped tiny pair: ddprobe/training/recall_curriculum.py):
the loss on where the drafter's full layer looks, the drafter's loop against the frozen target, and its
teacher-forced accuracy per block position. docs/tiny-model.md says what they are for."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .train import drafter_forward_train, focus_anchors, target_forward_train


def attn_loss(logw: torch.Tensor, x: torch.Tensor, anc: torch.Tensor, names: torch.Tensor | None, n_draft: int,
              match: int = 1):
    """-log(attention on the copy's source), averaged over heads and over the block positions k = 1..L of the
    anchors that have one: the source rows of block position k are the context rows j < a whose ``match`` tokens
    ending k back equal the ``match`` tokens ending at the bonus (names occur only in their passage and its copy,
    so with match 1 that is where the copy continues; in a refrain, match 2-3 tells "the cat" from "the mat").
    names: a [V] bool mask; then only anchors whose bonus is a name count (None: every anchor)."""
    b, h, kl, _ = logw.shape
    t = x.shape[1]
    lb = n_draft + 1
    j = torch.arange(t, device=x.device)
    k = torch.arange(1, lb, device=x.device)
    src = (j[None, None, None] < anc[..., None, None]).expand(b, anc.shape[1], n_draft, t)  # [B, K, L, T]
    for m in range(match):
        back = j[None, :] - k[:, None] - m  # [L, T]: row j's token k + m back
        want = x.gather(1, (anc - m).clamp(min=0))  # [B, K]: the token m before the bonus
        src = src & (x[:, back.clamp(min=0)][:, None] == want[..., None, None]) & (back >= 0)[None, None]
        src = src & (anc - m >= 0)[..., None, None]
    if names is not None:
        src = src & names[x.gather(1, anc)][..., None, None]
    lw = logw[..., :t].view(b, h, anc.shape[1], lb, t)[:, :, :, 1:]  # [B, H, K, L, T]: block positions 1..L
    hit = torch.logsumexp(lw.masked_fill(~src[:, None], float("-inf")), -1)  # [B, H, K, L]
    ok = src.any(-1)[:, None].expand_as(hit)
    return -(hit[ok]).mean() if ok.any() else logw.new_zeros(())


@torch.no_grad()
def draft_accuracy(eng, tokens: list[int], anc: torch.Tensor) -> list[float]:
    """Teacher-forced: the share of anchors [K] at which the drafter drafts the token k after the bonus, k = 1..L."""
    dev = eng.target.lm_head.weight.device
    y, anc = torch.tensor([tokens], device=dev), anc.to(dev)[None]
    _, feats = target_forward_train(eng.target, y)
    n_draft = eng.drafter.cfg.block_size - 1
    was = eng.drafter.training
    eng.drafter.eval()
    lp = drafter_forward_train(eng.drafter, eng.target, y, feats, anc)  # [1, K, L, V]
    eng.drafter.train(was)
    want = y[0, anc[0, :, None] + torch.arange(1, n_draft + 1, device=dev)]  # [K, L]
    return [round(v, 2) for v in (lp[0].argmax(-1) == want).float().mean(0).tolist()]


def drafter_loop(eng, streams, steps: int, lr: float, anchors: int, focus: int, say, tag: str, every: int,
                 check, attn_weight: float = 1.0, match: int = 2, span: int = 64, ramp: int = 50, seed: int = 3,
                 stop=None, names: torch.Tensor | None = None) -> None:
    """The drafter against the frozen target, batches drawn from ``streams`` [(stream, batch)] in turn: the
    cross-entropy of the L drafted tokens plus attn_weight * attn_loss (``match``-token match; on the anchors whose
    bonus is a name when ``names`` is given, else on every anchor) at a constant lr after a ramp; ``check()`` every
    ``every`` steps is logged, and ``stop(result)`` ends the loop."""
    d, t = eng.drafter, eng.target
    dev = t.lm_head.weight.device
    gen = torch.Generator().manual_seed(seed)
    n_draft = d.cfg.block_size - 1
    offs = torch.arange(1, n_draft + 1, device=dev)
    opt = torch.optim.AdamW(d.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.95))
    d.train().requires_grad_(True)
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr * min(1.0, (step + 1) / ramp)
        stream, bs = streams[step % len(streams)]
        x = stream.batch(bs)
        anc = focus_anchors(x, anchors, n_draft, focus, gen, span=span).to(dev)
        x = x.to(dev)
        with torch.no_grad():
            _, feats = target_forward_train(t, x)
        att = [] if attn_weight else None
        lp = drafter_forward_train(d, t, x, feats, anc, att)
        want = x.gather(1, (anc[..., None] + offs).flatten(1)).view_as(lp[..., 0])
        nll = F.nll_loss(lp.flatten(0, 2), want.flatten())
        al = attn_loss(att[0], x, anc, names, n_draft, match=match) if att else nll.new_zeros(())
        opt.zero_grad(set_to_none=True)
        (nll + attn_weight * al).backward()
        torch.nn.utils.clip_grad_norm_(d.parameters(), 1.0)
        opt.step()
        if (step + 1) % every == 0 or step == steps - 1:
            d.eval()
            res = check()
            d.train()
            say(stage=tag, step=step + 1, nll=round(nll.item(), 3), attn=round(al.item(), 3), **res)
            if stop and stop(res):
                break
    d.eval().requires_grad_(False)
