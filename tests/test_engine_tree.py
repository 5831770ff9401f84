"""DDTree build: exactly the B most probable prefixes (brute force on small vocabularies), ancestor
masks match parent arrays, equal depth -> equal position, chain shape, walk."""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from ddprobe.engine.kernels.trees import ancestor_mask
from ddprobe.engine.tree import build_tree, target_picks, walk


def brute_force(logp: torch.Tensor, budget: int) -> list[tuple[float, tuple[int, ...]]]:
    """All prefixes of length 1..L with their summed log-prob, best first, top ``budget``."""
    depth, vocab = logp.shape
    allp = []
    for d in range(1, depth + 1):
        for seq in itertools.product(range(vocab), repeat=d):
            allp.append((sum(float(logp[i, t]) for i, t in enumerate(seq)), seq))
    allp.sort(key=lambda x: -x[0])
    return allp[:budget]


def prefixes(tree) -> list[tuple[int, ...]]:
    out = []
    for i in range(1, tree.num_rows):
        seq, r = [], i
        while r > 0:
            seq.append(tree.tokens[r])
            r = tree.parents[r]
        out.append(tuple(reversed(seq)))
    return out


@pytest.mark.parametrize("depth,vocab,budget,seed", [
    (1, 5, 3, 0), (3, 4, 1, 1), (3, 4, 8, 2), (4, 3, 20, 3), (3, 5, 40, 4), (2, 6, 36, 5),
    (5, 2, 62, 6), (3, 3, 100, 7),  # 100 > 3 + 9 + 27 = 39 prefixes: the whole tree
])
def test_tree_is_the_b_most_probable_prefixes(depth, vocab, budget, seed):
    g = torch.Generator().manual_seed(seed)
    logp = torch.log_softmax(2 * torch.randn(depth, vocab, generator=g, dtype=torch.float64), dim=-1)
    tree = build_tree(logp, budget, bonus=99)
    want = brute_force(logp, budget)
    assert tree.size == len(want)
    assert set(prefixes(tree)) == {seq for _, seq in want}
    # nodes in pop order: scores never increase, and each score is the prefix's summed log-prob
    assert all(a >= b - 1e-12 for a, b in zip(tree.scores[1:], tree.scores[2:]))
    for (seq, score) in zip(prefixes(tree), tree.scores[1:]):
        assert math.isclose(score, sum(float(logp[i, t]) for i, t in enumerate(seq)), abs_tol=1e-9)
    assert tree.tokens[0] == 99 and tree.parents[0] == -1 and tree.depths[0] == 0


def test_mask_matches_parents_and_positions_share_depth():
    g = torch.Generator().manual_seed(11)
    logp = torch.log_softmax(torch.randn(7, 50, generator=g), dim=-1)
    tree = build_tree(logp, 32, bonus=3)
    mask = tree.ancestor_mask()
    r = tree.num_rows
    assert mask.shape == (r, r) and mask.dtype == torch.bool
    for i in range(r):
        anc, p = {i}, tree.parents[i]
        while p >= 0:
            anc.add(p)
            p = tree.parents[p]
        assert set(torch.nonzero(mask[i]).view(-1).tolist()) == anc
        assert p == -1 and tree.parents[i] < i
        assert tree.depths[i] == len(anc) - 1 <= 7
    pos = tree.positions(100)
    assert pos[0] == 100
    for i in range(r):
        for j in range(r):
            assert (pos[i] == pos[j]) == (tree.depths[i] == tree.depths[j])
    # siblings carry distinct tokens
    kids = [(p, t) for p, t in zip(tree.parents[1:], tree.tokens[1:])]
    assert len(kids) == len(set(kids))


def test_ancestor_mask_rejects_bad_parent_order():
    with pytest.raises(ValueError, match="parent"):
        ancestor_mask([-1, 2, 0])


def test_chain_shape():
    logp = torch.log_softmax(torch.randn(7, 30, generator=torch.Generator().manual_seed(1)), dim=-1)
    tree = build_tree(logp, 5, bonus=0, shape="chain")
    assert tree.parents == (-1, 0, 1, 2, 3, 4) and tree.depths == (0, 1, 2, 3, 4, 5)
    assert list(tree.tokens[1:]) == logp.argmax(-1)[:5].tolist()
    assert build_tree(logp, 32, bonus=0, shape="chain").size == 7  # at most L nodes
    m = tree.ancestor_mask()
    assert torch.equal(m, torch.ones(6, 6, dtype=torch.bool).tril())


def test_budget_and_shape_errors():
    logp = torch.zeros(3, 4)
    with pytest.raises(ValueError, match="budget"):
        build_tree(logp, 0, bonus=0)
    with pytest.raises(ValueError, match="shape"):
        build_tree(logp, 2, bonus=0, shape="star")
    with pytest.raises(ValueError, match="temperature"):
        target_picks(torch.zeros(2, 4), -1.0)


def test_walk_follows_matching_children():
    # root(7) -> a(1) -> c(3); root -> b(2) -> d(4)
    from ddprobe.engine.tree import DraftTree
    tree = DraftTree(tokens=(7, 1, 2, 3, 4), parents=(-1, 0, 0, 1, 2), depths=(0, 1, 1, 2, 2), scores=(0,) * 5)
    assert walk(tree, [2, 9, 4, 9, 5]) == ([0, 2, 4], 5)  # root picks 2 -> b picks 4 -> d picks 5
    assert walk(tree, [1, 3, 0, 6, 0]) == ([0, 1, 3], 6)
    assert walk(tree, [8, 0, 0, 0, 0]) == ([0], 8)  # nothing accepted: the pick is the bonus


def reference_order(logp: torch.Tensor, budget: int) -> list[tuple[int, ...]]:
    """Oracle for the tie rule: every prefix over the top-k tokens per depth (k = min(budget, V), ranks as
    torch.topk gives them), sorted by (-summed log-prob, rank path), the first ``budget`` as token tuples."""
    depth, vocab = logp.shape
    k = min(budget, vocab)
    vals, idx = torch.topk(logp.double(), k, dim=-1)
    allp = []
    for d in range(1, depth + 1):
        for ranks in itertools.product(range(k), repeat=d):
            score = 0.0
            for i, r in enumerate(ranks):
                score += float(vals[i, r])
            allp.append((-score, ranks))
    allp.sort()
    return [tuple(int(idx[i, r]) for i, r in enumerate(ranks)) for _, ranks in allp[:budget]]


def rows_as_prefixes(tree) -> list[tuple[int, ...]]:
    return prefixes(tree)  # row order kept: row i -> its token path from the root


def test_exact_ties_break_by_rank_path():
    # every token equally likely at both depths: all 2-token prefixes tie; the rank path decides
    logp = torch.full((2, 3), -math.log(3.0), dtype=torch.float64)
    tree = build_tree(logp, 7, bonus=0)
    want = reference_order(logp, 7)
    assert rows_as_prefixes(tree) == want
    assert [len(p) for p in want] == [1, 1, 1, 2, 2, 2, 2]  # depth 1 first (higher score), then (0,0), (0,1)...
    # a tie between a depth-2 prefix and a depth-1 sibling: log(1/2) + log(1) == log(1/2)
    logp = torch.log(torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]], dtype=torch.float64))
    tree = build_tree(logp, 3, bonus=0)
    assert rows_as_prefixes(tree) == reference_order(logp, 3)


@pytest.mark.parametrize("scale", [0.1, 0.3])
def test_bf16_rounded_distributions_match_the_reference_order(scale):
    """bf16-rounded drafter log-probs tie often; row order and node set must equal the reference's."""
    g = torch.Generator().manual_seed(17)
    tied_cases = 0
    for case in range(150):
        depth, vocab = 1 + case % 4, 3 + case % 6
        budget = 2 + (case * 7) % 12
        logp = torch.log_softmax(scale * torch.randn(depth, vocab, generator=g), dim=-1).bfloat16().float()
        tree = build_tree(logp, budget, bonus=5)
        want = reference_order(logp, budget)
        assert rows_as_prefixes(tree) == want, (case, logp)
        tied_cases += len(set(tree.scores[1:])) < tree.size
    assert tied_cases >= 20  # the test exercises ties, not only distinct scores
