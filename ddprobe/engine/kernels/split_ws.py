"""`split_ws`: `split`'s algorithm with a warp-specialized Gluon prefix kernel (Hopper only).

Same seam, layout and results as `split` (the contiguous layout: prefix rows 0..P-1, then the R new rows):
  1. ``_ws_gluon.ws_prefix_kernel``, grid (cdiv(Hq, 64), splits + 1): per 64 folded query rows and chunk of
     the prefix, a TMA loader warp feeding a ring of KV stages, warpgroup 0 doing S and the softmax and half
     of P V, warpgroup 1 the other half of P V (see that module). The last split index is the tree part.
     65-72 folded rows (8 heads x 9) from TAIL_MIN_PREFIX tokens: ``_ws_tail.ws_tail_kernel``, one program of
     64 + 8 rows per chunk (the 8 with KV tokens on the MMA's M side, on warpgroup 1), twice the splits.
     With the tree folded and at least BALANCE_MIN_TILES tiles a program (64 heads from 32k), the balanced grid
     (WsTuning.balance): one program per SM, full chunks cut at the same tiles in every row block plus spare
     programs sharing the remainders; a spare program's share may cover pieces of several row blocks
     (``_ws_gluon._piece``).
     From CUDA_MIN_ROW_BLOCKS row blocks up (64 heads x 9 rows: 9) the prefix kernel is the CUDA C++ seesaw
     instead (WsTuning.cuda, cuda/seesaw_sm90.cu through _cu.py: FlashMLA's schedule, no producer warp, on the
     same grids given as a work list of pieces, cu_pieces); it writes the same partials.
  2. The log-sum-exp merge of the partials (`split`'s buffers and layout): ``_merge_flat_kernel`` by default
     (all lse values first, then the partials with no rescale chain; 1.2x faster than `split`'s
     ``_merge_kernel`` at 8 heads and 1.8-4.2x from 16 heads up on the H200), `split`'s own as ``merge_kind=0``;
     with ``WsTuning.pdl`` launched as a programmatic dependent of step 1 (measured: no gain, off by default).
It needs an sm_90 GPU (wgmma, TMA, mbarriers), bf16 or fp16 q and kv, 16-byte aligned rows, and the
MLA widths the kernel is written for (v_dim 512, rope 64, rope a power of two); anything else is a one-line
ValueError. There is no interpreter path: Gluon does not run under TRITON_INTERPRET; `split` is the
CPU-tested path with the same results, and tests/test_kernels_gpu.py checks this one on the GPU.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton

from ._common import check_dims, check_rows, interpreting, kernel_meta, sm_count
from .plan import VerifyPlan, check_diagonal, check_plan_args, check_run_args, split_prefix_arg
from .split import LOG2E, _partials, mask_bits, merge_config
from .split import launch_merge as split_launch_merge

name = "split_ws"
layout = "contiguous"

BLOCK_M = 64     # query rows per program (one warpgroup's wgmma M)
BLOCK_N = 64     # KV tokens per tile
TAIL = 8         # rows beyond 64 that the _ws_tail kernel takes on warpgroup 1 (shared memory allows 8: 232,384 B)
TAIL_MIN_PREFIX = 49152  # WsTuning.tail = -1 uses it from here (H200, 8 heads: 2% faster at 48k, 4% slower at 32k)
TAIL_MERGE_ROWS = 8      # merge rows per program behind it (129 partials: 8.0 us against 10.0 with 16)
CUDA_MIN_ROW_BLOCKS = 4  # WsTuning.cuda = -1 runs the CUDA kernel from this many 64-row blocks (hq > 192) up
BALANCE_MIN_TILES = 16  # WsTuning.balance = -1 balances from this many prefix tiles per program up (H200, 64 heads:
                        # faster from 32k, 1.5% slower at 8k: 9 tiles a program)
STAGES = 2       # KV ring depth: Q 72 KB + 2 x 72 KB of tiles + P 8 KB fill the 227 KB of shared memory
PV_REGS = 232    # registers per thread of warpgroup 1 (setmaxnreg)
LOAD_REGS = 40   # registers per thread of the loader warp


@dataclass(frozen=True)
class WsTuning:
    """Knobs of the Gluon prefix kernel, fixed per plan."""

    pipe: int = 3       # warpgroup 0's schedule: 0 S, softmax, P V strictly in order, P and alpha handed to
                        # warpgroup 1 through the p_ready / p_free mbarriers; 3 (default): 0 with that hand-off on a
                        # named barrier (bar.arrive in warpgroup 0, bar.sync in warpgroup 1) and p_free folded into
                        # kv_free (H200: 1-2% faster at 64 heads, 0-1% at 8 heads); 1 S of tile i + 1 issued
                        # before the softmax of tile i (1.5x slower; with a 2-stage ring that tile is likely still in
                        # flight then, docs/perf.md);
                        # 2 S of tile i + 1 issued right behind P V of tile i (1-10% slower)
    balance: int = -1   # 1: one wave of `programs` programs (one per SM): chunks of cdiv(row blocks x tiles,
                        # programs) tiles cut at the same tiles in every row block, one program each, and the spare
                        # programs sharing the row blocks' remainders, a share crossing row blocks split into one
                        # piece per row block (_ws_gluon._piece; the tree folded into each row block's last piece);
                        # 64 heads at 128k: 140 tiles a program instead of 147 (9 x 14 programs on 132 SMs, as
                        # FlashMLA's grid); H200, two runs: 32k 0.6-1.2%, 64k 3.0-3.5%, 128k 1.2-5.0% faster (an
                        # even share of every row block's tiles, not cut at the same tiles, was 0-9% slower: the row
                        # blocks stop sharing tiles in L2); the tree is always folded (fold_tree is then unused);
                        # 0: row blocks x splits (choose_config); -1: 1 with pipe 3, no seesaw or tail kernel, the
                        # tree folded and at least BALANCE_MIN_TILES tiles a program
    programs: int = 0   # programs of the balanced grid (0: one per SM)
    ffma: int = 1       # 1 (default): the softmax scale inside the exponent, p = 2^(s c - m) as one FFMA per score
                        # (needs c > 0, so max(s) c = max(s c); a scale <= 0 runs the FMUL path)
                        # (pipe 0 / 3; 65 fewer instructions a tile in warpgroup 0's loop; H200: 0.2-1.6% faster at
                        # 64 heads from 32k, within 0.1 us elsewhere); 0: s scaled first (FMUL), then s - m (FADD)
    min_chunk: int = 64  # fewest prefix tokens per split
    fold_tree: int = -1  # 1: the last prefix split also attends the R tree columns (no program of its own);
                         # 0: the tree part is one more program per row block; -1: fold from 4 row blocks up
                         # (64 heads: one split more, 6% faster at 128k; 8 heads: the longer last split
                         # costs more than the 2 programs it saves, 1-14% slower; docs/perf.md round 4);
                         # -1 also folds behind the tail kernel (8 heads from 48k: 1.0 us faster at 64k-128k)
    seesaw: int = 0     # 1: FlashMLA's seesaw schedule (_ws_gluon.ws_seesaw_kernel): both warpgroups compute S
                        # for alternate tiles and P V of every tile on their own half of the columns; 2: the
                        # same, warpgroup 0 issuing S of its next tile behind its last P V (1 and 2: correct,
                        # 2-29% slower than 0 on the H200; docs/perf.md round 4); 3: tiles loaded and S issued
                        # in 64-column pieces (FlashMLA's granularity); 4: 3 with warpgroup 1 issuing P0 V0_R
                        # before P1 V1_R (3 and 4: correct on the H200, 5-16% slower than 1); `pipe` is then unused
                        # (a fifth, with no loader warp and consumer-issued TMA per piece, is on the branch seesaw5:
                        # correct, 1-65% slower; docs/perf.md, eighth session)
    merge_kind: int = -1    # the merge of the partials: 0 split's online merge (a running maximum, partials in
                            # steps of merge_split_chunk); 1 _merge_flat_kernel (the maximum of all lse first, then
                            # partials in steps with no rescale chain); 2: 1 with each step as unrolled per-thread 2-D
                            # loads; 3: 1 summing over the partials once, after the loop; -1: 3 up to 128 folded rows,
                            # else 1 (H200, 2026-12-01: 8 heads 128k 7.9 -> 6.4 us, 64 heads 25.3 -> 6.0 us; perf.md)
    merge_block_m: int = 0      # folded rows per merge program (0: the kind's preset, split.MERGE_PRESETS)
    merge_split_chunk: int = 0  # partials per step of the merge's loop (0: preset)
    merge_stages: int = 0       # software-pipeline depth of that loop (0: preset)
    merge_warps: int = 4        # warps per merge program
    merge_bv: int = 0           # value columns per merge program (0: halve 512 until the grid fills the SMs)
    pdl: int = 0                            # 1: launch the merge as a programmatic dependent of the prefix kernel
                                            # (griddepcontrol: its launch overlaps the prefix kernel's tail);
                                            # 2: also trigger it from the prefix kernel's start (not seesaw), so
                                            # its programs wait on the SMs the prefix grid leaves or frees
    cuda: int = -1      # 1: the prefix kernel is the CUDA C++ seesaw (cuda/seesaw_sm90.cu, a prebuilt cubin launched
                        # through the driver API, _cu.py): FlashMLA's schedule with no producer warp, each warpgroup
                        # refilling by TMA the 64-column pieces it read last, named barriers for every hand-off;
                        # the same grids (the balanced one as `balance` says; no tail kernel) as a work list of
                        # pieces (cu_pieces); needs a positive softmax scale; 0: the Gluon kernels; -1 (default):
                        # 1 from CUDA_MIN_ROW_BLOCKS row blocks up with seesaw 0 and a positive scale (H200, 64
                        # heads: 0.96-1.01x FlashMLA's time from 32k, 0.87x at 8k; the Gluon kernels stay faster
                        # at 8 heads, where the tail kernel runs; docs/perf.md, 2026-12-02)
    tail: int = -1      # 65-72 folded query rows (8 heads x 9) in ONE program per chunk (_ws_tail.ws_tail_kernel):
                        # rows 0..63 as usual, the 8 others with KV tokens on the MMA's M side on warpgroup 1, so
                        # twice the splits of the two-program grid, each half as long; 1 always, 0 never, -1 from
                        # TAIL_MIN_PREFIX tokens of prefix (the plan's bound) up; other row counts: unused


DEFAULT_TUNING = WsTuning()
_CHOICES = {"pipe": (0, 1, 2, 3), "seesaw": (0, 1, 2, 3, 4), "balance": (-1, 0, 1), "ffma": (0, 1),
            "fold_tree": (-1, 0, 1), "tail": (-1, 0, 1), "pdl": (0, 1, 2), "merge_kind": (-1, 0, 1, 2, 3), "cuda": (-1, 0, 1)}


def check_tuning(t: WsTuning) -> None:
    """One-line ValueError for a schedule knob outside the kernels' choices (a value no kernel implements would
    otherwise run some other schedule silently)."""
    for field, allowed in _CHOICES.items():
        if getattr(t, field) not in allowed:
            raise ValueError(f"WsTuning.{field} must be one of {', '.join(map(str, allowed))}, got {getattr(t, field)}")
    if t.cuda == 1 and (t.seesaw or t.tail == 1):
        raise ValueError("WsTuning.cuda=1 is the CUDA seesaw on 64-row blocks; it cannot run with a Gluon seesaw "
                         f"or the tail kernel (seesaw={t.seesaw}, tail={t.tail})")
    if t.programs < 0:
        raise ValueError(f"WsTuning.programs must be >= 0 (0: one per SM), got {t.programs}")


def tails(hq: int, t: WsTuning, prefix_len: int) -> bool:
    """Whether ``t`` runs hq folded rows as one program of 64 + TAIL rows (the _ws_tail kernel) for a plan
    bound of ``prefix_len`` tokens."""
    if t.seesaw or t.cuda == 1 or not BLOCK_M < hq <= BLOCK_M + TAIL:
        return False
    return prefix_len >= TAIL_MIN_PREFIX if t.tail < 0 else bool(t.tail)


def block_rows(hq: int, t: WsTuning, prefix_len: int) -> int:
    """Folded query rows per program: 64 (the default kernel), or 72 with the tail kernel (65-72 rows)."""
    return BLOCK_M + TAIL if tails(hq, t, prefix_len) else BLOCK_M


def uses_cuda(hq: int, t: WsTuning) -> bool:
    """Whether tuning ``t`` runs the CUDA prefix kernel for hq folded rows (before the scale's sign is known)."""
    if t.seesaw or t.cuda == 0:
        return False
    return t.cuda == 1 or triton.cdiv(hq, BLOCK_M) >= CUDA_MIN_ROW_BLOCKS


def supported(q: torch.Tensor, kv: torch.Tensor, v_dim: int) -> str | None:
    """None when this path can run these tensors, else the reason (one line)."""
    if interpreting():
        return "Gluon kernels do not run under TRITON_INTERPRET (use 'split' there)"
    if not (q.is_cuda and torch.cuda.get_device_capability(q.device) == (9, 0)):
        return "needs an sm_90 GPU (H100/H200: wgmma, TMA, mbarriers)"
    if q.dtype not in (torch.bfloat16, torch.float16):
        return f"needs bf16 or fp16 q and kv, got {q.dtype}"
    if v_dim != 512 or q.shape[2] - v_dim != 64:
        return f"is written for MLA rows of 512 + 64, got {v_dim} + {q.shape[2] - v_dim}"
    if kv.data_ptr() % 16 or (kv.stride(0) * kv.element_size()) % 16:
        return "needs 16-byte aligned kv rows"
    return None


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


def _balanced_grid(n_qb: int, tiles: int, programs: int) -> tuple[int, int, int, int]:
    """(P, F, nf, programs launched): chunks of P = cdiv(n_qb tiles, programs) tiles, F full ones per row block
    taken by nf = n_qb F programs, the rest of the programs (at most one per remaining tile) sharing the
    remainders."""
    w = n_qb * tiles
    pt = -(-w // programs)
    f = tiles // pt
    nf = n_qb * f
    return pt, f, nf, nf + min(programs - nf, n_qb * (tiles - f * pt))


def pieces(n_qb: int, tiles: int, programs: int) -> list[list[tuple[int, int, int, int]]]:
    """Host mirror of _ws_gluon._piece with BALANCE: per launched program, its pieces as (row block, first tile,
    end tile, slot), slot -1 standing for the row block's last slot (the one that also takes the tree columns)."""
    pt, f, nf, g_all = _balanced_grid(n_qb, tiles, programs)
    rt = tiles - f * pt
    ns, wt = max(g_all - nf, 1), max(n_qb * rt, 1)
    out = []
    for g in range(g_all):
        if g < nf:
            a = (g // n_qb) * pt
            out.append([(g % n_qb, a, a + pt, -1 if a + pt == tiles else g // n_qb)])
            continue
        h = g - nf
        lo, hi = h * wt // ns, (h + 1) * wt // ns
        prog = []
        for rb in range(lo // rt, (hi - 1) // rt + 1):
            base = rb * rt
            a, b = f * pt + max(lo, base) - base, f * pt + min(hi, base + rt) - base
            prog.append((rb, a, b, -1 if b == tiles else f + h - ((base + 1) * ns - 1) // wt))
        out.append(prog)
    return out


def cu_pieces(cfg: dict, prefix_len: int, r: int) -> tuple[list[int], list[int]]:
    """The CUDA kernel's work list (WsTuning.cuda) for a config of this module: per program of its 1-D grid, its
    pieces as (row block, first column, end column, partial slot, fill_lo, fill_hi), the slots [fill_lo, fill_hi)
    being those of the piece's row block that no piece writes (lse -inf for the merge; set by the row block's
    last piece). The row-block x split grid gives one piece per program, program = slot x row blocks + row block
    (the row blocks of a split side by side, so they read its tiles from L2 at about the same time); the balanced
    grid gives `pieces`'s. Returns (piece_ptr [programs + 1], the pieces flattened)."""
    n_qb, gs = cfg["n_qb"], cfg["grid_splits"]
    progs: list[list[list[int]]] = []
    if cfg.get("balance"):
        raw = pieces(n_qb, cfg["tiles"], cfg["programs"])
        used: list[set[int]] = [set() for _ in range(n_qb)]
        for prog in raw:
            for rb, _, _, slot in prog:
                used[rb].add(gs - 1 if slot < 0 else slot)
        for prog in raw:
            out = []
            for rb, a, b, slot in prog:
                if slot < 0:  # the row block's last piece: the tree columns, the last slot, the unused slots
                    lo = max((x for x in used[rb] if x != gs - 1), default=-1) + 1
                    out.append([rb, a * BLOCK_N, prefix_len + r, gs - 1, lo, gs - 1])
                else:
                    out.append([rb, a * BLOCK_N, b * BLOCK_N, slot, 0, 0])
            progs.append(out)
    else:
        chunk, fold = cfg["chunk"], cfg["fold"]
        for slot in range(gs):
            last = slot == gs - 1
            start = prefix_len if last and not fold else slot * chunk
            end = prefix_len + r if last else min(slot * chunk + chunk, prefix_len)
            progs.extend([[rb, start, end, slot, 0, 0]] for rb in range(n_qb))
    ptr, flat = [0], []
    for prog in progs:
        flat.extend(x for pc in prog for x in pc)
        ptr.append(ptr[-1] + len(prog))
    return ptr, flat


def cu_table(cfg: dict, prefix_len: int, r: int, device) -> tuple[torch.Tensor, torch.Tensor, tuple]:
    """cu_pieces as the int32 device tensors the CUDA kernel reads (piece_ptr, pieces [n, 6]), and their pinned
    host source. The copy does not block, so a table first needed inside a CUDA-graph capture is captured as a
    copy node; the host tensors stay with the table, so every replay copies the same values."""
    ptr, flat = cu_pieces(cfg, prefix_len, r)
    device = torch.device(device)
    host = (torch.tensor(ptr, dtype=torch.int32), torch.tensor(flat, dtype=torch.int32).view(-1, 6))
    if device.type == "cuda":
        host = tuple(h.pin_memory() for h in host)
    return host[0].to(device, non_blocking=True), host[1].to(device, non_blocking=True), host


def balanced_config(prefix_len: int, hq: int, sms: int, programs: int = 0) -> dict:
    """The balanced grid (WsTuning.balance) for ``programs`` (0: sms) programs, at most one per tile, over n_qb
    row blocks x cdiv(prefix_len, 64) tiles (_ws_gluon._piece): ``chunk`` = the full chunks' tokens,
    ``programs`` = programs launched, ``grid_splits`` = slots per row block (the most pieces a row block has)."""
    n_qb = triton.cdiv(hq, BLOCK_M)
    tiles = triton.cdiv(prefix_len, BLOCK_N)
    pt, f, nf, g_all = _balanced_grid(n_qb, tiles, min(programs or sms, n_qb * tiles))
    rt = tiles - f * pt
    ns, wt = max(g_all - nf, 1), max(n_qb * rt, 1)
    # a row block's pieces: its f full chunks, plus the sharing programs its remainder meets (first to last, as
    # _piece numbers them): O(row blocks) per plan, no walk over the programs
    slots = f + max((((rb + 1) * rt * ns - 1) // wt - ((rb * rt + 1) * ns - 1) // wt + 1 for rb in range(n_qb))
                    if rt else [0])
    return dict(n_qb=n_qb, num_splits=slots, chunk=pt * BLOCK_N, grid_splits=slots, fold=1,
                balance=True, tiles=tiles, programs=g_all)


def balances(prefix_len: int, hq: int, sms: int, t: WsTuning) -> bool:
    """Whether tuning ``t`` runs the balanced grid for this plan (WsTuning.balance)."""
    if t.balance == 0 or prefix_len == 0 or t.seesaw or tails(hq, t, prefix_len):
        return False
    if t.pipe != 3:
        if t.balance == 1:
            raise ValueError(f"WsTuning.balance=1 needs pipe 3 (the default), got pipe {t.pipe}")
        return False
    if t.balance == 1:
        return True
    n_qb = triton.cdiv(hq, BLOCK_M)
    return folds(n_qb, t.fold_tree) and n_qb * triton.cdiv(prefix_len, BLOCK_N) >= BALANCE_MIN_TILES * sms


def config(prefix_len: int, hq: int, sms: int, t: WsTuning) -> dict:
    """choose_config for tuning ``t`` (its row-block size, chunk floor and tree placement), with block_q and
    whether the tail kernel runs; balanced_config where ``t`` balances."""
    if balances(prefix_len, hq, sms, t):
        return dict(balanced_config(prefix_len, hq, sms, t.programs), block_q=BLOCK_M, tail=False)
    tail = tails(hq, t, prefix_len)
    fold = 1 if tail and t.fold_tree < 0 else t.fold_tree  # behind the tail kernel, fold by default (1-2% faster)
    bq = block_rows(hq, t, prefix_len)
    return dict(choose_config(prefix_len, hq, sms, t.min_chunk, fold, bq), block_q=bq, tail=tail)


def plan(prefix_len, tree_mask: torch.Tensor, slots: torch.Tensor | None = None, v_dim: int = 512, *,
         tuning=None, heads: int | None = None, max_prefix: int | None = None) -> VerifyPlan:
    """Per-step metadata (as `split`): the ancestor bitmask on the device, the SM count; with ``heads``
    also the split config and the partial buffers (else run() derives them per call). Host plans only:
    the Gluon kernel takes the prefix length as a launch argument."""
    tuning = DEFAULT_TUNING if tuning is None else tuning
    if not isinstance(tuning, WsTuning):
        raise ValueError(f"the split_ws path takes a WsTuning, got {type(tuning).__name__}")
    check_tuning(tuning)
    if isinstance(prefix_len, torch.Tensor) or max_prefix is not None:
        raise ValueError("the split_ws path takes a host prefix length (an int), not a device plan")
    dev = tree_mask.device
    bound, prefix_t, _ = split_prefix_arg(prefix_len, None, dev)
    check_plan_args(bound, tree_mask, slots)
    if slots is not None:
        raise ValueError("the split_ws path reads the contiguous layout (slots=None)")
    check_diagonal(tree_mask)
    r = int(tree_mask.shape[0])
    check_rows(r, name)
    extra = {"path": name, "bits": mask_bits(tree_mask), "sm_count": sm_count(dev)}
    if heads is not None:
        extra["heads"] = heads
        extra["config"] = cfg = config(bound, heads * r, extra["sm_count"], tuning)
        extra["partials"] = _partials(cfg["grid_splits"] - 1, heads * r, v_dim, dev)
        extra["merge"] = merge_plan(tuning, heads * r, v_dim, extra["sm_count"], bound)
        if uses_cuda(heads * r, tuning) and dev.type == "cuda":  # the work list, built before any graph capture
            extra["cu_pieces"] = cu_table(cfg, bound, r, dev)
    return VerifyPlan(prefix_len=bound, tree_mask=tree_mask, slots=None, v_dim=v_dim, prefix_t=prefix_t,
                      tuning=tuning, extra=extra)


def refresh(p: VerifyPlan) -> None:
    """Rebuild the bitmask from tree_mask after the caller rewrote it in place."""
    p.extra["bits"].copy_(mask_bits(p.tree_mask))


def _descs(q2: torch.Tensor, kv: torch.Tensor, p: VerifyPlan, seesaw: int = 0, tail: bool = False):
    """Tensor descriptors: Q in 64-row blocks (latent, rope), the KV tiles (latent, rope), and with ``tail`` the
    Q tail's TAIL-row blocks after them."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    dt = gl.bfloat16 if kv.dtype == torch.bfloat16 else gl.float16
    v, pe = p.v_dim, kv.shape[1] - p.v_dim
    rows = p.num_cols  # rows past the prefix and the tree read as zeros

    def desc(t, shape, block):
        return TensorDescriptor(t, shape, [t.stride(0), 1], block, gl.NVMMASharedLayout.get_default_for(block, dt))
    kv_w = (64 if seesaw >= 3 else v // 2) if seesaw else v  # seesaw: a tile's latent in halves or 64-col pieces
    hq = q2.shape[0]
    out = (desc(q2, [hq, v], [BLOCK_M, v]), desc(q2[:, v:], [hq, pe], [BLOCK_M, pe]),
           desc(kv, [rows, v], [BLOCK_N, kv_w]), desc(kv[:, v:], [rows, pe], [BLOCK_N, pe]))
    return out + (desc(q2, [hq, v], [TAIL, v]), desc(q2[:, v:], [hq, pe], [TAIL, pe])) if tail else out


def launch_prefix(q: torch.Tensor, kv: torch.Tensor, p: VerifyPlan, sm_scale: float, meta: dict | None = None):
    """Check the inputs and launch the prefix kernel; returns (partials, number of prefix partials n):
    the merge combines partials 0 .. n - 1 with the tree part's at index n."""
    check_run_args(q, kv, p)
    check_dims(q, kv, p.v_dim, name)
    if p.extra.get("path") != name:
        raise ValueError("plan was not built by split_ws.plan")
    why = supported(q, kv, p.v_dim)
    if why:
        raise ValueError(f"the {name} path {why}")
    from ._ws_gluon import ws_prefix_kernel, ws_seesaw_kernel  # Gluon: imported only where it can run

    r, h, d = q.shape
    hq = r * h
    planned = p.extra.get("heads") == h and p.extra["partials"][0].device == q.device
    t = p.tuning
    cfg = p.extra["config"] if planned else config(p.prefix_len, hq, p.extra["sm_count"], t)
    gs = cfg["grid_splits"]  # partials 0 .. gs - 1; the merge starts from the last (finite lse: the tree columns)
    parts = p.extra["partials"] if planned else _partials(gs - 1, hq, p.v_dim, q.device)
    o_part, lse_part = parts
    q2 = q.reshape(hq, d)  # row hq = r * H + h
    if q2.stride(1) != 1 or (q2.stride(0) * q2.element_size()) % 16 or q2.data_ptr() % 16:
        q2 = q2.contiguous()
    if uses_cuda(hq, t) and (t.cuda == 1 or sm_scale > 0):
        if sm_scale <= 0:
            raise ValueError(f"WsTuning.cuda=1 needs a positive softmax scale, got {sm_scale}")
        from . import _cu
        table = p.extra.get("cu_pieces") if planned else None
        if table is None:  # a plan built without these heads: one work list per (rows, device), kept by the plan
            key = (hq, q.device.index)
            tables = p.extra.setdefault("cu_tables", {})
            if key not in tables:
                tables[key] = cu_table(cfg, p.prefix_len, r, q.device)
            table = tables[key]
        try:
            info = _cu.launch_seesaw(q2, kv, p.num_cols, p.extra["bits"], table[0], table[1], o_part, lse_part,
                                     p.prefix_len, h, sm_scale * LOG2E)
        except _cu.LoadError as e:  # no usable cubin here (_cu remembers it): cuda=-1 falls back to the Gluon
            if t.cuda == 1:         # kernel on the same grid; Python shows the repeated warning once
                raise
            import warnings
            warnings.warn(f"split_ws: the CUDA prefix kernel is unavailable ({e}); using the Gluon kernel",
                          RuntimeWarning, stacklevel=2)
        else:
            if meta is not None:
                meta["prefix"] = info
            return parts, gs - 1
    qd_lat, qd_pe, kd_lat, kd_pe, *q_tail = _descs(q2, kv, p, t.seesaw, cfg["tail"])
    args = (qd_lat, qd_pe, kd_lat, kd_pe, p.extra["bits"], o_part, lse_part, o_part.stride(0), o_part.stride(1),
            p.prefix_len, r, cfg["chunk"], hq, h, sm_scale * LOG2E)
    if cfg["tail"]:
        from ._ws_tail import ws_tail_kernel
        qt_lat, qt_pe = q_tail
        k = ws_tail_kernel[(cfg["n_qb"], gs)](
            qd_lat, qd_pe, qt_lat, qt_pe, *args[2:], BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, V_DIM=p.v_dim,
            PE_DIM=d - p.v_dim, TAIL=TAIL, PV_REGS=PV_REGS, LOAD_REGS=LOAD_REGS, FOLD=cfg["fold"], num_warps=4,
        )
    elif t.seesaw:
        k = ws_seesaw_kernel[(cfg["n_qb"], gs)](
            *args, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, V_DIM=p.v_dim, PE_DIM=d - p.v_dim,
            PV_REGS=PV_REGS, LOAD_REGS=LOAD_REGS, FOLD=cfg["fold"], SEESAW=t.seesaw, num_warps=4,
        )
    else:
        bal = cfg.get("balance", False)
        k = ws_prefix_kernel[(cfg["programs"], 1) if bal else (cfg["n_qb"], gs)](
            *args, cfg.get("tiles", 0), cfg.get("programs", 0), gs, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, V_DIM=p.v_dim,
            PE_DIM=d - p.v_dim, STAGES=STAGES, PV_REGS=PV_REGS, LOAD_REGS=LOAD_REGS, PIPE=t.pipe, FOLD=cfg["fold"],
            TRIGGER=t.pdl >= 2, BALANCE=bal, FFMA=bool(t.ffma) and sm_scale > 0, num_warps=4,
        )
    if meta is not None:
        meta["prefix"] = kernel_meta(k)
    return parts, gs - 1


def merge_plan(t: WsTuning, hq: int, v_dim: int, sms: int, prefix_len: int) -> dict:
    """split.merge_config for this path: its prefix grid gives at most sms // (row blocks) partials; behind
    the tail kernel (twice the partials) the merge's programs take TAIL_MERGE_ROWS rows unless the tuning says;
    the balanced grid at most cdiv(sms, row blocks) + 1 with the tree's (S_MAX covers both, fixed per head count)."""
    if tails(hq, t, prefix_len) and not t.merge_block_m:
        t = replace(t, merge_block_m=TAIL_MERGE_ROWS)
    parts = sms // triton.cdiv(hq, block_rows(hq, t, prefix_len))
    if t.balance and not tails(hq, t, prefix_len):  # a row block meets at most cdiv(programs, n_qb) + 1 programs
        parts = max(parts, triton.cdiv(t.programs or sms, triton.cdiv(hq, BLOCK_M)))
    return merge_config(t, hq, v_dim, sms, parts)


def launch_merge(parts, n_splits: int, out: torch.Tensor, p: VerifyPlan, meta: dict | None = None) -> torch.Tensor:
    """The log-sum-exp merge of the partials into out [R, H, v_dim] (split.launch_merge, merge_config's kind)."""
    r, h, _ = out.shape
    mc = (p.extra["merge"] if p.extra.get("heads") == h
          else merge_plan(p.tuning, r * h, p.v_dim, p.extra["sm_count"], p.prefix_len))
    return split_launch_merge(parts, n_splits, out, mc, bool(p.tuning.pdl), meta)


def run(q: torch.Tensor, kv: torch.Tensor, p: VerifyPlan, sm_scale: float, *, meta: dict | None = None) -> torch.Tensor:
    """q [R, H, D], kv [rows, D] contiguous layout -> out [R, H, v_dim] in q's dtype. ``meta``: a dict
    to receive the compiled kernels' reports under "prefix" and "merge"."""
    parts, n_splits = launch_prefix(q, kv, p, sm_scale, meta)
    out = torch.empty(q.shape[0], q.shape[1], p.v_dim, dtype=q.dtype, device=q.device)
    return launch_merge(parts, n_splits, out, p, meta)
