"""Commit-length probe: is the drafter still accepting drafts at long context?

For every (context length, text kind) cell: a prompt of exactly ``ctx`` tokens counted by the
backend's own tokenizer, then a greedy decode of ``max_new_tokens``; the cell reports commit
length (mean, spread), accepted depth, drafts per step, verify steps, decode time per step,
tokens/s and prefill time. Cells are written to the results file as they finish.

``commit_len``: the per-step mean of tokens committed (accepted depth + 1), a step cut by the token
limit counted as the tokens it actually committed; the prefill's first token belongs to no step, so
commit_len = (completion_tokens - 1) / verify_steps. ``sglang_accept_length``: SGLang's
completion_tokens / verify_steps, which counts the prefill's token (higher by 1 / verify_steps).
"""
from __future__ import annotations

import statistics
from typing import Any, Callable

from ..results import ResultWriter
from ..units import DDProbeError, fmt_tokens
from .. import texts
from .backends import Backend, GenStats


DEFINITIONS = {
    "commit_len": "per-step mean of tokens committed (accepted depth + 1); a step cut by the token limit counts the "
                  "tokens it actually committed; the prefill's first token belongs to no step: "
                  "(completion_tokens - 1) / verify_steps",
    "sglang_accept_length": "SGLang's completion_tokens / spec_verify_ct (counts the prefill's token)",
}


def prompt_ids(backend: Backend, kind: str, ctx: int, seed: int = 0) -> list[int]:
    """Exactly ``ctx`` token ids of text ``kind`` in the backend's tokenizer."""
    if kind not in texts.KINDS:
        raise DDProbeError(f"unknown text kind {kind!r}; known: {', '.join(texts.KINDS)}")
    if kind == "recall":
        prompt, passage = texts.recall(8, seed)  # passage + the request, no filler yet
        head = backend.tokenize(passage)
        tail = backend.tokenize(prompt[len(passage):])
        room = ctx - len(head) - len(tail)
        if room < 0:
            raise DDProbeError(f"context {ctx} is too short for the recall text ({len(head) + len(tail)} tokens)")
        filler = _at_least(backend, lambda w: " " + texts.novel(w, seed + 7), room) if room else []
        return head + filler[:room] + tail
    return _at_least(backend, lambda w: texts.build(kind, w, seed), ctx)[:ctx]


def _at_least(backend: Backend, make: Callable[[int], str], n: int) -> list[int]:
    words = n
    for _ in range(12):
        ids = backend.tokenize(make(words))
        if len(ids) >= n:
            return ids
        words = words * 2 + 16
    raise DDProbeError(f"could not build {n} tokens of text with the backend's tokenizer")


# Room a request keeps beyond prompt + new tokens: a margin for the tree's verify rows (budget + 1 on top).
CONTEXT_SLACK = 64


def check_contexts(backend: Backend, ctxs: list[int], max_new_tokens: int) -> int | None:
    """Raise before anything runs if a context does not fit what the backend allows (the backend's verify rows,
    when it says its budget, and the slack included)."""
    if max_new_tokens < 2:  # the first token comes from the prefill: commit length needs a verify step
        raise DDProbeError(f"--max-new-tokens must be at least 2, got {max_new_tokens}")
    limit = backend.max_context()
    budget = backend.describe().get("budget") if hasattr(backend, "describe") else None
    slack = CONTEXT_SLACK + (int(budget) + 1 if isinstance(budget, int) else 0)
    if limit is not None:
        too_long = [c for c in ctxs if c + max_new_tokens + slack > limit]
        if too_long:
            c = too_long[0]
            raise DDProbeError(f"context {fmt_tokens(c)} ({c:,} tokens) + {max_new_tokens} new tokens is beyond the "
                               f"{limit:,} tokens the {backend.name} backend reaches")
    return limit


def cell_row(kind: str, ctx: int, max_new_tokens: int, st: GenStats, backend: str) -> dict[str, Any]:
    """One results row; keys carry units."""
    row: dict[str, Any] = {
        "backend": backend, "text": kind, "ctx": ctx, "prompt_tokens": st.prompt_tokens,
        "max_new_tokens": max_new_tokens, "completion_tokens": st.completion_tokens,
        "verify_steps": st.verify_steps, "commit_len": st.commit_len, "accepted_depth": st.commit_len - 1,
        "sglang_accept_length": st.sglang_accept_length,
        "commit_len_std": None, "commit_len_p10": None, "commit_len_p90": None,
        "drafts_per_step": st.drafts_per_step, "prefill_s": st.prefill_s, "decode_s": st.decode_s,
        "e2e_s": st.e2e_s, "decode_ms_per_step": None, "tokens_per_s": None,
    }
    if st.commit_lens:
        row["commit_len_std"] = statistics.pstdev(st.commit_lens)
        deciles = statistics.quantiles(st.commit_lens, n=10, method="inclusive") if len(st.commit_lens) > 1 \
            else [float(st.commit_lens[0])] * 9
        row["commit_len_p10"], row["commit_len_p90"] = deciles[0], deciles[8]
    if st.decode_s and st.verify_steps:
        row["decode_ms_per_step"] = st.decode_s * 1e3 / st.verify_steps
        row["tokens_per_s"] = (st.completion_tokens - 1) / st.decode_s  # the first token is the prefill's
    for k, v in st.extra.items():
        row.setdefault(k, v)
    return row


def run_commit_probe(backend: Backend, ctxs: list[int], kinds: list[str], max_new_tokens: int,
                     writer: ResultWriter, seed: int = 0,
                     on_start: Callable[[str, int, int], None] | None = None,
                     on_cell: Callable[[dict], None] | None = None) -> list[dict]:
    """Measure every (ctx, kind) cell in order, writing each row as soon as it is measured."""
    for k in kinds:
        if k not in texts.KINDS:
            raise DDProbeError(f"unknown text kind {k!r}; known: {', '.join(texts.KINDS)}")
    check_contexts(backend, ctxs, max_new_tokens)
    rows = []
    for ctx in ctxs:
        for kind in kinds:
            ids = prompt_ids(backend, kind, ctx, seed)
            if on_start:
                on_start(kind, ctx, len(ids))
            stats = backend.generate(ids, max_new_tokens)
            row = cell_row(kind, ctx, max_new_tokens, stats, backend.name)
            writer.result.summary.setdefault("definitions", DEFINITIONS)  # with the first row, never alone
            writer.add(row)
            rows.append(row)
            if on_cell:
                on_cell(row)
    return rows
