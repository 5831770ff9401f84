"""`split`: the fix. Split-K over the contiguous prefix + masked tree pass + one merge.

Two launches per layer, metadata built once per step in ``plan``:
  1. ``_split_prefix_kernel``, grid (q blocks, splits + 1): heads x rows are folded into one
     dimension of Hq = H * R query rows (row hq = r * H + h), so each [BLOCK_N, 576] latent
     tile is read from memory once for every head and row; the prefix is cut into chunks
     so that every SM streams its own part of the context. Each program writes a
     normalized partial output [Hq, v_dim] (fp32) and its log2-sum-exp.
     KV tiles come through two host tensor descriptors (latent [BLOCK_N, 512], rope [BLOCK_N, 64])
     on Hopper (bulk copies completing on mbarriers; rows past the prefix read as zeros), or
     through masked pointer loads elsewhere (tuning tma=0). The prefix length is read from device
     memory (plan.prefix_t) and each program derives its chunk from it, so one launch serves any
     length up to the plan's bound (a CUDA graph replays it as the context grows); full tiles come
     through the descriptors (which span all kv rows), the last partial tile of the prefix
     through masked pointer loads, so no row past the prefix is ever read. Where the rows take three or more
     64-row programs per split (64 heads), each iteration of the descriptor loop also asks L2 for the tile two
     ahead (``SplitTuning.prefetch``, a PTX prefetch): Triton issues the loop's bulk copies at the end of its body,
     so a copy hides only behind the previous P V; from L2 it lands sooner.
     Tiling: a main block of BLOCK_Q rows (64 -> one Hopper warpgroup MMA) plus, for 65-80 rows
     (72: 8 heads x 9), a separate 16-row program (TAIL_PROGRAM), so they cost 80 rows of tensor
     work rather than 128; the latent tile is loaded once and used both as K (with the rope tile)
     and as V. (The row tilings measured slower, 64 + 16 rows in one program and one 128-row
     block, are on the lab branch.)
     The last split index is the tree part: one short program per q block attends its rows
     over the R new rows under the per-row ancestor bitmask (R <= 64 columns: one tile) and
     writes it as one more partial, beside the prefix splits.
     The tiles and stages are sized on the host to fit the GPU's shared memory (prefix_smem: the
     64-token, 2-stage tiles fit 16-bit rows at 576 wide; fp32 rows there step down to fewer stages,
     then 32-token tiles, then 32-row blocks).
  2. The log-sum-exp merge of the prefix partials and the tree part (merge.py's ``launch_merge``; the
     choice is ``merge_config``'s, shared with `split_ws`): ``_merge_flat_kernel`` by default (every lse
     first, then the partials with no rescale chain), or the online ``_merge_kernel`` (``merge_kind=0``);
     writes the output in q's dtype.
Per GPU (``ARCHS``, the one place): sm_90 runs the tuning above; sm_80, sm_86/89 and sm_120 (no wgmma, no bulk
tensor copies) run pointer-load tilings compiled for them and checked to fit their shared memory
(tests/test_split_targets.py). Where that tiling does not fit the rows, or a kernel does not build on the GPU at its
first launch, ``run`` falls back to the fp32 reference over the same plan with one RuntimeWarning line (``_fallback``).
"""
from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from ... import verify_paths
from ._common import check_dims, check_rows, dot_flags, interpreting, kernel_meta, next_pow2, sm_count
from .merge import launch_merge, merge_config, partials
from .plan import VerifyPlan, check_diagonal, check_plan_args, check_run_args, split_prefix_arg

name = "split"
layout = verify_paths.BY_NAME[name].layout
device_plans = verify_paths.BY_NAME[name].device_plans

LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class SplitTuning:
    """Tuning knobs, fixed per plan (see choose_config)."""

    block_n: int = 64         # KV tokens per tile
    num_warps: int = 8
    num_stages: int = 2
    min_chunk: int = 64       # fewest prefix tokens per split
    block_q: int = 0          # force the main row block (0: auto: 64-row blocks, 64 < Hq <= 80 a 64-row and a 16-row program)
    prefetch: int = -1        # each iteration of the descriptor loop asks L2 for the tile this many tiles ahead (PTX
                              # prefetch; compiled kernels only); -1 auto: 2 where the rows take 3+ 64-row programs per
                              # split (64 heads: 4-7% faster on the H200, 2026-12-04), else 0 (8 heads: 0-4% slower with it)
    tma: int = 1              # 1: KV tiles through host tensor descriptors (Hopper bulk copies; 6% faster on the H200), 0: pointer loads
    merge_kind: int = -1      # the merge (merge_config; as WsTuning.merge_kind): -1 auto by folded rows, 0-3
    merge_block_m: int = 8    # folded rows per merge program (0: the kind's preset, merge.MERGE_PRESETS; 8: 1-4% faster
                              # than kind 3's 16 at 8 heads on the H200, 2026-12-03; kind 1, above 128 rows, has 8)
    merge_split_chunk: int = 0  # partials per step of the merge's loop (0: preset)
    merge_stages: int = 0     # software-pipeline depth of that loop (0: preset)
    merge_warps: int = 4
    merge_bv: int = 0         # value columns per merge program (0: halve v_dim until the grid fills the SMs)
    ksplit: int = 1           # pointer-load tiles (tma=0): the latent cut into 1, 2 or 4 column chunks, each its own
                              # S product and P V accumulator: independent MMA chains instead of one 36-step chain
    programs_per_sm: int = 1  # prefix programs per SM the split count is sized for (what the GPU's SM holds)
    kbatch: int = 0           # pointer-load tiles (tma=0): the latent as kbatch column chunks on the batch axis of 3-D
                              # dots (Triton gives each warp its own chunks: a warp reads only its Q chunk and its latent
                              # chunk, once as K and once as V, where the 2-D tiling's warps each re-read all of Q; S
                              # summed over the warps); 0 off (ksplit then applies), 2, 4 or 8 (at least 16 columns a
                              # chunk; keep num_warps <= kbatch); docs/kernels.md; the sm_120 proxy 35% slower
                              # with it (H100 and H200, 2026-12-07): off by default


DEFAULT_TUNING = SplitTuning()
SMEM_SM90 = 232448  # shared memory a block may opt into on sm_90 (H100/H200): the plan's limit off CUDA


@dataclass(frozen=True)
class Arch:
    """How `split` is configured on one GPU family: the tuning ``plan`` starts from there and what it fits in."""

    name: str
    smem: int                 # shared memory a block may opt into (bytes)
    tuning: SplitTuning
    shared: int = 0           # the prefix kernel's shared memory with that tuning for 16-bit rows 576 wide (Triton 3.9,
                              # tests/test_split_targets.py compiles it); 0: the sm_90 estimate (prefix_smem) fits the tiles
    max_rows: int = 64        # the most new rows R that fit (the tree part holds a [next_pow2(R), width] tile)
    sms: int = 132            # SMs of the GPU this entry stands for (a plan built off that GPU sizes its grids by it)


# The one place where `split` is configured per GPU (compute capability -> Arch). sm_90 keeps the tuned defaults
# (tensor descriptors, 64-token 2-stage tiles, fitted by prefix_smem). Without wgmma (sm_80, sm_86/89, sm_120) Triton
# emits mma.sync and cp.async pipelines whose shared memory prefix_smem does not model, so those tunings are the ones
# compiled for the target and checked to fit (tests/test_split_targets.py; docs/kernels.md has the figures): pointer
# loads (no bulk tensor copies), 2 stages (1 stage takes more shared memory there, not less). A GPU not listed keeps
# DEFAULT_TUNING fitted to its own limit by the sm_90 estimate.
SMEM_99K, SMEM_163K = 101376, 166912
# the 99 KB GPUs: 16-row blocks (all 4 warps along the tile: the latent tile read once from shared memory per
# product), 32-token tiles in 3 stages (two tiles resident: Triton keeps num_stages - 1 pointer-load buffers), the
# latent in 4 chunks; 1.58x the 32 x 32 x 2-stage, 8-warp tiling on an H100 as the proxy (2026-12-07, docs/perf.md)
_SMALL = dataclasses.replace(DEFAULT_TUNING, tma=0, block_q=16, block_n=32, num_stages=3, num_warps=4, ksplit=4)
ARCHS = {
    (9, 0): Arch("sm_90", SMEM_SM90, DEFAULT_TUNING),  # H100 / H200
    (8, 0): Arch("sm_80", SMEM_163K, dataclasses.replace(DEFAULT_TUNING, tma=0), shared=155648, max_rows=32, sms=108),
    (8, 6): Arch("sm_86", SMEM_99K, _SMALL, shared=93184, max_rows=16, sms=84),  # A40
    (8, 9): Arch("sm_89", SMEM_99K, _SMALL, shared=93184, max_rows=16, sms=128),  # RTX 4090
    (12, 0): Arch("sm_120", SMEM_99K, _SMALL, shared=93184, max_rows=16, sms=188),  # RTX PRO 6000 Blackwell
}


def default_tuning() -> SplitTuning:
    """The tuning ``plan`` starts from on this machine's GPU (ARCHS; sm_90's without one): what a tuning override
    (``bench verify --variant split:...``) is applied to."""
    cap = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
    return arch_for(cap).tuning


def arch_for(cap: tuple[int, int] | None) -> Arch:
    """The Arch of a GPU of compute capability ``cap`` (None: the interpreter, planned as sm_90)."""
    if cap is None:
        return ARCHS[(9, 0)]
    return ARCHS.get(tuple(cap)) or Arch(f"sm_{cap[0]}{cap[1]}", SMEM_SM90, DEFAULT_TUNING)


@triton.jit
def _attend_block(q_lat, q_pe, k_lat, k_pe, n_ok, m_i, l_i, acc, qk_scale, PREC: tl.constexpr):
    s = tl.dot(q_lat, tl.trans(k_lat), input_precision=PREC)
    s = tl.dot(q_pe, tl.trans(k_pe), s, input_precision=PREC)
    s = tl.where(n_ok[None, :], s * qk_scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(k_lat.dtype), k_lat, acc, input_precision=PREC)
    return m_new, l_i, acc


@triton.jit
def _load_q(Q, offs_q, Hq, H, stride_qr, stride_qh, offs_v, offs_pe, UPCAST: tl.constexpr):
    ok = offs_q < Hq
    base = Q + (offs_q // H) * stride_qr + (offs_q % H) * stride_qh
    q_lat = tl.load(base[:, None] + offs_v[None, :], mask=ok[:, None], other=0.0)
    q_pe = tl.load(base[:, None] + offs_pe[None, :], mask=ok[:, None], other=0.0)
    if UPCAST:
        q_lat = q_lat.to(tl.float32)
        q_pe = q_pe.to(tl.float32)
    return q_lat, q_pe


@triton.jit
def _store_partial(O_part, LSE_part, pid_s, offs_q, Hq, stride_ps, stride_pq, offs_v, m_i, l_i, acc):
    ok = offs_q < Hq
    o = acc / l_i[:, None]
    tl.store(O_part + pid_s * stride_ps + offs_q[:, None] * stride_pq + offs_v[None, :], o, mask=ok[:, None])
    tl.store(LSE_part + pid_s * Hq + offs_q, m_i + tl.log2(l_i), mask=ok)


@triton.jit
def _load_tile(KV, n0, end, stride_kv, offs_v, offs_pe, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr):
    """Rows n0 .. n0 + BLOCK_N through masked pointer loads (rows >= end read as zeros)."""
    offs_n = n0 + tl.arange(0, BLOCK_N)
    n_ok = offs_n < end
    k_ptr = KV + offs_n.to(tl.int64)[:, None] * stride_kv
    k_lat = tl.load(k_ptr + offs_v[None, :], mask=n_ok[:, None], other=0.0)
    k_pe = tl.load(k_ptr + offs_pe[None, :], mask=n_ok[:, None], other=0.0)
    if UPCAST:
        k_lat = k_lat.to(tl.float32)
        k_pe = k_pe.to(tl.float32)
    return k_lat, k_pe, n_ok


@triton.jit
def _prefetch_l2(KV, n0, end, stride_kv, BLOCK_N: tl.constexpr, WIDTH: tl.constexpr):
    """Ask L2 for rows n0 .. n0 + BLOCK_N (clamped below ``end``): a PTX prefetch per 128-byte line, up to 16 lines
    (2 KB) of each row."""
    LINE: tl.constexpr = 1024 // KV.dtype.element_ty.primitive_bitwidth  # elements per 128-byte line
    rows = tl.minimum(n0 + tl.arange(0, BLOCK_N), end - 1)
    cols = tl.minimum(tl.arange(0, 16) * LINE, WIDTH - 1)
    ptrs = KV + rows.to(tl.int64)[:, None] * stride_kv + cols[None, :]
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n mov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def _ks_load(KV, n0, end, stride_kv, V_DIM: tl.constexpr, PE_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
             KSPLIT: tl.constexpr, UPCAST: tl.constexpr):
    """Rows n0 .. n0 + BLOCK_N as KSPLIT latent chunks [BLOCK_N, V_DIM / KSPLIT] and the rope part (masked pointer
    loads; rows >= end read as zeros); unused chunks are the rope tile (never read)."""
    VC: tl.constexpr = V_DIM // KSPLIT
    offs_n = n0 + tl.arange(0, BLOCK_N)
    n_ok = offs_n < end
    k_ptr = KV + offs_n.to(tl.int64)[:, None] * stride_kv
    offs_c = tl.arange(0, VC)
    k0 = tl.load(k_ptr + offs_c[None, :], mask=n_ok[:, None], other=0.0)
    k1 = k0
    k2 = k0
    k3 = k0
    if KSPLIT >= 2:
        k1 = tl.load(k_ptr + (VC + offs_c)[None, :], mask=n_ok[:, None], other=0.0)
    if KSPLIT == 4:
        k2 = tl.load(k_ptr + (2 * VC + offs_c)[None, :], mask=n_ok[:, None], other=0.0)
        k3 = tl.load(k_ptr + (3 * VC + offs_c)[None, :], mask=n_ok[:, None], other=0.0)
    k_pe = tl.load(k_ptr + (V_DIM + tl.arange(0, PE_DIM))[None, :], mask=n_ok[:, None], other=0.0)
    if UPCAST:
        k0 = k0.to(tl.float32)
        k1 = k1.to(tl.float32)
        k2 = k2.to(tl.float32)
        k3 = k3.to(tl.float32)
        k_pe = k_pe.to(tl.float32)
    return k0, k1, k2, k3, k_pe, n_ok


@triton.jit
def _ks_attend(q0, q1, q2, q3, q_pe, k0, k1, k2, k3, k_pe, n_ok, m_i, l_i, a0, a1, a2, a3, qk_scale,
               KSPLIT: tl.constexpr, PREC: tl.constexpr):
    """_attend_block with the latent in KSPLIT chunks: the S products of the chunks and of the rope part are
    independent MMA chains (summed after), and each chunk keeps its own P V accumulator."""
    s = tl.dot(q_pe, tl.trans(k_pe), input_precision=PREC)
    s0 = tl.dot(q0, tl.trans(k0), input_precision=PREC)
    if KSPLIT >= 2:
        s1 = tl.dot(q1, tl.trans(k1), input_precision=PREC)
        s0 = s0 + s1
    if KSPLIT == 4:
        s2 = tl.dot(q2, tl.trans(k2), input_precision=PREC)
        s3 = tl.dot(q3, tl.trans(k3), input_precision=PREC)
        s0 = s0 + (s2 + s3)
    s = tl.where(n_ok[None, :], (s + s0) * qk_scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    pk = p.to(k0.dtype)
    a0 = tl.dot(pk, k0, a0 * alpha[:, None], input_precision=PREC)
    if KSPLIT >= 2:
        a1 = tl.dot(pk, k1, a1 * alpha[:, None], input_precision=PREC)
    if KSPLIT == 4:
        a2 = tl.dot(pk, k2, a2 * alpha[:, None], input_precision=PREC)
        a3 = tl.dot(pk, k3, a3 * alpha[:, None], input_precision=PREC)
    return m_new, l_i, a0, a1, a2, a3


@triton.jit
def _ks_rows(Q, KV, O_part, LSE_part, q0, start, end, stride_qr, stride_qh, stride_kv, stride_ps, stride_pq,
             Hq, H, qk_scale, pid_s, V_DIM: tl.constexpr, PE_DIM: tl.constexpr, BLOCK_Q: tl.constexpr,
             BLOCK_N: tl.constexpr, KSPLIT: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr):
    """_prefix_rows over pointer-load tiles with the latent in KSPLIT (2 or 4) column chunks (_ks_attend)."""
    VC: tl.constexpr = V_DIM // KSPLIT
    offs_q = q0 + tl.arange(0, BLOCK_Q)
    ok = offs_q < Hq
    base = Q + (offs_q // H) * stride_qr + (offs_q % H) * stride_qh
    offs_c = tl.arange(0, VC)
    qc0 = tl.load(base[:, None] + offs_c[None, :], mask=ok[:, None], other=0.0)
    qc1 = qc0
    qc2 = qc0
    qc3 = qc0
    if KSPLIT >= 2:
        qc1 = tl.load(base[:, None] + (VC + offs_c)[None, :], mask=ok[:, None], other=0.0)
    if KSPLIT == 4:
        qc2 = tl.load(base[:, None] + (2 * VC + offs_c)[None, :], mask=ok[:, None], other=0.0)
        qc3 = tl.load(base[:, None] + (3 * VC + offs_c)[None, :], mask=ok[:, None], other=0.0)
    q_pe = tl.load(base[:, None] + (V_DIM + tl.arange(0, PE_DIM))[None, :], mask=ok[:, None], other=0.0)
    if UPCAST:
        qc0 = qc0.to(tl.float32)
        qc1 = qc1.to(tl.float32)
        qc2 = qc2.to(tl.float32)
        qc3 = qc3.to(tl.float32)
        q_pe = q_pe.to(tl.float32)
    m_i = tl.full([BLOCK_Q], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_Q], tl.float32)
    a0 = tl.zeros([BLOCK_Q, VC], tl.float32)
    a1 = tl.zeros([BLOCK_Q, VC], tl.float32)
    a2 = tl.zeros([BLOCK_Q, VC], tl.float32)
    a3 = tl.zeros([BLOCK_Q, VC], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        k0, k1, k2, k3, k_pe, n_ok = _ks_load(KV, n0, end, stride_kv, V_DIM, PE_DIM, BLOCK_N, KSPLIT, UPCAST)
        m_i, l_i, a0, a1, a2, a3 = _ks_attend(qc0, qc1, qc2, qc3, q_pe, k0, k1, k2, k3, k_pe, n_ok, m_i, l_i,
                                              a0, a1, a2, a3, qk_scale, KSPLIT, PREC)
    o_ptr = O_part + pid_s * stride_ps + offs_q[:, None] * stride_pq + offs_c[None, :]
    tl.store(o_ptr, a0 / l_i[:, None], mask=ok[:, None])
    if KSPLIT >= 2:
        tl.store(o_ptr + VC, a1 / l_i[:, None], mask=ok[:, None])
    if KSPLIT == 4:
        tl.store(o_ptr + 2 * VC, a2 / l_i[:, None], mask=ok[:, None])
        tl.store(o_ptr + 3 * VC, a3 / l_i[:, None], mask=ok[:, None])
    tl.store(LSE_part + pid_s * Hq + offs_q, m_i + tl.log2(l_i), mask=ok)


@triton.jit
def _kb_rows(Q, KV, O_part, LSE_part, q0, start, end, stride_qr, stride_qh, stride_kv, stride_ps, stride_pq,
             Hq, H, qk_scale, pid_s, V_DIM: tl.constexpr, PE_DIM: tl.constexpr, BLOCK_Q: tl.constexpr,
             BLOCK_N: tl.constexpr, KBATCH: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr):
    """_prefix_rows over pointer-load tiles with the latent as KBATCH column chunks on the batch axis of 3-D dots
    (SplitTuning.kbatch). Triton lays a batched dot's warps along its batch axis, so each warp owns whole chunks:
    it reads its own Q chunk [BLOCK_Q, V_DIM / KBATCH] per tile (the 2-D dots' warps split the tile's tokens and each
    re-reads all of Q), its latent chunk once for S and once for P V (one [KBATCH, BLOCK_N, VC] tile, loaded from
    memory once), and the rope part rides along as RC-column chunks on the same batch axis (chunks past PE_DIM read as
    zeros: no bytes moved), so S is one sum over the batch axis (one cross-warp reduction per tile) and the softmax
    runs on rows every warp holds whole."""
    VC: tl.constexpr = V_DIM // KBATCH
    RC: tl.constexpr = PE_DIM // KBATCH if PE_DIM // KBATCH >= 16 else 16  # rope columns per batch slot
    offs_q = q0 + tl.arange(0, BLOCK_Q)
    ok = offs_q < Hq
    base = Q + (offs_q // H) * stride_qr + (offs_q % H) * stride_qh
    offs_b = tl.arange(0, KBATCH)[:, None, None]
    cols = offs_b * VC + tl.arange(0, VC)[None, None, :]  # [KBATCH, 1, VC]
    rcols = V_DIM + offs_b * RC + tl.arange(0, RC)[None, None, :]  # [KBATCH, 1, RC]
    r_ok = offs_b < PE_DIM // RC
    q3 = tl.load(base[None, :, None] + cols, mask=ok[None, :, None], other=0.0)  # [KBATCH, BLOCK_Q, VC]
    qr3 = tl.load(base[None, :, None] + rcols, mask=ok[None, :, None] & r_ok, other=0.0)  # [KBATCH, BLOCK_Q, RC]
    if UPCAST:
        q3 = q3.to(tl.float32)
        qr3 = qr3.to(tl.float32)
    m_i = tl.full([BLOCK_Q], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_Q], tl.float32)
    acc = tl.zeros([KBATCH, BLOCK_Q, VC], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < end
        row = KV + offs_n.to(tl.int64)[None, :, None] * stride_kv
        k3 = tl.load(row + cols, mask=n_ok[None, :, None], other=0.0)  # [KBATCH, BLOCK_N, VC]
        kr3 = tl.load(row + rcols, mask=n_ok[None, :, None] & r_ok, other=0.0)  # [KBATCH, BLOCK_N, RC]
        if UPCAST:
            k3 = k3.to(tl.float32)
            kr3 = kr3.to(tl.float32)
        s3 = tl.dot(qr3, tl.permute(kr3, (0, 2, 1)), input_precision=PREC)
        s3 = tl.dot(q3, tl.permute(k3, (0, 2, 1)), s3, input_precision=PREC)  # [KBATCH, BLOCK_Q, BLOCK_N]
        s = tl.sum(s3, 0)
        s = tl.where(n_ok[None, :], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
        p3 = tl.broadcast_to(p.to(k3.dtype)[None, :, :], (KBATCH, BLOCK_Q, BLOCK_N))
        acc = tl.dot(p3, k3, acc * alpha[None, :, None], input_precision=PREC)
    o = acc / l_i[None, :, None]
    tl.store(O_part + pid_s * stride_ps + offs_q[None, :, None] * stride_pq + cols, o, mask=ok[None, :, None])
    tl.store(LSE_part + pid_s * Hq + offs_q, m_i + tl.log2(l_i), mask=ok)


@triton.jit
def _prefix_rows(Q, KV, KD_lat, KD_pe, O_part, LSE_part, q0, start, end,
                 stride_qr, stride_qh, stride_kv, stride_ps, stride_pq, Hq, H, qk_scale, pid_s,
                 V_DIM: tl.constexpr, PE_DIM: tl.constexpr, BLOCK_Q: tl.constexpr,
                 BLOCK_N: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr, TMA: tl.constexpr,
                 PREFETCH: tl.constexpr, KSPLIT: tl.constexpr, KBATCH: tl.constexpr):
    """Stream KV rows [start, end) for query rows q0 + [0, BLOCK_Q): _plain_rows, or over pointer-load tiles with
    the latent as KBATCH > 0 batched chunks _kb_rows, or in KSPLIT > 1 chunks _ks_rows."""
    if not TMA and KBATCH > 0:
        _kb_rows(Q, KV, O_part, LSE_part, q0, start, end, stride_qr, stride_qh, stride_kv, stride_ps, stride_pq,
                 Hq, H, qk_scale, pid_s, V_DIM, PE_DIM, BLOCK_Q, BLOCK_N, KBATCH, UPCAST, PREC)
    elif not TMA and KSPLIT > 1:
        _ks_rows(Q, KV, O_part, LSE_part, q0, start, end, stride_qr, stride_qh, stride_kv, stride_ps, stride_pq,
                 Hq, H, qk_scale, pid_s, V_DIM, PE_DIM, BLOCK_Q, BLOCK_N, KSPLIT, UPCAST, PREC)
    else:
        _plain_rows(Q, KV, KD_lat, KD_pe, O_part, LSE_part, q0, start, end,
                    stride_qr, stride_qh, stride_kv, stride_ps, stride_pq, Hq, H, qk_scale, pid_s,
                    V_DIM, PE_DIM, BLOCK_Q, BLOCK_N, UPCAST, PREC, TMA, PREFETCH)


@triton.jit
def _plain_rows(Q, KV, KD_lat, KD_pe, O_part, LSE_part, q0, start, end,
                stride_qr, stride_qh, stride_kv, stride_ps, stride_pq, Hq, H, qk_scale, pid_s,
                V_DIM: tl.constexpr, PE_DIM: tl.constexpr, BLOCK_Q: tl.constexpr,
                BLOCK_N: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr, TMA: tl.constexpr,
                PREFETCH: tl.constexpr):
    """Stream KV rows [start, end) for query rows q0 + [0, BLOCK_Q).
    TMA: full tiles come through host tensor descriptors (bulk copies), the last partial tile
    through masked pointer loads; otherwise every tile through pointer loads."""
    offs_v = tl.arange(0, V_DIM)
    offs_pe = V_DIM + tl.arange(0, PE_DIM)
    offs_q = q0 + tl.arange(0, BLOCK_Q)
    q_lat, q_pe = _load_q(Q, offs_q, Hq, H, stride_qr, stride_qh, offs_v, offs_pe, UPCAST)
    m_i = tl.full([BLOCK_Q], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_Q], tl.float32)
    acc = tl.zeros([BLOCK_Q, V_DIM], tl.float32)
    if TMA:
        n_full = start + (tl.maximum(end - start, 0) // BLOCK_N) * BLOCK_N
        for n0 in range(start, n_full, BLOCK_N):
            if PREFETCH > 0:
                _prefetch_l2(KV, n0 + PREFETCH * BLOCK_N, end, stride_kv, BLOCK_N, V_DIM + PE_DIM)
            k_lat = KD_lat.load([n0, 0])
            k_pe = KD_pe.load([n0, 0])
            if UPCAST:
                k_lat = k_lat.to(tl.float32)
                k_pe = k_pe.to(tl.float32)
            n_ok = tl.full([BLOCK_N], 1, tl.int1)
            m_i, l_i, acc = _attend_block(q_lat, q_pe, k_lat, k_pe, n_ok, m_i, l_i, acc, qk_scale, PREC)
        if n_full < end:
            k_lat, k_pe, n_ok = _load_tile(KV, n_full, end, stride_kv, offs_v, offs_pe, BLOCK_N, UPCAST)
            m_i, l_i, acc = _attend_block(q_lat, q_pe, k_lat, k_pe, n_ok, m_i, l_i, acc, qk_scale, PREC)
    else:
        for n0 in range(start, end, BLOCK_N):
            k_lat, k_pe, n_ok = _load_tile(KV, n0, end, stride_kv, offs_v, offs_pe, BLOCK_N, UPCAST)
            m_i, l_i, acc = _attend_block(q_lat, q_pe, k_lat, k_pe, n_ok, m_i, l_i, acc, qk_scale, PREC)
    _store_partial(O_part, LSE_part, pid_s, offs_q, Hq, stride_ps, stride_pq, offs_v, m_i, l_i, acc)


@triton.jit
def _tree_rows(Q, KV, Bits, O_part, LSE_part, q0, prefix_len, R, split,
               stride_qr, stride_qh, stride_kv, stride_ps, stride_pq, Hq, H, qk_scale,
               V_DIM: tl.constexpr, PE_DIM: tl.constexpr, ROWS: tl.constexpr, BLOCK_R: tl.constexpr,
               UPCAST: tl.constexpr, PREC: tl.constexpr):
    """Query rows q0 + [0, ROWS) over the R new rows (cache rows prefix_len .. prefix_len + R - 1)
    under the per-row ancestor bitmask; written as one more partial (output and lse) at ``split``."""
    offs_q = q0 + tl.arange(0, ROWS)
    q_ok = offs_q < Hq
    offs_v = tl.arange(0, V_DIM)
    offs_pe = V_DIM + tl.arange(0, PE_DIM)
    q_lat, q_pe = _load_q(Q, offs_q, Hq, H, stride_qr, stride_qh, offs_v, offs_pe, UPCAST)
    offs_c = tl.arange(0, BLOCK_R)
    c_ok = offs_c < R
    k_ptr = KV + (prefix_len + offs_c)[:, None] * stride_kv
    k_lat = tl.load(k_ptr + offs_v[None, :], mask=c_ok[:, None], other=0.0)
    k_pe = tl.load(k_ptr + offs_pe[None, :], mask=c_ok[:, None], other=0.0)
    if UPCAST:
        k_lat = k_lat.to(tl.float32)
        k_pe = k_pe.to(tl.float32)
    s = tl.dot(q_lat, tl.trans(k_lat), input_precision=PREC)
    s = tl.dot(q_pe, tl.trans(k_pe), s, input_precision=PREC)
    bits = tl.load(Bits + offs_q // H, mask=q_ok, other=1)  # padded rows see new row 0: finite
    see = (((bits[:, None] >> offs_c[None, :].to(tl.int64)) & 1) != 0) & c_ok[None, :]
    s = tl.where(see, s * qk_scale, float("-inf"))
    m = tl.max(s, 1)
    p = tl.exp2(s - m[:, None])
    l = tl.sum(p, 1)
    acc = tl.dot(p.to(k_lat.dtype), k_lat, input_precision=PREC)
    _store_partial(O_part, LSE_part, split, offs_q, Hq, stride_ps, stride_pq, offs_v, m, l, acc)


@triton.jit
def _split_prefix_kernel(
    Q, KV, KD_lat, KD_pe, Bits, O_part, LSE_part,
    stride_qr, stride_qh, stride_kv, stride_ps, stride_pq,
    PrefixLen, R, min_chunk, Hq, H, qk_scale,
    V_DIM: tl.constexpr, PE_DIM: tl.constexpr, BLOCK_Q: tl.constexpr,
    TAIL_PROGRAM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
    UPCAST: tl.constexpr, PREC: tl.constexpr, TMA: tl.constexpr, PREFETCH: tl.constexpr,
    KSPLIT: tl.constexpr, KBATCH: tl.constexpr,
):
    # q blocks fastest: the programs of one split run together and share each KV tile in L2
    pid_q = tl.program_id(0)
    pid_s = tl.program_id(1)
    num_splits = tl.num_programs(1) - 1  # the last split index is the tree part
    # the chunk follows the prefix length in device memory: the splits share whatever is there
    prefix_len = tl.load(PrefixLen)
    chunk = tl.cdiv(tl.cdiv(prefix_len, tl.maximum(num_splits, 1)), BLOCK_N) * BLOCK_N
    chunk = tl.maximum(chunk, min_chunk)
    used_splits = tl.cdiv(prefix_len, chunk)
    start = pid_s * chunk
    end = tl.minimum(start + chunk, prefix_len)
    q0 = pid_q * BLOCK_Q
    if pid_s == num_splits:
        # the tree part, one short program per q block, running beside the prefix splits
        if TAIL_PROGRAM > 0:
            if pid_q == tl.num_programs(0) - 1:
                _tree_rows(Q, KV, Bits, O_part, LSE_part, q0, prefix_len, R, pid_s, stride_qr, stride_qh,
                           stride_kv, stride_ps, stride_pq, Hq, H, qk_scale, V_DIM, PE_DIM, TAIL_PROGRAM,
                           BLOCK_R, UPCAST, PREC)
            else:
                _tree_rows(Q, KV, Bits, O_part, LSE_part, q0, prefix_len, R, pid_s, stride_qr, stride_qh,
                           stride_kv, stride_ps, stride_pq, Hq, H, qk_scale, V_DIM, PE_DIM, BLOCK_Q,
                           BLOCK_R, UPCAST, PREC)
        else:
            _tree_rows(Q, KV, Bits, O_part, LSE_part, q0, prefix_len, R, pid_s, stride_qr, stride_qh,
                       stride_kv, stride_ps, stride_pq, Hq, H, qk_scale, V_DIM, PE_DIM, BLOCK_Q,
                       BLOCK_R, UPCAST, PREC)
    elif TAIL_PROGRAM > 0:
        # the last q block is a narrow program of TAIL_PROGRAM rows (e.g. rows 64..71 of 72); its splits past the
        # prefix (a device plan's grid is sized for its bound) mark their split empty (lse = -inf) and exit at once
        if pid_q == tl.num_programs(0) - 1:
            if pid_s < used_splits:
                _prefix_rows(Q, KV, KD_lat, KD_pe, O_part, LSE_part, q0, start, end,
                             stride_qr, stride_qh, stride_kv, stride_ps, stride_pq, Hq, H, qk_scale, pid_s,
                             V_DIM, PE_DIM, TAIL_PROGRAM, BLOCK_N, UPCAST, PREC, TMA, PREFETCH, KSPLIT, KBATCH)
            else:
                offs_t = q0 + tl.arange(0, TAIL_PROGRAM)
                tl.store(LSE_part + pid_s * Hq + offs_t, tl.full([TAIL_PROGRAM], float("-inf"), tl.float32),
                         mask=offs_t < Hq)
        else:
            _prefix_rows(Q, KV, KD_lat, KD_pe, O_part, LSE_part, q0, start, end,
                         stride_qr, stride_qh, stride_kv, stride_ps, stride_pq, Hq, H, qk_scale, pid_s,
                         V_DIM, PE_DIM, BLOCK_Q, BLOCK_N, UPCAST, PREC, TMA, PREFETCH, KSPLIT, KBATCH)
    else:
        _prefix_rows(Q, KV, KD_lat, KD_pe, O_part, LSE_part, q0, start, end,
                     stride_qr, stride_qh, stride_kv, stride_ps, stride_pq, Hq, H, qk_scale, pid_s,
                     V_DIM, PE_DIM, BLOCK_Q, BLOCK_N, UPCAST, PREC, TMA, PREFETCH, KSPLIT, KBATCH)


def bit_weights(r: int, device) -> torch.Tensor:
    """[R] int64: 1 << j (bit 63 as the int64 minimum)."""
    return torch.tensor([1 << j if j < 63 else -(1 << 63) for j in range(r)], dtype=torch.int64, device=device)


def mask_bits(tree_mask: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """[R, R] bool -> [R] int64 on the mask's device, bit j of row i set when row i sees new
    row j (R <= 64). Fixed-shape device ops: no host round trip."""
    w = bit_weights(tree_mask.shape[0], tree_mask.device) if weights is None else weights
    return (tree_mask.to(torch.int64) * w).sum(dim=1)


def smem_limit(device) -> int:
    """Shared memory (bytes) a block may opt into on ``device``; SMEM_SM90 off CUDA (the interpreter has no
    limit, but a CPU plan is then the H200's plan)."""
    if device is not None and torch.device(device).type == "cuda":
        return torch.cuda.get_device_properties(torch.device(device)).shared_memory_per_block_optin
    return SMEM_SM90


def prefix_smem(cfg: dict, r: int, width: int, elem_bytes: int) -> int:
    """Estimated shared memory (bytes) of _split_prefix_kernel on sm_90 with config ``cfg``, for r new rows
    and kv rows of ``width`` elements of ``elem_bytes``. Calibrated on Triton 3.6's metadata.shared
    (lab-2026-12-03:benchmarks/compile_split_sm90.py; within 16 B + the 1 KiB margin where the limit binds: fp32, and 16-bit
    64-row blocks): the prefix loop holds num_stages [block_n, width] KV tiles and the query rows
    [block_q, width] staged for the dots; the tree part its [BLOCK_R, width] tile and the block's rows. The
    branches share memory: the larger of the two, + 1 KiB (barriers, alignment)."""
    row = width * elem_bytes
    tile = cfg["block_n"] * row
    prefix = max(1, cfg["num_stages"]) * tile + cfg["block_q"] * row
    tree = (max(16, next_pow2(r)) + cfg["block_q"]) * row
    return max(prefix, tree) + 1024


def _row_blocks(hq: int, t: SplitTuning) -> tuple[int, int, int]:
    """(block_q, n_qb, tail_program) for Hq folded query rows: 64-row blocks (a 128-row block needs more registers
    than sm_90 gives 16 warps), 65-80 rows a 64-row block and a separate 16-row program."""
    if t.block_q:
        return t.block_q, triton.cdiv(hq, t.block_q), 0
    if hq <= 64:
        return max(16, next_pow2(hq)), 1, 0
    if hq <= 80:
        return 64, 2, 16
    return 64, triton.cdiv(hq, 64), 0


def _fit_tiles(t: SplitTuning, block_q: int, r: int, width: int, elem_bytes: int, limit: int) -> tuple[int, int] | None:
    """The tuning's (block_n, num_stages) when prefix_smem fits ``limit``, else fewer stages, then 32-token
    tiles: the first that fits (None if none does)."""
    stages = [t.num_stages] + list(range(t.num_stages - 1, 0, -1))
    tiles = [(t.block_n, s) for s in stages] + ([(32, s) for s in stages] if t.block_n > 32 else [])
    for bn, st in tiles:
        if prefix_smem(dict(block_n=bn, num_stages=st, block_q=block_q), r, width, elem_bytes) <= limit:
            return bn, st
    return None


def measured_smem(a: Arch, width: int, elem_bytes: int) -> int:
    """Shared memory of the prefix kernel with Arch ``a``'s own tuning (Arch.shared, compiled for 16-bit rows 576 wide)
    for rows of ``width`` x ``elem_bytes``: that figure scaled by their bytes, + 4 KB for what does not scale (barriers,
    reduction scratch: 4,224 B for the tiny preset's fp32 rows on sm_120, tests/test_split_targets.py)."""
    if width * elem_bytes == 576 * 2:
        return a.shared
    return -(-a.shared * width * elem_bytes // (576 * 2)) + 4096


def _check_measured(a: Arch, r: int, width: int, elem_bytes: int, limit: int) -> None:
    """On a GPU whose tuning was compiled and measured (Arch.shared): a one-line ValueError when measured_smem exceeds
    ``limit`` or R exceeds what fits."""
    need = measured_smem(a, width, elem_bytes)
    if r > a.max_rows:
        raise ValueError(f"the {name} path on {a.name} takes at most {a.max_rows} new rows (its tree tile), got {r}")
    if need > limit:
        raise ValueError(f"the {name} path on {a.name}: {r} new rows of {width} x {elem_bytes}-byte values need ~{need} B "
                         f"of shared memory, {limit} B there")


def choose_config(prefix_len: int, hq: int, sms: int, tuning: SplitTuning = DEFAULT_TUNING, *,
                  dtype: torch.dtype = torch.bfloat16, width: int = 576, r: int = 64,
                  smem_limit: int = SMEM_SM90, arch: Arch | None = None) -> dict:
    """Row tiling and split count for Hq folded query rows (pure function of shapes and tuning).
    prefix_len is the plan's bound: the split count is sized for it. The tuning's tiles and stages are
    kept when they fit ``smem_limit`` for r new rows of ``width`` elements of ``dtype`` (prefix_smem: the
    defaults do for 16-bit rows at 576 wide), else fewer stages, then 32-token tiles, then (automatic row
    blocks above 32 rows) 32-row blocks; a one-line ValueError when nothing fits. On a GPU of ``arch`` whose own
    tuning was compiled and measured there (Arch.shared), that tuning's tiles are kept as they are and checked
    (_check_measured); another tuning there is taken as given."""
    t = tuning
    eb = dtype.itemsize
    block_q, n_qb, tail_prog = _row_blocks(hq, t)
    tiles = (t.block_q, t.block_n, t.num_stages)
    if arch is not None and arch.shared:
        if tiles == (arch.tuning.block_q, arch.tuning.block_n, arch.tuning.num_stages):
            _check_measured(arch, r, width, eb, smem_limit)
        fit = (t.block_n, t.num_stages)
    else:
        fit = _fit_tiles(t, block_q, r, width, eb, smem_limit)
    if fit is None and block_q > 32 and not t.block_q:
        block_q, n_qb, tail_prog = 32, triton.cdiv(hq, 32), 0
        fit = _fit_tiles(t, block_q, r, width, eb, smem_limit)
    if fit is None:
        need = prefix_smem(dict(block_n=min(t.block_n, 32), num_stages=1, block_q=block_q), r, width, eb)
        raise ValueError(f"the {name} path: no tile config fits {dtype} kv rows {width} wide in {smem_limit} B of "
                         f"shared memory (the smallest, {min(t.block_n, 32)} tokens x 1 stage x {block_q} rows, "
                         f"needs ~{need} B); use fp16/bf16, narrower rows or a smaller SplitTuning.block_q")
    block_n, num_stages = fit
    if prefix_len == 0:
        num_splits, chunk = 0, block_n
    else:
        target = max(1, sms * max(1, t.programs_per_sm) // n_qb)  # programs_per_sm per SM (a tail program counts
        # as one of the n_qb)
        num_splits = max(1, min(target, triton.cdiv(prefix_len, t.min_chunk)))
        chunk = triton.cdiv(triton.cdiv(prefix_len, num_splits), block_n) * block_n
        num_splits = triton.cdiv(prefix_len, chunk)
    prefetch = (2 if block_q == 64 and n_qb >= 3 else 0) if t.prefetch < 0 else int(t.prefetch)
    if t.ksplit not in (1, 2, 4):
        raise ValueError(f"SplitTuning.ksplit must be 1, 2 or 4, got {t.ksplit}")
    if t.kbatch not in (0, 2, 4, 8):
        raise ValueError(f"SplitTuning.kbatch must be 0, 2, 4 or 8, got {t.kbatch}")
    return dict(block_q=block_q, tail_program=tail_prog, n_qb=n_qb, block_n=block_n, num_splits=num_splits,
                chunk=chunk, num_warps=t.num_warps, num_stages=num_stages, tma=int(t.tma), prefetch=prefetch,
                ksplit=int(t.ksplit), kbatch=int(t.kbatch))


def plan(prefix_len, tree_mask: torch.Tensor, slots: torch.Tensor | None = None, v_dim: int = 512, *,
         tuning: SplitTuning | None = None, heads: int | None = None, max_prefix: int | None = None,
         dtype: torch.dtype = torch.bfloat16, rope_dim: int = 64, arch: tuple[int, int] | None = None) -> VerifyPlan:
    """Per-step metadata: the ancestor bitmask on the device, the SM count, the device's shared memory
    limit; with ``heads`` also the tile/split config (for q/kv of ``dtype`` and ``rope_dim``: what fits
    shared memory depends on them) and the partial buffers (else run() derives them per call, nothing
    is memoized). prefix_len: int (host plan) or a [1] int32 device tensor with ``max_prefix``
    (device plan: splits and buffers sized for max_prefix; ``refresh`` rebuilds the bitmask). The GPU's Arch
    (ARCHS: its tuning, when none is given, and its shared memory) is the device's, or off CUDA that of compute
    capability ``arch`` (a plan to compile for a target without one, grids sized for its Arch.sms; None: sm_90's).
    On CUDA an ``arch`` given plans that GPU's tiling and shared-memory limit with this device's SM count (the
    portable build timed on another card: portable.py)."""
    dev = tree_mask.device
    target = arch is not None and dev.type == "cuda"
    a = arch_for(torch.cuda.get_device_capability(dev) if dev.type == "cuda" and not target else arch)
    tuning = a.tuning if tuning is None else tuning
    if not isinstance(tuning, SplitTuning):
        raise ValueError(f"the split path takes a SplitTuning, got {type(tuning).__name__}")
    bound, prefix_t, dynamic = split_prefix_arg(prefix_len, max_prefix, dev)
    check_plan_args(bound, tree_mask, slots)
    if slots is not None:
        raise ValueError("the split path reads the contiguous layout: the prefix in rows 0..prefix_len-1, then the R new rows (slots=None)")
    if not dynamic:
        check_diagonal(tree_mask)
    r = int(tree_mask.shape[0])
    check_rows(r, name)
    w = bit_weights(r, dev)
    sms = a.sms if dev.type != "cuda" and arch is not None else sm_count(dev)
    extra = {"bit_weights": w, "bits": mask_bits(tree_mask, w), "sm_count": sms,
             "smem_limit": smem_limit(dev) if dev.type == "cuda" and not target else a.smem, "dtype": dtype, "rope_dim": rope_dim,
             "arch": a}
    if heads is not None:
        extra["heads"] = heads
        try:
            extra["config"] = cfg = choose_config(bound, heads * r, extra["sm_count"], tuning, dtype=dtype,
                                                  width=v_dim + rope_dim, r=r, smem_limit=extra["smem_limit"], arch=a)
        except ValueError as e:  # the GPU's own tiling does not fit these rows: run() falls back to the reference
            if not a.shared:
                raise
            extra["fallback"] = str(e)
        else:
            extra["partials"] = partials(cfg["num_splits"], heads * r, v_dim, dev)
            extra["merge"] = merge_plan(tuning, heads * r, v_dim, extra["sm_count"])
    return VerifyPlan(prefix_len=bound, tree_mask=tree_mask, slots=None, v_dim=v_dim, prefix_t=prefix_t,
                      dynamic=dynamic, tuning=tuning, extra=extra)


def refresh(p: VerifyPlan) -> None:
    """Rebuild the bitmask from tree_mask (device plans, after the caller rewrote it in place)."""
    p.extra["bits"].copy_(mask_bits(p.tree_mask, p.extra["bit_weights"]))


def merge_plan(t: SplitTuning, hq: int, v_dim: int, sms: int) -> dict:
    """merge_config for this path: its prefix grid writes at most sms prefix partials (one program per SM)."""
    return merge_config(t, hq, v_dim, sms, sms)


def config_for(p: VerifyPlan, heads: int, dtype: torch.dtype | None = None, rope_dim: int | None = None) -> dict:
    """The tile/split config run() uses for ``heads`` and q/kv of ``dtype`` and ``rope_dim`` (default: the
    plan's): the plan's own when it was built for them, or when they choose the same one."""
    dtype = p.extra["dtype"] if dtype is None else dtype
    rope_dim = p.extra["rope_dim"] if rope_dim is None else rope_dim
    own = p.extra["config"] if p.extra.get("heads") == heads else None
    if own is not None and (dtype.itemsize, rope_dim) == (p.extra["dtype"].itemsize, p.extra["rope_dim"]):
        return own
    cfg = choose_config(p.prefix_len, heads * p.num_rows, p.extra["sm_count"], p.tuning, dtype=dtype,
                        width=p.v_dim + rope_dim, r=p.num_rows, smem_limit=p.extra["smem_limit"], arch=p.extra["arch"])
    return own if cfg == own else cfg


def _tma_ok(kv: torch.Tensor) -> bool:
    """Tensor descriptors need Hopper or later (or the interpreter) and 16-byte aligned rows."""
    if kv.data_ptr() % 16 or (kv.stride(0) * kv.element_size()) % 16:
        return False
    return interpreting() or (kv.is_cuda and torch.cuda.get_device_capability(kv.device)[0] >= 9)


def prefix_launch(q: torch.Tensor, kv: torch.Tensor, p: VerifyPlan, sm_scale: float, cfg: dict, parts, *,
                  tma_ok: bool, compiled: bool = False) -> tuple:
    """(kernel, grid, args, kwargs) of the prefix kernel's launch for ``cfg`` (config_for) into partials ``parts``;
    ``tma_ok``: tensor descriptors may be used (``_tma_ok``); ``compiled``: for a GPU target, never the interpreter's
    fp32 upcast (``_target_compile`` compiles it for a GPU on a machine without one)."""
    pe = q.shape[2] - p.v_dim
    o_part, lse_part = parts
    r, h, _ = q.shape
    ns = cfg["num_splits"]
    upcast, prec = dot_flags(q.dtype)
    kd_lat = kd_pe = kv
    if ns > 0 and cfg["tma"] and tma_ok:
        # full tiles only (the last partial tile of the prefix goes through pointer loads)
        kd_lat = TensorDescriptor(kv, [kv.shape[0], p.v_dim], [kv.stride(0), 1], [cfg["block_n"], p.v_dim])
        kd_pe = TensorDescriptor(kv[:, p.v_dim:], [kv.shape[0], pe], [kv.stride(0), 1], [cfg["block_n"], pe])
    # host plans: the kernel's chunk equals the config's; device plans: at least min_chunk tokens
    min_chunk = triton.cdiv(p.tuning.min_chunk, cfg["block_n"]) * cfg["block_n"] if p.dynamic else cfg["block_n"]
    args = (q, kv, kd_lat, kd_pe, p.extra["bits"], o_part, lse_part,
            q.stride(0), q.stride(1), kv.stride(0), o_part.stride(0), o_part.stride(1),
            p.prefix_t, r, min_chunk, r * h, h, sm_scale * LOG2E)
    kw = dict(V_DIM=p.v_dim, PE_DIM=pe, BLOCK_Q=cfg["block_q"], TAIL_PROGRAM=cfg["tail_program"],
              BLOCK_N=cfg["block_n"], BLOCK_R=max(16, next_pow2(r)),
              UPCAST=upcast and not compiled, PREC=prec, TMA=kd_lat is not kv,
              PREFETCH=0 if interpreting() and not compiled else cfg["prefetch"], KSPLIT=cfg["ksplit"],
              KBATCH=min(cfg.get("kbatch", 0), p.v_dim // 16),
              num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return _split_prefix_kernel, (cfg["n_qb"], ns + 1), args, kw


def run(q: torch.Tensor, kv: torch.Tensor, p: VerifyPlan, sm_scale: float, *, meta: dict | None = None) -> torch.Tensor:
    """q [R, H, D], kv [rows, D] contiguous layout -> out [R, H, v_dim] in q's dtype. ``meta``: a
    dict to receive the compiled kernels' reports under "prefix" and "merge". Where the kernels cannot run on this
    GPU (the plan's ``fallback``: its tuning does not fit there; or a build error at the first launch) the fp32
    reference runs instead, said once in one line (_fallback)."""
    check_run_args(q, kv, p)
    pe = check_dims(q, kv, p.v_dim, name)
    if "bits" not in p.extra:
        raise ValueError("plan was not built by split.plan")
    r, h, _ = q.shape
    hq = r * h
    try:
        cfg = p.extra.get("fallback") or config_for(p, h, q.dtype, pe)
    except ValueError as e:
        if not p.extra["arch"].shared:
            raise
        cfg = str(e)
    if isinstance(cfg, str):
        return _fallback(q, kv, p, sm_scale, cfg)
    ns = cfg["num_splits"]
    planned = cfg is p.extra.get("config") and p.extra["partials"][0].device == q.device
    parts = p.extra["partials"] if planned else partials(ns, hq, p.v_dim, q.device)
    out = torch.empty(r, h, p.v_dim, dtype=q.dtype, device=q.device)
    fn, grid, args, kw = prefix_launch(q, kv, p, sm_scale, cfg, parts, tma_ok=_tma_ok(kv))
    mc = p.extra["merge"] if planned else merge_plan(p.tuning, hq, p.v_dim, p.extra["sm_count"])
    try:
        k = fn[grid](*args, **kw)
        if meta is not None:
            meta["prefix"] = kernel_meta(k)
        return launch_merge(parts, ns, out, mc, meta=meta)
    except COMPILE_ERRORS as e:
        why = (str(e).strip().splitlines() or [""])[0][:200]
        return _fallback(q, kv, p, sm_scale, f"the {name} path's kernels ({cfg['block_q']} rows x {cfg['block_n']} "
                         f"tokens x {cfg['num_stages']} stages) do not build on {p.extra['arch'].name} "
                         f"({type(e).__name__}: {why})")


def _compile_errors() -> tuple[type, ...]:
    from triton.compiler.errors import CompilationError
    from triton.runtime.errors import OutOfResources, PTXASError

    return CompilationError, OutOfResources, PTXASError


COMPILE_ERRORS = _compile_errors()  # what a kernel that does not build for this GPU raises at its first launch


def _fallback(q: torch.Tensor, kv: torch.Tensor, p: VerifyPlan, sm_scale: float, why: str) -> torch.Tensor:
    """The kernels do not run on this GPU (``why``, one line naming the path and the GPU): a RuntimeWarning, once per
    plan, then the fp32 reference over the same plan, so a measurement goes on rather than ending in a traceback. The
    plan records what ran (``fallback``: the engine and bench verify read it) and that it was said."""
    p.extra.setdefault("fallback", why)
    if not p.extra.get("fallback_said"):
        p.extra["fallback_said"] = True
        warnings.warn(f"{why}; the fp32 reference runs instead", RuntimeWarning, stacklevel=3)
    from . import reference

    return reference.run(q, kv, p, sm_scale)
