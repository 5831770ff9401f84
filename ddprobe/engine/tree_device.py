"""DDTree build and walk on the device: plain torch ops on fixed shapes (a CUDA graph records them).

``build_tree_device(vals, idx, budget, bonus)`` makes exactly the tree ``tree.build_tree`` makes
(same rows in the same pop order, same tokens, parents, depths, scores), from the drafter's top-k
(values [L, k] sorted descending as ``torch.topk`` returns them, their token ids [L, k]), padded to
R = budget + 1 rows: a padded row has token 0, parent -1, depth 0, sees only itself, valid False.

How: B iterations, each pops one node. The frontier is indexed by parent row: every popped row p
has at most one pending candidate, its next child (rank = children popped so far, at depth
depth[p] + 1), with score score[p] + vals[depth[p], rank], summed in the host's order (float64).
Ties (equal scores) go to the lexicographically smaller rank path, as the heap key
``(-score, ranks)`` of ``tree.build_tree`` does. A candidate is the last child of its parent, so its
rank path sorts right after the end of its parent's popped subtree in preorder (children by rank):
candidates with different parents compare by that end (smaller first); two parents with the same
end lie on one rightmost chain, and the deeper parent's candidate is the smaller path. Each
iteration keeps every popped row's preorder position, the subtree ends come from the ancestor mask.

``ancestor_mask_device(parents)`` is the device twin of the host's one mask
(``kernels.trees.ancestor_mask``) for a whole parent array: pointer doubling, ceil(log2 R) rounds
on fixed shapes. (The build keeps its mask row by row as it pops, the same recurrence: row x = its
parent's row | x.)

``walk_device(...)`` is ``tree.walk`` at temperature 0 on the device (greedy picks [R]): a row is
accepted when it and every ancestor matched its parent's pick; the accepted rows form the path.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch


@dataclass
class DeviceTree:
    tokens: torch.Tensor  # [R] int64, row 0 = bonus, padded rows 0
    parents: torch.Tensor  # [R] int64, -1 for the root and padded rows
    depths: torch.Tensor  # [R] int64, padded rows 0
    mask: torch.Tensor  # [R, R] bool: row i sees itself and its ancestors (padded rows: themselves)
    valid: torch.Tensor  # [R] bool: row 0 and the drafted nodes
    scores: torch.Tensor  # [R] float64 summed draft log-prob (root and padded rows 0)
    size: torch.Tensor  # 0-d int64: drafted nodes (root not counted)


def ancestor_mask_device(parents: torch.Tensor) -> torch.Tensor:
    """parents [R] int64 on the device (-1: a root, so a padded row sees only itself; else a smaller
    row) -> [R, R] bool, row i seeing itself and its ancestors: ``kernels.trees.ancestor_mask`` on the
    device, with no host read (capturable). Round j ORs in the rows 2^j levels up (``up``: the
    ancestor 2^j levels up, a root its own)."""
    r = parents.shape[0]
    ar = torch.arange(r, dtype=torch.int64, device=parents.device)
    up = torch.where(parents >= 0, parents, ar)
    mask = torch.eye(r, dtype=torch.bool, device=parents.device) | (ar[None, :] == up[:, None])
    for _ in range(max(0, r - 2).bit_length()):  # ceil(log2(R - 1)) rounds; after round j: 2^(j+1) levels
        mask = mask | mask.index_select(0, up)
        up = up.index_select(0, up)
    return mask


def build_tree_device(vals: torch.Tensor, idx: torch.Tensor, budget: int, bonus) -> DeviceTree:
    """vals [L, k] (top-k log-probs, descending per row), idx [L, k] token ids, bonus: int or a
    one-element int64 tensor on the device -> the DeviceTree of ``tree.build_tree`` over them.
    k = min(budget, V) gives the "ddtree" shape, k = 1 the "chain" shape."""
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    # no Python value is written into a tensor here (``x[i] = 0`` copies from the host, which a
    # CUDA graph capture refuses): scalars go through fill_, full and where
    depth_max, k = vals.shape
    dev, r = vals.device, budget + 1
    i64 = dict(dtype=torch.int64, device=dev)
    # (L + 1) x (k + 1) tables: the padding row / column is "no candidate" (depth == L or rank == k)
    valsp = torch.zeros(depth_max + 1, k + 1, dtype=torch.float64, device=dev)
    valsp[:depth_max, :k] = vals.double()
    idxp = torch.zeros(depth_max + 1, k + 1, **i64)
    idxp[:depth_max, :k] = idx
    avail = torch.zeros(depth_max + 1, k + 1, dtype=torch.bool, device=dev)
    avail[:depth_max, :k].fill_(True)
    valsp, idxp, avail = valsp.view(-1), idxp.view(-1), avail.view(-1)
    eye = torch.eye(r, dtype=torch.bool, device=dev)
    # per-row state; unpopped rows sit at depth L (never a candidate's parent)
    dep = torch.full((r,), depth_max, **i64)
    dep[0:1].fill_(0)
    nr = torch.zeros(r, **i64)  # children popped so far
    score = torch.zeros(r, dtype=torch.float64, device=dev)
    parents = torch.full((r,), -1, **i64)
    tokens = torch.zeros(r, **i64)
    tokens[0:1] = bonus if isinstance(bonus, torch.Tensor) else torch.full((1,), int(bonus), **i64)
    anc = torch.zeros(r, r, dtype=torch.bool, device=dev)
    anc[0:1, 0:1].fill_(True)
    pos1 = torch.zeros(r, **i64)  # preorder position + 1 of popped rows, 0 for the others
    pos1[0:1].fill_(1)
    valid = torch.zeros(r, dtype=torch.bool, device=dev)
    valid[0:1].fill_(True)
    neg_inf = torch.full((), float("-inf"), dtype=torch.float64, device=dev)
    big = torch.full((), torch.iinfo(torch.int64).max, **i64)
    top = valsp.numel() - 1  # (L, k): no candidate
    one = torch.ones(1, **i64)
    # once the frontier is empty (fewer prefixes than the budget) it stays empty: the later rows
    # are computed anyway (no branch on the device) and masked out at the end through ``valid``
    for x in range(1, r):
        gidx = torch.add(nr, dep, alpha=k + 1).clamp_(max=top)  # [R] flat (depth, rank) of each row's candidate
        ok = avail[gidx]
        cand = score + valsp[gidx]
        end1 = (anc * pos1[:, None]).amax(0)  # [R] end of each row's subtree in preorder (+1)
        m = torch.where(ok, cand, neg_inf).amax()
        tie = ok & (cand == m)
        key = torch.where(tie, end1 * (depth_max + 2) - dep, big)
        p = key.argmin().view(1)
        tokens[x:x + 1] = idxp[gidx[p]]
        parents[x:x + 1] = p
        dep[x:x + 1] = dep[p] + 1
        score[x:x + 1] = cand[p]
        nr.index_add_(0, p, one)
        anc[x] = anc.index_select(0, p)[0] | eye[x]
        e1 = end1[p]
        pos1 += pos1 > e1
        pos1[x:x + 1] = e1 + 1
        valid[x:x + 1] = valid[x - 1:x] & tie.any()
    tokens = torch.where(valid, tokens, 0)
    parents = torch.where(valid, parents, -1)
    depths = torch.where(valid, dep, 0)
    score = torch.where(valid, score, 0.0)
    mask = torch.where(valid[:, None], anc, eye)
    return DeviceTree(tokens, parents, depths, mask, valid, score, valid.sum() - 1)


_FUSED_WHY: dict = {}  # (device, budget, L, k) -> None where build_tree_fused agrees with build_tree_device, else why


def fused_tree_works(device: torch.device, budget: int, depth: int, k: int) -> bool:
    """Does ``build_tree_fused`` run on this CUDA device and give ``build_tree_device``'s tree, every field equal,
    for this budget and draft shape [depth, k]? (``fused_tree_fallback`` is None.)"""
    return fused_tree_fallback(device, budget, depth, k) is None


def fused_tree_fallback(device: torch.device, budget: int, depth: int, k: int) -> str | None:
    """None where ``build_tree_fused`` gives ``build_tree_device``'s tree here, else why not: off CUDA, the error
    (no Triton, a compile error) or the difference. Checked once per shape on random top-k tables, exact ties among
    them (cached); on CUDA a fallback is said once, as a RuntimeWarning: the static step then keeps the plain build
    and ``Engine.fused_tree_fallback`` records why."""
    key = (str(device), budget, depth, k)
    if key not in _FUSED_WHY:
        why = "not a CUDA device"
        if torch.device(device).type == "cuda":
            try:
                why = None if _fused_tree_agrees(torch.device(device), budget, depth, k) else \
                    "its tree differs from the plain build's"
            except Exception as e:  # noqa: BLE001  no Triton, a compile error: the plain build
                why = f"{type(e).__name__}: {e}"[:300]
            if why is not None:
                warnings.warn(f"the fused tree kernel does not run on {device} (budget {budget}, draft [{depth}, "
                              f"{k}]): {why}; the plain device build runs instead", RuntimeWarning, stacklevel=2)
        _FUSED_WHY[key] = why
    return _FUSED_WHY[key]


def _fused_tree_agrees(device: torch.device, budget: int, depth: int, k: int) -> bool:
    g = torch.Generator().manual_seed(budget * 131 + depth * 7 + k)
    for scale, ties in ((1.0, False), (6.0, False), (1.0, True)):
        logits = torch.randint(0, 3, (depth, 4 * k + 3), generator=g).double() if ties else \
            scale * torch.randn(depth, 4 * k + 3, generator=g, dtype=torch.float64)
        vals, idx = torch.topk(torch.log_softmax(logits, -1), k, dim=-1)
        vals, idx = vals.to(device), idx.to(device)
        bonus = torch.full((1,), 5, dtype=torch.int64, device=device)
        a, b = build_tree_device(vals, idx, budget, bonus), build_tree_fused(vals, idx, budget, bonus)
        if not all(torch.equal(getattr(a, f), getattr(b, f)) for f in DeviceTree.__dataclass_fields__):
            return False
    return True


def build_tree_fused(vals: torch.Tensor, idx: torch.Tensor, budget: int, bonus,
                     out: DeviceTree | None = None) -> DeviceTree:
    """``build_tree_device`` in one Triton program (kernels/tree_build.py; the same tree, bit for bit): one
    launch instead of ~15 small kernels per popped node. ``out``: the DeviceTree whose buffers it writes (R =
    budget + 1 rows on vals' device), else new ones."""
    from .kernels.tree_build import tree_build

    dev, r = vals.device, budget + 1
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    if out is None:
        i64 = dict(dtype=torch.int64, device=dev)
        out = DeviceTree(torch.empty(r, **i64), torch.empty(r, **i64), torch.empty(r, **i64),
                         torch.empty(r, r, dtype=torch.bool, device=dev), torch.empty(r, dtype=torch.bool, device=dev),
                         torch.empty(r, dtype=torch.float64, device=dev), torch.empty((), **i64))
    if not isinstance(bonus, torch.Tensor):
        bonus = torch.full((1,), int(bonus), dtype=torch.int64, device=dev)
    tree_build(vals.contiguous(), idx.contiguous(), bonus.reshape(1), out.tokens, out.parents, out.depths, out.mask,
               out.valid, out.scores, out.size)
    return out


@dataclass
class DeviceWalk:
    accepted: torch.Tensor  # [R] bool: rows on the accepted path (row 0 always)
    count: torch.Tensor  # 0-d int64: k = accepted rows = commit length
    bonus: torch.Tensor  # [1] int64: the pick at the last accepted row
    perm: torch.Tensor  # [R] int64: accepted rows first (by depth), then the others in row order
    out: torch.Tensor  # [R] int64: committed tokens (path tokens after the root, then the bonus), 0 after


def walk_device(t: DeviceTree, picks: torch.Tensor) -> DeviceWalk:
    """``tree.walk`` at temperature 0: picks [R] the target's greedy token at every row."""
    r = t.tokens.shape[0]
    ar = torch.arange(r, dtype=torch.int64, device=picks.device)
    match = t.valid & (t.tokens == picks[t.parents.clamp(min=0)])
    match = match | (ar == 0)
    accepted = ~(t.mask & ~match[None, :]).any(1)  # every row it sees (itself, ancestors) matched
    count = accepted.sum()
    last = torch.where(accepted, t.depths, -1).argmax()
    bonus = picks.gather(0, last.view(1))  # [1] (no 0-d tensor index: that would read it on the host)
    rest = torch.cumsum((~accepted).long(), 0) - 1 + count
    perm = torch.where(accepted, t.depths, rest)
    out = torch.zeros(r + 1, dtype=torch.int64, device=picks.device)
    out.scatter_(0, torch.where(accepted & (ar > 0), t.depths - 1, r), t.tokens)
    out.scatter_(0, (count - 1).view(1), bonus)
    return DeviceWalk(accepted, count, bonus, perm, out[:r])
