"""Does the tiny target learn to copy a passage it is asked for (issue 14's recall), and how far does it hold?

The pair shipped on 2026-12-01 copied nothing: teacher-forced on the recall text, its target predicted the passage's
words at the grammar's rate (11% at 256-1024 tokens, the same as novel text; the pair shipped since 2026-12-02 copies,
docs/tiny-model.md). This trains fresh targets (the shipped
architecture, random init from seed 0) on the project's training text for a few recipes and measures, for each,
the teacher-forced copy accuracy on the probe's recall layout (passage first, novel filler, the request, the
passage again; scored after the 4-word cue) at 512 to 32k tokens. Copy-weighted loss: the repeated passage's
tokens (after the cue) weigh w in the cross-entropy.

    PYTHONPATH=$PWD python benchmarks/induction_sweep.py --out $OUT/induction_sweep.json

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
from ddprobe.engine.generate import Engine
from ddprobe.engine.tokenizer import WordTokenizer
from ddprobe.engine.train import _lr
from ddprobe.engine.traindata import COPY_CUE, REPEAT_PROMPT, TextStream

TOK = WordTokenizer.default()
REQ = TOK.encode(REPEAT_PROMPT)
CUE = COPY_CUE


class Stream:
    """The training text (traindata.TextStream) with a weight per token: w on a repeated passage after its cue."""

    def __init__(self, seq_len: int, recall: float, w: float, seed: int):
        self.text, self.w = TextStream(TOK, seq_len, seed, recall), w

    def batch(self, b, dev):
        xs, ms = zip(*[self.text.sequence_masked() for _ in range(b)])
        w = 1.0 + (self.w - 1.0) * torch.tensor(ms, dtype=torch.float32, device=dev)
        return torch.tensor(xs, device=dev), w


def recall_case(n_tokens: int, seed: int):
    """The probe's layout: passage (a roster of 64 names, texts.roster) first, novel filler, the request, the
    passage again."""
    passage = TOK.encode(texts.roster(64, random.Random(seed * 7 + 1)))
    room = n_tokens - 2 * len(passage) - len(REQ)
    filler = TOK.encode(texts.novel(room, seed=seed * 7 + 2))[:room]
    return passage + filler + REQ + passage, len(passage) + len(filler) + len(REQ)


@torch.no_grad()
def copy_acc(target, n_tokens: int, n: int, dev) -> float:
    hit = tot = 0
    for i in range(n):
        seq, start = recall_case(n_tokens, 1000 + i)
        x = torch.tensor([seq], device=dev)
        h, _ = target.forward_causal(x)
        pred = target.lm_head(h[0, start + CUE - 1: len(seq) - 1]).argmax(-1)
        truth = x[0, start + CUE:]
        hit += int((pred == truth).sum())
        tot += truth.numel()
    return hit / tot


def train(recipe: dict, dev) -> tuple:
    eng = Engine("tiny", seed=0, device=dev, max_ctx=1024)
    m = eng.target
    m.train().requires_grad_(True)
    opt = torch.optim.AdamW(m.parameters(), lr=recipe["lr"], weight_decay=0.01, betas=(0.9, 0.95))
    log = []
    t0 = time.perf_counter()
    for phase in recipe["phases"]:  # (seq_len, batch, steps, recall share, lr factor)
        t, b, steps, recall, lrf = phase
        st = Stream(t, recall, recipe["w"], seed=len(log) + 17)
        for step in range(steps):
            for g in opt.param_groups:
                g["lr"] = _lr(step, steps, recipe["lr"] * lrf)
            x, w = st.batch(b, dev)
            h, _ = m.forward_causal(x)
            lo = F.cross_entropy(m.lm_head(h)[:, :-1].flatten(0, 1).float(), x[:, 1:].flatten(), reduction="none")
            ww = w[:, 1:].flatten()
            loss = (lo * ww).sum() / ww.sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            opt.step()
            if step % 250 == 0 or step == steps - 1:
                m.eval()
                log.append({"t": t, "step": step, "loss": loss.item(), "copy512": copy_acc(m, 512, 8, dev),
                            "s": time.perf_counter() - t0})
                m.train()
                print(recipe["name"], json.dumps(log[-1]), flush=True)
    m.eval().requires_grad_(False)
    return m, log


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("induction_sweep.json"))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--scale", type=float, default=1.0, help="steps x scale (a short CPU smoke run: 0.02)")
    ap.add_argument("--eval", default="512,2048,8192,32768")
    a = ap.parse_args()
    dev = a.device
    torch.manual_seed(0)

    def ph(t, b, steps, recall, lrf=1.0):
        return (t, b, max(2, int(steps * a.scale)), recall, lrf)

    recipes = [
        {"name": "shipped-mix", "lr": 2e-3, "w": 1.0, "phases": [ph(512, 32, 2000, 0.25)]},
        {"name": "w4", "lr": 2e-3, "w": 4.0, "phases": [ph(512, 32, 2000, 0.25)]},
        # its log's last 512 entry is the same recipe at 512 alone (same init, same stream)
        {"name": "recall.75-w4-long", "lr": 2e-3, "w": 4.0,
         "phases": [ph(512, 32, 2000, 0.75), ph(2048, 8, 600, 0.75, 0.5), ph(8192, 2, 300, 0.75, 0.25)]},
        {"name": "recall.75-w4-3k", "lr": 3e-3, "w": 4.0, "phases": [ph(512, 32, 3000, 0.75)]},
    ]
    evals = [int(c) for c in a.eval.split(",")]
    out = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "date": time.strftime("%Y-%m-%d"),
           "results": []}
    for r in recipes:
        m, log = train(r, dev)
        acc = {n: copy_acc(m, n, 4 if n > 8192 else 8, dev) for n in evals}
        out["results"].append({"recipe": r, "log": log, "copy_acc": acc})
        print(r["name"], "copy acc", acc, flush=True)
        a.out.write_text(json.dumps(out, indent=1))
    print("\n| recipe | " + " | ".join(f"copy acc {n // 1024 if n >= 1024 else n}{'k' if n >= 1024 else ''}"
                                       for n in evals) + " | train s |")
    print("|---|" + "---|" * (len(evals) + 1))
    for res in out["results"]:
        print(f"| {res['recipe']['name']} | " + " | ".join(f"{res['copy_acc'][n]:.2f}" for n in evals)
              + f" | {res['log'][-1]['s']:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
