"""The recall curriculum for the tiny pair (issue 14, H200; the recipe of the weights shipped since 2026-12-02): a
target that copies a passage asked for again from far back, trained in the probe's own layout, then a drafter that
drafts the copy, then commit length.

Stages (each saves the state to --out, so a later call resumes from it with --resume):
  A  the target from scratch on RecallStream sequences of 256 tokens (passages of 16-64 names, most tokens in
     passages and copies), lr constant after a 50-step ramp, until the teacher-forced copy on texts.recall's own
     prompts with 64-name passages reaches --form or --a-steps run out;
  B-E the same stream at 1k, 4k, 16k and 32k tokens (passages of 16-160 names, each asked for once at a point
     drawn after it, so the gaps range up to the sequence), lr 1e-3 constant: each stage carries the copy out
     toward 4x its length (docs/tiny-model.md), so the stages double on;
  tune  the target at a low lr (--tune-lr) on 4k then --tune-xl-len sequences with refrains of fresh sentences;
  F  the target at --f-len tokens (one sequence a step, each followed by a 4k batch), --f-far of the passages
     asked for across the whole sequence;
  dwarm, drafter  (calls 1-4) the drafter: copy-dense 256-token sequences with the attention loss on name anchors
     until it drafts the copy, then 2k and 32k sequences (train.train_drafter, half of the anchors just after
     the request);
  rwarm, rdrafter  (calls 5-7) the drafter: copy-dense sequences and refrains in turn, the attention loss on every
     anchor with a 2-token match (drafter_loop), at 256 tokens until copy and refrain are drafted, then 2k and 32k;
  V  commit length with the engine (bf16, fp32 logits) at --eval-ctx for the three kinds, the words the target
     copied, the share of its output repeating its own 5-token spans;
  ship  --out becomes a weights folder (weights.save, the recipe, --ship-logs in train_log.json).
After every target stage: the teacher-forced copy on texts.recall prompts at --checks (probe layout); after every
drafter stage: its teacher-forced accuracy per block position at --dchecks.

    python -m ddprobe.probes.recall_curriculum --device cuda --out $OUT/rc --stages A,B,C
    python -m ddprobe.probes.recall_curriculum --device cuda --out $OUT/rc --resume ckpt/rc.pt \
        --stages D,E,drafter,V

The H200 runs of 2026-12-02 (logs in benchmarks/results/tiny_recall_curriculum_h200_2026-12-02/ at the tag
lab-2026-12-03, docs/tiny-model.md; the states state-call3..7.pt in those folders on the branch recall2; the script
was then benchmarks/recall_curriculum.py), each resuming from the state.pt the one before wrote:
  1. (7924129) --stages A,B,C,D,E                  A-D done, E cut by the call's limit (590 s)
  2. (7924129) --resume <1> --stages E,drafter,V --checks 16384,65536,131072
  3. (6847f33) --resume <2> --fresh-drafter --stages tune,dwarm,drafter,V --checks 16384,65536,131072
  4. (96142c9) --resume <3> --fresh-drafter --stages tune,dwarm,drafter,V --drafter-warm-steps 4000 \
         --drafter-steps 800 --drafter-xl-steps 100 --drafter-lr 1e-3 --checks 16384,65536,131072
     recall 8.00 / 8.00 / 4.70 / 2.27 / 1.42, novel 1.48-1.69, predictable 7.00 / 6.89 / 3.74 / 2.05 / 1.55 at
     1k / 16k / 64k / 128k / 256k (state-call4.pt).
Then, with DrafterConfig.history_rotation (benchmarks/results/tiny_recall_rotation_h200_2026-12-02/ at the same tag):
  5. (01be773) --resume <4> --fresh-drafter --stages F,rwarm,rdrafter,V --checks 16384,65536,131072,262144 \
         --dchecks 1024,65536 --rdrafter-steps 400,60
  6. (f04dab7) --resume <5> --stages F,rdrafter,V --f-len 131072 --f-steps 50 --rdrafter-steps 200,30 \
         --checks 65536,131072,262144 --dchecks 1024,65536
  7. (368da7a) --resume <6> --stages F,rdrafter,V --f-len 131072 --f-far 0.7 --f-steps 50 --tune-lr 4e-4 \
         --rdrafter-steps 150,20 --checks 65536,131072,262144 --dchecks 1024,65536
     predictable 8.00 at 1k-256k, novel 1.63-1.87, recall 8.00 / 8.00 / 8.00 / 8.00 / 2.84: the shipped pair,
     written to ddprobe/engine/weights/tiny by
  ship: --resume <7> --stages ship --out <dir> (weights.save, with this recipe and the calls' logs).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .. import texts
from ..engine.curriculum import draft_accuracy, drafter_loop
from ..engine.generate import Engine
from ..engine.tokenizer import WordTokenizer
from ..engine.train import target_forward_train, train_drafter
from ..engine.traindata import REPEAT_PROMPT, RecallStream

LONG = {"B": (1024, 16, 600), "C": (4096, 4, 400), "D": (16384, 2, 300), "E": (32768, 1, 200)}  # len, batch, steps


def backend(eng, tok):
    from .engine_backend import EngineBackend

    return EngineBackend.around(eng, tok)


def trained_without_bonus_all(eng) -> None:
    """For states trained before DrafterConfig.bonus_all (calls 1-3 of 2026-12-02): the drafter's blocks as then."""
    import dataclasses

    eng.drafter.cfg = dataclasses.replace(eng.drafter.cfg, bonus_all=False)


@torch.no_grad()
def copy_at(eng, tok, ctx: int, seed: int = 0, new_tokens: int = 128) -> float:
    """Teacher-forced: the share of the passage's names after the cue that the target predicts, on the probe's own
    recall prompt of ``ctx`` tokens (its passage sized for ``new_tokens``: 160 names for 128, 64 for 32 or fewer)."""
    from .commit import prompt_ids

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
    from .commit import prompt_ids

    ids = prompt_ids(backend(eng, tok), "recall", ctx, seed=seed)
    _, passage = texts.recall(8, seed, texts.RECALL_WORDS)
    y = ids + tok.encode(passage)[texts.RECALL_CUE_WORDS:]
    return draft_accuracy(eng, y, torch.linspace(len(ids), len(ids) + 100, anchors).long())


@torch.no_grad()
def draft_predictable_at(eng, tok, ctx: int) -> list[float]:
    """Teacher-forced drafter accuracy at block positions k = 1..L on the probe's predictable prompt of ``ctx``
    tokens, anchors on every phase of the 7-token refrain in its last 120 tokens."""
    from .commit import prompt_ids

    ids = prompt_ids(backend(eng, tok), "predictable", ctx)
    return draft_accuracy(eng, ids, torch.arange(len(ids) - 120, len(ids) - eng.drafter.cfg.block_size, 4))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    ap.add_argument("--checks", default="1024,4096,16384,65536")
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
    a = ap.parse_args()
    stages = [s for s in a.stages.split(",") if s]
    known = ("A", *LONG, "tune", "F", "dwarm", "drafter", "rwarm", "rdrafter", "V", "ship")
    bad = [s for s in stages if s not in known]
    if bad:
        ap.error(f"unknown stage {bad[0]!r}; known: {', '.join(known)}")
    ints = lambda text: [int(v) for v in text.split(",") if v]  # noqa: E731
    try:  # every list option parsed once, here
        tune_steps, rdrafter_steps, long_steps = ints(a.tune_steps), ints(a.rdrafter_steps), ints(a.long_steps)
        check_ctx, dcheck_ctx, eval_ctx = ints(a.checks), ints(a.dchecks), ints(a.eval_ctx)
    except ValueError as e:
        ap.error(f"steps and contexts are comma-separated integers ({e})")
    for name, v in (("--tune-steps", tune_steps), ("--rdrafter-steps", rdrafter_steps)):
        if len(v) != 2:
            ap.error(f"{name} takes two step counts, e.g. 600,100")
    if a.resume is not None and not a.resume.is_file():
        ap.error(f"--resume {a.resume}: no such file")
    for k, n in zip("BCDE", long_steps):
        LONG[k] = (*LONG[k][:2], n)
    a.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    tok = WordTokenizer.default()
    eng = Engine("tiny", seed=0, device=a.device, max_ctx=1024)
    if a.resume is not None:
        eng.load_state_dict(torch.load(a.resume, map_location=a.device))
        if a.fresh_drafter:
            eng.drafter.load_state_dict(Engine("tiny", seed=0, device=a.device, max_ctx=1024).drafter.state_dict())
    t = eng.target
    log = json.loads((a.out / "log.json").read_text()) if (a.out / "log.json").exists() else []
    t0 = time.time()

    def say(**kw):
        kw["s"] = round(time.time() - t0, 1)
        log.append(kw)
        print(json.dumps(kw), flush=True)
        (a.out / "log.json").write_text(json.dumps(log, indent=1))

    def save(tag):
        torch.save(eng.state_dict(), a.out / "state.pt")
        say(saved=tag)

    def checks(tag):
        say(check=tag, copy={c: copy_at(eng, tok, c) for c in check_ctx})

    def dchecks(tag):
        say(check=tag, draft_copy={c: draft_copy_at(eng, tok, c) for c in dcheck_ctx})

    def fit(stream, steps, batch, lr, tag, every, ramp=50, stop=None, alt=None):
        """alt: (stream, batch) drawn on every other step instead."""
        t.train().requires_grad_(True)
        opt = torch.optim.AdamW(t.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.95))
        for step in range(steps):
            for g in opt.param_groups:
                g["lr"] = lr * min(1.0, (step + 1) / ramp)
            src, bs = alt if alt is not None and step % 2 else (stream, batch)
            x = src.batch(bs).to(a.device)
            w = 1.0 + (a.copy_weight - 1.0) * src.last_mask[:, 1:].to(a.device, torch.float32)
            logits, _ = target_forward_train(t, x)
            ce = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), x[:, 1:].flatten(), reduction="none")
            loss = (ce * w.flatten()).sum() / w.sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(t.parameters(), 1.0)
            opt.step()
            if (step + 1) % every == 0 or step == steps - 1:
                c = stop() if stop else None
                say(stage=tag, step=step + 1, loss=round(loss.item(), 3), copy=c)
                if stop and c >= a.form:
                    break
        t.eval().requires_grad_(False)

    if "A" in stages:
        stream = RecallStream(tok, 256, 1, (16, 64), copy_share=0.8)
        fit(stream, a.a_steps, a.a_batch, a.lr, "A", 500,
            # the stop check on passages of 64 names, the longest stage A trains (a 160-name passage read <= 0.011
            # all through the first H200 run while the copy had formed by step 4,000)
            stop=lambda: round(sum(copy_at(eng, tok, 400, seed=s, new_tokens=16) for s in range(4)) / 4, 3))
        save("A")
        checks("A")
    for k, (n, b, steps) in LONG.items():
        if k in stages:
            fit(RecallStream(tok, n, 10 + ord(k), (16, 160 if n > 1024 else 64), copy_share=0.4), steps, b,
                a.long_lr, k, max(25, steps // 4), ramp=20)
            save(k)
            checks(k)
    if "tune" in stages:  # the rarer refrain starts (RecallStream's default now), at a low lr
        s4, s32 = tune_steps
        fit(RecallStream(tok, 4096, 31, (16, 160), copy_share=0.4), s4, 4, a.tune_lr, "tune4k", 100, ramp=20)
        fit(RecallStream(tok, a.tune_xl_len, 32, (16, 160), copy_share=0.4), s32, 1, a.tune_lr, "tune32k", 50, ramp=10)
        save("tune")
        checks("tune")
    if "F" in stages:  # the target at --f-len tokens (64k; 128k in calls 6-7), a 4k batch after each long step to
        # keep the short contexts, at the tune's low lr
        fit(RecallStream(tok, a.f_len, 41, (16, 160), copy_share=0.4, far=a.f_far), 2 * a.f_steps, 1, a.tune_lr, "F",
            40, ramp=20, alt=(RecallStream(tok, 4096, 42, (16, 160), copy_share=0.4), 4))
        save("F")
        checks("F")
    focus = tok.encode(REPEAT_PROMPT)[-1]
    show = lambda who, step, loss: say(stage=who, step=step, loss=round(loss, 3))  # noqa: E731
    if "dwarm" in stages:
        # the drafter's copy warm-up (calls 3-4): a constant lr, and (--attn-weight) a loss on where its full layer
        # looks, on the anchors whose bonus is a name
        names = torch.zeros(len(tok) + 8, dtype=torch.bool, device=a.device)
        names[tok.encode(" ".join(texts.NAMES))] = True
        drafter_loop(eng, [(RecallStream(tok, 256, 6, (16, 64), copy_share=0.8), 32)], a.drafter_warm_steps, a.lr, 16,
                     focus, say, "dwarm", 500, lambda: {"draft_copy": draft_copy_at(eng, tok, 1024)},
                     attn_weight=a.attn_weight, match=1, names=names,
                     stop=lambda r: sum(r["draft_copy"]) / len(r["draft_copy"]) >= 0.7)
        save("dwarm")
        dchecks("dwarm")
    if "drafter" in stages:
        train_drafter(eng.drafter, t, RecallStream(tok, 2048, 7, (16, 160), copy_share=0.4), a.drafter_steps, 8,
                      anchors=32, lr=a.drafter_lr, seed=1, on_log=show, log_every=250, focus=focus)
        train_drafter(eng.drafter, t, RecallStream(tok, a.drafter_xl_len, 8, (16, 160), copy_share=0.4), a.drafter_xl_steps,
                      1, anchors=128, lr=a.drafter_lr / 4, seed=2, on_log=show, log_every=50, focus=focus)
        save("drafter")
        dchecks("drafter")
    if "rwarm" in stages or "rdrafter" in stages:

        def dcheck(ctxs=(1024,)):
            return {"draft_copy": {c: draft_copy_at(eng, tok, c) for c in ctxs},
                    "draft_pred": {c: draft_predictable_at(eng, tok, c) for c in ctxs}}

        def good(res):
            accs = [v for kind in res.values() for per_k in kind.values() for v in per_k]
            return min(accs) >= 0.9
    if "rwarm" in stages:  # the history-rotation drafter: copies and refrains (up to 400 repeats) in turn, the loss
        # on where its full layer looks on every anchor with a 2-token match (history_rotation_cpu.py's recipe, on the
        # branch recall2)
        streams = [(RecallStream(tok, 256, 5, (16, 64), copy_share=0.8), 32),
                   (RecallStream(tok, 256, 6, (16, 64), copy_share=0.3, refrain=0.1, refrain_reps=(20, 400)), 32)]
        drafter_loop(eng, streams, a.rwarm_steps, a.lr, 16, focus, say, "rwarm", 500, dcheck, stop=good)
        save("rwarm")
        say(check="rwarm", **dcheck(dcheck_ctx))
    if "rdrafter" in stages:  # then longer sequences: 2k, and 32k whose refrains run to thousands of tokens
        s2, s32 = rdrafter_steps
        streams = [(RecallStream(tok, 2048, 7, (16, 160), copy_share=0.4), 8),
                   (RecallStream(tok, 2048, 9, (16, 160), copy_share=0.2, refrain=0.05, refrain_reps=(20, 400)), 8)]
        drafter_loop(eng, streams, s2, a.drafter_lr, 32, focus, say, "rdrafter2k", max(s2 // 4, 1), dcheck, seed=4)
        streams = [(RecallStream(tok, a.drafter_xl_len, 8, (16, 160), copy_share=0.4), 1),
                   (RecallStream(tok, a.drafter_xl_len, 10, (16, 160), copy_share=0.2, refrain=0.02,
                                 refrain_reps=(100, 1000)), 1)]
        drafter_loop(eng, streams, s32, a.drafter_lr / 4, 128, focus, say, "rdrafter32k", max(s32 // 2, 1), dcheck,
                     ramp=10, seed=5)
        save("rdrafter")
        say(check="rdrafter", **dcheck(dcheck_ctx))
    if "V" in stages:
        from .backends import GenStats
        from .commit import output_repeats, prompt_ids, recall_copied

        ctxs = eval_ctx
        ev = Engine("tiny", seed=0, device=a.device, dtype=torch.bfloat16, max_ctx=max(ctxs) + 1024)
        ev.load_state_dict(eng.state_dict())
        ev.model.to(dtype=torch.bfloat16)
        be = backend(ev, tok)
        for kind in ("predictable", "novel", "recall"):
            for ctx in ctxs:
                ids = prompt_ids(be, kind, ctx, new_tokens=a.eval_new)
                t1 = time.time()
                res = ev.generate(ids, a.eval_new)
                st = GenStats(prompt_tokens=len(ids), completion_tokens=len(res.tokens),
                              verify_steps=len(res.steps), tokens=list(res.tokens))
                say(eval=kind, ctx=ctx, commit=round(res.mean_commit_len, 2),
                    copied=(recall_copied(be, st) or (None,))[0] if kind == "recall" else None,
                    repeats=output_repeats(list(res.tokens)), gen_s=round(time.time() - t1, 1))
    if "ship" in stages:  # --out becomes the preset's weights folder: model, config, tokenizer, checksums, the log
        from ..engine import weights

        calls = [{"log": str(p), "entries": json.loads(p.read_text())} for p in a.ship_logs]
        log.clear()  # the folder gets train_log.json, not this call's log.json
        training = {"recipe": "ddprobe/probes/recall_curriculum.py, calls 1-7 of its docstring, each resuming the state "
                              "the one before saved", "device": "NVIDIA H200", "resumed": str(a.resume),
                    "docstring": __doc__, "calls": calls}
        weights.save(eng, a.out, tok, {"training": {k: v for k, v in training.items() if k != "calls"}})
        (a.out / "train_log.json").write_text(json.dumps(training, indent=1))
        (a.out / "log.json").unlink(missing_ok=True)
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
