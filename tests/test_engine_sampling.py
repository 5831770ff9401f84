"""Sampling at temperature > 0 preserves the target's distribution (lossless walk).

The walk test drives the engine's own build_tree / target_picks / walk with a Markov-chain target
(next-token logits depend on the last token only) over vocabulary 8 and a deliberately wrong
drafter, thousands of times, and compares the joint of generated tokens 2 and 3 (64 cells) with
the exact chain by a chi-square test; two lossy rules must fail the same test, so it can fail."""
from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from ddprobe.engine import Engine, ModelConfig
from ddprobe.engine.tree import build_tree, target_picks, walk

V, L, B, START = 8, 3, 6, 0
N = 4000


def chi2_limit(df: int, z: float = 3.719) -> float:
    """Wilson-Hilferty (1 - 1e-4) quantile of chi-square with df degrees of freedom."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def chi2(counts: Counter, probs: dict, n: int) -> float:
    return sum((counts.get(c, 0) - n * p) ** 2 / (n * p) for c, p in probs.items())


def chain():
    g = torch.Generator().manual_seed(3)
    m = 1.5 * torch.randn(V, V, generator=g, dtype=torch.float64)  # logits[next | last]
    return m, torch.softmax(m, dim=-1)


def lossy_walk_accept_draft(tree, picks, probs_rows):
    """Wrong: when the pick matches no child, accept the best child anyway if the target gives
    its token probability >= 0.15 (a 'close enough' acceptance)."""
    kids = tree.children()
    path, row = [0], 0
    while True:
        nxt = kids.get((row, picks[row]))
        if nxt is None:
            best = [i for i in range(1, tree.num_rows) if tree.parents[i] == row]
            if best and probs_rows[row][tree.tokens[best[0]]] >= 0.15:
                nxt = best[0]
            else:
                return path, picks[row]
        path.append(nxt)
        row = nxt


def sample_three(rule: str, n: int, seed: int = 0) -> Counter:
    """Generate 3 tokens after START n times; count (x2, x3)."""
    m, p = chain()
    gen = torch.Generator().manual_seed(seed)
    counts = Counter()
    for _ in range(n):
        bonus = int(torch.multinomial(p[START], 1, generator=gen))  # x1, as from the prefill
        out = [bonus]
        while len(out) < 3:
            draft = torch.log_softmax(2 * torch.randn(L, V, generator=gen, dtype=torch.float64), -1)
            tree = build_tree(draft, B, bonus)
            logits = m[list(tree.tokens)]  # [R, V]: the chain's logits after each row's token
            if rule == "shared_uniform":  # wrong: one uniform for every row (correlated picks)
                u = float(torch.rand((), generator=gen, dtype=torch.float64))
                cdf = torch.softmax(logits, -1).cumsum(-1)
                picks = [min(int((c < u).sum()), V - 1) for c in cdf]
            else:
                picks = target_picks(logits, 1.0, gen)
            if rule == "accept_draft":
                path, nxt = lossy_walk_accept_draft(tree, picks, torch.softmax(logits, -1).tolist())
            else:
                path, nxt = walk(tree, picks)
            out += [tree.tokens[r] for r in path[1:]] + [nxt]
            bonus = nxt
        counts[(out[1], out[2])] += 1
    return counts


def exact_pairs() -> dict:
    _, p = chain()
    return {(a, b): float(sum(p[START, x] * p[x, a] for x in range(V)) * p[a, b]) for a in range(V) for b in range(V)}


def test_walk_is_lossless():
    stat = chi2(sample_three("lossless", N), exact_pairs(), N)
    assert stat < chi2_limit(V * V - 1), f"chi2 {stat:.1f} over the 1e-4 limit {chi2_limit(V * V - 1):.1f}"


@pytest.mark.parametrize("rule", ["accept_draft", "shared_uniform"])
def test_lossy_rules_fail_the_same_test(rule):
    stat = chi2(sample_three(rule, N), exact_pairs(), N)
    assert stat > chi2_limit(V * V - 1), f"lossy rule {rule} passed: chi2 {stat:.1f}"


# ---- the engine end to end ------------------------------------------------------------------
def small_engine(**kw) -> Engine:
    cfg = ModelConfig.from_name("tiny", vocab_size=V, block_size=4)
    return Engine(cfg, budget=6, dtype=torch.float64, max_ctx=64, **kw)


def test_engine_sampling_matches_target_marginals():
    eng, prompt, n = small_engine(), [1, 2, 3], 120
    p1 = torch.softmax(eng.next_token_logits(prompt), -1)
    p2 = {a: torch.softmax(eng.next_token_logits(prompt + [a]), -1) for a in range(V)}
    x2 = sum(p1[a] * p2[a] for a in range(V))  # exact marginal of generated token 2
    counts, steps = Counter(), 0
    for s in range(n):
        res = eng.generate(prompt, 2, temperature=1.0, seed=s)
        counts[res.tokens[1]] += 1
        steps += len(res.steps)
    stat = chi2(counts, {a: float(x2[a]) for a in range(V)}, n)
    assert stat < chi2_limit(V - 1)
    assert steps == n  # token 2 always comes out of one verify step's walk


def test_engine_near_zero_temperature_is_greedy():
    eng = small_engine(poison=True)
    prompt = [5, 1, 4, 1]
    assert eng.generate(prompt, 40, temperature=1e-6, seed=1).tokens == eng.greedy_reference(prompt, 40)


def test_engine_seeded_sampling_is_reproducible():
    eng = small_engine()
    a = eng.generate([1, 2], 30, temperature=1.0, seed=5).tokens
    assert a == eng.generate([1, 2], 30, temperature=1.0, seed=5).tokens
    assert a != eng.generate([1, 2], 30, temperature=1.0, seed=6).tokens
