"""Fused Triton MoE for few rows (decode / verify, R <= 64): routing epilogue and routed experts, no sort.

Three kernels per MoE layer, all static shapes, no host sync (capturable in a CUDA graph):
- ``_moe_route``: router logits [R, n] -> sigmoid, top-k of the n local experts (the lowest index first
  among equal scores), normalized to sum to one and scaled: ids [R, k] int64, weights [R, k] fp32;
- ``_moe_gemm_gate_up``, grid (n experts, inter / BN): each program reads the [R, k] ids, and where no
  row routes to its expert reads and writes nothing more (untouched experts cost no bytes); else it streams its gate and
  up tiles [BN, dim] once and writes h = silu(gate) * up for all rows (padded to RP >= 16 for tl.dot)
  into h [n, RP, inter] fp32;
- ``_moe_gemm_down``, grid (n experts, dim / BN): the down projection of its expert's h, each routed
  row's result scaled by its routing weight and written to that row's k slot of y [R, k, dim] fp32
  (the slot whose id is this expert: every slot written exactly once, no atomics).
The sum over k is the caller's (one torch reduction in a fixed order: the same result every run). Rows not routed to
an expert are computed (compute is free here: the weights' bytes bound) and dropped.
Both entry points are ``torch.library`` custom ops, so torch.compile treats them as opaque calls.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import MOE_MAX_ROWS, dot_flags, next_pow2

# (BN, BK, num_warps, num_stages) per GEMM for 2-byte weights, the fastest of benchmarks/bench_moe.py --sweep on the
# H200 (2026-12-03); fp32 weights take half the BK and 2 stages (shared memory)
GATE_UP_CFG = (64, 128, 4, 3)
DOWN_CFG = (64, 128, 4, 3)


def _fit(cfg: tuple, dtype: torch.dtype) -> tuple:
    bn, bk, nw, ns = cfg
    return (bn, max(16, bk // 2), nw, min(ns, 2)) if dtype == torch.float32 else cfg


@triton.jit
def _moe_route(logits_ptr, ids_ptr, w_ptr, R, N, stride_r, scale,
               TOPK: tl.constexpr, RP: tl.constexpr, NP: tl.constexpr, KP: tl.constexpr):
    rows = tl.arange(0, RP)
    cols = tl.arange(0, NP)
    ks = tl.arange(0, KP)
    m = (rows[:, None] < R) & (cols[None, :] < N)
    s = tl.load(logits_ptr + rows[:, None] * stride_r + cols[None, :], mask=m, other=0.0).to(tl.float32)
    s = tl.where(m, tl.sigmoid(s), -1.0)  # sigmoid is in (0, 1): padding never wins
    nan_row = tl.sum((s != s).to(tl.int32), axis=1) > 0  # a NaN score: the row's weights NaN (as the torch path's)
    ids = tl.zeros((RP, KP), tl.int32)
    w = tl.zeros((RP, KP), tl.float32)
    for j in tl.static_range(TOPK):
        best = tl.max(s, axis=1)
        idx = tl.min(tl.where(s == best[:, None], cols[None, :], NP), axis=1)
        ids = tl.where(ks[None, :] == j, idx[:, None], ids)
        w = tl.where(ks[None, :] == j, best[:, None], w)
        s = tl.where(cols[None, :] == idx[:, None], -2.0, s)
    w = w / tl.sum(w, axis=1)[:, None] * scale
    w = tl.where(nan_row[:, None], float("nan"), w)
    ids = tl.where(nan_row[:, None], ks[None, :], ids)  # distinct experts 0..k-1 (NaN compares with nothing)
    out = rows[:, None] * TOPK + ks[None, :]
    keep = (rows[:, None] < R) & (ks[None, :] < TOPK)
    tl.store(ids_ptr + out, ids.to(tl.int64), mask=keep)
    tl.store(w_ptr + out, w, mask=keep)


@triton.jit
def _routed_to(ids_ptr, e, R, TOPK: tl.constexpr, RP: tl.constexpr, KP: tl.constexpr):
    """[RP, KP]: whether row r's k slot j routes to expert e (rows past R and slots past TOPK never)."""
    rows = tl.arange(0, RP)
    ks = tl.arange(0, KP)
    idv = tl.load(ids_ptr + rows[:, None] * TOPK + ks[None, :],
                  mask=(rows[:, None] < R) & (ks[None, :] < TOPK), other=-1)
    return idv == e


@triton.jit
def _moe_gemm_gate_up(x_ptr, ids_ptr, w13_ptr, h_ptr, R, DIM, INTER,
                      TOPK: tl.constexpr, RP: tl.constexpr, KP: tl.constexpr,
                      BN: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr):
    e = tl.program_id(0)
    nb = tl.program_id(1)
    rows = tl.arange(0, RP)
    touched = tl.sum(_routed_to(ids_ptr, e, R, TOPK, RP, KP).to(tl.int32)) > 0
    # untouched: a loop of no trips and no store (a bound, not a branch, keeps the loop software-pipelined)
    k_end = DIM * touched.to(tl.int32)
    cols = nb * BN + tl.arange(0, BN)
    cmask = cols < INTER * touched.to(tl.int32)
    wbase = w13_ptr + e.to(tl.int64) * (2 * INTER * DIM)
    acc_g = tl.zeros((BN, RP), tl.float32)
    acc_u = tl.zeros((BN, RP), tl.float32)
    for k0 in range(0, k_end, BK):
        kk = k0 + tl.arange(0, BK)
        kmask = kk < DIM
        xt = tl.load(x_ptr + rows[None, :] * DIM + kk[:, None], mask=(rows[None, :] < R) & kmask[:, None],
                     other=0.0)  # [BK, RP]
        wmask = cmask[:, None] & kmask[None, :]
        wg = tl.load(wbase + cols[:, None] * DIM + kk[None, :], mask=wmask, other=0.0)  # [BN, BK]
        wu = tl.load(wbase + (INTER + cols)[:, None] * DIM + kk[None, :], mask=wmask, other=0.0)
        if UPCAST:  # the interpreter's bf16 tl.dot is wrong: fp32 operands there
            wg, wu, xt = wg.to(tl.float32), wu.to(tl.float32), xt.to(tl.float32)
        else:
            xt = xt.to(wg.dtype)
        acc_g = tl.dot(wg, xt, acc_g, input_precision=PREC)
        acc_u = tl.dot(wu, xt, acc_u, input_precision=PREC)
    h = acc_g * tl.sigmoid(acc_g) * acc_u  # [BN, RP]
    tl.store(h_ptr + e.to(tl.int64) * (RP * INTER) + rows[None, :] * INTER + cols[:, None], h,
             mask=cmask[:, None])


@triton.jit
def _moe_gemm_down(h_ptr, ids_ptr, rw_ptr, w2_ptr, y_ptr, R, DIM, INTER,
                   TOPK: tl.constexpr, RP: tl.constexpr, KP: tl.constexpr,
                   BN: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr):
    e = tl.program_id(0)
    nb = tl.program_id(1)
    rows = tl.arange(0, RP)
    ks = tl.arange(0, KP)
    match = _routed_to(ids_ptr, e, R, TOPK, RP, KP)  # one slot per row when the row's ids are distinct (top-k's are)
    hit = tl.sum(match.to(tl.int32), axis=1)
    touched = tl.sum(hit) > 0
    k_end = INTER * touched.to(tl.int32)  # untouched: no trips, no store
    slot = tl.min(tl.where(match, ks[None, :], TOPK - 1), axis=1)  # the first match: in bounds whatever the ids
    rw = tl.sum(tl.where(match, tl.load(rw_ptr + rows[:, None] * TOPK + ks[None, :], mask=match, other=0.0), 0.0),
                axis=1)
    cols = nb * BN + tl.arange(0, BN)
    cmask = cols < DIM
    wbase = w2_ptr + e.to(tl.int64) * (DIM * INTER)
    hbase = h_ptr + e.to(tl.int64) * (RP * INTER)
    acc = tl.zeros((BN, RP), tl.float32)
    for k0 in range(0, k_end, BK):
        kk = k0 + tl.arange(0, BK)
        kmask = kk < INTER
        w = tl.load(wbase + cols[:, None] * INTER + kk[None, :], mask=cmask[:, None] & kmask[None, :], other=0.0)
        ht = tl.load(hbase + rows[None, :] * INTER + kk[:, None], mask=kmask[:, None], other=0.0)  # [BK, RP]
        if UPCAST:
            w = w.to(tl.float32)
        acc = tl.dot(w, ht.to(w.dtype), acc, input_precision=PREC)
    y = acc * rw[None, :]
    tl.store(y_ptr + (rows[None, :] * TOPK + slot[None, :]) * DIM + cols[:, None], y,
             mask=(hit[None, :] > 0) & cmask[:, None])


@torch.library.custom_op("ddprobe::moe_route", mutates_args=())
def moe_route(logits: torch.Tensor, k: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [R, n] (any row stride: a slice of a joined GEMM's output) -> (ids [R, k] int64, weights [R, k] fp32):
    sigmoid, top-k, normalized, scaled; a row with a NaN logit gets NaN weights (its output NaN, as on the torch
    path) and ids that are still experts."""
    r, n = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    ids = torch.empty(r, k, dtype=torch.int64, device=logits.device)
    w = torch.empty(r, k, dtype=torch.float32, device=logits.device)
    _moe_route[(1,)](logits, ids, w, r, n, logits.stride(0), float(scale), TOPK=k, RP=next_pow2(r), NP=next_pow2(n),
                     KP=next_pow2(k), num_warps=4)
    return ids, w


@moe_route.register_fake
def _(logits, k, scale):
    r = logits.shape[0]
    return (logits.new_empty(r, k, dtype=torch.int64), logits.new_empty(r, k, dtype=torch.float32))


@torch.library.custom_op("ddprobe::moe_experts", mutates_args=())
def moe_experts(x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, w13: torch.Tensor,
                w2: torch.Tensor) -> torch.Tensor:
    """Routed experts' SwiGLU, per (row, k slot): x [R, dim], ids / w [R, k], w13 [n, 2 inter, dim],
    w2 [n, dim, inter] -> y [R, k, dim] fp32, y[r, j] = w[r, j] expert_{ids[r, j]}(x[r]); the caller sums over k
    (under torch.compile, fused with what follows). A row's ids must be distinct experts (moe_route's are): a
    repeated id writes only its first slot."""
    return launch(x, ids, w, w13, w2)


def launch(x, ids, w, w13, w2, gate_up_cfg: tuple = GATE_UP_CFG, down_cfg: tuple = DOWN_CFG) -> torch.Tensor:
    """``moe_experts`` with explicit (BN, BK, num_warps, num_stages) per GEMM (the benchmark's sweep): [R, k, dim] fp32."""
    if x.shape[0] > MOE_MAX_ROWS:
        raise ValueError(f"the fused MoE takes at most {MOE_MAX_ROWS} rows, got {x.shape[0]}")
    x, ids, w, w13, w2 = (t.contiguous() for t in (x, ids, w, w13, w2))
    h = gate_up(x, ids, w13, gate_up_cfg)
    return down(h, ids, w, w2, down_cfg)


def gate_up(x, ids, w13, cfg: tuple = GATE_UP_CFG) -> torch.Tensor:
    """silu(gate) * up of every row for each expert some row routes to: h [n, RP, inter] fp32 (others unwritten)."""
    (r, dim), k, (n, two_inter, _) = x.shape, ids.shape[1], w13.shape
    inter, rp = two_inter // 2, max(16, next_pow2(r))
    upcast, prec = dot_flags(w13.dtype)
    h = torch.empty(n, rp, inter, dtype=torch.float32, device=x.device)
    bn, bk, nw, ns = _fit(cfg, w13.dtype)
    _moe_gemm_gate_up[(n, triton.cdiv(inter, bn))](x, ids, w13, h, r, dim, inter, TOPK=k, RP=rp, KP=next_pow2(k),
                                                    BN=bn, BK=bk, PREC=prec, UPCAST=upcast, num_warps=nw,
                                                    num_stages=ns)
    return h


def down(h, ids, w, w2, cfg: tuple = DOWN_CFG) -> torch.Tensor:
    """h [n, RP, inter] -> y [R, k, dim] fp32: slot (r, j) holds w[r, j] * down_{ids[r, j]}(h[ids[r, j], r])."""
    (r, k), (n, dim, inter), rp = ids.shape, w2.shape, h.shape[1]
    upcast, prec = dot_flags(w2.dtype)
    y = torch.empty(r, k, dim, dtype=torch.float32, device=h.device)
    bn, bk, nw, ns = _fit(cfg, w2.dtype)
    _moe_gemm_down[(n, triton.cdiv(dim, bn))](h, ids, w, w2, y, r, dim, inter, TOPK=k, RP=rp, KP=next_pow2(k),
                                              BN=bn, BK=bk, PREC=prec, UPCAST=upcast, num_warps=nw, num_stages=ns)
    return y


@moe_experts.register_fake
def _(x, ids, w, w13, w2):
    return x.new_empty(x.shape[0], ids.shape[1], x.shape[1], dtype=torch.float32)
