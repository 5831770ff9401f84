"""Commit-length probe: is the drafter still accepting drafts at long context?

For every (context length, text kind) cell: a prompt of exactly ``ctx`` tokens counted by the
backend's own tokenizer, then a greedy decode of ``max_new_tokens``; the cell reports commit
length (mean, spread), accepted depth, drafts per step, verify steps, decode time per step,
tokens/s and prefill time. Cells are written to the results file as they finish.

Order and prefix reuse: the cells of one text kind run together, in increasing context order
(``cell_order``), and a backend that can keep its cache between requests (the engine:
``generate(..., reuse_prefix=True)``) reuses the previous prompt, a prefix of the next one (a kind's
shorter prompt is the start of its longer one; recall's closing request differs), so it prefills only
the new tokens: a kind's prefill work is that of its longest context. ``reused_tokens`` in each row says
how many prompt tokens came from the kept prefix; ``prefill_s`` times only the tokens prefilled.
Rows are written in that run order (grouped per kind).

Progress: ``CellProgress`` is told when a cell starts, how far its prefill is (from the engine's
``on_prefill`` hook) and its decode (committed tokens), and when it ends; the CLI draws it.

``commit_len``: the per-step mean of tokens committed (accepted depth + 1), a step cut by the token
limit counted as the tokens it actually committed; the prefill's first token belongs to no step, so
commit_len = (completion_tokens - 1) / verify_steps. ``sglang_accept_length``: SGLang's
completion_tokens / verify_steps, which counts the prefill's token (higher by 1 / verify_steps).
"""
from __future__ import annotations

import inspect
import statistics
from typing import Any, Callable, Sequence

from ..results import ResultWriter
from ..units import DDProbeError, fmt_tokens
from .. import texts
from .backends.base import Backend, GenStats
from .backends.sanity import suspect


DEFINITIONS = {
    "commit_len": "per-step mean of tokens committed (accepted depth + 1); a step cut by the token limit counts the "
                  "tokens it actually committed; the prefill's first token belongs to no step: "
                  "(completion_tokens - 1) / verify_steps",
    "sglang_accept_length": "SGLang's completion_tokens / spec_verify_ct (counts the prefill's token)",
    "output_repeats": "share of the output's tokens that continue a 5-token span already seen earlier in the output "
                      "(0: no repeats, 1: a loop); on novel text, high together with a high commit length means the "
                      "target is likely looping and commit length measures the loop",
    "suspect": "why the cell's numbers cannot be trusted (its output is one token repeated, or the target's logits "
               "are not finite or all equal), else null",
    "tree": "the draft's shape: ddtree (the budget's most probable prefixes) or chain (the drafter's top-1 at each "
            "depth, budget = its depth)",
    "cond_accept_per_pos": "acceptance per depth: steps that accepted depth p + 1 over those that accepted depth p",
    "sibling_share": "committed draft tokens that came from a sibling of rank >= 1 (not the parent's most probable "
                     "child) over all committed draft tokens, over the steps that ran",
    "spine_commit_len": "the commit length the tree's own spine (its rank-0 path) gives on the same steps and picks",
    "gain_over_spine": "the tree's commit length over its own spine's, on the same steps",
    "spine_violations": "steps where the tree accepted fewer tokens than its own spine: a bug under greedy decoding",
    "recall_copied_words": "recall text: how many words the output begins with that equal the passage after its cue (the "
                           "target itself recalling it); a high commit length with few copied words is a drafter "
                           "agreeing with something else the target wrote",
}


def prompt_ids(backend: Backend, kind: str, ctx: int, seed: int = 0, new_tokens: int = 128) -> list[int]:
    """Exactly ``ctx`` token ids of text ``kind`` in the backend's tokenizer (recall: its passage sized for a decode
    of ``new_tokens``, ``texts.recall_words``)."""
    if kind not in texts.KINDS:
        raise DDProbeError(f"unknown text kind {kind!r}; known: {', '.join(texts.KINDS)}")
    if kind == "recall":
        head, tail = _recall_parts(backend, seed, new_tokens)
        room = ctx - len(head) - len(tail)
        if room < 0:
            raise DDProbeError(_recall_too_short(ctx, len(head) + len(tail), new_tokens))
        filler = _at_least(backend, lambda w: " " + texts.novel(w, seed + 7), room) if room else []
        return head + filler[:room] + tail
    return _at_least(backend, lambda w: texts.build(kind, w, seed), ctx)[:ctx]


def _recall_parts(backend: Backend, seed: int, new_tokens: int) -> tuple[list[int], list[int]]:
    """Token ids of the recall text's passage (sized for ``new_tokens``) and of its closing request + cue."""
    if new_tokens > texts.RECALL_MAX_NEW:
        raise DDProbeError(f"the recall text covers at most {texts.RECALL_MAX_NEW} new tokens (its passage is a roster "
                           f"of at most {len(texts.NAMES)} names), asked for {new_tokens}")
    prompt, passage = texts.recall(8, seed, texts.recall_words(new_tokens))  # passage + request, no filler yet
    return backend.tokenize(passage), backend.tokenize(prompt[len(passage):])


def _recall_too_short(ctx: int, need: int, new_tokens: int) -> str:
    return (f"context {fmt_tokens(ctx)} ({ctx:,} tokens) is too short for the recall text: its passage (sized for "
            f"{new_tokens} new tokens) and request take {need:,}")


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


def request_tokens(ctx: int, new_tokens: int, budget: int | None) -> int:
    """Tokens of KV a request of ``ctx`` + ``new_tokens`` needs: the verify rows of a ``budget``-node tree (budget +
    1, when the backend says its budget) and ``CONTEXT_SLACK`` included. The one slack formula: the engine's
    capacity (``cli.options``) and the context check read it."""
    return ctx + new_tokens + CONTEXT_SLACK + (int(budget) + 1 if isinstance(budget, int) else 0)


def check_contexts(backend: Backend, ctxs: list[int], max_new_tokens: int, kinds: list[str] = (),
                   seed: int = 0) -> int | None:
    """The one context check: raise before anything runs if a context does not fit what the backend allows
    (``request_tokens``: its verify rows, when it says its budget, and the slack included), or, with recall among
    ``kinds``, is shorter than the recall text's passage and request. Each command calls it once before it builds
    anything; ``run_commit_probe`` calls it for callers that did not."""
    if max_new_tokens < 2:  # the first token comes from the prefill: commit length needs a verify step
        raise DDProbeError(f"--max-new-tokens must be at least 2, got {max_new_tokens}")
    if "recall" in kinds and ctxs:
        need = sum(len(p) for p in _recall_parts(backend, seed, max_new_tokens))
        if min(ctxs) < need:
            raise DDProbeError(_recall_too_short(min(ctxs), need, max_new_tokens))
    limit = backend.max_context()
    budget = backend.describe().get("budget") if hasattr(backend, "describe") else None
    if limit is not None:
        too_long = [c for c in ctxs if request_tokens(c, max_new_tokens, budget) > limit]
        if too_long:
            c = too_long[0]
            rows = int(budget) + 1 if isinstance(budget, int) else 0
            margin = CONTEXT_SLACK + rows
            said = f"{rows} verify rows + {CONTEXT_SLACK} slack" if rows else f"{CONTEXT_SLACK} slack"
            fits = limit - max_new_tokens - margin
            raise DDProbeError(f"context {fmt_tokens(c)}: {c:,} + {max_new_tokens} new + {margin} margin ({said}) = "
                               f"{request_tokens(c, max_new_tokens, budget):,}, beyond the {limit:,} tokens the "
                               f"{backend.name} backend reaches" + (f"; at most {fits:,} of context fit" if fits > 0
                                                                     else ""))
    return limit


def accepts(fn: Callable, name: str) -> bool:
    """Does ``fn`` take a keyword ``name`` (backends and engines that predate a hook do not)?"""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def cell_order(ctxs: Sequence[int], kinds: Sequence[str]) -> list[tuple[str, int]]:
    """(kind, ctx) in run order: per kind (in the order given), contexts increasing, so each prompt can
    reuse the previous one as its prefix."""
    return [(kind, ctx) for kind in kinds for ctx in sorted(ctxs)]


class CellProgress:
    """What a probe tells its display about the cell it runs (no-ops here; the CLI draws them).
    ``prefill(done, total)`` comes first with the tokens reused (``done`` may be > 0), then after each
    prefill chunk; ``decoded(n)`` with the tokens each verify step committed (the prefill's first token
    included). Backends without prefill progress (HTTP servers) call neither: only start and end."""

    def cell_started(self, kind: str, ctx: int, prompt_tokens: int, max_new_tokens: int) -> None: ...

    def prefill(self, done: int, total: int) -> None: ...

    def decoded(self, n: int) -> None: ...

    def cell_done(self, row: dict | None) -> None: ...


def generate_hooked(backend: Backend, ids: list[int], max_new_tokens: int, progress: CellProgress | None = None,
                    reuse_prefix: bool = False) -> GenStats:
    """``backend.generate`` with the progress hooks and prefix reuse it supports (HTTP backends: none)."""
    kw: dict[str, Any] = {}
    gen = backend.generate
    if progress is not None and accepts(gen, "on_prefill"):
        kw["on_prefill"] = progress.prefill
    if progress is not None and accepts(gen, "on_tokens"):
        kw["on_tokens"] = lambda new: progress.decoded(len(new))
    if reuse_prefix and accepts(gen, "reuse_prefix"):
        kw["reuse_prefix"] = True
    return gen(ids, max_new_tokens, **kw)


def recall_copied(backend: Backend, st: GenStats, seed: int = 0, new_tokens: int = 128) -> tuple[int, int] | None:
    """(words copied, words to copy): how many leading words of the decoded output equal the recall passage's words
    after the cue the prompt ends with (``texts.recall``, the passage of ``prompt_ids`` for a decode of
    ``new_tokens``); None when the backend cannot decode its tokens."""
    decode = getattr(backend, "decode", None)
    if decode is None or not st.tokens:
        return None
    _, passage = texts.recall(8, seed, texts.recall_words(new_tokens))
    want = passage.lower().split()[texts.RECALL_CUE_WORDS:]  # case aside: a decoder may capitalize its first word
    got = decode(list(st.tokens)).lower().split()
    n = 0
    while n < min(len(want), len(got)) and got[n] == want[n]:
        n += 1
    return n, len(want)


REPEAT_SPAN = 5  # tokens: a span of this length seen twice in an output is a repeat, not chance, in prose
LOOP_NOTE_OVER = 0.5  # novel cells whose output repeats more than this get a note...
LOOP_NOTE_COMMIT = 2.5  # ...when their commit length is also this high (a small model's novel prose repeats
                        # phrases, "this humble hunter ... this humble hunter", that no drafter predicts)


def output_repeats(tokens: Sequence[int], span: int = REPEAT_SPAN) -> float | None:
    """Share of the output's tokens (from the span-th on) that end a ``span``-token run already seen earlier in
    the same output: 0 for prose that never repeats, near 1 once greedy decoding is in a loop. None when the
    output is too short to tell (or its tokens are unknown)."""
    if len(tokens) <= span:
        return None
    seen: set[tuple[int, ...]] = set()
    hits = 0
    for i in range(span, len(tokens) + 1):
        gram = tuple(tokens[i - span:i])
        hits += gram in seen
        seen.add(gram)
    return hits / (len(tokens) - span + 1)


def loop_notes(rows: Sequence[dict]) -> list[str]:
    """One line per novel cell whose output repeats itself (``output_repeats`` over ``LOOP_NOTE_OVER``) and whose
    commit length is high (at least ``LOOP_NOTE_COMMIT``): there the drafter is likely predicting the repeats."""
    return [f"novel @ {fmt_tokens(r['ctx'])}: {r['output_repeats']:.0%} of the output repeats its own earlier "
            f"{REPEAT_SPAN}-token spans and commit length is {r['commit_len']:.2f}: the target is likely looping, "
            "and commit length there measures the loop, not novel text"
            for r in rows if r.get("text") == "novel" and (r.get("output_repeats") or 0.0) > LOOP_NOTE_OVER
            and (r.get("commit_len") or 0.0) >= LOOP_NOTE_COMMIT]


def timing_note(rows: Sequence[dict]) -> str | None:
    """Why the timing columns are ``-`` when no cell has a prefill/decode split (a server that says no first-token
    time), with the end-to-end latency it does report; None when some cell has one."""
    if not rows or any(r.get("decode_ms_per_step") is not None for r in rows):
        return None
    e2e = [f"{r['text']} @ {fmt_tokens(r['ctx'])} {r['e2e_s']:.3g} s" for r in rows
           if isinstance(r.get("e2e_s"), (int, float))]
    line = (f"the {rows[0].get('backend', 'server')} backend reports no first-token time, so no prefill/decode "
            "split: ms/step, tok/s and prefill are '-'")
    return line + (f"; end-to-end latency per request (prefill included; e2e_s in the results file): "
                   f"{', '.join(e2e)}" if e2e else "")


def cell_row(kind: str, ctx: int, max_new_tokens: int, st: GenStats, backend: str) -> dict[str, Any]:
    """One results row; keys carry units."""
    row: dict[str, Any] = {
        "backend": backend, "text": kind, "ctx": ctx, "prompt_tokens": st.prompt_tokens,
        "reused_tokens": st.reused_tokens,
        "max_new_tokens": max_new_tokens, "completion_tokens": st.completion_tokens,
        "verify_steps": st.verify_steps, "commit_len": st.commit_len, "accepted_depth": st.commit_len - 1,
        "sglang_accept_length": st.sglang_accept_length if st.verify_steps else None,
        "commit_len_std": None, "commit_len_p10": None, "commit_len_p90": None,
        "drafts_per_step": st.drafts_per_step, "prefill_s": st.prefill_s, "decode_s": st.decode_s,
        "e2e_s": st.e2e_s, "decode_ms_per_step": None, "tokens_per_s": None,
        "output_repeats": output_repeats(st.tokens),
    }
    if st.commit_lens:
        row["commit_len_std"] = statistics.pstdev(st.commit_lens)
        deciles = statistics.quantiles(st.commit_lens, n=10, method="inclusive") if len(st.commit_lens) > 1 \
            else [float(st.commit_lens[0])] * 9
        row["commit_len_p10"], row["commit_len_p90"] = deciles[0], deciles[8]
    steps = st.extra.get("decode_steps") or st.verify_steps  # a server's steps that drafted nothing included
    if st.decode_s and steps:
        row["decode_ms_per_step"] = st.decode_s * 1e3 / steps
        row["tokens_per_s"] = (st.completion_tokens - 1) / st.decode_s  # the first token is the prefill's
    for k, v in st.extra.items():
        row.setdefault(k, v)
    return row


def run_commit_probe(backend: Backend, ctxs: list[int], kinds: list[str], max_new_tokens: int,
                     writer: ResultWriter, seed: int = 0,
                     on_start: Callable[[str, int, int], None] | None = None,
                     on_cell: Callable[[dict], None] | None = None,
                     progress: CellProgress | None = None, reuse_prefix: bool = True) -> list[dict]:
    """Measure every (kind, ctx) cell in ``cell_order`` (per kind, contexts increasing), each prompt reusing
    the previous one's cache where the backend can (``reuse_prefix``), writing each row as soon as it is
    measured. Whatever the backend keeps is dropped at the end (``forget_prefix``)."""
    for k in kinds:
        if k not in texts.KINDS:
            raise DDProbeError(f"unknown text kind {k!r}; known: {', '.join(texts.KINDS)}")
    check_contexts(backend, ctxs, max_new_tokens, kinds, seed)
    rows = []
    try:
        for kind, ctx in cell_order(ctxs, kinds):
            ids = prompt_ids(backend, kind, ctx, seed, max_new_tokens)
            if on_start:
                on_start(kind, ctx, len(ids))
            if progress is not None:
                progress.cell_started(kind, ctx, len(ids), max_new_tokens)
            row = None
            try:
                stats = generate_hooked(backend, ids, max_new_tokens, progress, reuse_prefix)
                row = cell_row(kind, ctx, max_new_tokens, stats, backend.name)
                copied = recall_copied(backend, stats, seed, max_new_tokens) if kind == "recall" else None
                row["recall_copied_words"] = copied[0] if copied else None
                check = getattr(backend, "logits_problem", None)
                row["suspect"] = suspect(stats.tokens, check(ids + list(stats.tokens)) if check else None)
            finally:
                if progress is not None:
                    progress.cell_done(row)
            writer.result.summary.setdefault("definitions", DEFINITIONS)  # with the first row, never alone
            writer.add(row)
            rows.append(row)
            if on_cell:
                on_cell(row)
    finally:
        forget = getattr(backend, "forget_prefix", None)
        if forget is not None:
            forget()
    return rows


# ---- the tree shape as an axis (issue 61) ---------------------------------------------------------------------
TREE_SHAPES = ("ddtree", "chain")  # the engine's (``engine.tree.TREE_SHAPES``; no torch here)
SWEEP_BUDGETS = (2, 4, 8, 16)  # the budgets a shape sweep (--tree typed) runs unless --budgets says otherwise


def tree_shapes(text: str) -> list[str]:
    """``--tree ddtree,chain``: the shapes, checked (one line naming an unknown one)."""
    shapes = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in shapes if s not in TREE_SHAPES]
    if bad or not shapes:
        raise DDProbeError(f"--tree: unknown tree shape {(bad or [text])[0]!r}; known: {', '.join(TREE_SHAPES)}")
    return list(dict.fromkeys(shapes))


def int_list(text: str, what: str) -> list[int]:
    """Comma-separated positive integers (``--budgets``, ``--chain-depths``); one line naming a bad one."""
    out = []
    for part in text.split(","):
        try:
            v = int(part)
        except ValueError:
            raise DDProbeError(f"{what}: bad value {part.strip()!r}: expected a whole number") from None
        if v < 1:
            raise DDProbeError(f"{what}: {v} must be at least 1")
        out.append(v)
    return list(dict.fromkeys(out))


def tree_configs(shapes: list[str], budgets: list[int], chain_depths: list[int] | None,
                 depth_max: int) -> list[tuple[str, int]]:
    """(shape, budget) pairs to measure, in run order: the tree at each budget, the chain at each of
    ``chain_depths`` (a depth beyond the drafter's ``depth_max`` = L refused in one line) or, by default, at
    min(budget, L) for each budget (the chain a budget buys: one node per depth)."""
    if chain_depths is not None:
        over = [d for d in chain_depths if d > depth_max]
        if over:
            raise DDProbeError(f"--chain-depths: depth {over[0]} is beyond the drafter's block: it drafts {depth_max} "
                               f"tokens per step (block size {depth_max + 1})")
        if "chain" not in shapes:
            raise DDProbeError("--chain-depths: give --tree with chain (e.g. --tree ddtree,chain)")
    depths = chain_depths if chain_depths is not None else list(dict.fromkeys(min(b, depth_max) for b in budgets))
    return [(s, b) for s in shapes for b in (budgets if s == "ddtree" else depths)]


def run_tree_probe(backend: Backend, configs: list[tuple[str, int]], ctxs: list[int], kinds: list[str],
                   max_new_tokens: int, writer: ResultWriter, **kw) -> list[dict]:
    """``run_commit_probe`` once per (shape, budget) of ``configs`` on one backend (``set_tree`` between them; a
    None config: the backend as it is), the rows of all in one results file, each row saying its ``tree`` and
    ``budget`` where the backend knows them; the backend's own shape and budget come back at the end."""
    rows: list[dict] = []
    was = (backend.tree_shape, backend.budget) if any(configs) else None
    try:
        for c in configs:  # None: the backend as it is
            if c is not None:
                backend.set_tree(*c)
            rows += run_commit_probe(backend, ctxs, kinds, max_new_tokens, writer, **kw)
    finally:
        if was is not None:  # the backend as it was (a later step measures its own tree)
            backend.set_tree(*was)
    return rows


def spine_bugs(rows: Sequence[dict]) -> list[str]:
    """One line per cell whose tree accepted fewer tokens than its own spine on some step (a bug: under greedy
    decoding the spine is inside the tree)."""
    return [f"{r['text']} @ {fmt_tokens(r['ctx'])}, {r.get('tree')} budget {r.get('budget')}: the tree accepted fewer "
            f"tokens than its own spine on {r['spine_violations']} step(s), first at step {f['step']} "
            f"({f['tree_tokens']} against {f['spine_tokens']}): an engine or server bug (state drift, a broken walk)"
            for r in rows if r.get("spine_violations") and (f := r.get("spine_violation_first"))]
