"""The recall curriculum: the recipe of the shipped tiny pair (a target that copies a passage asked for again from
far back, trained in the probe's own layout, then a drafter that drafts the copy). Each call runs the --stages named
(in the order below) and saves the state to --out, so a later call resumes from it with --resume; docs/tiny-model.md
lists the seven H200 calls that made the shipped weights.

    python -m ddprobe.training.recall_curriculum --device cuda --out $OUT/rc --stages A,B,C
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .. import texts
from ..engine.generate import Engine
from ..engine.tokenizer import WordTokenizer
from .curriculum import draft_accuracy, drafter_loop
from .train import target_forward_train, train_drafter
from .traindata import REPEAT_PROMPT, RecallStream

LONG = {"B": (1024, 16, 600), "C": (4096, 4, 400), "D": (16384, 2, 300), "E": (32768, 1, 200)}  # len, batch, steps


def backend(eng, tok):
    from ..probes.backends.engine import EngineBackend

    return EngineBackend.around(eng, tok)


@torch.no_grad()
def copy_at(eng, tok, ctx: int, seed: int = 0, new_tokens: int = 128) -> float:
    """Teacher-forced: the share of the passage's names after the cue that the target predicts, on the probe's own
    recall prompt of ``ctx`` tokens (its passage sized for ``new_tokens``: 160 names for 128, 64 for 32 or fewer)."""
    from ..probes.commit import prompt_ids

    ids = prompt_ids(backend(eng, tok), "recall", ctx, seed=seed, new_tokens=new_tokens)
    _, passage = texts.recall(8, seed, texts.recall_words(new_tokens))
    p = tok.encode(passage)[texts.RECALL_CUE_WORDS:]
    t = eng.target
    was = t.training
    t.eval()
    y = torch.tensor([ids + p], device=t.lm_head.weight.device)
    pred = t.lm_head(t.forward_causal(y)[0])[0, len(ids) - 1:-1].argmax(-1)
    t.train(was)
    return round((pred == y[0, len(ids):]).float().mean().item(), 3)


@torch.no_grad()
def draft_copy_at(eng, tok, ctx: int, seed: int = 0, anchors: int = 16) -> list[float]:
    """Teacher-forced drafter accuracy at block positions k = 1..L inside the copy of the probe's recall prompt of
    ``ctx`` tokens (anchors spread over the first 100 copied names)."""
    from ..probes.commit import prompt_ids

    ids = prompt_ids(backend(eng, tok), "recall", ctx, seed=seed)
    _, passage = texts.recall(8, seed, texts.RECALL_WORDS)
    y = ids + tok.encode(passage)[texts.RECALL_CUE_WORDS:]
    return draft_accuracy(eng, y, torch.linspace(len(ids), len(ids) + 100, anchors).long())


@torch.no_grad()
def draft_predictable_at(eng, tok, ctx: int) -> list[float]:
    """Teacher-forced drafter accuracy at block positions k = 1..L on the probe's predictable prompt of ``ctx``
    tokens, anchors on every phase of the 7-token refrain in its last 120 tokens."""
    from ..probes.commit import prompt_ids

    ids = prompt_ids(backend(eng, tok), "predictable", ctx)
    return draft_accuracy(eng, ids, torch.arange(len(ids) - 120, len(ids) - eng.drafter.cfg.block_size, 4))


STAGES = {  # name: what it trains (the --help text); run in this order whatever the order typed
    "A": "the target from scratch on 256-token RecallStream sequences (16-64-name passages), lr constant after a "
         "50-step ramp, until the teacher-forced copy on 64-name recall prompts reaches --form or --a-steps run out",
    "B,C,D,E": "the same stream at 1k, 4k, 16k, 32k tokens (16-160 names, asked for anywhere after), --long-lr: "
               "each stage carries the copy out toward 4x its length",
    "tune": "the target at --tune-lr on 4k then --tune-xl-len sequences with refrains of fresh sentences",
    "F": "the target at --f-len tokens (one sequence a step, each followed by a 4k batch), --f-far of the "
         "passages asked for across the whole sequence",
    "dwarm": "the drafter on copy-dense 256-token sequences with the attention loss on name anchors until it "
             "drafts the copy",
    "drafter": "the drafter at 2k then --drafter-xl-len (train_drafter, half of the anchors after the request)",
    "rwarm": "the drafter on copies and refrains in turn, the attention loss on every anchor (2-token match), "
             "until both are drafted",
    "rdrafter": "the same at 2k then --drafter-xl-len",
    "V": "commit length with the engine (bf16, fp32 logits) at --eval-ctx for the three text kinds",
    "ship": "--out becomes a weights folder (weights.save, the recipe, --ship-logs in train_log.json)",
}
KNOWN = ("A", *LONG, "tune", "F", "dwarm", "drafter", "rwarm", "rdrafter", "V", "ship")


def parser() -> argparse.ArgumentParser:
    epilog = "stages:\n" + "\n".join(f"  {k:9} {v}" for k, v in STAGES.items())
    ap = argparse.ArgumentParser(description=__doc__, epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--resume", type=Path, default=None, help="a state saved by an earlier call")
    ap.add_argument("--stages", default="A,B,C")
    ap.add_argument("--a-steps", type=int, default=12000)
    ap.add_argument("--a-batch", type=int, default=32)
    ap.add_argument("--form", type=float, default=0.9, help="stage A ends when the copy reads this")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--long-lr", type=float, default=1e-3)
    ap.add_argument("--copy-weight", type=float, default=2.0)
    ap.add_argument("--long-steps", default="", help="steps of B,C,D,E instead of 600,400,300,200")
    ap.add_argument("--checks", default="1024,4096,16384,65536", help="contexts of the target's copy checks")
    ap.add_argument("--drafter-steps", type=int, default=800)
    ap.add_argument("--drafter-warm-steps", type=int, default=4000, help="the drafter first on 256-token sequences "
                    "dense with copies (stage 'dwarm'), checked every 500 steps, until it drafts the copy")
    ap.add_argument("--attn-weight", type=float, default=1.0, help="dwarm: weight of the loss on where the full "
                    "layer looks (attn_loss)")
    ap.add_argument("--fresh-drafter", action="store_true", help="the drafter from its seeded init, not --resume's")
    ap.add_argument("--tune-lr", type=float, default=3e-4)
    ap.add_argument("--tune-steps", default="300,100", help="stage 'tune': steps at 4k (batch 4), then at 32k")
    ap.add_argument("--tune-xl-len", type=int, default=32768)
    ap.add_argument("--dchecks", default="1024,65536", help="contexts of the drafter's copy checks")
    ap.add_argument("--drafter-xl-steps", type=int, default=100)
    ap.add_argument("--drafter-lr", type=float, default=1e-3, help="the drafter's phases after dwarm")
    ap.add_argument("--drafter-xl-len", type=int, default=32768)
    ap.add_argument("--eval-ctx", default="1024,16384,65536,131072,262144")
    ap.add_argument("--eval-new", type=int, default=128)
    ap.add_argument("--f-steps", type=int, default=120, help="stage F: 64k steps (each followed by a 4k batch)")
    ap.add_argument("--f-len", type=int, default=65536)
    ap.add_argument("--f-far", type=float, default=0.0, help="stage F: RecallStream's far (passages asked for "
                    "across the whole sequence)")
    ap.add_argument("--rwarm-steps", type=int, default=6000, help="stage rwarm: the drafter's steps at most")
    ap.add_argument("--rdrafter-steps", default="600,100", help="stage rdrafter: steps at 2k (batch 8), then at 32k")
    ap.add_argument("--ship-logs", type=Path, nargs="*", default=[], help="stage ship: the calls' log.json files, "
                    "in order, kept in the shipped train_log.json")
    return ap


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The options, every list option parsed once (into ints), every bad value refused by argparse in one line."""
    ap = parser()
    a = ap.parse_args(argv)
    a.stages = [s for s in a.stages.split(",") if s]
    bad = [s for s in a.stages if s not in KNOWN]
    if bad:
        ap.error(f"unknown stage {bad[0]!r}; known: {', '.join(KNOWN)}")
    ints = lambda text: [int(v) for v in text.split(",") if v]  # noqa: E731
    try:
        for name in ("tune_steps", "rdrafter_steps", "long_steps", "checks", "dchecks", "eval_ctx"):
            setattr(a, name, ints(getattr(a, name)))
    except ValueError as e:
        ap.error(f"steps and contexts are comma-separated integers ({e})")
    for name, v in (("--tune-steps", a.tune_steps), ("--rdrafter-steps", a.rdrafter_steps)):
        if len(v) != 2:
            ap.error(f"{name} takes two step counts, e.g. 600,100")
    if a.resume is not None and not a.resume.is_file():
        ap.error(f"--resume {a.resume}: no such file")
    a.long = dict(LONG)
    for k, n in zip("BCDE", a.long_steps):
        a.long[k] = (*LONG[k][:2], n)
    return a


class Run:
    """One call: the options, the engine being trained, the tokenizer, and the log (--out/log.json, appended to)."""

    def __init__(self, a: argparse.Namespace):
        self.a = a
        a.out.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(0)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        self.tok = WordTokenizer.default()
        self.eng = Engine("tiny", seed=0, device=a.device, max_ctx=1024)
        if a.resume is not None:
            self.eng.load_state_dict(torch.load(a.resume, map_location=a.device))
            if a.fresh_drafter:
                fresh = Engine("tiny", seed=0, device=a.device, max_ctx=1024)
                self.eng.drafter.load_state_dict(fresh.drafter.state_dict())
        self.log_path = a.out / "log.json"
        self.log = json.loads(self.log_path.read_text()) if self.log_path.exists() else []
        self.focus = self.tok.encode(REPEAT_PROMPT)[-1]
        self.t0 = time.time()

    def say(self, **kw) -> None:
        kw["s"] = round(time.time() - self.t0, 1)
        self.log.append(kw)
        print(json.dumps(kw), flush=True)
        self.log_path.write_text(json.dumps(self.log, indent=1))

    def show(self, who: str, step: int, loss: float) -> None:
        self.say(stage=who, step=step, loss=round(loss, 3))

    def save(self, tag: str) -> None:
        torch.save(self.eng.state_dict(), self.a.out / "state.pt")
        self.say(saved=tag)

    def checks(self, tag: str) -> None:
        """After a target stage: the teacher-forced copy on texts.recall prompts at --checks."""
        self.say(check=tag, copy={c: copy_at(self.eng, self.tok, c) for c in self.a.checks})

    def dchecks(self, tag: str) -> None:
        """After a drafter stage: its teacher-forced accuracy per block position at --dchecks."""
        self.say(check=tag, draft_copy={c: draft_copy_at(self.eng, self.tok, c) for c in self.a.dchecks})

    def dcheck(self, ctxs=(1024,)) -> dict:
        """The rotation drafter's check: copy and refrain drafted, per block position, at ``ctxs``."""
        return {"draft_copy": {c: draft_copy_at(self.eng, self.tok, c) for c in ctxs},
                "draft_pred": {c: draft_predictable_at(self.eng, self.tok, c) for c in ctxs}}

    def stream(self, n: int, seed: int, passage=(16, 160), **kw) -> RecallStream:
        return RecallStream(self.tok, n, seed, passage, **kw)


def drafted_both(res: dict) -> bool:
    """dcheck's result: every block position drafted at least 0.9 on copy and refrain."""
    return min(v for kind in res.values() for per_k in kind.values() for v in per_k) >= 0.9


def fit(run: Run, stream, steps: int, batch: int, lr: float, tag: str, every: int, ramp: int = 50, stop=None,
        alt=None) -> None:
    """The target's cross-entropy (copied tokens weighted --copy-weight), AdamW, lr ramped over ``ramp`` steps;
    logged every ``every`` steps, where ``stop()`` (a copy score) ends it at --form; alt: (stream, batch) drawn on
    every other step instead."""
    t, dev = run.eng.target, run.a.device
    t.train().requires_grad_(True)
    opt = torch.optim.AdamW(t.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.95))
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr * min(1.0, (step + 1) / ramp)
        src, bs = alt if alt is not None and step % 2 else (stream, batch)
        x = src.batch(bs).to(dev)
        w = 1.0 + (run.a.copy_weight - 1.0) * src.last_mask[:, 1:].to(dev, torch.float32)
        logits, _ = target_forward_train(t, x)
        ce = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), x[:, 1:].flatten(), reduction="none")
        loss = (ce * w.flatten()).sum() / w.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(t.parameters(), 1.0)
        opt.step()
        if (step + 1) % every == 0 or step == steps - 1:
            c = stop() if stop else None
            run.say(stage=tag, step=step + 1, loss=round(loss.item(), 3), copy=c)
            if stop and c >= run.a.form:
                break
    t.eval().requires_grad_(False)


def stage_a(run: Run) -> None:
    """The stop check reads passages of 64 names, the longest stage A trains (a 160-name passage read <= 0.011 all
    through the first H200 run while the copy had formed by step 4,000)."""
    eng, tok = run.eng, run.tok
    fit(run, run.stream(256, 1, (16, 64), copy_share=0.8), run.a.a_steps, run.a.a_batch, run.a.lr, "A", 500,
        stop=lambda: round(sum(copy_at(eng, tok, 400, seed=s, new_tokens=16) for s in range(4)) / 4, 3))
    run.save("A")
    run.checks("A")


def stage_long(run: Run, k: str) -> None:
    n, b, steps = run.a.long[k]
    fit(run, run.stream(n, 10 + ord(k), (16, 160 if n > 1024 else 64), copy_share=0.4), steps, b, run.a.long_lr, k,
        max(25, steps // 4), ramp=20)
    run.save(k)
    run.checks(k)


def stage_tune(run: Run) -> None:
    """The rarer refrain starts (RecallStream's default now), at a low lr."""
    s4, s32 = run.a.tune_steps
    fit(run, run.stream(4096, 31, copy_share=0.4), s4, 4, run.a.tune_lr, "tune4k", 100, ramp=20)
    fit(run, run.stream(run.a.tune_xl_len, 32, copy_share=0.4), s32, 1, run.a.tune_lr, "tune32k", 50, ramp=10)
    run.save("tune")
    run.checks("tune")


def stage_f(run: Run) -> None:
    """The target at --f-len tokens (64k; 128k in calls 6-7), a 4k batch after each long step to keep the short
    contexts, at the tune's low lr."""
    a = run.a
    fit(run, run.stream(a.f_len, 41, copy_share=0.4, far=a.f_far), 2 * a.f_steps, 1, a.tune_lr, "F", 40, ramp=20,
        alt=(run.stream(4096, 42, copy_share=0.4), 4))
    run.save("F")
    run.checks("F")


def stage_dwarm(run: Run) -> None:
    """The drafter's copy warm-up (calls 3-4): a constant lr, and (--attn-weight) a loss on where its full layer
    looks, on the anchors whose bonus is a name."""
    eng, tok, a = run.eng, run.tok, run.a
    names = torch.zeros(len(tok) + 8, dtype=torch.bool, device=a.device)
    names[tok.encode(" ".join(texts.NAMES))] = True
    drafter_loop(eng, [(run.stream(256, 6, (16, 64), copy_share=0.8), 32)], a.drafter_warm_steps, a.lr, 16,
                 run.focus, run.say, "dwarm", 500, lambda: {"draft_copy": draft_copy_at(eng, tok, 1024)},
                 attn_weight=a.attn_weight, match=1, names=names,
                 stop=lambda r: sum(r["draft_copy"]) / len(r["draft_copy"]) >= 0.7)
    run.save("dwarm")
    run.dchecks("dwarm")


def stage_drafter(run: Run) -> None:
    eng, a = run.eng, run.a
    train_drafter(eng.drafter, eng.target, run.stream(2048, 7, copy_share=0.4), a.drafter_steps, 8, anchors=32,
                  lr=a.drafter_lr, seed=1, on_log=run.show, log_every=250, focus=run.focus)
    train_drafter(eng.drafter, eng.target, run.stream(a.drafter_xl_len, 8, copy_share=0.4), a.drafter_xl_steps, 1,
                  anchors=128, lr=a.drafter_lr / 4, seed=2, on_log=run.show, log_every=50, focus=run.focus)
    run.save("drafter")
    run.dchecks("drafter")


def stage_rwarm(run: Run) -> None:
    """The history-rotation drafter: copies and refrains (up to 400 repeats) in turn, the loss on where its full
    layer looks on every anchor with a 2-token match."""
    streams = [(run.stream(256, 5, (16, 64), copy_share=0.8), 32),
               (run.stream(256, 6, (16, 64), copy_share=0.3, refrain=0.1, refrain_reps=(20, 400)), 32)]
    drafter_loop(run.eng, streams, run.a.rwarm_steps, run.a.lr, 16, run.focus, run.say, "rwarm", 500, run.dcheck,
                 stop=drafted_both)
    run.save("rwarm")
    run.say(check="rwarm", **run.dcheck(run.a.dchecks))


def stage_rdrafter(run: Run) -> None:
    """Then longer sequences: 2k, and --drafter-xl-len whose refrains run to thousands of tokens."""
    a, eng = run.a, run.eng
    s2, s32 = a.rdrafter_steps
    streams = [(run.stream(2048, 7, copy_share=0.4), 8),
               (run.stream(2048, 9, copy_share=0.2, refrain=0.05, refrain_reps=(20, 400)), 8)]
    drafter_loop(eng, streams, s2, a.drafter_lr, 32, run.focus, run.say, "rdrafter2k", max(s2 // 4, 1), run.dcheck,
                 seed=4)
    streams = [(run.stream(a.drafter_xl_len, 8, copy_share=0.4), 1),
               (run.stream(a.drafter_xl_len, 10, copy_share=0.2, refrain=0.02, refrain_reps=(100, 1000)), 1)]
    drafter_loop(eng, streams, s32, a.drafter_lr / 4, 128, run.focus, run.say, "rdrafter32k", max(s32 // 2, 1),
                 run.dcheck, ramp=10, seed=5)
    run.save("rdrafter")
    run.say(check="rdrafter", **run.dcheck(a.dchecks))


def stage_v(run: Run) -> None:
    """Commit length with the engine (bf16, fp32 logits) for the three kinds, the words the target copied, the
    share of its output repeating its own 5-token spans."""
    from ..probes.backends.base import GenStats
    from ..probes.commit import output_repeats, prompt_ids, recall_copied

    a, ctxs = run.a, run.a.eval_ctx
    ev = Engine("tiny", seed=0, device=a.device, dtype=torch.bfloat16, max_ctx=max(ctxs) + 1024)
    ev.load_state_dict(run.eng.state_dict())
    ev.model.to(dtype=torch.bfloat16)
    be = backend(ev, run.tok)
    for kind in ("predictable", "novel", "recall"):
        for ctx in ctxs:
            ids = prompt_ids(be, kind, ctx, new_tokens=a.eval_new)
            t1 = time.time()
            res = ev.generate(ids, a.eval_new)
            st = GenStats(prompt_tokens=len(ids), completion_tokens=len(res.tokens), verify_steps=len(res.steps),
                          tokens=list(res.tokens))
            run.say(eval=kind, ctx=ctx, commit=round(res.mean_commit_len, 2),
                    copied=(recall_copied(be, st) or (None,))[0] if kind == "recall" else None,
                    repeats=output_repeats(list(res.tokens)), gen_s=round(time.time() - t1, 1))


def stage_ship(run: Run) -> None:
    """--out becomes the preset's weights folder: model, config, tokenizer, checksums, and the calls' logs."""
    from ..engine import weights

    a = run.a
    calls = [{"log": str(p), "entries": json.loads(p.read_text())} for p in a.ship_logs]
    run.log.clear()  # the folder gets train_log.json, not this call's log.json
    training = {"recipe": "ddprobe/training/recall_curriculum.py, the calls listed in docs/tiny-model.md, each "
                          "resuming the state the one before saved", "device": "NVIDIA H200", "resumed": str(a.resume),
                "docstring": __doc__, "calls": calls}
    weights.save(run.eng, a.out, run.tok, {"training": {k: v for k, v in training.items() if k != "calls"}})
    (a.out / "train_log.json").write_text(json.dumps(training, indent=1))
    run.log_path.unlink(missing_ok=True)
    print(f"wrote {a.out}")


def main(argv: list[str] | None = None) -> int:
    run = Run(parse(argv))
    steps = {"A": stage_a, **{k: (lambda r, k=k: stage_long(r, k)) for k in LONG}, "tune": stage_tune, "F": stage_f,
             "dwarm": stage_dwarm, "drafter": stage_drafter, "rwarm": stage_rwarm, "rdrafter": stage_rdrafter,
             "V": stage_v, "ship": stage_ship}
    for name in KNOWN:
        if name in run.a.stages:
            steps[name](run)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
