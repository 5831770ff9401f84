"""`paged`: DDTree verify as SGLang runs it today over a page_size=1 token pool (ddprobe's own rendering).

Tree verify (R > 1 rows) renders SGLang's Triton ``extend_attention_fwd`` for MLA as ``TritonAttnBackend`` launches it
for a TARGET_VERIFY batch: SGLang's ``_fwd_kernel`` written as SGLang writes it (same arguments, expressions and
order, for the features TARGET_VERIFY uses: custom mask, causal, ``skip_prefix_custom_mask``), so that Triton emits
the same code (``_target_compile`` checks it without a GPU). One program per (request, head, block of BLOCK_M query
rows), KV blocks of BLOCK_N tokens, no split over the context, ``num_stages=1``, BLOCK_M / BLOCK_N / num_warps per
GPU architecture as SGLang picks them for 576-wide heads (``extend_blocks``). Stage 1 walks the committed prefix
through ``kv_indices`` (int64 slots): K gathered as a transposed [512, BLOCK_N] tile then the rope tile, V (the
rows' first 512 values) loaded again as SGLang loads it from its v_buffer view; no mask bytes read. Stage 2 walks
the R new rows up to the row block's causal end from their own contiguous buffer (k_extend / v_extend, gathered
from the pool by ``run``) under SGLang's flat custom mask (request b, row i, column j at
mask_indptr[b] + i * (prefix + R) + j), skipping all-masked tiles. Each head re-reads the whole prefix.

Plain decode (R = 1, no tree) renders SGLang's split-K decode (``decode_attention_fwd`` with MLA): stage 1, one
program per (request, 16 heads, KV split) over BLOCK_N = 32 tokens at a time with V taken from the K tile; stage 2
merges the splits per head. The number of splits follows SGLang's heuristic (``decode_splits``) up to its MLA cap
(``max_kv_splits``). Where sglang is installed, the ``sglang`` path runs SGLang's own kernels beside this one.

A rendering, not a copy: the kernels here are ddprobe's own functions; where codegen depends on it (index
arithmetic, the online-softmax update, the tl.multiple_of hints) they follow the expressions of SGLang's
Apache-2.0 ``extend_attention.py`` / ``decode_attention.py`` (sglang 0.5.14), so the baseline costs what SGLang's
kernel costs where sglang is not installed.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ... import verify_paths
from ._common import check_dims, check_rows, dot_flags, kernel_meta, next_pow2, sm_count
from .plan import VerifyPlan, check_run_args, pool_plan_args

name = "paged"
layout = verify_paths.BY_NAME[name].layout
device_plans = verify_paths.BY_NAME[name].device_plans

# SGLang's split-K decode for MLA (decode_attention.py, TritonAttnBackend), as ddprobe renders it
DECODE_BLOCK_N = 32  # tokens per iteration (BLOCK on CUDA for 576-wide rows)
DECODE_BLOCK_H = 16  # heads per program
MIN_BLOCK_KV = 32  # split lengths are multiples of this
BASE_KV_SPLITS = 8  # server_args.triton_attention_num_kv_splits (its default on CUDA)
MODEL_CONTEXT = 163840  # the model context length that caps max_kv_splits (DeepSeek-V3 / Kimi-K2's)


@dataclass(frozen=True)
class PagedTuning:
    """Launch knobs; 0 means SGLang's choice for this GPU (``extend_blocks``). SGLang launches num_stages=1."""

    num_warps: int = 0
    num_stages: int = 1
    block_m: int = 0
    block_n: int = 0


DEFAULT_TUNING = PagedTuning()


def extend_blocks(cap: tuple[int, int] | None, hip: bool = False) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) SGLang's extend kernel takes for 576-wide MLA heads on a GPU of compute
    capability ``cap`` (None: no CUDA GPU, the interpreter; SGLang's fallback for other GPUs)."""
    if hip:
        return 64, 64, 4
    if cap is None:
        return 32, 32, 8
    major, minor = cap
    if major == 12:  # sm_120 workstation Blackwell: ~100 KB shared memory
        return 32, 32, 8
    if major == 10:  # sm_100 data-center Blackwell
        return 16, 64, 8
    if major >= 9:  # Hopper
        return 32, 64, 8
    if major == 8:
        return (32, 32, 8) if minor in (6, 9) else (32, 64, 8)
    return 32, 32, 8


def max_kv_splits(sm: int, hip: bool = False) -> int:
    """SGLang's MLA decode split cap: the base count, raised to the SM count's power of two within the context."""
    base = 16 if hip else BASE_KV_SPLITS
    if sm <= 0:
        return base
    return max(base, min(next_pow2(sm), next_pow2(triton.cdiv(MODEL_CONTEXT, MIN_BLOCK_KV))))


def decode_splits(seq_len: torch.Tensor, heads: int, sm: int, cap: int) -> torch.Tensor:
    """[1] int32 splits for one request of ``seq_len`` tokens (a [1] int device tensor; fixed-shape ops, so a
    CUDA graph replays it): SGLang's heuristic for one sequence, splits grow with log2 of the length over the SMs."""
    length = seq_len.to(torch.float32)
    cores = (sm * torch.clamp(torch.log2(length / 64.0), min=1.0)).to(torch.int32)
    grid = -(-heads // min(DECODE_BLOCK_H, heads))
    most = torch.clamp(-(-cores // grid), max=cap)
    chunk = -(-seq_len.to(torch.int32) // most)
    return torch.clamp(-(-seq_len.to(torch.int32) // chunk), min=1).to(torch.int32)


@triton.jit
def _scores(q, qpe, KV, loc, n_ok, stride_kv, offs_d, offs_pe, sm_scale, UPCAST: tl.constexpr, PREC: tl.constexpr):
    """q . K for one block of gathered rows, K loaded transposed ([D, BLOCK_N]) latent then rope."""
    k = tl.load(KV + loc[None, :] * stride_kv + offs_d[:, None], mask=n_ok[None, :], other=0.0)
    kpe = tl.load(KV + loc[None, :] * stride_kv + offs_pe[:, None], mask=n_ok[None, :], other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
        kpe = kpe.to(tl.float32)
    qk = tl.dot(q, k, input_precision=PREC)
    qk += tl.dot(qpe, kpe, input_precision=PREC)
    return qk * sm_scale, k


@triton.jit
def _online_softmax(qk, e_max, deno):
    """One step of the online softmax over a masked score tile (SGLang's order of operations)."""
    row_max = tl.max(qk, 1)
    row_max_fixed = tl.where(row_max == float("-inf"), -1e20, row_max)
    n_e_max = tl.maximum(row_max_fixed, e_max)
    re_scale = tl.exp(e_max - n_e_max)
    p = tl.exp(qk - n_e_max[:, None])
    deno = deno * re_scale + tl.sum(p, 1)
    return p, re_scale, n_e_max, deno


@triton.jit
def _prefix_stage(q, qpe, K_Buffer, V_Buffer, kv_indices, cur_seq_kv_start_idx, cur_seq_len_prefix, mask_m,
                  cur_kv_head, stride_buf_kbs, stride_buf_kh, stride_buf_vbs, stride_buf_vh, sm_scale, k_scale,
                  v_scale, acc, deno, e_max, Lq: tl.constexpr, V_DIM: tl.constexpr, PE_DIM: tl.constexpr,
                  BLOCK_N: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr):
    """Stage 1: the committed prefix from the pool through kv_indices; no mask bytes (skip_prefix_custom_mask).
    Offsets, masks and operations as SGLang's _fwd_kernel writes them."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, V_DIM)
    offs_dpe = V_DIM + tl.arange(0, PE_DIM)
    mask_d = offs_d < Lq
    mask_dv = offs_d < V_DIM
    for start_n in range(0, cur_seq_len_prefix, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        mask_n = (start_n + offs_n) < cur_seq_len_prefix
        final_mask = mask_m[:, None] & mask_n[None, :]
        offs_kv_loc = tl.load(kv_indices + cur_seq_kv_start_idx + start_n + offs_n, mask=mask_n, other=0)
        offs_buf_k = offs_kv_loc[None, :] * stride_buf_kbs + cur_kv_head * stride_buf_kh + offs_d[:, None]
        k = tl.load(K_Buffer + offs_buf_k, mask=(mask_n[None, :]) & (mask_d[:, None]), other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
        qk = tl.dot(q.to(k.dtype), k, input_precision=PREC)
        offs_kpe = offs_kv_loc[None, :] * stride_buf_kbs + cur_kv_head * stride_buf_kh + offs_dpe[:, None]
        kpe = tl.load(K_Buffer + offs_kpe, mask=mask_n[None, :], other=0.0)
        if UPCAST:
            kpe = kpe.to(tl.float32)
        qk += tl.dot(qpe.to(kpe.dtype), kpe, input_precision=PREC)
        qk *= sm_scale * k_scale
        qk = tl.where(final_mask, qk, float("-inf"))
        p, re_scale, e_max, deno = _online_softmax(qk, e_max, deno)
        offs_buf_v = offs_kv_loc[:, None] * stride_buf_vbs + cur_kv_head * stride_buf_vh + offs_d[None, :]
        v = tl.load(V_Buffer + offs_buf_v, mask=mask_n[:, None] & mask_dv[None, :], other=0.0)
        if UPCAST:
            v = v.to(tl.float32)
        p = p.to(v.dtype)
        acc = acc * re_scale[:, None] + tl.dot(p, v, input_precision=PREC) * v_scale
    return acc, deno, e_max


@triton.jit
def _extend_stage(q, qpe, K_Extend, V_Extend, mask_ptr, cur_seq_mask_start_idx, cur_block_m, cur_seq_len,
                  cur_seq_len_prefix, cur_seq_extend_start_idx, cur_block_m_end, mask_m, cur_kv_head, stride_kbs,
                  stride_kh, stride_vbs, stride_vh, sm_scale, acc, deno, e_max, Lq: tl.constexpr,
                  V_DIM: tl.constexpr, PE_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  UPCAST: tl.constexpr, PREC: tl.constexpr):
    """Stage 2: the new rows from their own contiguous buffer (k_extend / v_extend) up to the row block's causal
    end, under the flat custom mask; all-masked tiles skipped. As SGLang's _fwd_kernel writes it."""
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, V_DIM)
    offs_dpe = V_DIM + tl.arange(0, PE_DIM)
    mask_d = offs_d < Lq
    mask_dv = offs_d < V_DIM
    for start_n in range(0, cur_block_m_end, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        mask_n = (start_n + offs_n) < cur_block_m_end
        final_mask = mask_m[:, None] & mask_n[None, :]
        custom_mask = tl.load(mask_ptr + cur_seq_mask_start_idx
                              + (cur_block_m * BLOCK_M + offs_m[:, None]) * cur_seq_len
                              + cur_seq_len_prefix + start_n + offs_n[None, :],
                              mask=(mask_m[:, None] & mask_n[None, :]), other=0)
        custom_mask &= mask_m[:, None] & mask_n[None, :]
        final_mask &= custom_mask
        if tl.max(tl.max(final_mask.to(tl.int32), axis=1), axis=0) != 0:
            offs_k = ((cur_seq_extend_start_idx + start_n + offs_n[None, :]) * stride_kbs + cur_kv_head * stride_kh
                      + offs_d[:, None])
            k = tl.load(K_Extend + offs_k, mask=(mask_n[None, :]) & (mask_d[:, None]), other=0.0)
            if UPCAST:
                k = k.to(tl.float32)
            qk = tl.dot(q, k, out_dtype=tl.float32, input_precision=PREC)
            offs_kpe = ((cur_seq_extend_start_idx + start_n + offs_n[None, :]) * stride_kbs
                        + cur_kv_head * stride_kh + offs_dpe[:, None])
            kpe = tl.load(K_Extend + offs_kpe, mask=mask_n[None, :], other=0.0)
            if UPCAST:
                kpe = kpe.to(tl.float32)
            qk += tl.dot(qpe, kpe, input_precision=PREC)
            qk *= sm_scale
            qk = tl.where(final_mask, qk, float("-inf"))
            p, re_scale, e_max, deno = _online_softmax(qk, e_max, deno)
            offs_v = ((cur_seq_extend_start_idx + start_n + offs_n[:, None]) * stride_vbs + cur_kv_head * stride_vh
                      + offs_d[None, :])
            v = tl.load(V_Extend + offs_v, mask=mask_n[:, None] & mask_dv[None, :], other=0.0)
            if UPCAST:
                v = v.to(tl.float32)
            p = p.to(v.dtype)
            acc = acc * re_scale[:, None] + tl.dot(p, v, input_precision=PREC)
    return acc, deno, e_max


@triton.jit
def _paged_verify_kernel(
    Q_Extend, K_Extend, V_Extend, O_Extend, K_Buffer, V_Buffer, qo_indptr, kv_indptr, kv_indices, mask_ptr,
    mask_indptr, sm_scale, k_scale, v_scale, kv_group_num, stride_qbs, stride_qh, stride_kbs, stride_kh, stride_vbs,
    stride_vh, stride_obs, stride_oh, stride_buf_kbs, stride_buf_kh, stride_buf_vbs, stride_buf_vh,
    V_DIM: tl.constexpr, PE_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr, PREC: tl.constexpr,
):
    """SGLang's extend kernel for one (request, head, block of BLOCK_M new rows), with its arguments: MLA (one KV
    head: kv_group_num = heads), custom mask, causal, skip_prefix_custom_mask; no sinks, window or logit cap."""
    cur_seq, cur_head, cur_block_m = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    cur_kv_head = cur_head // kv_group_num
    cur_seq_extend_start_idx = tl.load(qo_indptr + cur_seq)
    cur_seq_len_extend = tl.load(qo_indptr + cur_seq + 1) - cur_seq_extend_start_idx
    cur_seq_kv_start_idx = tl.load(kv_indptr + cur_seq)
    cur_seq_len_prefix = tl.load(kv_indptr + cur_seq + 1) - cur_seq_kv_start_idx
    cur_seq_len = cur_seq_len_prefix + cur_seq_len_extend
    cur_seq_mask_start_idx = tl.load(mask_indptr + cur_seq)
    Lq: tl.constexpr = V_DIM + PE_DIM
    offs_d = tl.arange(0, V_DIM)
    offs_m = tl.arange(0, BLOCK_M)
    mask_m = (cur_block_m * BLOCK_M + offs_m) < cur_seq_len_extend
    mask_d = offs_d < Lq
    mask_dv = offs_d < V_DIM
    offs_q = ((cur_seq_extend_start_idx + cur_block_m * BLOCK_M + offs_m[:, None]) * stride_qbs
              + cur_head * stride_qh + offs_d[None, :])
    q = tl.load(Q_Extend + offs_q, mask=(mask_m[:, None]) & (mask_d[None, :]), other=0.0)
    offs_dpe = V_DIM + tl.arange(0, PE_DIM)
    offs_qpe = ((cur_seq_extend_start_idx + cur_block_m * BLOCK_M + offs_m[:, None]) * stride_qbs
                + cur_head * stride_qh + offs_dpe[None, :])
    qpe = tl.load(Q_Extend + offs_qpe, mask=mask_m[:, None], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
        qpe = qpe.to(tl.float32)
    acc = tl.zeros([BLOCK_M, V_DIM], dtype=tl.float32)
    deno = tl.zeros([BLOCK_M], dtype=tl.float32)
    e_max = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    acc, deno, e_max = _prefix_stage(q, qpe, K_Buffer, V_Buffer, kv_indices, cur_seq_kv_start_idx, cur_seq_len_prefix,
                                     mask_m, cur_kv_head, stride_buf_kbs, stride_buf_kh, stride_buf_vbs, stride_buf_vh,
                                     sm_scale, k_scale, v_scale, acc, deno, e_max, Lq, V_DIM, PE_DIM, BLOCK_N, UPCAST,
                                     PREC)
    cur_block_m_end = tl.minimum(cur_seq_len_extend, (cur_block_m + 1) * BLOCK_M)  # is_causal
    acc, deno, e_max = _extend_stage(q, qpe, K_Extend, V_Extend, mask_ptr, cur_seq_mask_start_idx, cur_block_m,
                                     cur_seq_len, cur_seq_len_prefix, cur_seq_extend_start_idx, cur_block_m_end,
                                     mask_m, cur_kv_head, stride_kbs, stride_kh, stride_vbs, stride_vh, sm_scale, acc,
                                     deno, e_max, Lq, V_DIM, PE_DIM, BLOCK_M, BLOCK_N, UPCAST, PREC)
    offs_o = ((cur_seq_extend_start_idx + cur_block_m * BLOCK_M + offs_m[:, None]) * stride_obs + cur_head * stride_oh
              + offs_d[None, :])
    tl.store(O_Extend + offs_o, acc / deno[:, None], mask=mask_m[:, None] & mask_dv[None, :])


@triton.jit
def _paged_decode_split(
    Q, KV, Mid, MidLse, Slots, SeqLen, NumSplits, stride_qh, stride_kv, stride_mh, stride_ms, sm_scale, H,
    V_DIM: tl.constexpr, PE_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    MIN_BLOCK_KV: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr,
):
    """Stage 1 of the split-K decode: BLOCK_H heads over one KV split; V is the K tile (MLA)."""
    hblk, split = tl.program_id(1), tl.program_id(2)
    heads = hblk * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = heads < H
    seq = tl.load(SeqLen)
    per = tl.cdiv(tl.cdiv(seq, tl.load(NumSplits)), MIN_BLOCK_KV) * MIN_BLOCK_KV
    lo = per * split
    hi = tl.minimum(lo + per, seq)
    offs_d = tl.arange(0, V_DIM)
    offs_pe = V_DIM + tl.arange(0, PE_DIM)
    if hi > lo:
        q = tl.load(Q + heads[:, None] * stride_qh + offs_d[None, :], mask=h_ok[:, None], other=0.0)
        qpe = tl.load(Q + heads[:, None] * stride_qh + offs_pe[None, :], mask=h_ok[:, None], other=0.0)
        if UPCAST:
            q = q.to(tl.float32)
            qpe = qpe.to(tl.float32)
        e_max = tl.zeros([BLOCK_H], tl.float32) - float("inf")
        e_sum = tl.zeros([BLOCK_H], tl.float32)
        acc = tl.zeros([BLOCK_H, V_DIM], tl.float32)
        for start in range(lo, hi, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            n_ok = offs_n < hi
            loc = tl.load(Slots + offs_n, mask=n_ok, other=0).to(tl.int64)
            qk, k = _scores(q, qpe, KV, loc, n_ok, stride_kv, offs_d, offs_pe, sm_scale, UPCAST, PREC)
            qk = tl.where(h_ok[:, None] & n_ok[None, :], qk, float("-inf"))
            n_e_max = tl.maximum(tl.max(qk, 1), e_max)
            re_scale = tl.exp(e_max - n_e_max)
            p = tl.exp(qk - n_e_max[:, None])
            acc = acc * re_scale[:, None] + tl.dot(p.to(k.dtype), tl.trans(k), input_precision=PREC)
            e_sum = e_sum * re_scale + tl.sum(p, 1)
            e_max = n_e_max
        mid = Mid + heads[:, None] * stride_mh + split * stride_ms + offs_d[None, :]
        tl.store(mid, acc / e_sum[:, None], mask=h_ok[:, None])
        tl.store(MidLse + heads * (stride_mh // V_DIM) + split, e_max + tl.log(e_sum), mask=h_ok)


@triton.jit
def _paged_decode_merge(Mid, MidLse, Out, SeqLen, NumSplits, stride_mh, stride_ms, stride_oh,
                        MAX_SPLITS: tl.constexpr, V_DIM: tl.constexpr, MIN_BLOCK_KV: tl.constexpr):
    """Stage 2: merge one head's splits by their log-sum-exp."""
    head = tl.program_id(1)
    seq = tl.load(SeqLen)
    per = tl.cdiv(tl.cdiv(seq, tl.load(NumSplits)), MIN_BLOCK_KV) * MIN_BLOCK_KV
    offs_d = tl.arange(0, V_DIM)
    e_sum = 0.0
    e_max = -float("inf")
    acc = tl.zeros([V_DIM], tl.float32)
    for split in range(0, MAX_SPLITS):
        lo = per * split
        if tl.minimum(lo + per, seq) > lo:
            tv = tl.load(Mid + head * stride_mh + split * stride_ms + offs_d)
            lse = tl.load(MidLse + head * (stride_mh // V_DIM) + split)
            n_e_max = tl.maximum(lse, e_max)
            old = tl.exp(e_max - n_e_max)
            w = tl.exp(lse - n_e_max)
            acc = acc * old + w * tv
            e_sum = e_sum * old + w
            e_max = n_e_max
    tl.store(Out + head * stride_oh + offs_d, (acc / e_sum).to(Out.dtype.element_ty))


def arch(device: torch.device) -> tuple[tuple[int, int] | None, bool]:
    """(compute capability or None, ROCm) of the GPU a plan runs on (None: the CPU interpreter)."""
    if device.type != "cuda":
        return None, False
    return torch.cuda.get_device_capability(device), torch.version.hip is not None


def launch(tuning: PagedTuning, device: torch.device) -> dict:
    """The extend kernel's launch configuration: SGLang's for this GPU, with the tuning's non-zero fields."""
    bm, bn, nw = extend_blocks(*arch(device))
    return dict(block_m=tuning.block_m or bm, block_n=tuning.block_n or bn, num_warps=tuning.num_warps or nw,
                num_stages=tuning.num_stages)


def fill_flat_mask(p: VerifyPlan, out: torch.Tensor) -> None:
    """SGLang's flat custom mask of a one-request plan into ``out`` ([R * (bound + R)]): row i starts at
    i * (prefix + R) with the prefix columns 1, then row i of the tree mask (fixed-shape ops: capturable)."""
    r = p.num_rows
    if not p.dynamic:
        full = torch.cat([torch.ones(r, p.prefix_len, dtype=torch.bool, device=p.tree_mask.device), p.tree_mask], 1)
        out.copy_(full.reshape(-1))
        return
    total = p.prefix_t.to(torch.int64) + r
    flat = torch.arange(out.shape[0], device=p.tree_mask.device)
    row, col = flat // total, flat % total
    rel = col - p.prefix_t.to(torch.int64)
    tree = p.tree_mask[row.clamp(max=r - 1), rel.clamp(0, r - 1)]
    out.copy_(((rel < 0) | tree) & (row < r))


def extend_buffers(bound: int, r: int, dev: torch.device) -> dict:
    """SGLang's TARGET_VERIFY metadata for one request of R new rows over at most ``bound`` prefix tokens (filled by
    ``refresh_extend``): qo_indptr [0, R], kv_indptr [0, prefix], int64 kv_indices (the slots), the flat bool custom
    mask and mask_indptr, and ``ext_idx``, the new rows' slots (their K and V make k_extend / v_extend)."""
    i32, i64 = dict(dtype=torch.int32, device=dev), dict(dtype=torch.int64, device=dev)
    return {"qo_indptr": torch.tensor([0, r], **i32), "kv_indptr": torch.zeros(2, **i32),
            "kv_indices": torch.empty(bound + r, **i64), "mask_indptr": torch.zeros(2, **i64),
            "custom_mask": torch.empty(r * (bound + r), dtype=torch.bool, device=dev),
            "ext_idx": torch.empty(r, **i64), "rows": torch.arange(r, **i64)}


def refresh_extend(p: VerifyPlan) -> None:
    """Fill ``extend_buffers`` from prefix_t, slots and tree_mask with fixed-shape device ops (capturable)."""
    e, r = p.extra, p.num_rows
    e["kv_indices"].copy_(p.slots[: p.num_cols])
    e["kv_indptr"][1:].copy_(p.prefix_t)
    e["mask_indptr"][1:].copy_((p.prefix_t.to(torch.int64) + r) * r)
    e["ext_idx"].copy_(p.slots.index_select(0, p.prefix_t.to(torch.int64) + e["rows"]))
    fill_flat_mask(p, e["custom_mask"])


def extend_rows(kv: torch.Tensor, p: VerifyPlan) -> torch.Tensor:
    """The step's new rows [R, D] gathered from the pool: SGLang's k_extend (v_extend: their first v_dim values).
    SGLang's backend hands over the step's fresh projections; here they are read back from their slots."""
    return kv.index_select(0, p.extra["ext_idx"])


def plan(prefix_len, tree_mask: torch.Tensor, slots: torch.Tensor | None = None, v_dim: int = 512, *,
         tuning: PagedTuning | None = None, heads: int | None = None, max_prefix: int | None = None) -> VerifyPlan:
    """SGLang's metadata, built once per step: the slot row, flat custom mask and indptrs (R > 1), or the split-K
    decode's length and split count (R = 1: ``heads`` sizes the split count as SGLang does; None counts 16).
    prefix_len: int (host plan) or a [1] int32 device tensor with ``max_prefix`` (device plan: buffers sized for
    max_prefix, refreshed in place by ``refresh``)."""
    tuning = DEFAULT_TUNING if tuning is None else tuning
    if not isinstance(tuning, PagedTuning):
        raise ValueError(f"the paged path takes a PagedTuning, got {type(tuning).__name__}")
    dev = tree_mask.device
    bound, prefix_t, dynamic = pool_plan_args(name, prefix_len, max_prefix, tree_mask, slots)
    r = int(tree_mask.shape[0])
    check_rows(r, name)
    i32 = dict(dtype=torch.int32, device=dev)
    if r == 1:
        sm = sm_count(dev)
        extra = {"decode": True, "seq_len": torch.empty(1, **i32), "num_splits": torch.empty(1, **i32),
                 "heads": heads or DECODE_BLOCK_H, "sm": sm, "max_splits": max_kv_splits(sm, arch(dev)[1])}
    else:
        extra = {"decode": False, **extend_buffers(bound, r, dev), "launch": launch(tuning, dev)}
    p = VerifyPlan(prefix_len=bound, tree_mask=tree_mask, slots=slots, v_dim=v_dim, prefix_t=prefix_t,
                   dynamic=dynamic, tuning=tuning, extra=extra)
    refresh(p)
    return p


def refresh(p: VerifyPlan) -> None:
    """Rebuild the derived buffers from slots, tree_mask and prefix_t with fixed-shape device ops (capturable)."""
    e = p.extra
    if e["decode"]:
        e["seq_len"].copy_(p.prefix_t + 1)
        e["num_splits"].copy_(decode_splits(e["seq_len"], e["heads"], e["sm"], e["max_splits"]))
        return
    refresh_extend(p)


def _run_decode(q, kv, p, sm_scale, out, upcast, prec, meta):
    e, h = p.extra, q.shape[1]
    mid = torch.empty(h, e["max_splits"], p.v_dim, dtype=torch.float32, device=q.device)
    lse = torch.empty(h, e["max_splits"], dtype=torch.float32, device=q.device)
    grid = (1, triton.cdiv(h, min(DECODE_BLOCK_H, h)), e["max_splits"])
    k1 = _paged_decode_split[grid](
        q, kv, mid, lse, p.slots, e["seq_len"], e["num_splits"], q.stride(1), kv.stride(0), mid.stride(0),
        mid.stride(1), sm_scale, h, V_DIM=p.v_dim, PE_DIM=q.shape[2] - p.v_dim, BLOCK_H=DECODE_BLOCK_H,
        BLOCK_N=DECODE_BLOCK_N, MIN_BLOCK_KV=MIN_BLOCK_KV, UPCAST=upcast, PREC=prec, num_warps=4, num_stages=2)
    k2 = _paged_decode_merge[(1, h)](
        mid, lse, out, e["seq_len"], e["num_splits"], mid.stride(0), mid.stride(1), out.stride(1),
        MAX_SPLITS=e["max_splits"], V_DIM=p.v_dim, MIN_BLOCK_KV=MIN_BLOCK_KV, num_warps=4, num_stages=2)
    if meta is not None:
        meta["paged_decode"], meta["paged_merge"] = kernel_meta(k1), kernel_meta(k2)
    return out


def verify_launch(q, kv, p: VerifyPlan, sm_scale: float, out, upcast: bool, prec: str) -> tuple[tuple, tuple, dict]:
    """(grid, arguments, keywords) of the tree-verify launch, as SGLang's extend_attention_fwd launches _fwd_kernel
    (also what ``kernels._target_compile`` compiles for a GPU target without one)."""
    e, c = p.extra, p.extra["launch"]
    new = extend_rows(kv, p)
    grid = (1, q.shape[1], triton.cdiv(q.shape[0], c["block_m"]))
    width, v = kv.shape[1], p.v_dim  # MLA: one KV head, K the whole row, V its first v_dim values
    args = (q, new, new, out, kv, kv, e["qo_indptr"], e["kv_indptr"], e["kv_indices"], e["custom_mask"],
            e["mask_indptr"], sm_scale, 1.0, 1.0, q.shape[1], q.stride(0), q.stride(1), new.stride(0), width,
            new.stride(0), v, out.stride(0), out.stride(1), kv.stride(0), width, kv.stride(0), v)
    kw = dict(V_DIM=p.v_dim, PE_DIM=q.shape[2] - p.v_dim, BLOCK_M=c["block_m"], BLOCK_N=c["block_n"],
              UPCAST=upcast, PREC=prec, num_warps=c["num_warps"], num_stages=c["num_stages"])
    return grid, args, kw


def run(q: torch.Tensor, kv: torch.Tensor, p: VerifyPlan, sm_scale: float, *, meta: dict | None = None) -> torch.Tensor:
    """q [R, H, D], kv [pool, D] -> out [R, H, v_dim] in q's dtype (R = 1: the split-K decode). ``meta``: a dict
    to receive the compiled kernels' reports (registers, spills, shared memory, wgmma count)."""
    check_run_args(q, kv, p)
    check_dims(q, kv, p.v_dim, name)
    if p.slots is None or "decode" not in p.extra:
        raise ValueError("plan was not built by paged.plan (needs slots)")
    r, h, d = q.shape
    out = torch.empty(r, h, p.v_dim, dtype=q.dtype, device=q.device)
    upcast, prec = dot_flags(q.dtype)
    if p.extra["decode"]:
        return _run_decode(q, kv, p, sm_scale, out, upcast, prec, meta)
    grid, args, kw = verify_launch(q, kv, p, sm_scale, out, upcast, prec)
    k = _paged_verify_kernel[grid](*args, **kw)
    if meta is not None:
        meta["paged"] = kernel_meta(k)
    return out
