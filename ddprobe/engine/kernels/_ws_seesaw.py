"""Gluon kernel of `split_ws` with ``WsTuning.seesaw = 5``: the seesaw with no loader warp.

The seesaw of ``_ws_gluon.ws_seesaw_kernel`` (both warpgroups compute S, for alternate tiles; each does the
softmax of its own tile and P V of both tiles of a pair on its 256 of the 512 output columns; one running
maximum chained through shared memory) rebuilt around the four things FlashMLA's sm90 dense decode kernel does
differently (deepseek-ai/FlashMLA ``csrc/sm90/decode/dense/splitkv_mla.cuh``, read, not copied):

- no producer warp: two partitions of one warpgroup each (256 threads). A KV tile arrives as nine 64-column
  pieces (latent 0-63, ..., 448-511, rope), each on its own ``ready`` mbarrier, and the warpgroup that reads a
  piece last issues its refill by TMA right after the wgmma that read it completes (no ``free`` barriers, no
  hop through a loader):

      stage 0 (even tiles): pieces 0-3 (V0_L) warpgroup 0 after P0 V0_L; pieces 4-8 (V0_R and the rope block,
                            which holds P0) warpgroup 1 after P0 V0_R
      stage 1 (odd tiles):  pieces 0-3 (V1_L) and 8 (the rope block, which holds P1) warpgroup 0 after P1 V1_L;
                            pieces 4-7 (V1_R) warpgroup 1 after P1 V1_R

- every hand-off between the warpgroups is a named barrier (``bar.arrive`` by the producer after its stores,
  ``bar.sync`` by the consumer; 256 threads each), three per pair: SC0 (P of tile 2j, its maximum m0 and the
  rescale factor sc0, 0 -> 1), SC1 (m1 and sc1 after tile 2j + 1, 1 -> 0), P1 (P of tile 2j + 1, 1 -> 0, arrived
  once warpgroup 1 has issued its P V). Each id is arrived once per pair and the other side's next arrive on it
  waits for a hand-off in the opposite direction, so no warpgroup can arrive twice on an id before the other has
  synced on it. m and the factors have one buffer per writer (m_s0 / sc0_s by warpgroup 0, m_s1 / sc1_s by
  warpgroup 1), so a reader is always one hand-off ahead of the next write.
- the chain between the two softmaxes is short: P0 goes over relative to m0 together with SC0 (not rescaled by
  sc1 afterwards, as in ws_seesaw_kernel and FlashMLA): warpgroup 1 applies sc1 to its accumulator instead,
  O_R = (O_R sc0 + P0 V0_R) sc1 + P1 V1_R, issuing P0 V0_R as soon as SC0 passes, under its own softmax; it takes
  its tile's row maximum before waiting on SC0, so only the combination with m0 is on the chain.
- every refill is issued as soon as its pieces' last reader is done (with two stages, the period of a pair is a
  copy's latency plus how long a stage is held after it lands: benchmarks/seesaw_trace.py measures both), and S
  is issued piece by piece, each 64-column K step as soon as its piece has landed, in the order the pieces are
  refilled: warpgroup 0 pieces 0-8 of its next tile once P1 V1_L is done and stage 1 refilled; warpgroup 1
  pieces 4-7, 0-3, 8.
- P goes where the tile's rope block was (dead once S of that tile is complete; a [64, 64] bf16 wgmma operand),
  as in ws_seesaw_kernel; FlashMLA keeps Q's rope block in registers for a second P buffer instead.

Per pair (j): warpgroup 0 O_L = (O_L sc0 + P0 V0_L) sc1 + P1 V1_L; warpgroup 1 O_R = (O_R sc0 + P0 V0_R) sc1 +
P1 V1_R; l0 = (l0 sc0 + sum P0) sc1, l1 = l1 sc0 sc1 + sum P1, both relative to the running maximum; at the
end l = l0 + l1 (FIN1: l1 to warpgroup 0, FIN0: 1 / l back). A split with an odd number of tiles ends with a lone
even tile: warpgroup 1 only rescales and adds P0 V0_R. Grid, split rule, tree folding and partials as
ws_prefix_kernel without BALANCE (``_ws_gluon._chunk_bounds``).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from ._ws_gluon import _chunk_bounds

# named barrier ids (Gluon's own partition barriers use the low ids), 256 threads each
SC0, SC1, P1, FIN1, FIN0 = 8, 9, 11, 12, 13
_ASM = {k: (gl.constexpr(f"bar.arrive {k}, 256; // $0"), gl.constexpr(f"bar.sync {k}, 256; // $0"))
        for k in (SC0, SC1, P1, FIN1, FIN0)}
A_SC0, S_SC0 = _ASM[SC0]
A_SC1, S_SC1 = _ASM[SC1]
A_P1, S_P1 = _ASM[P1]
A_FIN1, S_FIN1 = _ASM[FIN1]
A_FIN0, S_FIN0 = _ASM[FIN0]
PIECE = gl.constexpr(64)  # columns of a piece


@gluon.jit
def _bar(asm: gl.constexpr):
    gl.inline_asm_elementwise(asm, "=r", [], dtype=gl.int32, is_pure=False, pack=1)


TRACE_PAIRS = gl.constexpr(128)  # pairs per program and warpgroup that TRACE records
TRACE_EVENTS = gl.constexpr(8)   # stamps per pair


@gluon.jit
def _stamp(Trace, wg, j, e, TRACE: gl.constexpr):
    """TRACE (timing studies only, benchmarks/seesaw_trace.py): the SM's cycle counter at event e of pair j of
    warpgroup wg, into Trace[program, wg, j, e] (int64)."""
    if TRACE:
        if j < TRACE_PAIRS:
            t = gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)
            pid = gl.program_id(0) * gl.num_programs(1) + gl.program_id(1)
            gl.store(Trace + ((pid * 2 + wg) * TRACE_PAIRS + j) * TRACE_EVENTS + e, t)


@gluon.jit
def _refill(kh_d, k_pe_d, ka_q, kb_q, kc_s, ready, st, n0, LO: gl.constexpr, HI: gl.constexpr):
    """TMA pieces LO .. HI - 1 of the tile starting at token n0 into stage st (pieces 0-3: latent columns
    0-255 in ka_q, 4-7: 256-511 in kb_q, 8: the rope block in kc_s), each completing its own ready barrier."""
    NP: gl.constexpr = ka_q.shape[0] // 2
    for k in gl.static_range(LO, HI):
        bar = ready[st * (2 * NP + 1) + k]
        if k < 2 * NP:
            mbarrier.expect(bar, kh_d.block_type.nbytes)
            if k < NP:
                tma.async_copy_global_to_shared(kh_d, [n0, k * PIECE], bar, ka_q.index(st * NP + k))
            else:
                tma.async_copy_global_to_shared(kh_d, [n0, k * PIECE], bar, kb_q.index(st * NP + k - NP))
        else:
            mbarrier.expect(bar, k_pe_d.block_type.nbytes)
            tma.async_copy_global_to_shared(k_pe_d, [n0, 0], bar, kc_s.index(st))


@gluon.jit
def _s_pieces(q_lat_s, q_pe_s, ka_q, kb_q, kc_s, ready, st, ph, s, LO: gl.constexpr, HI: gl.constexpr,
              FIRST: gl.constexpr):
    """Issue the K steps of S for pieces LO .. HI - 1 of stage st (phase ph), each once its piece has landed;
    FIRST: the first of them starts the accumulator (use_acc False)."""
    NP: gl.constexpr = ka_q.shape[0] // 2
    for k in gl.static_range(LO, HI):
        mbarrier.wait(ready[st * (2 * NP + 1) + k], ph)
        if k < NP:
            s = warpgroup_mma(q_lat_s.slice(k * PIECE, PIECE, dim=1), ka_q.index(st * NP + k).permute((1, 0)), s,
                              use_acc=not (FIRST and k == LO), is_async=True)
        elif k < 2 * NP:
            s = warpgroup_mma(q_lat_s.slice(k * PIECE, PIECE, dim=1), kb_q.index(st * NP + k - NP).permute((1, 0)),
                              s, use_acc=not (FIRST and k == LO), is_async=True)
        else:
            s = warpgroup_mma(q_pe_s, kc_s.index(st).permute((1, 0)), s, use_acc=not (FIRST and k == LO),
                              is_async=True)
    return s


@gluon.jit
def _masked(s, t, bits, offs_n0, start, end, prefix_len, BLOCK_N: gl.constexpr):
    """Tile t's raw scores, -inf where a row does not see the column (only tiles that reach the tree columns or
    the chunk's end are tested)."""
    n0 = start + t * BLOCK_N
    if n0 + BLOCK_N > gl.minimum(end, prefix_len):
        offs_n = n0 + offs_n0
        c = gl.minimum(gl.maximum(offs_n - prefix_len, 0), 63).to(gl.int64)
        see = (offs_n < prefix_len)[None, :] | (((bits[:, None] >> c[None, :]) & 1) != 0)
        s = gl.where(see & (offs_n < end)[None, :], s, float("-inf"))
    return s


@gluon.jit
def _rowmax(s, qk_scale, FFMA: gl.constexpr):
    """(scores to exponentiate, each row's maximum in scaled base-2 units): with FFMA the scores stay raw (the scale
    goes into the exponent's FFMA, qk_scale > 0), else they are scaled here."""
    if FFMA:
        return s, gl.max(s, axis=1) * qk_scale
    else:
        s = s * qk_scale
        return s, gl.max(s, axis=1)


@gluon.jit
def _exp(s, m_new, qk_scale, FFMA: gl.constexpr):
    """P = 2^(scores - m_new) (one FFMA per score with FFMA)."""
    if FFMA:
        return gl.exp2(gl.fma(s, gl.full(s.shape, qk_scale, gl.float32, s.type.layout), -m_new[:, None]))
    else:
        return gl.exp2(s - m_new[:, None])


@gluon.jit
def _wg0(q_lat_s, q_pe_s, ka_s, kb_s, kc_s, ka_q, kb_q, m_s0, m_s1, sc0_s, sc1_s, l_s, il_s, q_bar, ready,
         kh_d, k_pe_d, Bits, O_part, LSE_part, stride_ps, stride_pq, q0, pid_s, start, end, n_tiles, prefix_len,
         Hq, H, qk_scale, Trace, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HALF: gl.constexpr,
         FFMA: gl.constexpr, TRACE: gl.constexpr):
    """Warpgroup 0 (default partition): S and softmax of the even tiles, O[:, :HALF] of every tile."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HALF, 16])
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    col_o: gl.constexpr = gl.SliceLayout(0, o_layout)
    p_dot: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    NP: gl.constexpr = HALF // PIECE
    dt: gl.constexpr = ka_s.dtype

    m_run = gl.full([BLOCK_M], float("-inf"), gl.float32, row_s)
    l_i = gl.zeros([BLOCK_M], gl.float32, row_s)
    acc = gl.zeros([BLOCK_M, HALF], gl.float32, o_layout)
    s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    offs_n0 = gl.arange(0, BLOCK_N, col_s)
    rows = q0 + gl.arange(0, BLOCK_M, row_s)
    bits = gl.load(Bits + rows // H, mask=rows < Hq, other=-1)
    mbarrier.wait(q_bar, 0)
    if n_tiles > 0:
        s = _s_pieces(q_lat_s, q_pe_s, ka_q, kb_q, kc_s, ready, 0, 0, s, 0, 2 * NP + 1, True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
    for j in range((n_tiles + 1) // 2):  # the last pass is a lone even tile when n_tiles is odd
        t0 = 2 * j
        ph = j & 1
        _stamp(Trace, 0, j, 0, TRACE)  # S of tile 2j done
        # softmax of tile 2j against the running maximum; P0 (relative to m0), m0 and sc0 to warpgroup 1 at once
        sx, mloc = _rowmax(_masked(s, t0, bits, offs_n0, start, end, prefix_len, BLOCK_N), qk_scale, FFMA)
        m0 = gl.maximum(m_run, mloc)
        sc0 = gl.exp2(m_run - m0)
        p = _exp(sx, m0, qk_scale, FFMA)
        l_i = l_i * sc0 + gl.sum(p, axis=1)
        p16 = p.to(dt)
        kc_s.index(0).store(p16)  # P0 in stage 0's rope block (dead once S of tile 2j is complete)
        m_s0.store(m0)
        sc0_s.store(sc0)
        fence_async_shared()
        _bar(A_SC0)
        _stamp(Trace, 0, j, 1, TRACE)  # softmax of tile 2j done, P0 and SC0 handed over
        # O_L = O_L sc0 + P0 V0_L (P from registers)
        acc = acc * gl.convert_layout(sc0, row_o)[:, None]
        acc = warpgroup_mma(gl.convert_layout(p16, p_dot), ka_s.index(0), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        # every refill is issued as soon as its pieces' last reader is done: a stage is held from a copy's
        # landing to that point, and with two stages that hold plus the copy's latency is the period of a pair
        if t0 + 2 < n_tiles:  # V0_L read for the last time: stage 0's pieces 0-3 take tile 2j + 2
            _refill(kh_d, k_pe_d, ka_q, kb_q, kc_s, ready, 0, start + (t0 + 2) * BLOCK_N, 0, NP)
        if t0 + 1 < n_tiles:
            _bar(S_SC1)  # warpgroup 1's maximum after tile 2j + 1
            _stamp(Trace, 0, j, 2, TRACE)  # stage 0's pieces 0-3 refilled, SC1 passed
            sc1 = sc1_s.load(row_s)
            m_run = m_s1.load(row_s)
            acc = acc * gl.convert_layout(sc1, row_o)[:, None]
            l_i = l_i * sc1
            _stamp(Trace, 0, j, 3, TRACE)  # rescaled
            _bar(S_P1)
            _stamp(Trace, 0, j, 4, TRACE)  # P1 passed
            # O_L += P1 V1_L (P1 from stage 1's rope block), waited alone so stage 1 refills at once
            acc = warpgroup_mma(kc_s.index(1), ka_s.index(1), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
            _stamp(Trace, 0, j, 5, TRACE)  # P1 V1_L done
            if t0 + 3 < n_tiles:  # V1_L and P1 read for the last time: stage 1's pieces 0-3 and 8
                n1 = start + (t0 + 3) * BLOCK_N
                _refill(kh_d, k_pe_d, ka_q, kb_q, kc_s, ready, 1, n1, 0, NP)
                _refill(kh_d, k_pe_d, ka_q, kb_q, kc_s, ready, 1, n1, 2 * NP, 2 * NP + 1)
            if t0 + 2 < n_tiles:  # S of tile 2j + 2, each piece as it lands (0-3 were refilled first)
                s = _s_pieces(q_lat_s, q_pe_s, ka_q, kb_q, kc_s, ready, 0, ph ^ 1, s, 0, NP + 1, True)
                _stamp(Trace, 0, j, 7, TRACE)  # S pieces 0-4 issued (their refills landed)
                s = _s_pieces(q_lat_s, q_pe_s, ka_q, kb_q, kc_s, ready, 0, ph ^ 1, s, NP + 1, 2 * NP + 1, False)
                _stamp(Trace, 0, j, 6, TRACE)  # S pieces 0-8 issued
                s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
        else:
            m_run = m0
    # l = l0 + l1; 1 / l to warpgroup 1
    _bar(S_FIN1)
    l_i = l_i + l_s.load(row_s)
    inv_l = 1.0 / l_i
    il_s.store(inv_l)
    _bar(A_FIN0)
    gl.store(LSE_part + pid_s * Hq + rows, m_run + gl.log2(l_i), mask=rows < Hq)
    out = acc * gl.convert_layout(inv_l, row_o)[:, None]
    rows_o = q0 + gl.arange(0, BLOCK_M, row_o)
    cols = gl.arange(0, HALF, col_o)
    gl.store(O_part + pid_s * stride_ps + rows_o[:, None] * stride_pq + cols[None, :], out, mask=(rows_o < Hq)[:, None])


@gluon.jit
def _wg1(q_lat_s, q_pe_s, ka_s, kb_s, kc_s, ka_q, kb_q, m_s0, m_s1, sc0_s, sc1_s, l_s, il_s, q_bar, ready,
         kh_d, k_pe_d, Bits, O_part, stride_ps, stride_pq, q0, pid_s, start, end, n_tiles, prefix_len, Hq, H,
         qk_scale, Trace, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HALF: gl.constexpr, FFMA: gl.constexpr,
         TRACE: gl.constexpr):
    """Warpgroup 1: S and softmax of the odd tiles, O[:, HALF:] of every tile."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HALF, 16])
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    col_o: gl.constexpr = gl.SliceLayout(0, o_layout)
    p_dot: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    NP: gl.constexpr = HALF // PIECE
    dt: gl.constexpr = ka_s.dtype

    l_i = gl.zeros([BLOCK_M], gl.float32, row_s)
    acc = gl.zeros([BLOCK_M, HALF], gl.float32, o_layout)
    s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    offs_n0 = gl.arange(0, BLOCK_N, col_s)
    rows = q0 + gl.arange(0, BLOCK_M, row_s)
    bits = gl.load(Bits + rows // H, mask=rows < Hq, other=-1)
    mbarrier.wait(q_bar, 0)
    n_pairs = n_tiles // 2
    if n_pairs > 0:  # S of tile 1: pieces 4-7 first, as in every later pair
        s = _s_pieces(q_lat_s, q_pe_s, ka_q, kb_q, kc_s, ready, 1, 0, s, NP, 2 * NP, True)
        s = _s_pieces(q_lat_s, q_pe_s, ka_q, kb_q, kc_s, ready, 1, 0, s, 0, NP, False)
        s = _s_pieces(q_lat_s, q_pe_s, ka_q, kb_q, kc_s, ready, 1, 0, s, 2 * NP, 2 * NP + 1, False)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
    for j in range(n_pairs):
        t1 = 2 * j + 1
        ph = j & 1
        _stamp(Trace, 1, j, 0, TRACE)  # S of tile 2j + 1 done
        # this tile's row maximum before the wait: only its combination with m0 is on the chain
        sx, mloc = _rowmax(_masked(s, t1, bits, offs_n0, start, end, prefix_len, BLOCK_N), qk_scale, FFMA)
        _bar(S_SC0)  # warpgroup 0's maximum after tile 2j, and P0
        _stamp(Trace, 1, j, 1, TRACE)  # SC0 passed
        m0 = m_s0.load(row_s)
        sc0 = sc0_s.load(row_s)
        # O_R = (O_R sc0 + P0 V0_R) sc1 + P1 V1_R: P0 V0_R first, under this warpgroup's softmax
        acc = acc * gl.convert_layout(sc0, row_o)[:, None]
        acc_t = warpgroup_mma(kc_s.index(0), kb_s.index(0), acc, is_async=True)
        m1 = gl.maximum(m0, mloc)
        sc1 = gl.exp2(m0 - m1)
        m_s1.store(m1)
        sc1_s.store(sc1)
        _bar(A_SC1)
        _stamp(Trace, 1, j, 2, TRACE)  # SC1 arrived
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc_t, ))
        _stamp(Trace, 1, j, 5, TRACE)  # P0 V0_R done
        if t1 + 1 < n_tiles:  # V0_R and P0 read for the last time: stage 0's pieces 4-8 take tile 2j + 2
            _refill(kh_d, k_pe_d, ka_q, kb_q, kc_s, ready, 0, start + (t1 + 1) * BLOCK_N, NP, 2 * NP + 1)
        _stamp(Trace, 1, j, 7, TRACE)  # stage 0's pieces 4-8 refill issued
        p = _exp(sx, m1, qk_scale, FFMA)
        l_i = l_i * (sc0 * sc1) + gl.sum(p, axis=1)
        p16 = p.to(dt)
        acc = acc * gl.convert_layout(sc1, row_o)[:, None]
        acc_t = warpgroup_mma(gl.convert_layout(p16, p_dot), kb_s.index(1), acc, is_async=True)
        kc_s.index(1).store(p16)  # P1 in stage 1's rope block, for warpgroup 0
        fence_async_shared()
        _bar(A_P1)
        _stamp(Trace, 1, j, 3, TRACE)  # P1 V1_R issued, P1 handed over
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc_t, ))
        _stamp(Trace, 1, j, 4, TRACE)  # P1 V1_R done
        if t1 + 2 < n_tiles:  # V1_R read for the last time: stage 1's pieces 4-7 take tile 2j + 3
            _refill(kh_d, k_pe_d, ka_q, kb_q, kc_s, ready, 1, start + (t1 + 2) * BLOCK_N, NP, 2 * NP)
            s = _s_pieces(q_lat_s, q_pe_s, ka_q, kb_q, kc_s, ready, 1, ph ^ 1, s, NP, 2 * NP, True)
            s = _s_pieces(q_lat_s, q_pe_s, ka_q, kb_q, kc_s, ready, 1, ph ^ 1, s, 0, NP, False)
            _stamp(Trace, 1, j, 6, TRACE)  # S pieces 4-7 and 0-3 issued
            s = _s_pieces(q_lat_s, q_pe_s, ka_q, kb_q, kc_s, ready, 1, ph ^ 1, s, 2 * NP, 2 * NP + 1, False)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
    if n_tiles % 2 == 1:  # the lone even tile: O_R = O_R sc0 + P0 V0_R
        _bar(S_SC0)
        sc0 = sc0_s.load(row_s)
        l_i = l_i * sc0
        acc = acc * gl.convert_layout(sc0, row_o)[:, None]
        acc = warpgroup_mma(kc_s.index(0), kb_s.index(0), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    l_s.store(l_i)
    _bar(A_FIN1)
    _bar(S_FIN0)
    inv_l = il_s.load(row_o)
    out = acc * inv_l[:, None]
    rows_o = q0 + gl.arange(0, BLOCK_M, row_o)
    cols = HALF + gl.arange(0, HALF, col_o)
    gl.store(O_part + pid_s * stride_ps + rows_o[:, None] * stride_pq + cols[None, :], out, mask=(rows_o < Hq)[:, None])


@gluon.jit
def ws_seesaw5_kernel(q_lat_d, q_pe_d, kh_d, k_pe_d, Bits, O_part, LSE_part, stride_ps, stride_pq,
                      prefix_len, R, chunk, Hq, H, qk_scale,
                      BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, V_DIM: gl.constexpr, PE_DIM: gl.constexpr,
                      WG1_REGS: gl.constexpr, FOLD: gl.constexpr, FFMA: gl.constexpr, Trace=None,
                      TRACE: gl.constexpr = False):
    """Grid (cdiv(Hq, 64), splits (+ 1 with the tree part as its own split unless FOLD)), as ws_prefix_kernel;
    kh_d: KV latent in [BLOCK_N, 64] pieces, k_pe_d: the rope block [BLOCK_N, PE_DIM] (PE_DIM = 64)."""
    gl.static_assert(PE_DIM == PIECE, "the rope block is the ninth 64-column piece")
    gl.static_assert(V_DIM % (2 * PIECE) == 0, "the latent splits into 64-column pieces per half")
    pid_q = gl.program_id(0)
    pid_s = gl.program_id(1)
    q0 = pid_q * BLOCK_M
    start, end, n_tiles = _chunk_bounds(pid_s, chunk, prefix_len, R, BLOCK_N, FOLD)
    HALF: gl.constexpr = V_DIM // 2
    NP: gl.constexpr = HALF // PIECE
    dt: gl.constexpr = kh_d.dtype

    q_lat_s = gl.allocate_shared_memory(dt, [BLOCK_M, V_DIM], q_lat_d.layout)
    q_pe_s = gl.allocate_shared_memory(dt, [BLOCK_M, PE_DIM], q_pe_d.layout)
    half_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HALF], dt)
    ka_s = gl.allocate_shared_memory(dt, [2, BLOCK_N, HALF], half_layout)
    kb_s = gl.allocate_shared_memory(dt, [2, BLOCK_N, HALF], half_layout)
    kc_s = gl.allocate_shared_memory(dt, [2, BLOCK_N, PE_DIM], k_pe_d.layout)
    # the halves as 64-column pieces (a [64, 256] 128B-swizzled tile is four [64, 64] ones, 8 KB apart)
    ka_q = ka_s._reinterpret(dt, [2 * NP, BLOCK_N, PIECE], k_pe_d.layout)
    kb_q = kb_s._reinterpret(dt, [2 * NP, BLOCK_N, PIECE], k_pe_d.layout)
    vec: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])
    m_s0 = gl.allocate_shared_memory(gl.float32, [BLOCK_M], vec)
    m_s1 = gl.allocate_shared_memory(gl.float32, [BLOCK_M], vec)
    sc0_s = gl.allocate_shared_memory(gl.float32, [BLOCK_M], vec)
    sc1_s = gl.allocate_shared_memory(gl.float32, [BLOCK_M], vec)
    l_s = gl.allocate_shared_memory(gl.float32, [BLOCK_M], vec)
    il_s = gl.allocate_shared_memory(gl.float32, [BLOCK_M], vec)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    # one allocation per piece barrier, so the compiler's shared-memory hazard analysis tells them apart
    bl: gl.constexpr = mbarrier.MBarrierLayout()
    ready = (gl.allocate_shared_memory(gl.int64, [1], bl), gl.allocate_shared_memory(gl.int64, [1], bl),
             gl.allocate_shared_memory(gl.int64, [1], bl), gl.allocate_shared_memory(gl.int64, [1], bl),
             gl.allocate_shared_memory(gl.int64, [1], bl), gl.allocate_shared_memory(gl.int64, [1], bl),
             gl.allocate_shared_memory(gl.int64, [1], bl), gl.allocate_shared_memory(gl.int64, [1], bl),
             gl.allocate_shared_memory(gl.int64, [1], bl), gl.allocate_shared_memory(gl.int64, [1], bl),
             gl.allocate_shared_memory(gl.int64, [1], bl), gl.allocate_shared_memory(gl.int64, [1], bl),
             gl.allocate_shared_memory(gl.int64, [1], bl), gl.allocate_shared_memory(gl.int64, [1], bl),
             gl.allocate_shared_memory(gl.int64, [1], bl), gl.allocate_shared_memory(gl.int64, [1], bl),
             gl.allocate_shared_memory(gl.int64, [1], bl), gl.allocate_shared_memory(gl.int64, [1], bl))
    gl.static_assert(NP == 4, "18 piece barriers: two stages of 8 latent pieces and the rope block")
    mbarrier.init(q_bar, count=1)
    for b in gl.static_range(18):
        mbarrier.init(ready[b], count=1)
    fence_async_shared()
    # Q and the first two tiles; every later tile is loaded by the warpgroup that frees its pieces
    mbarrier.expect(q_bar, q_lat_d.block_type.nbytes + q_pe_d.block_type.nbytes)
    tma.async_copy_global_to_shared(q_lat_d, [q0, 0], q_bar, q_lat_s)
    tma.async_copy_global_to_shared(q_pe_d, [q0, 0], q_bar, q_pe_s)
    if n_tiles > 0:
        _refill(kh_d, k_pe_d, ka_q, kb_q, kc_s, ready, 0, start, 0, 2 * NP + 1)
    if n_tiles > 1:
        _refill(kh_d, k_pe_d, ka_q, kb_q, kc_s, ready, 1, start + BLOCK_N, 0, 2 * NP + 1)

    gl.warp_specialize([
        (_wg0, (q_lat_s, q_pe_s, ka_s, kb_s, kc_s, ka_q, kb_q, m_s0, m_s1, sc0_s, sc1_s, l_s, il_s, q_bar, ready,
                kh_d, k_pe_d, Bits, O_part, LSE_part, stride_ps, stride_pq, q0, pid_s, start, end, n_tiles,
                prefix_len, Hq, H, qk_scale, Trace, BLOCK_M, BLOCK_N, HALF, FFMA, TRACE)),
        (_wg1, (q_lat_s, q_pe_s, ka_s, kb_s, kc_s, ka_q, kb_q, m_s0, m_s1, sc0_s, sc1_s, l_s, il_s, q_bar, ready,
                kh_d, k_pe_d, Bits, O_part, stride_ps, stride_pq, q0, pid_s, start, end, n_tiles, prefix_len, Hq,
                H, qk_scale, Trace, BLOCK_M, BLOCK_N, HALF, FFMA, TRACE)),
    ], [4], [WG1_REGS])
