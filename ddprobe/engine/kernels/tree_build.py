"""The DDTree build in one Triton program: ``tree_device.build_tree_device`` (plain torch ops, its reference: the
same rows, tokens, parents, depths, scores and mask, bit for bit) without its ~15 small kernels per popped node.

One program holds the whole tree in registers ([RP] row vectors, the [RP, RP] ancestor mask, RP = R rounded up
to a power of two) and pops the R - 1 nodes in a loop, with build_tree_device's rules: each popped row's
pending candidate is its next child (depth + 1, rank = children popped so far) with score score + vals[depth,
rank] in float64; the best score wins, ties to the candidate whose parent's subtree ends first in preorder, then
the deeper parent. Selecting row p's values is a max over the rows masked to p (exact for every dtype).
Runs under TRITON_INTERPRET on the CPU (the tests compare it there with the reference).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import MAX_ROWS, next_pow2


@triton.jit(do_not_specialize=["L", "K"])  # L or K of 1 would otherwise arrive as a constexpr
def _tree_build(vals_ptr, idx_ptr, bonus_ptr, tok_ptr, par_ptr, dep_ptr, mask_ptr, valid_ptr, score_ptr, size_ptr,
                L, K, R: tl.constexpr, RP: tl.constexpr):
    rows = tl.arange(0, RP)
    live = rows < R
    eye = rows[:, None] == rows[None, :]
    big: tl.constexpr = 9223372036854775807
    depth_max = L.to(tl.int64)
    dep = tl.where(rows == 0, 0, depth_max).to(tl.int64)  # unpopped rows sit at depth L: never a parent
    nr = tl.zeros([RP], tl.int64)  # children popped so far
    score = tl.zeros([RP], tl.float64)
    parents = tl.full([RP], -1, tl.int64)
    tokens = tl.where(rows == 0, tl.load(bonus_ptr), 0).to(tl.int64)
    anc = (rows[:, None] == 0) & (rows[None, :] == 0)  # anc[j, i]: i is j or an ancestor of j
    pos1 = tl.where(rows == 0, 1, 0).to(tl.int64)  # preorder position + 1 of popped rows
    valid = rows == 0
    alive = tl.max(valid.to(tl.int32), axis=0) > 0  # True: the frontier was not empty at any pop so far
    for x in range(1, R):  # a loop, not unrolled: R up to 64 compiles as fast as 9
        ok = (dep < depth_max) & (nr < K)
        cand = score + tl.load(vals_ptr + dep * K + nr, mask=ok, other=0.0).to(tl.float64)
        end1 = tl.max(tl.where(anc, pos1[:, None], 0), axis=0)  # end of each row's subtree in preorder (+1)
        m = tl.max(tl.where(ok, cand, float("-inf")), axis=0)  # tl.max skips NaN; torch's amax returns it:
        nan = tl.max((ok & (cand != cand)).to(tl.int32), axis=0) > 0  # a NaN candidate ties nothing there
        tie = ok & (cand == m) & (nan == 0)
        key = tl.where(tie, end1 * (depth_max + 2) - dep, big)
        p = tl.argmin(key, axis=0)
        sel = rows == p
        dep_p = tl.max(tl.where(sel, dep, -1), axis=0)
        nr_p = tl.max(tl.where(sel, nr, -1), axis=0)
        cand_p = tl.max(tl.where(sel, cand, float("-inf")), axis=0)
        end1_p = tl.max(tl.where(sel, end1, -1), axis=0)
        ok_p = (dep_p < depth_max) & (nr_p < K)
        tok = tl.load(idx_ptr + dep_p * K + nr_p, mask=ok_p, other=0).to(tl.int64)
        here = rows == x
        tokens = tl.where(here, tok, tokens)
        parents = tl.where(here, p.to(tl.int64), parents)
        dep = tl.where(here, dep_p + 1, dep)
        score = tl.where(here, cand_p, score)
        nr = tl.where(sel, nr + 1, nr)
        anc_p = tl.max(tl.where(sel[:, None] & anc, 1, 0), axis=0) > 0
        anc = tl.where(here[:, None], anc_p[None, :] | here[None, :], anc)
        pos1 = pos1 + (pos1 > end1_p).to(tl.int64)
        pos1 = tl.where(here, end1_p + 1, pos1)
        alive = alive & (tl.max(tie.to(tl.int32), axis=0) > 0)
        valid = tl.where(here, alive, valid)
    tl.store(tok_ptr + rows, tl.where(valid, tokens, 0), mask=live)
    tl.store(par_ptr + rows, tl.where(valid, parents, -1), mask=live)
    tl.store(dep_ptr + rows, tl.where(valid, dep, 0), mask=live)
    tl.store(score_ptr + rows, tl.where(valid, score, 0.0), mask=live)
    tl.store(valid_ptr + rows, valid, mask=live)
    tl.store(mask_ptr + rows[:, None] * R + rows[None, :], tl.where(valid[:, None], anc, eye),
             mask=live[:, None] & live[None, :])
    tl.store(size_ptr, tl.sum(valid.to(tl.int64), axis=0) - 1)


def tree_build(vals: torch.Tensor, idx: torch.Tensor, bonus: torch.Tensor, tokens: torch.Tensor,
               parents: torch.Tensor, depths: torch.Tensor, mask: torch.Tensor, valid: torch.Tensor,
               scores: torch.Tensor, size: torch.Tensor) -> None:
    """Write the tree of vals / idx [L, k] (top-k log-probs, descending per row, and their token ids) with root
    token ``bonus`` (a one-element int64 tensor) into tokens / parents / depths [R] int64, mask [R, R] bool,
    valid [R] bool, scores [R] float64 and size (one int64), all contiguous on vals' device, R = budget + 1
    (at most MAX_ROWS). One program, no host synchronization (a CUDA graph records it)."""
    r = tokens.numel()
    if not 1 < r <= MAX_ROWS:
        raise ValueError(f"the tree build takes 2 to {MAX_ROWS} rows (budget 1 to {MAX_ROWS - 1}), got {r}")
    if vals.dim() != 2 or idx.shape != vals.shape:
        raise ValueError(f"vals and idx must be [L, k] of one shape, got {tuple(vals.shape)} and {tuple(idx.shape)}")
    outs = (tokens, parents, depths, mask, valid, scores, size)
    if any(not t.is_contiguous() or t.device != vals.device for t in (vals, idx, bonus, *outs)):
        raise ValueError("the tree build needs contiguous tensors on one device")
    _tree_build[(1,)](vals, idx, bonus, tokens, parents, depths, mask, valid, scores, size, vals.shape[0],
                      vals.shape[1], R=r, RP=next_pow2(r), num_warps=1)
