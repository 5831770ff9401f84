"""How many words of a far copy can the tiny drafter draft per block: one full-attention layer against two?

Issue 14's recall target (at least 4.0 committed per step at 64k and 128k) needs the drafter to draft three or
more words of a passage asked for again, from far back. The shipped drafter has one full-attention layer (the
other sees the last 128 context tokens). This trains drafters from the same init against the shipped target
(frozen), on recall text only, with every block anchored in the copy (after the request and its 4-word cue),
and labels the true continuation (the passage), so it measures what the drafter's architecture can copy, not
whether the target copies. Two drafters: the shipped layout, and the same with the window as wide as the
sequence (both layers full attention: two hops). Scored on the probe's layout (passage first, filler that puts
it more than 128 tokens back, the request, the passage again): the drafter's accuracy at block position k = 1..7
and the mean run of correct positions from the first (what a chain of drafts would have accepted).

    PYTHONPATH=$PWD python benchmarks/drafter_copy_depth.py --out $OUT/drafter_copy_depth.json   # CPU: ~14 min

On the 2-core CPU (2026-12-01, 4 sequences x 16 anchor blocks a step): neither drafter learned to copy, in 600
steps (accuracy 0.07-0.13 at every position, the grammar's rate; mean correct run 0.13 and 0.14) nor in 2,000
(0.07-0.13; 0.09 and 0.10), so these runs say nothing about one hop against two. On the H200 with 8,000 steps
(2026-12-01, docs/tiny-model.md) neither learned either (0.08-0.13; mean run 0.13 and 0.13): more steps do not
help while the frozen target's features carry no match; a target that copies is what would.

Prints a table last.
"""
from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ddprobe import texts
from ddprobe.engine import weights
from ddprobe.engine.config import ModelConfig
from ddprobe.engine.generate import Engine
from ddprobe.engine.tokenizer import WordTokenizer
from ddprobe.engine.train import _lr, drafter_forward_train, target_forward_train
from ddprobe.engine.traindata import COPY_CUE, REPEAT_PROMPT

TOK = WordTokenizer.default()
REQ = TOK.encode(REPEAT_PROMPT)


def recall_seq(rng: random.Random, t: int, min_gap: int) -> tuple[list[int], int, int]:
    """(tokens, copy start, copy end): passage of 16-64 words at a random place, filler of at least min_gap
    tokens, the request, the passage again; novel prose around it up to t tokens."""
    def novel(n):
        out = []
        while len(out) < n:
            out += TOK.encode(texts.sentence(rng))
        return out

    passage = novel(rng.randint(16, 64))[:64]
    head = novel(rng.randint(0, max(1, t - 3 * len(passage) - min_gap - len(REQ) - 64)))
    room = t - len(head) - 2 * len(passage) - len(REQ)
    filler = novel(rng.randint(min_gap, max(min_gap, room)))[:max(min_gap, room)]
    seq = head + passage + filler + REQ + passage
    start = len(head) + len(passage) + len(filler) + len(REQ)
    seq = (seq + novel(t))[:t]
    return seq, start, min(start + len(passage), t)


def batch(rng, b: int, t: int, anchors: int, n_draft: int, min_gap: int):
    toks, anc = [], []
    for _ in range(b):
        while True:
            seq, s, e = recall_seq(rng, t, min_gap)
            lo, hi = s + COPY_CUE - 1, min(e - n_draft - 1, t - n_draft - 1)  # bonus = the cue's last word onward
            if hi > lo:
                break
        toks.append(seq)
        anc.append([rng.randint(lo, hi) for _ in range(anchors)])
    return torch.tensor(toks), torch.tensor(anc)


def train_and_score(window: int, steps: int, seed: int, t: int, min_gap: int, dev: str = "cpu") -> dict:
    cfg = ModelConfig.from_name("tiny", drafter_sliding_window=window)
    eng = Engine(cfg, seed=seed, max_ctx=t + 64, device=dev)
    shipped = Engine("tiny", max_ctx=t + 64, device=dev)
    weights.load_into(shipped, "tiny")
    eng.target.load_state_dict(shipped.target.state_dict())  # the shipped target; the drafter from the seed
    target, drafter = eng.target.eval().requires_grad_(False), eng.drafter
    n_draft = cfg.drafter.block_size - 1
    offs = torch.arange(1, n_draft + 1, device=dev)
    rng = random.Random(seed)
    drafter.train().requires_grad_(True)
    opt = torch.optim.AdamW(drafter.parameters(), lr=2e-3, weight_decay=0.01, betas=(0.9, 0.95))
    t0, log = time.perf_counter(), []
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = _lr(step, steps, 2e-3)
        x, anc = (v.to(dev) for v in batch(rng, 4, t, 16, n_draft, min_gap))
        with torch.no_grad():
            _, feats = target_forward_train(target, x)
        logp = drafter_forward_train(drafter, target, x, feats, anc)
        labels = x.gather(1, (anc[..., None] + offs).reshape(4, -1)).view(4, 16, -1)
        loss = F.nll_loss(logp.reshape(-1, logp.shape[-1]), labels.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == steps - 1:
            log.append({"step": step, "loss": loss.item(), "s": time.perf_counter() - t0})
            print(f"window {window} step {step} loss {loss.item():.3f} ({log[-1]['s']:.0f} s)", flush=True)
    drafter.eval().requires_grad_(False)
    erng = random.Random(10_000 + seed)  # the same held-out sequences for every drafter
    hits = torch.zeros(n_draft)
    runs, n = 0.0, 0
    with torch.no_grad():
        for _ in range(8):
            x, anc = (v.to(dev) for v in batch(erng, 4, t, 16, n_draft, min_gap))
            _, feats = target_forward_train(target, x)
            pred = drafter_forward_train(drafter, target, x, feats, anc).argmax(-1)  # [4, 16, L]
            labels = x.gather(1, (anc[..., None] + offs).reshape(4, -1)).view(4, 16, -1)
            ok = (pred == labels)
            hits += ok.float().sum((0, 1)).cpu()
            runs += float(ok.int().cumprod(-1).sum())
            n += ok.shape[0] * ok.shape[1]
    return {"window": window, "steps": steps, "log": log, "acc_by_position": (hits / n).tolist(),
            "mean_correct_run": runs / n}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("drafter_copy_depth.json"))
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--min-gap", type=int, default=256, help="filler tokens between the passage and the request")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--windows", default="", help="drafter windows to train (default: 128 and one past the sequence)")
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    out = {"device": a.device, "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "args": vars(a) | {
        "out": str(a.out)}, "results": []}
    for window in [int(w) for w in a.windows.split(",") if w] or (128, a.seq_len + 64):
        out["results"].append(train_and_score(window, a.steps, a.seed, a.seq_len, a.min_gap, a.device))
        a.out.write_text(json.dumps(out, indent=1))
    print("\n| drafter | " + " | ".join(f"k={k}" for k in range(1, 8)) + " | mean correct run |")
    print("|---|" + "---|" * 8)
    for r in out["results"]:
        name = "1 full layer (window 128)" if r["window"] == 128 else "2 full layers"
        print(f"| {name} | " + " | ".join(f"{v:.2f}" for v in r["acc_by_position"]) + f" | {r['mean_correct_run']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
