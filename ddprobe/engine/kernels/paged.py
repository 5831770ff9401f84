"""`paged`: DDTree verify as SGLang runs it today over a page_size=1 token pool.

A faithful rendering of SGLang's Triton `extend_attention_fwd` for MLA with a custom
(tree) mask: one program per (request, head, block of 32 query rows), KV blocks of 64
tokens, no split over the context. Stage 1 walks the committed prefix, reading each
block's token indices from the request-to-token table and gathering the 1152-byte rows
one token at a time; stage 2 walks the new (extend) rows the same way. The tree mask is
SGLang's flat layout: for request b, query row i, column j (prefix then new columns) the
byte at mask_indptr[b] + i * (prefix_len + R) + j. Each head re-reads the whole prefix.
K is the full 576-wide row (512 latent + 64 rope), V its first 512 values.

(SGLang loads V a second time from a v_buffer view of the same rows; here the latent tile
is loaded once and used for both products, which can only help this path.)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ... import verify_paths
from ._common import check_dims, check_rows, dot_flags, kernel_meta
from .plan import VerifyPlan, check_diagonal, check_plan_args, check_run_args, split_prefix_arg

name = "paged"
layout = verify_paths.BY_NAME[name].layout
device_plans = verify_paths.BY_NAME[name].device_plans

BLOCK_M = 32  # query rows per program (SGLang's choice for 576-wide heads on sm_80+/sm_90)
BLOCK_N = 64  # KV tokens per block


@dataclass(frozen=True)
class PagedTuning:
    """Launch knobs. SGLang launches with num_stages=1; 2 is faster here (benchmarked both), so
    the baseline is not a strawman."""

    num_warps: int = 8
    num_stages: int = 2


DEFAULT_TUNING = PagedTuning()


@triton.jit
def _stage(q_lat, q_pe, KV, rtt, Mask, row_base, col0, n_cols, offs_m, m_ok, ext, stride_kv, qk_scale,
           m_i, l_i, acc, offs_v, offs_pe, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr):
    """One of SGLang's two loops: columns col0 .. col0 + n_cols of the request, KV blocks of
    BLOCK_N tokens gathered one token at a time through the req_to_token row, masked by the flat
    custom mask (row_base[m] + column)."""
    for n0 in range(0, n_cols, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < n_cols
        idx = tl.load(rtt + col0 + offs_n, mask=n_ok, other=0).to(tl.int64)
        k_ptr = KV + idx[:, None] * stride_kv
        k_lat = tl.load(k_ptr + offs_v[None, :], mask=n_ok[:, None], other=0.0)
        k_pe = tl.load(k_ptr + offs_pe[None, :], mask=n_ok[:, None], other=0.0)
        if UPCAST:
            k_lat = k_lat.to(tl.float32)
            k_pe = k_pe.to(tl.float32)
        s = tl.dot(q_lat, tl.trans(k_lat), input_precision=PREC)
        s = tl.dot(q_pe, tl.trans(k_pe), s, input_precision=PREC)
        s = s * qk_scale
        cm = tl.load(Mask + row_base[:, None] + col0 + offs_n[None, :], mask=m_ok[:, None] & n_ok[None, :], other=0)
        ok = ((cm != 0) | (offs_m[:, None] >= ext)) & n_ok[None, :]
        s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(k_lat.dtype), k_lat, acc, input_precision=PREC)
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _paged_verify_kernel(
    Q, KV, Out, ReqToToken, PrefixLens, ExtendLens, ExtendStart, MaskIndptr, Mask,
    stride_qr, stride_qh, stride_kv, stride_or, stride_oh, stride_rtt, qk_scale,
    V_DIM: tl.constexpr, PE_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr, PREC: tl.constexpr,
):
    req = tl.program_id(0)
    head = tl.program_id(1)
    mblk = tl.program_id(2)

    prefix = tl.load(PrefixLens + req)
    ext = tl.load(ExtendLens + req)
    ext_start = tl.load(ExtendStart + req)
    mask_off = tl.load(MaskIndptr + req)
    total = prefix + ext

    offs_m = mblk * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = offs_m < ext
    offs_v = tl.arange(0, V_DIM)
    offs_pe = V_DIM + tl.arange(0, PE_DIM)
    q_ptr = Q + (ext_start + offs_m)[:, None] * stride_qr + head * stride_qh
    q_lat = tl.load(q_ptr + offs_v[None, :], mask=m_ok[:, None], other=0.0)
    q_pe = tl.load(q_ptr + offs_pe[None, :], mask=m_ok[:, None], other=0.0)
    if UPCAST:
        q_lat = q_lat.to(tl.float32)
        q_pe = q_pe.to(tl.float32)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, V_DIM], tl.float32)
    rtt = ReqToToken + req * stride_rtt
    row_base = mask_off + offs_m.to(tl.int64) * total
    # stage 1: the committed prefix; stage 2: the new (extend) rows under the tree mask
    m_i, l_i, acc = _stage(q_lat, q_pe, KV, rtt, Mask, row_base, 0, prefix, offs_m, m_ok, ext, stride_kv, qk_scale,
                           m_i, l_i, acc, offs_v, offs_pe, BLOCK_N, UPCAST, PREC)
    m_i, l_i, acc = _stage(q_lat, q_pe, KV, rtt, Mask, row_base, prefix, ext, offs_m, m_ok, ext, stride_kv, qk_scale,
                           m_i, l_i, acc, offs_v, offs_pe, BLOCK_N, UPCAST, PREC)

    out = acc / l_i[:, None]
    o_ptr = Out + (ext_start + offs_m)[:, None] * stride_or + head * stride_oh + offs_v[None, :]
    tl.store(o_ptr, out.to(Out.dtype.element_ty), mask=m_ok[:, None])


def plan(prefix_len, tree_mask: torch.Tensor, slots: torch.Tensor | None = None, v_dim: int = 512, *,
         tuning: PagedTuning | None = None, heads: int | None = None, max_prefix: int | None = None) -> VerifyPlan:
    """Build SGLang's metadata once per step: req_to_token row, flat custom mask, indptrs.
    prefix_len: int (host plan) or a [1] int32 device tensor with ``max_prefix`` (device plan:
    buffers sized for max_prefix, refreshed in place by ``refresh``). ``heads`` is not needed."""
    tuning = DEFAULT_TUNING if tuning is None else tuning
    if not isinstance(tuning, PagedTuning):
        raise ValueError(f"the paged path takes a PagedTuning, got {type(tuning).__name__}")
    dev = tree_mask.device
    bound, prefix_t, dynamic = split_prefix_arg(prefix_len, max_prefix, dev)
    check_plan_args(bound, tree_mask, slots)
    if slots is None:
        raise ValueError("the paged path needs the page_size=1 token pool: pass slots")
    if not dynamic:
        check_diagonal(tree_mask)
    r = int(tree_mask.shape[0])
    check_rows(r, name)
    n = bound + r
    i32 = dict(dtype=torch.int32, device=dev)
    extra = {
        "req_to_token": torch.empty(1, n, **i32),  # [batch=1, max_len]
        "custom_mask": torch.empty(r * n, dtype=torch.uint8, device=dev),  # flat [R * (prefix + R)]
        "mask_indptr": torch.zeros(1, dtype=torch.int64, device=dev),
        "extend_lens": torch.tensor([r], **i32),
        "extend_start_loc": torch.zeros(1, **i32),
        "batch": 1,
    }
    p = VerifyPlan(prefix_len=bound, tree_mask=tree_mask, slots=slots, v_dim=v_dim, prefix_t=prefix_t,
                   dynamic=dynamic, tuning=tuning, extra=extra)
    refresh(p)
    return p


def refresh(p: VerifyPlan) -> None:
    """Rebuild the req_to_token row and the flat mask from slots, tree_mask and prefix_t, with
    fixed-shape device ops (capturable in a CUDA graph). Row i of the flat mask starts at
    i * (prefix + R): the prefix columns are 1, then row i of the tree mask."""
    e, r = p.extra, p.num_rows
    n = p.num_cols
    e["req_to_token"][0].copy_(p.slots[:n])
    if not p.dynamic:
        full = torch.cat([torch.ones(r, p.prefix_len, dtype=torch.bool, device=p.tree_mask.device), p.tree_mask], 1)
        e["custom_mask"].copy_(full.reshape(-1))
        return
    total = p.prefix_t.to(torch.int64) + r
    flat = torch.arange(r * n, device=p.tree_mask.device)
    row, col = flat // total, flat % total
    rel = col - p.prefix_t.to(torch.int64)
    tree = p.tree_mask[row.clamp(max=r - 1), rel.clamp(0, r - 1)]
    e["custom_mask"].copy_(((rel < 0) | tree) & (row < r))


def run(q: torch.Tensor, kv: torch.Tensor, p: VerifyPlan, sm_scale: float, *, meta: dict | None = None) -> torch.Tensor:
    """q [R, H, D], kv [pool, D] -> out [R, H, v_dim] in q's dtype. ``meta``: a dict to receive
    the compiled kernel's report under "paged" (registers, spills, shared memory, wgmma count)."""
    check_run_args(q, kv, p)
    check_dims(q, kv, p.v_dim, name)
    if p.slots is None or "req_to_token" not in p.extra:
        raise ValueError("plan was not built by paged.plan (needs slots)")
    r, h, d = q.shape
    pe = d - p.v_dim
    out = torch.empty(r, h, p.v_dim, dtype=q.dtype, device=q.device)
    e, t = p.extra, p.tuning
    upcast, prec = dot_flags(q.dtype)
    grid = (e["batch"], h, triton.cdiv(r, BLOCK_M))
    k = _paged_verify_kernel[grid](
        q, kv, out, e["req_to_token"], p.prefix_t, e["extend_lens"], e["extend_start_loc"],
        e["mask_indptr"], e["custom_mask"],
        q.stride(0), q.stride(1), kv.stride(0), out.stride(0), out.stride(1), e["req_to_token"].stride(0),
        sm_scale * 1.4426950408889634,
        V_DIM=p.v_dim, PE_DIM=pe, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, UPCAST=upcast, PREC=prec,
        num_warps=t.num_warps, num_stages=t.num_stages,
    )
    if meta is not None:
        meta["paged"] = kernel_meta(k)
    return out
