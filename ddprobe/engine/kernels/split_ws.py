"""`split_ws`: `split`'s algorithm with warp-specialized Hopper prefix kernels (sm_90 only).

Same seam, layout and results as `split` (the contiguous layout: prefix rows 0..P-1, then the R new rows):
  1. The prefix kernel, one per shape (``choose``: the same for host and device plans, so the kernel the engine's
     CUDA-graph step runs is the one `bench verify` times), per block of folded query rows (row hq = r * H + h)
     and chunk of the prefix:
     - the CUDA C++ seesaw (cuda/seesaw_sm90.cu through _cu.py; FlashMLA's schedule, no producer warp) on 64-row
       blocks, for every shape but the next one;
     - for 65-72 folded rows (8 heads x 9) in plans sized for TAIL_FROM tokens and more, the Gluon tail kernel
       (``_ws_tail.ws_tail_kernel``: a TMA loader warp, warpgroup 0 doing S, the softmax and half of P V for rows
       0..63, warpgroup 1 the other half and the 8 tail rows with the operands swapped), one program per chunk.
     Both read the prefix length from device memory (VerifyPlan.prefix_t) and derive their chunk from it on the
     row-block x split grid sized for the plan's bound (splits past the live length mark their slot empty and exit
     at once), so a CUDA graph replays one launch at any length up to the bound.
  2. The log-sum-exp merge of the partials: the CUDA merge (cuda/seesaw_sm90.cu, _cu.MergeLauncher) by default,
     the Triton merges (merge.py: launch_merge, merge_config's kinds) where the tuning asks for one (a merge kind or
     knob, ``triton_merge``), past the CUDA merge's 1,024 partials, or where the cubin does not load here.
``plan`` plans and ``run`` only launches: given the heads and the dtype, ``plan`` chooses the kernel and the grid,
allocates the partials and builds the CUDA kernels' launchers (their parameter blocks) into a typed WsPlan
(VerifyPlan.detail); ``run`` checks that the inputs match it (a one-line ValueError otherwise) and launches: on
the CUDA kernels, the output's allocation and two driver launches, the prefix kernel's and the CUDA merge's (with
WsTuning.merge_kind -1 one: the prefix kernel merges its own partials after a grid barrier, its grid one wave;
slower on the H100: docs/perf.md); the tail kernel is a Triton launch (its tensor descriptors kept per plan) followed
by the merge's, or, with WsTuning.tail_fuse 1, merging its own partials after a grid barrier (one launch); with
WsTuning.tail_queue 1 its grid is one program per SM taking tiles from the plan's queue (``WsPlan.queue``).
A plan built without heads is completed per call for the call's heads (correct, with the host cost of a plan).
It needs an sm_90 GPU (wgmma, TMA, mbarriers), bf16 or fp16 q and kv, 16-byte aligned rows, the MLA widths the
kernels are written for (v_dim 512, rope 64) and, on the CUDA kernel, a positive softmax scale and a cubin the
driver loads; anything else is a one-line ValueError. There is no interpreter path: `split` is the CPU-tested
path with the same results, and tests/test_kernels_gpu.py checks this one on the GPU.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch
import triton

from ... import verify_paths
from . import _cu
from ._common import check_rows, interpreting, kernel_meta, sm_count
from .plan import VerifyPlan, check_diagonal, check_plan_args, check_run_args, split_prefix_arg
from .merge import launch_merge as launch_triton_merge
from .merge import merge_config, partials
from .split import LOG2E, bit_weights, mask_bits

name = "split_ws"
layout = verify_paths.BY_NAME[name].layout
device_plans = verify_paths.BY_NAME[name].device_plans  # the engine reads this to capture steps in CUDA graphs

BLOCK_M = 64     # query rows per program (one warpgroup's wgmma M)
BLOCK_N = 64     # KV tokens per tile
TAIL = 8         # rows beyond 64 that the _ws_tail kernel takes on warpgroup 1 (shared memory allows 8: 232,384 B)
TAIL_MERGE_ROWS = 8      # merge rows per program behind it (129 partials: 8.0 us against 10.0 with 16)
TAIL_FROM = 65536  # plan bounds (prefix tokens) from which 65-72 folded rows run the tail kernel by default
PV_REGS = 232    # registers per thread of warpgroup 1 (setmaxnreg)
LOAD_REGS = 40   # registers per thread of the loader warp
MAX_DESCS = 128  # tensor descriptor sets a plan keeps for the tail kernel's launches


@dataclass(frozen=True)
class WsTuning:
    """Knobs of the prefix kernels, fixed per plan: -1 (the default of tail) is ``choose``'s choice, the same for
    host and device plans (the kernel the engine runs); the other values are explicit tunings that the tests and
    ``bench verify --variant`` select. Kernels and knobs nothing chooses are on the lab branch (the plain Gluon
    prefix kernel, cuda=0; the balanced grid, balance=1: docs/kernels.md says where)."""

    min_chunk: int = 128  # fewest prefix tokens per split: 128 (two tiles) sizes fewer, fuller splits below 8k
                          # (8 heads on an H100: 13.5 / 15.0 us at 1k / 4k against 14.2 / 16.6 with 64; 64 heads
                          # alike; from 8k the split count, not this floor, sets the chunk; 2026-12-07)
    fold_tree: int = -1  # the tree columns on the last prefix split (1) or their own program per row block (0);
                         # -1: fold from 4 row blocks up and behind the tail kernel (64 heads: 6% faster at 128k;
                         # 8 heads on the CUDA kernel 1-14% slower folded); both placements are tested
    merge_kind: int = -2    # the merge: -2 (default) the CUDA merge in its own launch (with a merge knob below set,
                            # or where the cubin does not load: the Triton merge, kind 3 up to 128 folded rows,
                            # else 1); -1 the CUDA merge inside the CUDA prefix kernel's launch after a grid barrier
                            # (one launch; 0.6-18% slower than its own launch at every CUDA-kernel shape but 64 heads
                            # 128k, 0.7% faster there, on an H100 2026-12-08: docs/perf.md); 0-3 the Triton merges
                            # (merge.merge_config; the tests check every kind)
    merge_block_m: int = 0      # folded rows per merge program (0: the kind's preset, merge.MERGE_PRESETS)
    merge_split_chunk: int = 0  # partials per step of the merge's loop (0: preset)
    merge_stages: int = 0       # software-pipeline depth of that loop (0: preset)
    merge_warps: int = 4        # warps per merge program
    merge_bv: int = 0           # value columns per merge program (0: halve 512 until the grid fills the SMs)
    tail: int = -1      # 65-72 folded rows (8 heads x 9) on the Gluon tail kernel, one program of 64 + 8 rows per
                        # chunk: -1 (default) from a plan bound of TAIL_FROM tokens, 1 at every bound, 0 never (the
                        # CUDA kernel on two 64-row blocks); other row counts always run the CUDA kernel
    part_bits: int = 32  # the partial outputs between the prefix kernel and the merge: 32 (fp32) or 16 (the inputs'
                         # own 16-bit type, as FlashInfer's split-K decode keeps them: half the bytes written and
                         # read; the log-sum-exps stay fp32)
    tail_fuse: int = 0   # behind the tail kernel: 1 runs the merge inside its launch after a grid barrier (one
                         # launch, as the CUDA kernel's fused merge; the grid is one wave), 0 the CUDA merge's own
                         # launch
    tail_queue: int = 0  # the tail kernel's schedule: 0 fixed chunks (a chunk of whole tiles per split, the grid
                         # sized for the plan's bound); 1 one program per SM, each taking the next 64-token tile
                         # from the plan's counter until none is left (a program that streams faster takes more
                         # tiles; every SM busy; the output's last bits vary between runs; not yet run on a GPU:
                         # off, docs/kernels.md); not with tail_fuse


DEFAULT_TUNING = WsTuning()
_CHOICES = {"fold_tree": (-1, 0, 1), "tail": (-1, 0, 1), "merge_kind": (-2, -1, 0, 1, 2, 3), "part_bits": (32, 16),
            "tail_fuse": (0, 1), "tail_queue": (0, 1)}


def check_tuning(t: WsTuning) -> None:
    """One-line ValueError for a knob outside the kernels' choices (a value no kernel implements would otherwise run
    some other schedule silently), or a pair of knobs no kernel runs together."""
    for knob, allowed in _CHOICES.items():
        if getattr(t, knob) not in allowed:
            raise ValueError(f"WsTuning.{knob} must be one of {', '.join(map(str, allowed))}, got {getattr(t, knob)}")
    if t.tail_queue and t.tail_fuse:
        raise ValueError("WsTuning.tail_queue 1 runs the merge in its own launch: it takes tail_fuse 0")
    if t.tail_queue and t.merge_kind == 0:  # the online merge starts from the last slot's lse, finite only there
        raise ValueError("WsTuning.tail_queue 1 leaves any slot empty, which the online merge (merge_kind 0) does "
                         "not take: use -2, -1 or 1-3")


def tails(hq: int, t: WsTuning, bound: int = 0) -> bool:
    """Whether ``t`` runs hq folded rows, in a plan sized for ``bound`` prefix tokens, as one program of 64 + TAIL
    rows (the _ws_tail kernel): 65-72 rows with tail=1, or tail=-1 from TAIL_FROM tokens."""
    return BLOCK_M < hq <= BLOCK_M + TAIL and (t.tail == 1 or (t.tail == -1 and bound >= TAIL_FROM))


def block_rows(hq: int, t: WsTuning, bound: int = 0) -> int:
    """Folded query rows per program: 64 (the CUDA kernel), or 72 on the tail kernel (65-72 rows)."""
    return BLOCK_M + TAIL if tails(hq, t, bound) else BLOCK_M


def choose(hq: int, bound: int, t: WsTuning = DEFAULT_TUNING) -> tuple[WsTuning, str]:
    """The one choice of kernel per shape (pure Python): (the effective tuning, tail resolved to 0 or 1, and the
    prefix kernel, "cuda" or "tail") for hq folded rows in a plan sized for ``bound`` prefix tokens (a host plan's
    length, a device plan's max_prefix). Both kernels read the live length from device memory and derive their
    chunks there, so host and device plans (the engine's CUDA-graph step) of one shape run the same kernel and
    `bench verify` times the kernel the engine runs for a plan of that bound: the tail kernel for 65-72 rows from
    TAIL_FROM tokens (faster at 8 heads from 64k, slower at 16k-32k: docs/perf.md), else the CUDA kernel."""
    kernel = "tail" if tails(hq, t, bound) else "cuda"
    return replace(t, tail=int(kernel == "tail")), kernel


def folds(n_qb: int, fold_tree: int) -> bool:
    """Whether the tree part rides on the last prefix split (fold_tree -1: from 4 row blocks of 64 up)."""
    return n_qb >= 4 if fold_tree < 0 else bool(fold_tree)


def choose_config(prefix_len: int, hq: int, sms: int, min_chunk: int = 64, fold_tree: int = 1,
                  block_q: int = BLOCK_M) -> dict:
    """Splits so that all programs (row blocks of ``block_q`` x splits, + the tree part unless folded) fit one
    wave. ``grid_splits`` is the grid's second dimension; the merge combines ``grid_splits`` partials."""
    n_qb = triton.cdiv(hq, block_q)
    extra = 0 if folds(n_qb, fold_tree) else 1
    if prefix_len == 0:
        return dict(n_qb=n_qb, num_splits=1 - extra, chunk=BLOCK_N, grid_splits=1, fold=1 - extra)
    target = max(1, sms // n_qb - extra)
    num_splits = max(1, min(target, triton.cdiv(prefix_len, min_chunk)))
    chunk = triton.cdiv(triton.cdiv(prefix_len, num_splits), BLOCK_N) * BLOCK_N
    ns = triton.cdiv(prefix_len, chunk)
    return dict(n_qb=n_qb, num_splits=ns, chunk=chunk, grid_splits=ns + extra, fold=1 - extra)


def grid_piece(g: int, n_qb: int, grid_splits: int, fold: int, prefix_len: int, r: int) -> tuple[int, int, int, int]:
    """Host mirror of the CUDA kernel's row-block x split grid (host and device plans): program g's (row block, first
    column, end column, slot) at live length ``prefix_len``; start == end: an empty split (lse -inf, exits)."""
    rb, slot = g % n_qb, g // n_qb
    ns = grid_splits - 1 + fold
    if not fold and slot == ns:
        return rb, prefix_len, prefix_len + r, slot
    chunk = max(BLOCK_N, -(-(-(-prefix_len // ns)) // BLOCK_N) * BLOCK_N)
    start = min(slot * chunk, prefix_len)
    end = prefix_len + r if fold and slot == ns - 1 else min(start + chunk, prefix_len)
    return rb, start, end, slot


def config(prefix_len: int, hq: int, sms: int, t: WsTuning) -> dict:
    """choose_config for tuning ``t`` (its row-block size, chunk floor and tree placement) at a plan bound of
    ``prefix_len`` tokens, with block_q and whether the tail kernel runs."""
    tail = tails(hq, t, prefix_len)
    fold = 1 if tail and t.fold_tree < 0 else t.fold_tree  # behind the tail kernel, fold by default (1-2% faster)
    bq = block_rows(hq, t, prefix_len)
    if tail and t.tail_queue:  # one program per SM, one partial each; the tiles come from the queue
        return dict(n_qb=1, num_splits=sms, chunk=BLOCK_N, grid_splits=sms, fold=1, block_q=bq, tail=True, queue=True)
    return dict(choose_config(prefix_len, hq, sms, t.min_chunk, fold, bq), block_q=bq, tail=tail)


def merge_plan(t: WsTuning, hq: int, v_dim: int, sms: int, bound: int = 0) -> dict:
    """merge.merge_config for this path: its prefix grid gives at most sms // (row blocks) partials; behind
    the tail kernel (twice the partials) the merge's programs take TAIL_MERGE_ROWS rows unless the tuning says."""
    tail = tails(hq, t, bound)
    if tail and not t.merge_block_m:
        t = replace(t, merge_block_m=TAIL_MERGE_ROWS)
    return merge_config(t, hq, v_dim, sms, sms // triton.cdiv(hq, BLOCK_M + TAIL if tail else BLOCK_M))


@dataclass(frozen=True)
class WsPlan:
    """What ``plan`` built for one head count and dtype (VerifyPlan.detail); ``run`` only launches from it.
    heads None: a plan built without heads (``run`` completes one per call)."""

    heads: int | None
    dtype: torch.dtype
    bits: torch.Tensor          # [R] int64 ancestor bits, rebuilt by refresh()
    bit_weights: torch.Tensor
    sm_count: int
    tuning: WsTuning = DEFAULT_TUNING   # the effective tuning (``choose``: tail resolved to 0 or 1)
    kernel: str = ""            # "cuda" or "tail"
    cfg: dict | None = None     # the grid (config / choose_config)
    partials: tuple | None = None
    merge: dict | None = None   # the Triton merge's config (merge.merge_config), when ``merger`` is None
    launcher: Any = None        # _cu.Launcher of the CUDA prefix kernel
    merger: Any = None          # _cu.MergeLauncher of the CUDA merge
    fused: bool = False         # the merge runs inside the prefix kernel's launch (launcher(..., out), or the tail
                                # kernel's with ``counter``)
    counter: torch.Tensor | None = None  # the fused tail kernel's grid barrier ([2] int32: arrivals, generation)
    queue: torch.Tensor | None = None    # the tail kernel's tile queue (tail_queue 1; [2] int32: next tile, done)
    signature: tuple = ()       # what ``run`` compares its inputs with: (R, heads, D, D, dtype, dtype, and both
                                # tensors' device index, Tensor.get_device: cheaper than building torch.device)
    index: int = -1             # the CUDA device's index
    descs: dict = field(default_factory=dict)  # the tail kernel's tensor descriptors per (q, kv) address and
                                               # stride (they hold the tensors: at most MAX_DESCS kept)
    compiled: dict = field(default_factory=dict)  # the tail kernel as compiled for this plan (its first launch)


def _why_not(device, dtype, v_dim: int, rope_dim: int) -> str | None:
    """None when this path runs on ``device`` with this dtype and widths, else the reason (one line)."""
    if interpreting():
        return "does not run under TRITON_INTERPRET (use 'split' there)"
    dev = torch.device(device)
    if not (dev.type == "cuda" and torch.cuda.get_device_capability(dev) == (9, 0)):
        return "needs an sm_90 GPU (H100/H200: wgmma, TMA, mbarriers)"
    if dtype not in (torch.bfloat16, torch.float16):
        return f"needs bf16 or fp16 q and kv, got {dtype}"
    if v_dim != 512 or rope_dim != 64:
        return f"is written for MLA rows of 512 + 64, got {v_dim} + {rope_dim}"
    return None


def supported(q: torch.Tensor, kv: torch.Tensor, v_dim: int) -> str | None:
    """None when this path can run these tensors, else the reason (one line)."""
    why = _why_not(q.device, q.dtype, v_dim, q.shape[2] - v_dim)
    if why is None and (kv.data_ptr() % 16 or (kv.stride(0) * kv.element_size()) % 16):
        why = "needs 16-byte aligned kv rows"
    return why


def _complete(p: VerifyPlan, base: WsPlan, heads: int, dtype: torch.dtype, rope_dim: int = 64) -> WsPlan:
    """base (bits, SM count) with the kernel, grid, partials, merge and launcher for ``heads`` and ``dtype``."""
    why = _why_not(base.bits.device, dtype, p.v_dim, rope_dim)
    if why:
        raise ValueError(f"the {name} path {why}")
    r, dev, sms = p.num_rows, base.bits.device, base.sm_count
    hq = heads * r
    t, kernel = choose(hq, p.prefix_len, p.tuning)
    cfg = config(p.prefix_len, hq, sms, t)
    parts = partials(cfg["grid_splits"] - 1, hq, p.v_dim, dev, dtype if t.part_bits == 16 else torch.float32)
    merger = _merger(t, dev, dtype, parts, hq, heads, cfg["grid_splits"], sms)
    launcher = None
    if kernel == "cuda":
        fuse = cfg["grid_splits"] if merger is not None and t.merge_kind == -1 else 0
        try:
            launcher = _cu.Launcher(dev, dtype, hq, heads, r, p.num_cols, base.bits, p.prefix_t, *parts, cfg["n_qb"],
                                    cfg["grid_splits"], cfg["fold"], fuse_parts=fuse, sms=sms)
        except _cu.LoadError as e:  # no usable cubin here (_cu remembers it): one line, no other kernel for this shape
            raise ValueError(f"the {name} path's CUDA kernel does not load here ({e}); the split path runs "
                             f"anywhere") from None
    counter = None
    if kernel == "tail" and t.tail_fuse and t.merge_kind < 0 and merger is not None \
            and cfg["n_qb"] * cfg["grid_splits"] <= sms \
            and not _cu._mps_limited():  # the grid barrier needs every program resident: one wave, all the SMs
        counter = torch.zeros(2, dtype=torch.int32, device=dev)
    queue = torch.zeros(2, dtype=torch.int32, device=dev) if cfg.get("queue") else None
    dim = p.v_dim + rope_dim
    return replace(base, heads=heads, dtype=dtype, tuning=t, kernel=kernel, cfg=cfg, partials=parts, descs={},
                   compiled={}, queue=queue,
                   merge=merge_plan(t, hq, p.v_dim, sms), launcher=launcher, counter=counter,
                   merger=merger, fused=(launcher is not None and launcher.fused) or counter is not None,
                   signature=(r, heads, dim, dim, dtype, dtype, dev.index, dev.index),
                   index=dev.index if dev.index is not None else -1)


def triton_merge(t: WsTuning) -> bool:
    """Whether tuning ``t`` asks for the Triton merge (merge.py): a merge kind 0-3, or any of its knobs set (the
    CUDA merge has none, so a knob set with merge_kind -1 or -2 means the Triton merge's default kind with that knob)."""
    return t.merge_kind >= 0 or (t.merge_block_m, t.merge_split_chunk, t.merge_stages, t.merge_bv, t.merge_warps) \
        != (0, 0, 0, 0, 4)


def _merger(t: WsTuning, dev, dtype, parts, hq: int, heads: int, n_parts: int, sms: int):
    """The CUDA merge's launcher (_cu.MergeLauncher), or None for the Triton merge: when the tuning asks for it,
    past the CUDA merge's MERGE_MAX_PARTS partials, or where its kernel does not load here (warned)."""
    if triton_merge(t) or n_parts > _cu.MERGE_MAX_PARTS:
        return None
    try:
        return _cu.MergeLauncher(dev, dtype, *parts, hq, heads, n_parts, sms)
    except _cu.LoadError as e:  # the warnings module shows it once per message
        import warnings
        warnings.warn(f"split_ws: the CUDA merge is unavailable ({e}); using the Triton merge", RuntimeWarning,
                      stacklevel=4)
        return None


def plan(prefix_len, tree_mask: torch.Tensor, slots: torch.Tensor | None = None, v_dim: int = 512, *,
         tuning=None, heads: int | None = None, max_prefix: int | None = None,
         dtype: torch.dtype = torch.bfloat16, rope_dim: int = 64) -> VerifyPlan:
    """Per-step metadata: the ancestor bitmask on the device and the SM count; with ``heads`` (and q/kv's
    ``dtype``) also the kernel, the grid, the partial buffers, the merge and the CUDA kernel's launcher.
    prefix_len: int (host plan) or a [1] int32 device tensor with ``max_prefix`` (device plan: the CUDA kernel,
    its grid and buffers sized for max_prefix; ``refresh`` rebuilds the bitmask)."""
    tuning = DEFAULT_TUNING if tuning is None else tuning
    if not isinstance(tuning, WsTuning):
        raise ValueError(f"the split_ws path takes a WsTuning, got {type(tuning).__name__}")
    check_tuning(tuning)
    dev = tree_mask.device
    bound, prefix_t, dynamic = split_prefix_arg(prefix_len, max_prefix, dev)
    check_plan_args(bound, tree_mask, slots)
    if slots is not None:
        raise ValueError("the split_ws path reads the contiguous layout (slots=None)")
    if not dynamic:
        check_diagonal(tree_mask)
    r = int(tree_mask.shape[0])
    check_rows(r, name)
    w = bit_weights(r, dev)
    base = WsPlan(heads=None, dtype=dtype, bits=mask_bits(tree_mask, w), bit_weights=w, sm_count=sm_count(dev),
                  tuning=tuning)
    p = VerifyPlan(prefix_len=bound, tree_mask=tree_mask, slots=None, v_dim=v_dim, prefix_t=prefix_t,
                   dynamic=dynamic, tuning=tuning, detail=base)
    if heads is None:
        return p
    return replace(p, detail=_complete(p, base, heads, dtype, rope_dim))


def refresh(p: VerifyPlan) -> None:
    """Rebuild the bitmask from tree_mask after the caller rewrote it in place (fixed shapes, capturable)."""
    p.detail.bits.copy_(mask_bits(p.tree_mask, p.detail.bit_weights))


def _descs(q2: torch.Tensor, kv: torch.Tensor, p: VerifyPlan):
    """The tail kernel's tensor descriptors, in its argument order: Q in 64-row blocks (latent, rope), the Q tail's
    TAIL-row blocks (latent, rope), the KV tiles (latent, rope); rows past the plan's columns read as zeros."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    dt = gl.bfloat16 if kv.dtype == torch.bfloat16 else gl.float16
    v, pe = p.v_dim, kv.shape[1] - p.v_dim
    rows, hq = p.num_cols, q2.shape[0]

    def desc(t, shape, block):
        return TensorDescriptor(t, shape, [t.stride(0), 1], block, gl.NVMMASharedLayout.get_default_for(block, dt))
    return (desc(q2, [hq, v], [BLOCK_M, v]), desc(q2[:, v:], [hq, pe], [BLOCK_M, pe]),
            desc(q2, [hq, v], [TAIL, v]), desc(q2[:, v:], [hq, pe], [TAIL, pe]),
            desc(kv, [rows, v], [BLOCK_N, v]), desc(kv[:, v:], [rows, pe], [BLOCK_N, pe]))


def tail_launch(descs, bits, o_part, lse_part, p: VerifyPlan, cfg: dict, hq: int, dim: int, h: int,
                sm_scale: float, out: torch.Tensor | None = None,
                counter: torch.Tensor | None = None, queue: torch.Tensor | None = None) -> tuple[tuple, tuple, dict]:
    """(grid, arguments, constexprs) of the Gluon tail kernel on ``cfg``'s grid: what ``_launch_tail`` launches and
    kernels/_target_compile.py compiles on the CPU (``descs``: ``_descs(q2, kv, p)``; ``bits``: the tree's mask).
    ``out`` and ``counter`` given: the merge fused into the launch (FUSE), into out [R, H, v_dim]; ``queue`` given
    (a plan of tail_queue 1): the tiles taken from it (QUEUE)."""
    grid = (cfg["n_qb"], cfg["grid_splits"], 1)
    fuse = out is not None
    args = (*descs, bits, o_part, lse_part, o_part.stride(0), o_part.stride(1), p.prefix_t, p.num_rows,
            cfg["grid_splits"] - 1 + cfg["fold"], hq, h, sm_scale * LOG2E,
            out if fuse else o_part, out.stride(0) if fuse else 0, out.stride(1) if fuse else 0,
            counter if fuse else bits, queue if queue is not None else bits)
    consts = dict(BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, V_DIM=p.v_dim, PE_DIM=dim - p.v_dim, TAIL=TAIL, PV_REGS=PV_REGS,
                  LOAD_REGS=LOAD_REGS, FOLD=cfg["fold"], FUSE=int(fuse),
                  PARTS=triton.next_power_of_2(max(cfg["grid_splits"], 32)), QUEUE=int(queue is not None))
    return grid, args, consts


def _launch_tail(q2, kv, p: VerifyPlan, d: WsPlan, sm_scale: float, h: int, out: torch.Tensor | None = None):
    """The Gluon tail kernel on d's grid (it reads the live length from p.prefix_t and derives its chunk on the
    device, host and device plans alike); returns the compiled kernel. The tensor descriptors are built on first
    sight of q2 and kv; the first launch goes through Triton's JIT (compiling or finding the kernel for the plan's
    fixed shapes), later ones straight to the compiled kernel's launcher (the JIT's argument binding and cache
    lookup are most of an eager call's host time; the specialization cannot change within a plan: its integers
    are fixed and q2 and kv are 16-byte aligned). ``out``: the merge fused into the launch (a plan with a
    counter; the compiled kernel is kept per fused or not)."""
    from ._ws_tail import ws_tail_kernel

    cfg, (o_part, lse_part) = d.cfg, d.partials
    hq, dim = q2.shape
    key = (q2.data_ptr(), q2.stride(0), hq, kv.data_ptr(), kv.stride(0))
    descs = d.descs.get(key)
    if descs is None:  # Python work of tens of microseconds: kept with the tensors they point at
        if len(d.descs) >= MAX_DESCS:
            d.descs.clear()
        descs = d.descs[key] = _descs(q2, kv, p)
    grid, args, consts = tail_launch(descs, d.bits, o_part, lse_part, p, cfg, hq, dim, h, sm_scale, out,
                                     d.counter if out is not None else None, d.queue)
    role = "tail" if out is None else "tail_fused"
    k = d.compiled.get(role)
    if k is None:
        k = d.compiled[role] = ws_tail_kernel[grid](*args, **consts, num_warps=4)
    else:  # every argument, the constexprs included, in the kernel's order (what the JIT hands the launcher)
        k[grid](*args, *(consts[n] for n in ws_tail_kernel.arg_names[len(args):]), stream=_cu.stream_of(d.index))
    return k


def check_inputs(q: torch.Tensor, kv: torch.Tensor, p: VerifyPlan) -> WsPlan:
    """The plan's WsPlan for these inputs (completed for q's heads when the plan was built without heads); a
    one-line ValueError when the plan does not match them. The common case is one tuple comparison."""
    d = p.detail
    if not isinstance(d, WsPlan):
        raise ValueError("plan was not built by split_ws.plan")
    if d.heads is None:
        check_run_args(q, kv, p)
        if kv.dtype != q.dtype or kv.device != q.device:
            raise ValueError(f"the {name} path needs q and kv of one dtype on one device, got q {q.dtype} on "
                             f"{q.device} and kv {kv.dtype} on {kv.device}")
        _check_kv_rows(kv)
        return _complete(p, d, q.shape[1], q.dtype, q.shape[2] - p.v_dim)
    qs, ks = q.shape, kv.shape
    if len(qs) != 3 or len(ks) != 2 \
            or (qs[0], qs[1], qs[2], ks[1], q.dtype, kv.dtype, q.get_device(), kv.get_device()) != d.signature \
            or ks[0] < p.prefix_len + qs[0]:
        check_run_args(q, kv, p)
        raise ValueError(f"the {name} plan was built for {d.heads} heads of {d.dtype} rows {p.v_dim} + 64 wide on "
                         f"{d.bits.device}; got q {tuple(q.shape)} {q.dtype} on {q.device} and kv {kv.dtype} on "
                         f"{kv.device}")
    _check_kv_rows(kv)
    return d


def _check_kv_rows(kv: torch.Tensor) -> None:
    if kv.data_ptr() % 16 or (kv.stride(0) * kv.element_size()) % 16 or kv.stride(1) != 1:
        raise ValueError(f"the {name} path needs 16-byte aligned kv rows with unit column stride")


def launch_prefix(q: torch.Tensor, kv: torch.Tensor, p: VerifyPlan, sm_scale: float, meta: dict | None = None,
                  d: WsPlan | None = None, out: torch.Tensor | None = None):
    """Check the inputs (unless ``d``, the WsPlan check_inputs gave for them, is passed) and launch the prefix
    kernel; returns (WsPlan, number of prefix partials n): the merge combines partials 0 .. n - 1 with the tree
    part's at index n. ``out`` (the tail kernel of a fused plan only): the merge runs inside the launch."""
    d = check_inputs(q, kv, p) if d is None else d
    if out is not None and d.counter is None:
        raise ValueError(f"the {name} plan's prefix kernel does not merge inside its launch (WsTuning.tail_fuse 1 on "
                         f"the tail kernel, in one wave, does)")
    r, h, dim = q.shape
    q2 = q.reshape(r * h, dim)  # row hq = r * H + h
    if q2.stride(1) != 1 or (q2.stride(0) * q2.element_size()) % 16 or q2.data_ptr() % 16:
        q2 = q2.contiguous()
    if d.kernel == "cuda":
        if sm_scale <= 0:
            raise ValueError(f"the {name} CUDA kernel needs a positive softmax scale, got {sm_scale}")
        dev = q.device.index
        if dev == torch.cuda.current_device():
            info = d.launcher(q2, kv, sm_scale * LOG2E, _cu.stream_of(dev))
        else:
            with torch.cuda.device(dev):
                info = d.launcher(q2, kv, sm_scale * LOG2E, _cu.stream_of(dev))
    elif d.index == torch.cuda.current_device():
        k = _launch_tail(q2, kv, p, d, sm_scale, h, out)
        info = kernel_meta(k) if meta is not None else None
    else:
        with torch.cuda.device(d.index):
            k = _launch_tail(q2, kv, p, d, sm_scale, h, out)
        info = kernel_meta(k) if meta is not None else None
    if meta is not None:
        meta["prefix"] = info
    return d, d.cfg["grid_splits"] - 1


def launch_merge(parts, n_splits: int, out: torch.Tensor, p: VerifyPlan, meta: dict | None = None) -> torch.Tensor:
    """The log-sum-exp merge of the partials into out [R, H, v_dim]: the plan's CUDA merge when it was built for
    these heads (and ``out`` is one it can write), else the Triton merge (merge.launch_merge) with the plan's
    config or merge_plan's for these heads."""
    r, h, _ = out.shape
    d = p.detail
    if d.heads == h and d.merger is not None and parts is d.partials and _cuda_out(out, d, r):
        return _cuda_merge(d, out, meta)
    mc = d.merge if d.heads == h else merge_plan(p.tuning, r * h, p.v_dim, d.sm_count, p.prefix_len)
    return launch_triton_merge(parts, n_splits, out, mc, meta=meta)


def _cuda_out(out: torch.Tensor, d: WsPlan, r: int) -> bool:
    """Whether the CUDA merge can write ``out``: the plan's dtype, rows, heads and device, 512 values of unit stride,
    strides of whole 4-value groups and an 8-byte aligned start (it stores 4 16-bit values at a time)."""
    return (out.dtype == d.dtype and tuple(out.shape) == (r, d.heads, 512) and out.stride(2) == 1
            and not out.stride(0) % 4 and not out.stride(1) % 4 and not out.data_ptr() % 8
            and out.device == d.bits.device)


def _cuda_merge(d: WsPlan, out: torch.Tensor, meta: dict | None) -> torch.Tensor:
    dev = out.device.index
    if dev == torch.cuda.current_device():
        info = d.merger(out, _cu.stream_of(dev))
    else:
        with torch.cuda.device(dev):
            info = d.merger(out, _cu.stream_of(dev))
    if meta is not None:
        meta["merge"] = info
    return out


def run(q: torch.Tensor, kv: torch.Tensor, p: VerifyPlan, sm_scale: float, *, meta: dict | None = None) -> torch.Tensor:
    """q [R, H, D], kv [rows, D] contiguous layout -> out [R, H, v_dim] in q's dtype. ``meta``: a dict
    to receive the compiled kernels' reports under "prefix" and "merge"."""
    d = check_inputs(q, kv, p)
    if d.merger is not None and d.kernel == "cuda" and sm_scale > 0 and meta is None and q.is_contiguous() \
            and not q.data_ptr() % 16 \
            and d.index == torch.cuda.current_device():
        # the common case, both kernels in CUDA: one driver launch (the merge fused) or two on the plan's
        # parameter blocks
        stream = _cu.stream_of(d.index)
        out = torch.empty(q.shape[0], q.shape[1], p.v_dim, dtype=q.dtype, device=q.device)
        if d.fused:
            d.launcher(q, kv, sm_scale * LOG2E, stream, out)
        else:
            d.launcher(q, kv, sm_scale * LOG2E, stream)
            d.merger(out, stream)
        return out
    out = torch.empty(q.shape[0], q.shape[1], p.v_dim, dtype=q.dtype, device=q.device)
    if d.counter is not None:  # the tail kernel with its merge inside its launch
        launch_prefix(q, kv, p, sm_scale, meta, d, out)
        if meta is not None:
            meta["merge"] = {"merge": "fused", "partials": d.cfg["grid_splits"]}
        return out
    d, n_splits = launch_prefix(q, kv, p, sm_scale, meta, d)
    if d.merger is not None:
        return _cuda_merge(d, out, meta)
    return launch_triton_merge(d.partials, n_splits, out, d.merge, meta=meta)
