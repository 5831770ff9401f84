"""The generate loop, gpt-fast style: explicit ``prefill`` and ``decode`` functions that take the
runner (what the steps run on: ``runner.StepRunner``) and the models (``spec.Models``).

    last = prefill(runner, models, kv, prompt_ids, dctx, on_prefill)   # logits [V] of the last prompt token
    out, records = decode(runner, models, caches, bonus, max_new_tokens, temperature, gen, proposer, on_tokens)

``prefill``: causal prefill of the prompt tokens not yet in ``kv``, in chunks through the spec's
prefill path ("prefill": PyTorch's fused attention, chunks on a grid fixed from position 0, so a
prompt prefilled in two calls gets the rows of one call, to the bit; "reference": chunks sized by
an fp32 score budget).
``decode``: the one DDTree decode loop. From the state after prefill (committed prompt, first bonus)
it calls a step strategy (``steps.step_for``: eager, static with the host tree, static with the
device tree) until max_new_tokens are out, hands each step's tokens to ``on_tokens`` and turns the
phase marks into ``StepRecord``s (times from ``clock.StepClock``).
``greedy``: plain greedy decoding on the static one-row step (``graphs.DecodeStep``): one token per
replay, one copy back each.
"""
from __future__ import annotations

import time
from typing import Callable

import torch

from .clock import StepClock
from .drafter import DrafterContext
from .graphs import DecodeStep
from .kv_cache import KVCache
from .records import StepRecord
from .runner import Caches, StepRunner
from .spec import Models
from .steps import step_for


def prefill(runner: StepRunner, models: Models, kv: KVCache, prompt_ids: list[int],
            dctx: DrafterContext | None = None, on_prefill: Callable[[int, int], None] | None = None) -> torch.Tensor:
    """Prefill ``prompt_ids`` from ``kv.committed`` on -> logits [V] of the last token. dctx: the
    drafter context to append to; on_prefill(done, total): before the first chunk and after each."""
    spec, heads = runner.spec, runner.config.target.num_heads
    ids = torch.tensor(prompt_ids, dtype=torch.int64, device=spec.device)
    n, logits = ids.numel(), None
    if kv.committed >= n:
        raise ValueError(f"nothing to prefill: {kv.committed} tokens cached for a {n}-token prompt")
    if on_prefill is not None:
        on_prefill(kv.committed, n)
    rows, grid = spec.prefill_max_rows, spec.prefill_path.name == "prefill"
    while kv.committed < n:
        c0 = kv.committed
        if grid:  # up to the next grid line
            limit = rows - c0 % rows
        else:  # fp32 score bytes of the reference path: per query row H x 4 x (prefix + chunk)
            limit = spec.prefill_score_bytes // (heads * 4 * (c0 + 512) + 1)
        chunk = int(max(1, min(rows, n - c0, limit)))
        mask = torch.ones(chunk, chunk, dtype=torch.bool, device=spec.device).tril_()
        pos = torch.arange(c0, c0 + chunk, dtype=torch.int64, device=spec.device)
        logits, feats = runner.forward(models.target, kv, ids[c0: c0 + chunk], pos, mask, spec.prefill_path,
                                       last_only=True)
        kv.commit(torch.arange(chunk))
        if dctx is not None:
            models.drafter.append_context(dctx, feats, pos)
        if on_prefill is not None:
            on_prefill(kv.committed, n)
    return logits[-1]


def decode(runner: StepRunner, models: Models, c: Caches, bonus: int, max_new_tokens: int, temperature: float = 0.0,
           gen: torch.Generator | None = None, proposer=None,
           on_tokens: Callable[[list[int], int], None] | None = None, strategy=None,
           max_steps: int | None = None) -> tuple[list[int], list]:
    """Decode after prefill -> (tokens, step records); tokens start with ``bonus`` and may run past
    max_new_tokens (the last step's commit is whole). on_tokens(tokens, tree_size): the bonus (tree
    size 0), then each step's committed tokens; what it raises stops the loop and propagates.
    strategy: a ``steps`` class to use instead of ``step_for``'s choice (benchmarks); max_steps: stop after
    that many steps as well (timing: a fixed number of steps)."""
    step = (strategy or step_for)(runner, models, c, temperature, gen, proposer)
    out, pending, clock = [bonus], [], StepClock(runner.spec.device)
    if on_tokens is not None:  # streaming / cancellation hook: the prefill's token, then each step's
        on_tokens([bonus], 0)
    step.start(bonus)
    while len(out) < max_new_tokens and (max_steps is None or len(pending) < max_steps):
        ctx_len = step.committed
        w0 = time.perf_counter()
        done = step(bonus, clock)
        host_ms = (time.perf_counter() - w0 - done.blocked) * 1e3 if step.graphs else None
        out.extend(done.tokens)
        bonus = out[-1]
        pending.append((ctx_len, done.size, len(done.tokens), done.marks, host_ms, done.ranks, done.spine))
        if on_tokens is not None:
            on_tokens(done.tokens, done.size)
    return out, records(clock, pending, step.graphs, c.captured, c.capture_ms, step.d2h)


def plain_step(runner: StepRunner, models: Models, kv: KVCache, token: int) -> torch.Tensor:
    """One eager plain decode step (a host plan over one row at the committed length) -> logits [1, V]."""
    dev = runner.spec.device
    one = torch.ones(1, 1, dtype=torch.bool, device=dev)
    pos = torch.tensor([kv.committed], dtype=torch.int64, device=dev)
    logits, _ = runner.forward(models.target, kv, torch.tensor([token], device=dev), pos, one, runner.spec.path)
    kv.commit([0])
    return logits


def greedy(runner: StepRunner, st: DecodeStep, first: int, max_new_tokens: int,
           on_token: Callable[[int], None] | None = None) -> list[int]:
    """Plain greedy decode on ``st`` (its cache holds the prefilled prompt) from the prefill's token
    ``first`` -> max_new_tokens tokens, ``first`` included; on_token(token) with each, first included."""
    out = [first]
    if on_token is not None:
        on_token(first)
    st.start(first)
    while len(out) < max_new_tokens:
        tok, finite = st.step()
        runner.require_finite(runner.spec.path, lambda: finite)
        out.append(tok)
        if on_token is not None:
            on_token(tok)
    return out


def records(clock: StepClock, pending: list, graphs: bool, captured: str, capture_ms: float,
            d2h: int | None) -> list[StepRecord]:
    """StepRecords of (context_len, tree_size, commit_len, marks, host_ms, ranks, spine) tuples (one clock read)."""
    steps = []
    for i, (ctx_len, size, k, marks, host_ms, ranks, spine) in enumerate(pending):
        d, t, v, cm = clock.times_ms(marks)
        steps.append(StepRecord(step=i, context_len=ctx_len, tree_size=size, accepted_depth=k - 1, commit_len=k,
                                draft_ms=d, tree_ms=t, verify_ms=v, commit_ms=cm, graphs=graphs,
                                captured=captured if i == 0 else "", capture_ms=capture_ms if i == 0 else 0.0,
                                host_ms=host_ms, d2h=d2h, ranks=ranks, spine_depth=spine))
    return steps
