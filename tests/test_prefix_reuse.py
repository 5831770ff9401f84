"""Prefix reuse across contexts (issue 14): the commit probe runs a text kind's cells in increasing context
order and asks the engine to keep each prompt's cache for the next (``generate(..., reuse_prefix=True)``).
A cell measured this way equals the same cell measured alone: the same tokens, the same commit lengths. The
real tiny engine on the CPU, contexts 1k and 2k, every text kind."""
import pytest

from ddprobe.probes.commit import cell_row, prompt_ids, run_commit_probe
from ddprobe.probes.backends.engine import EngineBackend
from ddprobe.results import Result, ResultWriter, RunMeta

KINDS = ["predictable", "novel", "recall"]
NEW = 32


@pytest.fixture(scope="module")
def engine():
    return EngineBackend()  # the defaults: the tiny preset with its trained weights, fp32 on the CPU


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def reusable(engine, a: list[int], b: list[int]) -> int:
    """What the engine keeps of ``a`` for ``b``: their common prefix (the last token of b always prefilled),
    down to the prefill chunk grid (so every kept row is the row a fresh prefill computes)."""
    n = min(common_prefix(a, b), len(b) - 1)
    return n - n % engine.engine.prefill_max_rows


def test_a_kinds_shorter_prompt_is_a_prefix_of_its_longer_one(engine):
    for kind in KINDS:
        short, long = prompt_ids(engine, kind, 1024), prompt_ids(engine, kind, 2048)
        n = common_prefix(short, long)
        if kind == "recall":  # the closing request and the passage's first words end each prompt
            assert 1024 - 32 < n < 1024
        else:
            assert n == 1024


@pytest.mark.parametrize("kind", KINDS)
def test_cell_after_its_prefix_equals_the_cell_alone(engine, kind):
    short, long = prompt_ids(engine, kind, 1024), prompt_ids(engine, kind, 2048)
    engine.forget_prefix()
    first = engine.generate(short, NEW, reuse_prefix=True)
    calls = []
    second = engine.generate(long, NEW, reuse_prefix=True, on_prefill=lambda done, total: calls.append((done, total)))
    assert first.reused_tokens == 0
    assert second.reused_tokens == reusable(engine, short, long)
    assert second.reused_tokens == (0 if kind == "recall" else 1024)  # recall shares < 1024 tokens: none kept
    # progress: the reused tokens first, then after every prefill chunk, all of them at the end
    assert calls[0] == (second.reused_tokens, 2048) and calls[-1] == (2048, 2048) and len(calls) >= 2
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
    alone_calls = []
    alone = engine.generate(long, NEW, on_prefill=lambda done, total: alone_calls.append((done, total)))
    assert alone.reused_tokens == 0  # reuse_prefix=False: whatever was kept is dropped
    assert alone_calls[0] == (0, 2048) and alone_calls[-1] == (2048, 2048)
    assert [d for d, _ in alone_calls] == sorted(d for d, _ in alone_calls)
    assert second.tokens == alone.tokens and second.commit_lens == alone.commit_lens
    assert (second.completion_tokens, second.verify_steps) == (alone.completion_tokens, alone.verify_steps)
    first_alone = engine.generate(short, NEW)
    assert first.tokens == first_alone.tokens and first.commit_lens == first_alone.commit_lens


def test_the_probe_measures_each_cell_as_it_would_alone(engine):
    w = ResultWriter(Result("commit", RunMeta.collect(probe_gpu=False)))
    rows = run_commit_probe(engine, [2048, 1024], KINDS, NEW, w)
    assert [(r["text"], r["ctx"]) for r in rows] == [(k, c) for k in KINDS for c in (1024, 2048)]
    for r in rows:
        ids = prompt_ids(engine, r["text"], r["ctx"], new_tokens=NEW)  # recall: the passage sized for NEW tokens
        if r["ctx"] == 2048:  # the 1k prompt of its kind was kept
            assert r["reused_tokens"] == reusable(engine, prompt_ids(engine, r["text"], 1024, new_tokens=NEW), ids)
        # recall cells say how many passage words the target wrote back (an int), the others nothing
        assert (isinstance(r["recall_copied_words"], int) and 0 <= r["recall_copied_words"] <= NEW) \
            if r["text"] == "recall" else r["recall_copied_words"] is None
        alone = cell_row(r["text"], r["ctx"], NEW, engine.generate(ids, NEW), engine.name)
        assert 0.0 <= r["output_repeats"] <= 1.0
        for key in ("prompt_tokens", "completion_tokens", "verify_steps", "commit_len", "commit_len_p10",
                    "commit_len_p90", "accepted_depth", "output_repeats"):
            assert r[key] == alone[key], (r["text"], r["ctx"], key)


def test_forget_and_no_reuse_drop_the_kept_prefix(engine):
    short, long = prompt_ids(engine, "novel", 1024), prompt_ids(engine, "novel", 2048)
    engine.generate(short, 4, reuse_prefix=True)
    engine.forget_prefix()
    assert engine.generate(long, 4, reuse_prefix=True).reused_tokens == 0
    engine.generate(short, 4, reuse_prefix=True)
    engine.generate(prompt_ids(engine, "predictable", 512), 4)  # without reuse: drops what was kept
    assert engine.generate(long, 4, reuse_prefix=True).reused_tokens == 0
    engine.forget_prefix()
