"""DDTree: build the draft tree from per-position distributions, its ancestor mask, and the walk.

Rows: row 0 is the root (the bonus token, depth 0); rows 1..B are the drafted nodes in pop order,
so a parent's row is always smaller than its children's. ``parents[0] = -1``. Position of row i
is prefix_len + depth[i]: nodes at equal depth share a position.

The best tree of B nodes is the B most probable prefixes under the product of the per-position
marginals. Best-first search: a heap over prefixes by summed log-prob starts with the root's first
child; each pop pushes the popped node's next sibling (same parent, next-ranked token at that
depth) and its first child (depth + 1, top token). Only the top min(B, V) tokens per depth matter.

Ties: prefixes of equal summed log-prob are ordered by their rank path (the tuple of top-k ranks
from depth 1 down, ranks as ``torch.topk`` returns them), lexicographically smaller first, as the
DDTree reference code does (heap key ``(-score, ranks)``). With bf16-rounded drafter logits exact
ties are common; without this rule the row order (and at the budget's edge the node set) would
depend on push order. The pop order is then exactly the sort of all top-k prefixes by
``(-score, ranks)``: a node's parent and previous sibling always sort before it.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import torch

from .kernels.trees import ancestor_mask

TREE_SHAPES = ("ddtree", "chain")


@dataclass(frozen=True)
class DraftTree:
    """Frozen tree plan of one step (host lists plus device tensors built once)."""

    tokens: tuple[int, ...]  # [R] row 0 = bonus
    parents: tuple[int, ...]  # [R] parents[0] = -1
    depths: tuple[int, ...]  # [R] depths[0] = 0
    scores: tuple[float, ...]  # [R] summed draft log-prob of the prefix (root 0.0)

    @property
    def num_rows(self) -> int:  # R = B' + 1
        return len(self.tokens)

    @property
    def size(self) -> int:  # drafted nodes (root not counted)
        return len(self.tokens) - 1

    def ancestor_mask(self, device="cpu") -> torch.Tensor:
        """[R, R] bool: row i sees itself and its ancestors (``kernels.trees.ancestor_mask``)."""
        return ancestor_mask(self.parents, device)

    def positions(self, prefix_len: int, device="cpu") -> torch.Tensor:  # [R] int64
        return torch.tensor(self.depths, dtype=torch.int64, device=device) + prefix_len

    def children(self) -> dict[tuple[int, int], int]:
        """(parent row, token) -> child row. Siblings have distinct tokens."""
        return {(p, t): i for i, (p, t) in enumerate(zip(self.parents, self.tokens)) if i > 0}


def build_tree(logp: torch.Tensor, budget: int, bonus: int, shape: str = "ddtree") -> DraftTree:
    """logp [L, V] per-position log-probs -> the DraftTree of at most ``budget`` nodes, depth <= L.

    shape "ddtree": the ``budget`` most probable prefixes (fewer if fewer exist);
    shape "chain": the top-1 token at every depth, min(budget, L) nodes.
    """
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    if logp.dim() != 2 or logp.shape[0] < 1:
        raise ValueError(f"logp must be [L >= 1, V], got {tuple(logp.shape)}")
    if shape not in TREE_SHAPES:
        raise ValueError(f"unknown tree shape {shape!r}; known: {', '.join(TREE_SHAPES)}")
    depth_max, vocab = logp.shape
    k = 1 if shape == "chain" else min(budget, vocab)
    vals, idx = torch.topk(logp.double(), k, dim=-1)  # [L, k], sorted descending
    vals, idx = vals.cpu().tolist(), idx.cpu().tolist()
    tokens, parents, depths, scores = [bonus], [-1], [0], [0.0]
    if shape == "chain":
        for d in range(min(budget, depth_max)):
            tokens.append(idx[d][0]); parents.append(d); depths.append(d + 1); scores.append(scores[-1] + vals[d][0])
        return DraftTree(tuple(tokens), tuple(parents), tuple(depths), tuple(scores))
    # heap entries: (-score, rank path, d (0-based position), rank, parent row, parent score);
    # rank paths are unique, so equal scores never fall through to the later fields
    heap = [(-vals[0][0], (0,), 0, 0, 0, 0.0)]
    while heap and len(tokens) <= budget:
        neg, ranks, d, r, parent, pscore = heapq.heappop(heap)
        row = len(tokens)
        tokens.append(idx[d][r]); parents.append(parent); depths.append(d + 1); scores.append(-neg)
        if r + 1 < k:  # next sibling
            heapq.heappush(heap, (-(pscore + vals[d][r + 1]), ranks[:-1] + (r + 1,), d, r + 1, parent, pscore))
        if d + 1 < depth_max:  # first child
            heapq.heappush(heap, (-(-neg + vals[d + 1][0]), ranks + (0,), d + 1, 0, row, -neg))
    return DraftTree(tuple(tokens), tuple(parents), tuple(depths), tuple(scores))


def tree_from_topk(vals: torch.Tensor, idx: torch.Tensor, budget: int, bonus: int, shape: str) -> DraftTree:
    """build_tree over the top-k values [L, k] (host), tokens mapped back through idx [L, k]:
    the same tree build_tree makes from the full log-probs (it only ever reads their top-k)."""
    t = build_tree(vals, budget, bonus, shape)
    idx = idx.tolist()
    tokens = (bonus,) + tuple(idx[d - 1][c] for c, d in zip(t.tokens[1:], t.depths[1:]))
    return DraftTree(tokens, t.parents, t.depths, t.scores)


def walk(tree: DraftTree, picks: list[int]) -> tuple[list[int], int]:
    """picks [R]: the target's token at every row (argmax or a sample). From the root, follow the
    child whose token equals the pick; stop when none does. Returns (accepted path rows starting
    with 0, next bonus token = pick at the last accepted row)."""
    children = tree.children()
    path, row = [0], 0
    while (row_next := children.get((row, picks[row]))) is not None:
        row = row_next
        path.append(row)
    return path, picks[row]


def sibling_ranks(tree: DraftTree) -> tuple[int, ...]:
    """[R] each row's rank among its parent's children (0 = the parent's first, most probable child; the root 0).
    Children are popped in rank order, so a child's rank is its place among its siblings in row order."""
    seen: dict[int, int] = {}
    ranks = [0]
    for p in tree.parents[1:]:
        ranks.append(seen.get(p, 0))
        seen[p] = ranks[-1] + 1
    return tuple(ranks)


def spine_depth(tree: DraftTree, picks: list[int]) -> int:
    """Draft tokens the tree's own spine (the rank-0 path inside it: each node's first child) would accept on the
    same target picks: follow first children while the child's token is the pick at its parent. Independent of
    ``walk``: under greedy decoding the walk accepts at least this many (the spine is inside the tree); fewer is a
    bug (``records.provenance`` counts it)."""
    first: dict[int, int] = {}
    for i, p in enumerate(tree.parents[1:], 1):
        first.setdefault(p, i)
    row, depth = 0, 0
    while (child := first.get(row)) is not None and tree.tokens[child] == picks[row]:
        row, depth = child, depth + 1
    return depth


def path_ranks(tree: DraftTree, path: list[int]) -> tuple[int, ...]:
    """The sibling rank of every accepted node after the root (``sibling_ranks``), in depth order."""
    ranks = sibling_ranks(tree)
    return tuple(ranks[r] for r in path[1:])


def target_picks(logits: torch.Tensor, temperature: float, generator: torch.Generator | None = None) -> list[int]:
    """logits [R, V] -> one token per row: argmax at temperature 0, else a sample of
    softmax(logits / T) drawn independently at every row (what makes the walk lossless)."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0:
        return logits.argmax(dim=-1).tolist()
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).view(-1).tolist()
