"""The log-sum-exp merge of split-K partials, shared by `split` and `split_ws` (Triton).

Partials (``partials``): a normalized output [slots, Hq, v_dim] (fp32, or 16-bit: read as fp32) and a fp32
log2-sum-exp [slots, Hq] per slot:
the prefix splits 0 .. n - 1, then the tree part's at index n (folded row hq = r * H + h). The merge writes
out[r, h, :] = sum_i 2^(lse_i - M) o_i / sum_i 2^(lse_i - M) in the output's dtype, an empty slot (lse -inf, its
partial never written) weighing nothing. ``merge_config`` picks the kernel and its tiles from a tuning with the
merge_* fields (SplitTuning, WsTuning); ``launch_merge`` runs it. (`split_ws` merges in CUDA by default:
cuda/seesaw_sm90.cu; these kernels are its fallback and its merge_kind 0-3.)
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import kernel_meta, next_pow2

# merge kind -> (rows per program, partials per step, pipeline stages); kind 0 is the online _merge_kernel
MERGE_PRESETS = {0: (16, 8, 2), 1: (8, 1, 4), 2: (8, 8, 1), 3: (16, 8, 3)}


@triton.jit
def _merge_tile(Hq, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr):
    """A merge program's folded rows (and which are real) and value columns."""
    offs_q = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    return offs_q, offs_q < Hq, tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)


@triton.jit
def _merge_kernel(
    O_part, LSE_part, Out, stride_or, stride_oh, stride_ps, stride_pq, Hq, H, num_splits,
    BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, SPLIT_CHUNK: tl.constexpr,
):
    """out = sum_i 2^(lse_i - M) o_i / sum_i 2^(lse_i - M) over the prefix splits 0 .. num_splits - 1
    and the tree part at index num_splits, in one online pass whose running max M starts at the tree
    part's lse (finite: every row sees itself). The partial loads of a chunk depend neither on each
    other nor on the running state: an empty split's O_part was never written, so its value is
    discarded with tl.where rather than masked on its lse (which would chain a second global load
    behind the first)."""
    offs_q, q_ok, offs_v = _merge_tile(Hq, BLOCK_M, BLOCK_V)
    m = tl.load(LSE_part + num_splits * Hq + offs_q, mask=q_ok, other=0.0)
    acc = tl.load(O_part + num_splits * stride_ps + offs_q[:, None] * stride_pq + offs_v[None, :],
                  mask=q_ok[:, None], other=0.0).to(tl.float32)
    wsum = tl.full([BLOCK_M], 1.0, tl.float32)
    for s0 in range(0, num_splits, SPLIT_CHUNK):
        offs_s = s0 + tl.arange(0, SPLIT_CHUNK)
        ok = (offs_s < num_splits)[:, None] & q_ok[None, :]
        lse = tl.load(LSE_part + offs_s[:, None] * Hq + offs_q[None, :], mask=ok, other=float("-inf"))
        o = tl.load(O_part + offs_s[:, None, None] * stride_ps + offs_q[None, :, None] * stride_pq + offs_v[None, None, :],
                    mask=ok[:, :, None], other=0.0).to(tl.float32)
        m_new = tl.maximum(m, tl.max(lse, 0))
        alpha = tl.exp2(m - m_new)
        w = tl.exp2(lse - m_new[None, :])  # [SPLIT_CHUNK, BLOCK_M], 0 for empty splits
        o = tl.where((lse > float("-inf"))[:, :, None], o, 0.0)
        acc = acc * alpha[:, None] + tl.sum(w[:, :, None] * o, 0)
        wsum = wsum * alpha + tl.sum(w, 0)
        m = m_new
    out = acc / wsum[:, None]
    o_ptr = Out + (offs_q // H)[:, None] * stride_or + (offs_q % H)[:, None] * stride_oh + offs_v[None, :]
    tl.store(o_ptr, out.to(Out.dtype.element_ty), mask=q_ok[:, None])


@triton.jit
def _merge_flat_kernel(
    O_part, LSE_part, Out, stride_or, stride_oh, stride_ps, stride_pq, Hq, H, num_splits,
    BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, SPLIT_CHUNK: tl.constexpr, S_MAX: tl.constexpr,
    STAGES: tl.constexpr, UNROLL: tl.constexpr, ACC3: tl.constexpr,
):
    """The same merge as _merge_kernel (partials 0 .. num_splits - 1 of the prefix, the tree part's at
    num_splits), in two steps: the maximum M of all num_splits + 1 lse values of a row and the sum of their
    weights 2^(lse_i - M) from one load (S_MAX >= num_splits + 1, fixed per head count so a growing prefix
    compiles nothing new), then sum_i 2^(lse_i - M) o_i over the partials, SPLIT_CHUNK at a time. The weights
    are known before any partial is read, so no step waits on the one before (no running rescale): the loop's
    loads are independent. An empty split (lse -inf) has weight 0 and its never-written partial is dropped
    with tl.where. UNROLL: each step is SPLIT_CHUNK unrolled 2-D loads (a thread's own elements of every
    partial, so the sum over partials stays in its registers) instead of one 3-D load summed across threads."""
    offs_q, q_ok, offs_v = _merge_tile(Hq, BLOCK_M, BLOCK_V)
    offs_all = tl.arange(0, S_MAX)
    lse_all = tl.load(LSE_part + offs_all[:, None] * Hq + offs_q[None, :],
                      mask=(offs_all <= num_splits)[:, None] & q_ok[None, :], other=float("-inf"))
    m = tl.max(lse_all, 0)
    m = tl.where(q_ok, m, 0.0)
    wsum = tl.sum(tl.exp2(lse_all - m[None, :]), 0)
    acc = tl.zeros([BLOCK_M, BLOCK_V], dtype=tl.float32)
    if UNROLL:  # SPLIT_CHUNK separate [BLOCK_M, BLOCK_V] loads per step, each thread's own: no cross-thread sum
        for s0 in tl.range(0, num_splits + 1, SPLIT_CHUNK, num_stages=STAGES):
            for j in tl.static_range(SPLIT_CHUNK):
                ok = q_ok & (tl.full([BLOCK_M], s0 + j, tl.int32) <= num_splits)
                lse = tl.load(LSE_part + (s0 + j) * Hq + offs_q, mask=ok, other=float("-inf"))
                o = tl.load(O_part + (s0 + j) * stride_ps + offs_q[:, None] * stride_pq + offs_v[None, :],
                            mask=ok[:, None], other=0.0).to(tl.float32)
                w = tl.exp2(lse - m)
                acc += tl.where((w > 0)[:, None], w[:, None] * o, 0.0)
    else:
        # ACC3: keep one [BLOCK_M, BLOCK_V] sum per partial slot of a step and add the slots once at the end
        # (a sum across threads after the loop instead of in every step)
        acc3 = tl.zeros([SPLIT_CHUNK if ACC3 else 1, BLOCK_M, BLOCK_V], dtype=tl.float32)
        for s0 in tl.range(0, num_splits + 1, SPLIT_CHUNK, num_stages=STAGES):
            offs_s = s0 + tl.arange(0, SPLIT_CHUNK)
            ok = (offs_s <= num_splits)[:, None] & q_ok[None, :]
            lse = tl.load(LSE_part + offs_s[:, None] * Hq + offs_q[None, :], mask=ok, other=float("-inf"))
            o = tl.load(O_part + offs_s[:, None, None] * stride_ps + offs_q[None, :, None] * stride_pq + offs_v[None, None, :],
                        mask=ok[:, :, None], other=0.0).to(tl.float32)
            w = tl.exp2(lse - m[None, :])
            if ACC3:
                acc3 += tl.where((w > 0)[:, :, None], w[:, :, None] * o, 0.0)
            else:
                acc += tl.sum(tl.where((w > 0)[:, :, None], w[:, :, None] * o, 0.0), 0)
        if ACC3:
            acc = tl.sum(acc3, 0)
    out = acc / wsum[:, None]
    o_ptr = Out + (offs_q // H)[:, None] * stride_or + (offs_q % H)[:, None] * stride_oh + offs_v[None, :]
    tl.store(o_ptr, out.to(Out.dtype.element_ty), mask=q_ok[:, None])


def merge_config(t, hq: int, v_dim: int, sms: int, max_parts: int) -> dict:
    """The merge for hq folded rows, from a tuning with the merge_* fields (SplitTuning, WsTuning): its kind
    (-1: 3 up to 128 rows, else 1; measured on the H200, the diary on the lab branch, "The merge"), rows per program,
    partials per step, stages and warps, the grid (n_mb row blocks x v_dim / bv column blocks: merge_bv
    columns, or v_dim halved until the grid fills the SMs) and S_MAX for the flat kinds: a power of two
    above max_parts, the most prefix partials the path's prefix grid can write for these rows (fixed per
    head count, so a growing prefix compiles nothing new)."""
    kind = t.merge_kind if t.merge_kind >= 0 else (3 if hq <= 128 else 1)
    if kind not in MERGE_PRESETS:
        raise ValueError(f"merge_kind must be -1 or one of {sorted(MERGE_PRESETS)}, got {kind}")
    bm, ch, st = MERGE_PRESETS[kind]
    bm = t.merge_block_m or bm
    n_mb = triton.cdiv(hq, bm)
    bv = t.merge_bv or v_dim
    if not t.merge_bv:
        while bv > 16 and n_mb * (v_dim // bv) < sms:
            bv //= 2
    return dict(kind=kind, block_m=bm, split_chunk=t.merge_split_chunk or ch, stages=t.merge_stages or st,
                warps=t.merge_warps, n_mb=n_mb, bv=bv, s_max=next_pow2(max_parts + 1))


def merge_launch(parts, n_splits: int, out: torch.Tensor, mc: dict) -> tuple:
    """(kernel, grid, args, kwargs) of the merge of prefix partials 0 .. n_splits - 1 and the tree part's (index
    n_splits) into out [R, H, v_dim] with merge_config's choice ``mc``."""
    o_part, lse_part = parts
    r, h, v = out.shape
    grid = (mc["n_mb"], v // mc["bv"])
    args = (o_part, lse_part, out, out.stride(0), out.stride(1), o_part.stride(0), o_part.stride(1), r * h, h, n_splits)
    if mc["kind"]:
        return _merge_flat_kernel, grid, args, dict(
            BLOCK_M=mc["block_m"], BLOCK_V=mc["bv"], SPLIT_CHUNK=mc["split_chunk"],
            S_MAX=max(mc["s_max"], next_pow2(n_splits + 1)), STAGES=mc["stages"],
            UNROLL=mc["kind"] == 2, ACC3=mc["kind"] == 3, num_warps=mc["warps"])
    return _merge_kernel, grid, args, dict(BLOCK_M=mc["block_m"], BLOCK_V=mc["bv"], SPLIT_CHUNK=mc["split_chunk"],
                                           num_warps=mc["warps"], num_stages=mc["stages"])


def launch_merge(parts, n_splits: int, out: torch.Tensor, mc: dict, meta: dict | None = None) -> torch.Tensor:
    """Merge prefix partials 0 .. n_splits - 1 and the tree part's (index n_splits) into out [R, H, v_dim]
    with merge_config's choice ``mc`` (merge_launch)."""
    fn, grid, args, kw = merge_launch(parts, n_splits, out, mc)
    k = fn[grid](*args, **kw)
    if meta is not None:
        meta["merge"] = kernel_meta(k)
    return out


def partials(ns: int, hq: int, v_dim: int, device, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Partial outputs (fp32, or ``dtype``: split_ws's part_bits 16 keeps them in the inputs' 16-bit type) and
    fp32 log2-sum-exps of the ns prefix splits, then the tree part's at index ns."""
    return (torch.empty(ns + 1, hq, v_dim, dtype=dtype, device=device),
            torch.empty(ns + 1, hq, dtype=torch.float32, device=device))
