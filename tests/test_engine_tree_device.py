"""The device tree build, walk and ancestor mask (tree_device.py) against the host's tree.build_tree,
tree.walk and kernels.trees.ancestor_mask.

Exactly equal (rows in pop order, tokens, parents, depths, scores, ancestor mask) on many random
distributions, exact ties (few distinct values, bf16-rounded log-probs) included, at budgets 1, 8
and 32, several depths, the chain shape and vocabularies smaller than the budget.
"""
from __future__ import annotations

import pytest
import torch

from ddprobe.engine.kernels.trees import SHAPES, ancestor_mask
from ddprobe.engine.tree import build_tree, walk
from ddprobe.engine.tree_device import ancestor_mask_device, build_tree_device, walk_device


def host_and_device(logp: torch.Tensor, budget: int, bonus: int, shape: str = "ddtree"):
    want = build_tree(logp, budget, bonus, shape)
    k = 1 if shape == "chain" else min(budget, logp.shape[1])
    vals, idx = torch.topk(logp.double(), k, dim=-1)  # what build_tree reads
    return want, build_tree_device(vals, idx, budget, torch.tensor([bonus]))


def assert_same(want, got, budget: int) -> None:
    n = want.num_rows
    assert int(got.size) == want.size
    assert got.tokens[:n].tolist() == list(want.tokens)
    assert got.parents[:n].tolist() == list(want.parents)
    assert got.depths[:n].tolist() == list(want.depths)
    assert got.scores[:n].tolist() == list(want.scores)
    assert got.valid.tolist() == [True] * n + [False] * (budget + 1 - n)
    mask = torch.eye(budget + 1, dtype=torch.bool)
    mask[:n, :n] = want.ancestor_mask()
    assert torch.equal(got.mask, mask)
    assert got.tokens[n:].eq(0).all() and got.parents[n:].eq(-1).all() and got.depths[n:].eq(0).all()


def distributions(seed: int, depth: int, vocab: int):
    """Random log-probs of four kinds: smooth, peaked, few distinct values (many exact ties), bf16."""
    g = torch.Generator().manual_seed(seed)
    kind = seed % 4
    if kind == 0:
        logits = torch.randn(depth, vocab, generator=g, dtype=torch.float64)
    elif kind == 1:
        logits = 4 * torch.randn(depth, vocab, generator=g, dtype=torch.float64)
    elif kind == 2:  # integer logits in a small range: equal values within and across depths
        logits = torch.randint(0, 3, (depth, vocab), generator=g).double()
    else:  # every other bf16 case peaked: top log-probs round to exactly 0 (child ties its parent)
        logits = (2 if seed % 8 == 3 else 30) * torch.randn(depth, vocab, generator=g, dtype=torch.float64)
    logp = torch.log_softmax(logits, dim=-1)
    if kind == 3:
        logp = logp.to(torch.bfloat16).float()  # a bf16 drafter's log-probs, then upcast
    if kind == 2 and seed % 8 == 2:  # the same row at every depth: sums tie across paths
        logp = logp[:1].expand(depth, vocab).contiguous()
    return logp


def random_cases(n: int):
    """(seed, log-probs) for seeds 0..n-1: depths 1-16, vocabularies 3-256, the four kinds of ``distributions``."""
    for seed in range(n):
        yield seed, distributions(seed, [1, 2, 4, 7, 16][seed % 5], [3, 16, 64, 256][(seed // 5) % 4])


@pytest.mark.parametrize("budget", [1, 8, 32])
def test_device_build_equals_build_tree(budget):
    ties = 0
    for seed, logp in random_cases(40):
        want, got = host_and_device(logp, budget, 42 + seed)
        assert_same(want, got, budget)
        ties += len(set(want.scores[1:])) < want.size
    if budget > 1:
        assert ties >= 5  # the tie rule was exercised


def test_device_build_chain_and_small_vocab():
    g = torch.Generator().manual_seed(9)
    logp = torch.log_softmax(torch.randn(5, 32, generator=g, dtype=torch.float64), -1)
    for budget in (1, 3, 8):
        assert_same(*host_and_device(logp, budget, 7, "chain"), budget)
    # fewer prefixes than the budget: V = 2, L = 2 has 6
    logp = torch.log_softmax(torch.randn(2, 2, generator=g, dtype=torch.float64), -1)
    want, got = host_and_device(logp, 8, 1)
    assert want.size == 6
    assert_same(want, got, 8)


def test_tie_rule_is_lexicographic_rank_path():
    """All-equal log-probs: every prefix of a depth ties; pop order = smaller rank path first."""
    logp = torch.full((3, 4), -1.0, dtype=torch.float64)
    want, got = host_and_device(logp, 8, 0)
    assert list(want.parents) == [-1, 0, 0, 0, 0, 1, 1, 1, 1]
    assert_same(want, got, 8)
    # a certain token after the first (log-prob exactly 0): (0, 0) ties (1,) and its path is smaller
    logp = torch.tensor([[-1.0, -1.0, -2.0], [0.0, float("-inf"), float("-inf")], [-0.5, -0.5, -3.0]],
                        dtype=torch.float64)
    want, got = host_and_device(logp, 6, 0)
    assert list(want.parents[:3]) == [-1, 0, 1] and list(want.depths[:3]) == [0, 1, 2]
    assert_same(want, got, 6)


@pytest.mark.parametrize("budget", [1, 8, 32])
def test_device_walk_equals_walk(budget):
    g = torch.Generator().manual_seed(budget)
    accepted_depths = set()
    for seed in range(30):
        logp = distributions(seed, [1, 4, 16][seed % 3], 16)
        want, got = host_and_device(logp, budget, 3)
        n = want.num_rows
        # picks: follow the tree for a random number of steps, then a token no child has
        picks = torch.randint(0, 16, (budget + 1,), generator=g)
        row = 0
        for _ in range(int(torch.randint(0, 6, (1,), generator=g))):
            kids = [i for i in range(n) if want.parents[i] == row]
            if not kids:
                break
            row = kids[int(torch.randint(0, len(kids), (1,), generator=g))]
            picks[want.parents[row]] = want.tokens[row]
        path, nxt = walk(want, picks[:n].tolist())
        w = walk_device(got, picks)
        rows = sorted(torch.nonzero(w.accepted).view(-1).tolist(), key=lambda i: want.depths[i])
        assert rows == path and int(w.count) == len(path) and int(w.bonus) == nxt
        assert w.out[: len(path)].tolist() == [want.tokens[i] for i in path[1:]] + [nxt]
        assert w.out[len(path):].eq(0).all()
        perm = w.perm.tolist()  # accepted rows first, in path order, the others after in row order
        others = [j for j in range(budget + 1) if j not in path]
        assert [perm[j] for j in path] == list(range(len(path)))
        assert [perm[j] for j in others] == list(range(len(path), budget + 1))
        accepted_depths.add(len(path) - 1)
    assert len(accepted_depths) >= (2 if budget == 1 else 3)


def random_parents(n: int, g: torch.Generator) -> list[int]:
    return [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]


def test_ancestor_mask_device_equals_host():
    """The one host mask and its device twin: equal on the named shapes and random trees of 1 to
    80 rows (deep chains need every doubling round), padded rows (parent -1) seeing only themselves."""
    assert ancestor_mask([-1, 0, 0, 1, 2]).tolist() == [  # fork(4), by hand
        [True, False, False, False, False], [True, True, False, False, False], [True, False, True, False, False],
        [True, True, False, True, False], [True, False, True, False, True]]
    g = torch.Generator().manual_seed(4)
    cases = [fn(b) for fn in SHAPES.values() for b in (1, 2, 3, 4, 5, 8, 31, 32, 33, 63, 64)]
    cases += [random_parents(n, g) for n in list(range(1, 20)) + [33, 64, 65, 80] for _ in range(3)]
    for parents in cases:
        want = ancestor_mask(parents)
        assert torch.equal(ancestor_mask_device(torch.tensor(parents)), want), parents
        pad = 3  # the static step pads a tree with rows that see only themselves
        padded = torch.eye(len(parents) + pad, dtype=torch.bool)
        padded[:len(parents), :len(parents)] = want
        assert torch.equal(ancestor_mask_device(torch.tensor(parents + [-1] * pad)), padded)


def test_device_build_mask_is_the_twin_of_its_parents():
    for seed, budget in ((1, 8), (2, 32), (3, 1)):
        logp = distributions(seed, 7, 64)
        _, got = host_and_device(logp, budget, 5)
        assert torch.equal(got.mask, ancestor_mask_device(got.parents))
