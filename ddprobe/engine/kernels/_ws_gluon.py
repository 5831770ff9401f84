"""Gluon kernel of the `split_ws` path: one prefix split (or the tree part) of 64 query rows, warp-specialized.

Written in Gluon (``triton.experimental.gluon``, Triton >= 3.6) because Triton 3.6 ignores
``warp_specialize`` on sm_90 and cannot express who waits on whom. One program = 64 folded query rows
(row hq = r * H + h) x one chunk of KV tokens, three partitions sharing shared memory:

  loader   (1 warp):  Q tile once, then each [64 tokens, 512 + 64] KV tile by TMA into a ring of STAGES
                      buffers; waits ``kv_free[s]``, signals ``kv_ready[s]`` (byte-count completion).
  softmax  (4 warps, the default partition, warpgroup 0): S = Q_lat K_lat^T + Q_pe K_pe^T (wgmma m64n64,
                      K = 576), the mask, the online softmax in base 2; hands P (bf16) and the rescale
                      factor alpha to warpgroup 1 through shared memory (PIPE 3, the default: a named
                      barrier, bar.arrive here and bar.sync there, with warpgroup 1 done with the previous P
                      when the previous tile's ``kv_free`` completes; else ``p_ready`` / ``p_free``), then
                      O[:, :256] = alpha O + P V[:, :256] with P from registers.
  pv       (4 warps, warpgroup 1): O[:, 256:] = alpha O + P V[:, 256:] with P from shared memory.
The 64 x 512 fp32 accumulator is split over the two warpgroups (128 registers each), so warpgroup 1
computes the second half of P V while warpgroup 0 already computes S of the next tile. At the end
warpgroup 0 passes 1 / l through the same handshake, both store their half of the normalized partial
(fp32), and warpgroup 0 stores the log2-sum-exp: the layout `split`'s merge kernel reads.
With BALANCE (the balanced grid, split_ws.WsTuning.balance) a program runs one or more such pieces in turn
(``_piece``): each partition loops over them, the KV ring runs on across pieces, the loader loads a piece's Q
once warpgroup 0 has computed S of the previous piece's last tile (``q_free``), and 1/l has its own buffer.
The tree part (the R new rows, columns prefix_len .. prefix_len + R - 1, masked by the per-row ancestor
bitmask: bit j of row r set when row r sees new row j) is folded into the last prefix split (FOLD), whose
partial therefore always has a finite log-sum-exp, or is one more split index of its own (FOLD = 0).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)


@gluon.jit
def _chunk_bounds(pid_s, chunk, prefix_len, R, BLOCK_N: gl.constexpr, FOLD: gl.constexpr):
    """Columns [start, end) of split pid_s and its tile count: with FOLD the last split also takes the R tree
    columns, else the last split index is the tree part alone."""
    if FOLD:
        last = pid_s == gl.num_programs(1) - 1
        start = pid_s * chunk
        end = gl.where(last, prefix_len + R, gl.minimum(pid_s * chunk + chunk, prefix_len))
    else:
        is_tree = pid_s == gl.num_programs(1) - 1
        start = gl.where(is_tree, prefix_len, pid_s * chunk)
        end = gl.where(is_tree, prefix_len + R, gl.minimum(pid_s * chunk + chunk, prefix_len))
    return start, end, gl.cdiv(end - start, BLOCK_N)


@gluon.jit
def _piece(k, chunk, prefix_len, R, Hq, tiles, programs, slots, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
           FOLD: gl.constexpr, BALANCE: gl.constexpr):
    """Piece k of this program: (row block, partial slot, columns [start, end), tiles, pieces in the program,
    first slot of the row block to mark empty). Without BALANCE a program is one piece: row block
    program_id(0), split program_id(1) (_chunk_bounds). With BALANCE the grid is (programs,) over row blocks of
    ``tiles`` prefix tiles, cut at the same tiles in every row block (so the row blocks read a tile at about the
    same time and share it through L2): programs 0 .. nf - 1 take the full chunks of P = chunk / BLOCK_N tiles
    (program g: row block g % n_qb, chunk g // n_qb, slot g // n_qb); the other programs share the row blocks'
    remainders (the last tiles - F P of each, F full chunks), laid end to end and cut evenly, a share that
    crosses row blocks being one piece per row block (slots F, F + 1, ...). A row block's last piece also takes
    the R tree columns (so its lse is finite), writes slot ``slots`` - 1 and marks the slots its row block
    leaves unused (lse -inf) for the merge."""
    if BALANCE:
        g = gl.program_id(0)
        n_qb = gl.cdiv(Hq, BLOCK_M)
        pt = chunk // BLOCK_N
        f = tiles // pt
        rt = tiles - f * pt
        nf = n_qb * f
        spare = g >= nf
        h = g - nf
        ns = gl.maximum(programs - nf, 1)   # programs sharing the remainders
        wt = gl.maximum(n_qb * rt, 1)
        rt1 = gl.maximum(rt, 1)
        lo = h * wt // ns
        hi = (h + 1) * wt // ns
        rb = gl.where(spare, lo // rt1 + k, g % n_qb)
        base = rb * rt
        a = gl.where(spare, f * pt + gl.maximum(lo, base) - base, (g // n_qb) * pt)
        b = gl.where(spare, f * pt + gl.minimum(hi, base + rt) - base, (g // n_qb) * pt + pt)
        last = b == tiles
        first_sp = ((base + 1) * ns - 1) // wt   # the sharing program that holds the row block's first remainder
        last_sp = ((base + rt) * ns - 1) // wt   # ... and its last
        start = a * BLOCK_N
        end = gl.where(last, prefix_len + R, b * BLOCK_N)
        slot = gl.where(last, slots - 1, gl.where(spare, f + h - first_sp, g // n_qb))
        fill_lo = gl.where(last & spare, f + last_sp - first_sp, slots - 1)
        n_pieces = gl.where(spare, (hi - 1) // rt1 - lo // rt1 + 1, 1)
    else:
        rb = gl.program_id(0)
        slot = gl.program_id(1)
        start, end, _ = _chunk_bounds(slot, chunk, prefix_len, R, BLOCK_N, FOLD)
        fill_lo = slots - 1
        n_pieces = 1
    return rb, slot, start, end, gl.cdiv(end - start, BLOCK_N), n_pieces, fill_lo


@gluon.jit
def _load_tiles(k_lat_d, k_pe_d, k_lat_s, k_pe_s, kv_ready, kv_free, start, n_tiles, BLOCK_N: gl.constexpr,
                STAGES: gl.constexpr, base=0):
    """The loader's ring: each [BLOCK_N, 512 + 64] KV tile of the chunk by TMA into stage (base + i) % STAGES
    once both consumer warpgroups have released it (``kv_free``), completing ``kv_ready`` by byte count
    (``base``: tiles this program loaded before, in earlier pieces)."""
    nbytes: gl.constexpr = k_lat_d.block_type.nbytes + k_pe_d.block_type.nbytes
    for i in range(n_tiles):
        st = (base + i) % STAGES
        mbarrier.wait(kv_free.index(st), (((base + i) // STAGES) & 1) ^ 1)
        bar = kv_ready.index(st)
        mbarrier.expect(bar, nbytes)
        n0 = start + i * BLOCK_N
        tma.async_copy_global_to_shared(k_lat_d, [n0, 0], bar, k_lat_s.index(st))
        tma.async_copy_global_to_shared(k_pe_d, [n0, 0], bar, k_pe_s.index(st))


@gluon.jit
def _loader(q_lat_d, q_pe_d, k_lat_d, k_pe_d, q_lat_s, q_pe_s, k_lat_s, k_pe_s, q_bar, q_free, kv_ready, kv_free,
            chunk, prefix_len, R, Hq, tiles, programs, slots, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
            STAGES: gl.constexpr, FOLD: gl.constexpr, BALANCE: gl.constexpr):
    """Per piece: its Q row block (once warpgroup 0 has issued S of the previous piece's last tile: q_free),
    then its KV tiles through the ring, which runs on across pieces."""
    _, _, _, _, _, n_pieces, _ = _piece(0, chunk, prefix_len, R, Hq, tiles, programs, slots, BLOCK_M, BLOCK_N,
                                        FOLD, BALANCE)
    done = 0
    for k in range(n_pieces):
        rb, _, start, _, n_tiles, _, _ = _piece(k, chunk, prefix_len, R, Hq, tiles, programs, slots, BLOCK_M,
                                                BLOCK_N, FOLD, BALANCE)
        if k > 0:
            mbarrier.wait(q_free, (k - 1) & 1)
        mbarrier.expect(q_bar, q_lat_d.block_type.nbytes + q_pe_d.block_type.nbytes)
        tma.async_copy_global_to_shared(q_lat_d, [rb * BLOCK_M, 0], q_bar, q_lat_s)
        tma.async_copy_global_to_shared(q_pe_d, [rb * BLOCK_M, 0], q_bar, q_pe_s)
        _load_tiles(k_lat_d, k_pe_d, k_lat_s, k_pe_s, kv_ready, kv_free, start, n_tiles, BLOCK_N, STAGES, done)
        done += n_tiles


@gluon.jit
def _issue_s(q_lat_s, q_pe_s, k_lat_s, k_pe_s, kv_ready, s_zero, i, STAGES: gl.constexpr):
    """Wait for tile i, issue S = Q_lat K_lat^T + Q_pe K_pe^T asynchronously (a wgmma token)."""
    st = i % STAGES
    mbarrier.wait(kv_ready.index(st), (i // STAGES) & 1)
    s = warpgroup_mma(q_lat_s, k_lat_s.index(st).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    return warpgroup_mma(q_pe_s, k_pe_s.index(st).permute((1, 0)), s, is_async=True)


NAMED_BAR = 8  # the named barrier of the PIPE=3 hand-off (Gluon's partitions use ids 0-2)
_ARRIVE_ASM = gl.constexpr(f"bar.arrive {NAMED_BAR}, 256; // $0")
_SYNC_ASM = gl.constexpr(f"bar.sync {NAMED_BAR}, 256; // $0")


@gluon.jit
def _named_arrive():
    """bar.arrive on NAMED_BAR for 256 threads (warpgroup 0 arrives, warpgroup 1 syncs): does not wait."""
    gl.inline_asm_elementwise(_ARRIVE_ASM, "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _named_sync():
    gl.inline_asm_elementwise(_SYNC_ASM, "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _softmax_step(s, i, gi, m_i, l_i, acc, bits, offs_n0, k_lat_s, p_s, a_s, p_ready, p_free, start, end,
                  prefix_len, qk_scale, o_layout: gl.constexpr, BLOCK_N: gl.constexpr, HALF: gl.constexpr,
                  STAGES: gl.constexpr, kv_free=None, NAMED: gl.constexpr = False, FFMA: gl.constexpr = False):
    """Tile i of the piece (the program's tile gi, which sets the ring stage) -> online softmax; P and alpha
    handed to warpgroup 1; O[:, :HALF] rescaled and P V[:, :HALF] issued asynchronously (a wgmma token)."""
    n0 = start + i * BLOCK_N
    if n0 + BLOCK_N > gl.minimum(end, prefix_len):  # only tiles reaching the tree columns or the chunk's end
        offs_n = n0 + offs_n0
        c = gl.minimum(gl.maximum(offs_n - prefix_len, 0), 63).to(gl.int64)
        see = (offs_n < prefix_len)[None, :] | (((bits[:, None] >> c[None, :]) & 1) != 0)
        s = gl.where(see & (offs_n < end)[None, :], s, float("-inf"))
    if FFMA:  # the scale inside the exponent's argument: one FFMA per score instead of FMUL + FADD
        m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)  # qk_scale > 0: max(s) * c == max(s * c)
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(gl.fma(s, gl.full(s.shape, qk_scale, gl.float32, s.type.layout), -m_new[:, None]))
    else:
        s = s * qk_scale
        m_new = gl.maximum(m_i, gl.max(s, axis=1))
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + gl.sum(p, axis=1)
    k_lat = k_lat_s.index(gi % STAGES)
    p16 = p.to(k_lat.dtype)
    # hand P and alpha to warpgroup 1 once it has finished with the previous ones
    if NAMED:  # warpgroup 1 is done with P(gi - 1) when tile gi - 1's stage is free (kv_free, as the loader waits)
        if gi > 0:
            mbarrier.wait(kv_free.index((gi - 1) % STAGES), ((gi - 1) // STAGES) & 1)
        p_s.store(p16)
        a_s.store(alpha)
        fence_async_shared()
        _named_arrive()
    else:
        mbarrier.wait(p_free, (i & 1) ^ 1)
        p_s.store(p16)
        a_s.store(alpha)
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(p_ready, count=1)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    p_dot: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    acc = acc * gl.convert_layout(alpha, row_o)[:, None]
    acc = warpgroup_mma(gl.convert_layout(p16, p_dot), k_lat.slice(0, HALF, dim=1), acc, is_async=True)
    return m_new, l_i, acc


@gluon.jit
def _tile(i, gi, m_i, l_i, acc, bits, offs_n0, q_lat_s, q_pe_s, k_lat_s, k_pe_s, p_s, a_s, q_free, kv_ready, kv_free,
          p_ready, p_free, s_zero, start, end, prefix_len, qk_scale, o_layout: gl.constexpr, BLOCK_N: gl.constexpr,
          HALF: gl.constexpr, STAGES: gl.constexpr, NAMED: gl.constexpr, FREE_Q: gl.constexpr,
          FFMA: gl.constexpr = False):
    """One tile of pipe 0 / 3: S (waited), the softmax and P V; FREE_Q: release Q (q_free) once S is done."""
    s = warpgroup_mma_wait(num_outstanding=0,
                           deps=(_issue_s(q_lat_s, q_pe_s, k_lat_s, k_pe_s, kv_ready, s_zero, gi, STAGES), ))
    if FREE_Q:
        mbarrier.arrive(q_free, count=1)
    m_i, l_i, acc = _softmax_step(s, i, gi, m_i, l_i, acc, bits, offs_n0, k_lat_s, p_s, a_s, p_ready, p_free, start,
                                  end, prefix_len, qk_scale, o_layout, BLOCK_N, HALF, STAGES, kv_free, NAMED, FFMA)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    mbarrier.arrive(kv_free.index(gi % STAGES), count=1)
    return m_i, l_i, acc


@gluon.jit
def _softmax_wg(q_lat_s, q_pe_s, k_lat_s, k_pe_s, p_s, a_s, l_s, q_bar, q_free, kv_ready, kv_free, p_ready, p_free,
                Bits, O_part, LSE_part, stride_ps, stride_pq, chunk, prefix_len, R, Hq, H, tiles, programs, slots,
                qk_scale, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HALF: gl.constexpr, STAGES: gl.constexpr,
                PIPE: gl.constexpr, FOLD: gl.constexpr, BALANCE: gl.constexpr, FFMA: gl.constexpr = False):
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HALF, 16])
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    col_o: gl.constexpr = gl.SliceLayout(0, o_layout)

    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    offs_n0 = gl.arange(0, BLOCK_N, col_s)
    _, _, _, _, _, n_pieces, _ = _piece(0, chunk, prefix_len, R, Hq, tiles, programs, slots, BLOCK_M, BLOCK_N,
                                        FOLD, BALANCE)
    done = 0  # tiles of earlier pieces (the ring's position)
    for k in range(n_pieces):
        rb, slot, start, end, n_tiles, _, fill_lo = _piece(k, chunk, prefix_len, R, Hq, tiles, programs, slots,
                                                          BLOCK_M, BLOCK_N, FOLD, BALANCE)
        q0 = rb * BLOCK_M
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_s)
        l_i = gl.zeros([BLOCK_M], gl.float32, row_s)
        acc = gl.zeros([BLOCK_M, HALF], gl.float32, o_layout)
        rows = q0 + gl.arange(0, BLOCK_M, row_s)
        # the ancestor bits of each row over the tree columns prefix_len + j (padded rows see them all: finite)
        bits = gl.load(Bits + rows // H, mask=rows < Hq, other=-1)
        mbarrier.wait(q_bar, k & 1)
        if PIPE == 1:
            # S of tile i + 1 is issued before the softmax of tile i, so the tensor cores compute it meanwhile
            s_cur = warpgroup_mma_wait(num_outstanding=0,
                                       deps=(_issue_s(q_lat_s, q_pe_s, k_lat_s, k_pe_s, kv_ready, s_zero, 0, STAGES), ))
            for i in range(n_tiles):
                if i + 1 < n_tiles:
                    s_nxt = _issue_s(q_lat_s, q_pe_s, k_lat_s, k_pe_s, kv_ready, s_zero, i + 1, STAGES)
                else:
                    s_nxt = warpgroup_mma_init(s_zero)
                m_i, l_i, acc = _softmax_step(s_cur, i, i, m_i, l_i, acc, bits, offs_n0, k_lat_s, p_s, a_s, p_ready,
                                              p_free, start, end, prefix_len, qk_scale, o_layout, BLOCK_N, HALF, STAGES)
                s_cur, acc = warpgroup_mma_wait(num_outstanding=0, deps=(s_nxt, acc))
                mbarrier.arrive(kv_free.index(i % STAGES), count=1)
        elif PIPE == 2:
            # S of tile i + 1 is issued right behind P V of tile i, before waiting for it (no issue gap)
            s = warpgroup_mma_wait(num_outstanding=0,
                                   deps=(_issue_s(q_lat_s, q_pe_s, k_lat_s, k_pe_s, kv_ready, s_zero, 0, STAGES), ))
            for i in range(n_tiles):
                m_i, l_i, acc = _softmax_step(s, i, i, m_i, l_i, acc, bits, offs_n0, k_lat_s, p_s, a_s, p_ready,
                                              p_free, start, end, prefix_len, qk_scale, o_layout, BLOCK_N, HALF, STAGES)
                if i + 1 < n_tiles:
                    s_nxt = _issue_s(q_lat_s, q_pe_s, k_lat_s, k_pe_s, kv_ready, s_zero, i + 1, STAGES)
                else:
                    s_nxt = warpgroup_mma_init(s_zero)
                s, acc = warpgroup_mma_wait(num_outstanding=0, deps=(s_nxt, acc))
                mbarrier.arrive(kv_free.index(i % STAGES), count=1)
        elif BALANCE:  # the piece's last tile peeled: once its S is done, the loader may bring the next Q
            for i in range(n_tiles - 1):
                m_i, l_i, acc = _tile(i, done + i, m_i, l_i, acc, bits, offs_n0, q_lat_s, q_pe_s, k_lat_s, k_pe_s,
                                      p_s, a_s, q_free, kv_ready, kv_free, p_ready, p_free, s_zero, start, end,
                                      prefix_len, qk_scale, o_layout, BLOCK_N, HALF, STAGES, PIPE == 3, False, FFMA)
            m_i, l_i, acc = _tile(n_tiles - 1, done + n_tiles - 1, m_i, l_i, acc, bits, offs_n0, q_lat_s, q_pe_s,
                                  k_lat_s, k_pe_s, p_s, a_s, q_free, kv_ready, kv_free, p_ready, p_free, s_zero, start,
                                  end, prefix_len, qk_scale, o_layout, BLOCK_N, HALF, STAGES, PIPE == 3, True, FFMA)
        else:  # PIPE 0, and 3 (the hand-off to warpgroup 1 on a named barrier, p_free folded into kv_free)
            for i in range(n_tiles):
                m_i, l_i, acc = _tile(i, i, m_i, l_i, acc, bits, offs_n0, q_lat_s, q_pe_s, k_lat_s, k_pe_s, p_s, a_s,
                                      q_free, kv_ready, kv_free, p_ready, p_free, s_zero, start, end, prefix_len,
                                      qk_scale, o_layout, BLOCK_N, HALF, STAGES, PIPE == 3, False, FFMA)
        inv_l = 1.0 / l_i
        if PIPE == 3:  # 1 / l in l_s (a_s itself unless BALANCE: then the next piece's alpha must not overwrite it)
            if n_tiles > 0:
                mbarrier.wait(kv_free.index((done + n_tiles - 1) % STAGES), ((done + n_tiles - 1) // STAGES) & 1)
            l_s.store(inv_l)
            if BALANCE:  # sync, not arrive: the next piece's first arrive must not meet warpgroup 1 before this
                _named_sync()  # one's bar.sync (two arrives of warpgroup 0 would complete the barrier alone)
            else:
                _named_arrive()
        else:
            mbarrier.wait(p_free, (n_tiles & 1) ^ 1)
            a_s.store(inv_l)
            gl.thread_barrier()
            mbarrier.arrive(p_ready, count=1)
        gl.store(LSE_part + slot * Hq + rows, m_i + gl.log2(l_i), mask=rows < Hq)
        for j in range(fill_lo, slots - 1):  # slots this row block leaves unused: empty for the merge
            gl.store(LSE_part + j * Hq + rows, gl.full([BLOCK_M], float("-inf"), gl.float32, row_s), mask=rows < Hq)
        out = acc * gl.convert_layout(inv_l, row_o)[:, None]
        rows_o = q0 + gl.arange(0, BLOCK_M, row_o)
        cols = gl.arange(0, HALF, col_o)
        ptr = O_part + slot * stride_ps + rows_o[:, None] * stride_pq + cols[None, :]
        gl.store(ptr, out, mask=(rows_o < Hq)[:, None])
        done += n_tiles


@gluon.jit
def _pv_wg(k_lat_s, p_s, a_s, l_s, kv_free, p_ready, p_free, O_part, stride_ps, stride_pq, chunk, prefix_len, R, Hq,
           tiles, programs, slots, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HALF: gl.constexpr,
           STAGES: gl.constexpr, FOLD: gl.constexpr, BALANCE: gl.constexpr, NAMED: gl.constexpr = False):
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HALF, 16])
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    col_o: gl.constexpr = gl.SliceLayout(0, o_layout)
    _, _, _, _, _, n_pieces, _ = _piece(0, chunk, prefix_len, R, Hq, tiles, programs, slots, BLOCK_M, BLOCK_N,
                                        FOLD, BALANCE)
    done = 0
    for k in range(n_pieces):
        rb, slot, _, _, n_tiles, _, _ = _piece(k, chunk, prefix_len, R, Hq, tiles, programs, slots, BLOCK_M,
                                               BLOCK_N, FOLD, BALANCE)
        acc = gl.zeros([BLOCK_M, HALF], gl.float32, o_layout)
        for i in range(n_tiles):
            st = (done + i) % STAGES
            if NAMED:
                _named_sync()
            else:
                mbarrier.wait(p_ready, i & 1)
            alpha = a_s.load(row_o)
            acc = acc * alpha[:, None]
            acc = warpgroup_mma(p_s, k_lat_s.index(st).slice(HALF, HALF, dim=1), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
            gl.thread_barrier()
            if not NAMED:
                mbarrier.arrive(p_free, count=1)
            mbarrier.arrive(kv_free.index(st), count=1)
        if NAMED:
            _named_sync()
        else:
            mbarrier.wait(p_ready, n_tiles & 1)
        inv_l = l_s.load(row_o)
        out = acc * inv_l[:, None]
        rows = rb * BLOCK_M + gl.arange(0, BLOCK_M, row_o)
        cols = HALF + gl.arange(0, HALF, col_o)
        ptr = O_part + slot * stride_ps + rows[:, None] * stride_pq + cols[None, :]
        gl.store(ptr, out, mask=(rows < Hq)[:, None])
        done += n_tiles


@gluon.jit
def ws_prefix_kernel(q_lat_d, q_pe_d, k_lat_d, k_pe_d, Bits, O_part, LSE_part, stride_ps, stride_pq,
                     prefix_len, R, chunk, Hq, H, qk_scale, tiles, programs, slots,
                     BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, V_DIM: gl.constexpr, PE_DIM: gl.constexpr,
                     STAGES: gl.constexpr, PV_REGS: gl.constexpr, LOAD_REGS: gl.constexpr, PIPE: gl.constexpr,
                     FOLD: gl.constexpr, TRIGGER: gl.constexpr = False, BALANCE: gl.constexpr = False,
                     FFMA: gl.constexpr = False):
    """Grid (cdiv(Hq, 64), num_splits) with FOLD (the last split also takes the R tree columns), else
    (cdiv(Hq, 64), num_splits + 1) with the tree part as split index num_splits; ``slots`` is the grid's
    second dimension. BALANCE (PIPE 3, FOLD): grid (programs,), full chunks of ``chunk`` tokens aligned across
    row blocks plus programs sharing the remainders (_piece), each row block's partials in ``slots`` slots
    (FFMA: the softmax scale inside the exponent's FFMA). TRIGGER: let a programmatic dependent launch (the
    merge, which then waits on griddepcontrol.wait) as soon as every program has started, so its programs take
    the SMs this grid leaves free and those freed as programs finish."""
    gl.static_assert(not BALANCE or PIPE == 3, "BALANCE runs pieces with the named-barrier hand-off (PIPE 3) only")
    if TRIGGER:
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)
    HALF: gl.constexpr = V_DIM // 2
    dt: gl.constexpr = k_lat_d.dtype

    q_lat_s = gl.allocate_shared_memory(dt, [BLOCK_M, V_DIM], q_lat_d.layout)
    q_pe_s = gl.allocate_shared_memory(dt, [BLOCK_M, PE_DIM], q_pe_d.layout)
    k_lat_s = gl.allocate_shared_memory(dt, [STAGES, BLOCK_N, V_DIM], k_lat_d.layout)
    k_pe_s = gl.allocate_shared_memory(dt, [STAGES, BLOCK_N, PE_DIM], k_pe_d.layout)
    p_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_N], dt)
    p_s = gl.allocate_shared_memory(dt, [BLOCK_M, BLOCK_N], p_layout)
    a_s = gl.allocate_shared_memory(gl.float32, [BLOCK_M], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
    if BALANCE:
        l_s = gl.allocate_shared_memory(gl.float32, [BLOCK_M], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
    else:
        l_s = a_s
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kv_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    p_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    p_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    mbarrier.init(q_free, count=1)
    mbarrier.init(p_ready, count=1)
    mbarrier.init(p_free, count=1)
    for st in gl.static_range(STAGES):
        mbarrier.init(kv_ready.index(st), count=1)
        mbarrier.init(kv_free.index(st), count=2)  # both warpgroups release a stage
    fence_async_shared()

    gl.warp_specialize([
        (_softmax_wg, (q_lat_s, q_pe_s, k_lat_s, k_pe_s, p_s, a_s, l_s, q_bar, q_free, kv_ready, kv_free, p_ready,
                       p_free, Bits, O_part, LSE_part, stride_ps, stride_pq, chunk, prefix_len, R, Hq, H, tiles,
                       programs, slots, qk_scale, BLOCK_M, BLOCK_N, HALF, STAGES, PIPE, FOLD, BALANCE, FFMA)),
        (_pv_wg, (k_lat_s, p_s, a_s, l_s, kv_free, p_ready, p_free, O_part, stride_ps, stride_pq, chunk, prefix_len,
                  R, Hq, tiles, programs, slots, BLOCK_M, BLOCK_N, HALF, STAGES, FOLD, BALANCE, PIPE == 3)),
        (_loader, (q_lat_d, q_pe_d, k_lat_d, k_pe_d, q_lat_s, q_pe_s, k_lat_s, k_pe_s, q_bar, q_free, kv_ready,
                   kv_free, chunk, prefix_len, R, Hq, tiles, programs, slots, BLOCK_M, BLOCK_N, STAGES, FOLD,
                   BALANCE)),
    ], [4, 1], [PV_REGS, LOAD_REGS])


# ---------------------------------------------------------------------------------------------------------------
# The seesaw schedule (WsTuning.seesaw = 1; FlashMLA's sm90 dense decode schedule, re-derived for this layout).
# Both consumer warpgroups compute S, for alternate tiles: warpgroup 0 the even tiles (ring stage 0), warpgroup 1
# the odd ones (stage 1). Each does the softmax of its own tile and P V of BOTH tiles of a pair on its own 256 of
# the 512 output columns, so each issues S (4.7 MFLOP) + 2 x P V half (2 x 1.05) per pair of tiles, and one
# warpgroup's softmax runs under the other's MMAs. The running maximum is one chain through shared memory
# (tile 2j by warpgroup 0, then tile 2j + 1 by warpgroup 1, then 2j + 2 ...), handed over with mbarriers:
#   sc0_ready  wg0 -> wg1  m after tile 2j and its rescale factor sc0 (m_s, sc0_s)
#   sc1_ready  wg1 -> wg0  m after tile 2j + 1 and sc1 (m_s, sc1_s)
#   p1_ready   wg1 -> wg0  P of tile 2j + 1 (bf16) in stage 1's rope buffer
#   p0_ready   wg0 -> wg1  P of tile 2j, rescaled by sc1, in stage 0's rope buffer
# P goes where the tile's K_pe was: once S of a tile is computed its 64 x 64 rope block is dead, and it has the
# layout of a [64, 64] bf16 wgmma operand, so no shared memory is added (Q 72 KB + 2 stages x 72 KB).
# Per pair: wg0  O_L = (O_L sc0 + P0 V0_L) sc1 + P1 V1_L;   wg1  O_R = O_R sc0 sc1 + P1 V1_R + (P0 sc1) V0_R;
# l0 = (l0 sc0 + sum P0) sc1, l1 = l1 sc0 sc1 + sum P1, both relative to the same running maximum; at the end
# l = l0 + l1. A KV tile arrives in three TMA parts, each with its own ready / free mbarrier, so a part is
# reloaded as soon as its last reader is done: A = latent columns 0..255 (K for S, V for wg0), B = latent
# 256..511 (K for S, V for wg1), C = rope (K for S, then P). Last readers (who arrives on free):
#   stage 0: A wg0 (P0 V0_L), B wg1 (P0 V0_R), C wg1 (P0 V0_R);  stage 1: A wg0 (P1 V1_L), B wg1 (P1 V1_R),
#   C wg0 (P1 V1_L).
# ---------------------------------------------------------------------------------------------------------------


@gluon.jit
def _ss_loader(q_lat_d, q_pe_d, kh_d, k_pe_d, q_lat_s, q_pe_s, ka_s, kb_s, kc_s, ka_q, kb_q, q_bar, ready, free,
               q0, start, n_tiles, BLOCK_N: gl.constexpr, HALF: gl.constexpr, PIECES: gl.constexpr):
    mbarrier.expect(q_bar, q_lat_d.block_type.nbytes + q_pe_d.block_type.nbytes)
    tma.async_copy_global_to_shared(q_lat_d, [q0, 0], q_bar, q_lat_s)
    tma.async_copy_global_to_shared(q_pe_d, [q0, 0], q_bar, q_pe_s)
    for i in range(n_tiles):
        st = i % 2
        ph = ((i // 2) & 1) ^ 1
        n0 = start + i * BLOCK_N
        if PIECES:  # nine 64-column pieces, each on its own ready barrier (kh_d: [BLOCK_N, 64] blocks)
            W: gl.constexpr = kh_d.block_type.shape[1]
            NP: gl.constexpr = HALF // W
            mbarrier.wait(free.index(st * 3 + 0), ph)
            for k in gl.static_range(NP):
                mbarrier.expect(ready.index(st * (2 * NP + 1) + k), kh_d.block_type.nbytes)
                tma.async_copy_global_to_shared(kh_d, [n0, k * W], ready.index(st * (2 * NP + 1) + k),
                                                ka_q.index(st * NP + k))
            mbarrier.wait(free.index(st * 3 + 1), ph)
            for k in gl.static_range(NP):
                mbarrier.expect(ready.index(st * (2 * NP + 1) + NP + k), kh_d.block_type.nbytes)
                tma.async_copy_global_to_shared(kh_d, [n0, HALF + k * W], ready.index(st * (2 * NP + 1) + NP + k),
                                                kb_q.index(st * NP + k))
            mbarrier.wait(free.index(st * 3 + 2), ph)
            mbarrier.expect(ready.index(st * (2 * NP + 1) + 2 * NP), k_pe_d.block_type.nbytes)
            tma.async_copy_global_to_shared(k_pe_d, [n0, 0], ready.index(st * (2 * NP + 1) + 2 * NP), kc_s.index(st))
        else:
            mbarrier.wait(free.index(st * 3 + 0), ph)
            mbarrier.expect(ready.index(st * 3 + 0), kh_d.block_type.nbytes)
            tma.async_copy_global_to_shared(kh_d, [n0, 0], ready.index(st * 3 + 0), ka_s.index(st))
            mbarrier.wait(free.index(st * 3 + 1), ph)
            mbarrier.expect(ready.index(st * 3 + 1), kh_d.block_type.nbytes)
            tma.async_copy_global_to_shared(kh_d, [n0, HALF], ready.index(st * 3 + 1), kb_s.index(st))
            mbarrier.wait(free.index(st * 3 + 2), ph)
            mbarrier.expect(ready.index(st * 3 + 2), k_pe_d.block_type.nbytes)
            tma.async_copy_global_to_shared(k_pe_d, [n0, 0], ready.index(st * 3 + 2), kc_s.index(st))


@gluon.jit
def _ss_s(q_lat_s, q_pe_s, ka_s, kb_s, kc_s, ka_q, kb_q, ready, i, s_layout: gl.constexpr, BLOCK_M: gl.constexpr,
          BLOCK_N: gl.constexpr, HALF: gl.constexpr, PIECES: gl.constexpr):
    """S of tile i, waited."""
    if PIECES:
        s = _ss_s_pieces(q_lat_s, q_pe_s, kc_s, ka_q, kb_q, ready, i, s_layout, BLOCK_M, BLOCK_N, HALF)
    else:
        s = _ss_s_issue(q_lat_s, q_pe_s, ka_s, kb_s, kc_s, ready, i, s_layout, BLOCK_M, BLOCK_N, HALF)
    return warpgroup_mma_wait(num_outstanding=0, deps=(s, ))


@gluon.jit
def _ss_s_issue(q_lat_s, q_pe_s, ka_s, kb_s, kc_s, ready, i, s_layout: gl.constexpr, BLOCK_M: gl.constexpr,
                BLOCK_N: gl.constexpr, HALF: gl.constexpr):
    """S of tile i (stage i % 2), each of its three parts issued as soon as it has landed (three wgmma
    groups in flight on return)."""
    st = i % 2
    ph = (i // 2) & 1
    mbarrier.wait(ready.index(st * 3 + 0), ph)
    s = warpgroup_mma(q_lat_s.slice(0, HALF, dim=1), ka_s.index(st).permute((1, 0)),
                      gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout), use_acc=False, is_async=True)
    mbarrier.wait(ready.index(st * 3 + 1), ph)
    s = warpgroup_mma(q_lat_s.slice(HALF, HALF, dim=1), kb_s.index(st).permute((1, 0)), s, is_async=True)
    mbarrier.wait(ready.index(st * 3 + 2), ph)
    return warpgroup_mma(q_pe_s, kc_s.index(st).permute((1, 0)), s, is_async=True)


@gluon.jit
def _ss_s_pieces(q_lat_s, q_pe_s, kc_s, ka_q, kb_q, ready, i, s_layout: gl.constexpr, BLOCK_M: gl.constexpr,
                 BLOCK_N: gl.constexpr, HALF: gl.constexpr):
    """S of tile i as nine K = 64 steps, each issued as soon as its piece has landed (FlashMLA's granularity)."""
    W: gl.constexpr = ka_q.shape[2]
    NP: gl.constexpr = HALF // W
    st = i % 2
    ph = (i // 2) & 1
    rb = st * (2 * NP + 1)
    mbarrier.wait(ready.index(rb), ph)
    s = warpgroup_mma(q_lat_s.slice(0, W, dim=1), ka_q.index(st * NP).permute((1, 0)),
                      gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout), use_acc=False, is_async=True)
    for k in gl.static_range(1, NP):
        mbarrier.wait(ready.index(rb + k), ph)
        s = warpgroup_mma(q_lat_s.slice(k * W, W, dim=1), ka_q.index(st * NP + k).permute((1, 0)), s, is_async=True)
    for k in gl.static_range(NP):
        mbarrier.wait(ready.index(rb + NP + k), ph)
        s = warpgroup_mma(q_lat_s.slice(HALF + k * W, W, dim=1), kb_q.index(st * NP + k).permute((1, 0)), s,
                          is_async=True)
    mbarrier.wait(ready.index(rb + 2 * NP), ph)
    return warpgroup_mma(q_pe_s, kc_s.index(st).permute((1, 0)), s, is_async=True)


@gluon.jit
def _ss_scores(s, i, bits, offs_n0, start, end, prefix_len, qk_scale, BLOCK_N: gl.constexpr):
    """Tile i's scores in base 2, masked only where a tile reaches the tree columns or the chunk's end."""
    n0 = start + i * BLOCK_N
    if n0 + BLOCK_N > gl.minimum(end, prefix_len):
        offs_n = n0 + offs_n0
        c = gl.minimum(gl.maximum(offs_n - prefix_len, 0), 63).to(gl.int64)
        see = (offs_n < prefix_len)[None, :] | (((bits[:, None] >> c[None, :]) & 1) != 0)
        s = gl.where(see & (offs_n < end)[None, :], s * qk_scale, float("-inf"))
    else:
        s = s * qk_scale
    return s


@gluon.jit
def _ss_wg0(q_lat_s, q_pe_s, ka_s, kb_s, kc_s, ka_q, kb_q, m_s, sc0_s, sc1_s, l_s, q_bar, ready, free, hs,
            Bits, O_part, LSE_part, stride_ps, stride_pq, q0, pid_s, start, end, n_tiles, prefix_len, Hq, H,
            qk_scale, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HALF: gl.constexpr, EARLY: gl.constexpr,
            PIECES: gl.constexpr):
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
    sc0_ready = hs.index(0)
    sc1_ready = hs.index(1)
    p0_ready = hs.index(2)
    p1_ready = hs.index(3)
    fin0 = hs.index(4)
    fin1 = hs.index(5)

    m_run = gl.full([BLOCK_M], float("-inf"), gl.float32, row_s)
    l_i = gl.zeros([BLOCK_M], gl.float32, row_s)
    acc = gl.zeros([BLOCK_M, HALF], gl.float32, o_layout)
    offs_n0 = gl.arange(0, BLOCK_N, col_s)
    rows = q0 + gl.arange(0, BLOCK_M, row_s)
    bits = gl.load(Bits + rows // H, mask=rows < Hq, other=-1)
    dt: gl.constexpr = ka_s.dtype
    mbarrier.wait(q_bar, 0)
    if n_tiles > 0:
        s = _ss_s(q_lat_s, q_pe_s, ka_s, kb_s, kc_s, ka_q, kb_q, ready, 0, s_layout, BLOCK_M, BLOCK_N, HALF, PIECES)
    else:
        s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    n_pairs = n_tiles // 2
    for j in range(n_pairs):
        ph = j & 1
        t0 = 2 * j
        # softmax of tile 2j against the running maximum; m and sc0 to warpgroup 1
        s = _ss_scores(s, t0, bits, offs_n0, start, end, prefix_len, qk_scale, BLOCK_N)
        m0 = gl.maximum(m_run, gl.max(s, axis=1))
        sc0 = gl.exp2(m_run - m0)
        p = gl.exp2(s - m0[:, None])
        l_i = l_i * sc0 + gl.sum(p, axis=1)
        m_s.store(m0)
        sc0_s.store(sc0)
        gl.thread_barrier()
        mbarrier.arrive(sc0_ready, count=1)
        # O_L = O_L sc0 + P0 V0_L (P from registers)
        acc = acc * gl.convert_layout(sc0, row_o)[:, None]
        acc = warpgroup_mma(gl.convert_layout(p.to(dt), p_dot), ka_s.index(0), acc, is_async=True)
        # warpgroup 1's softmax of tile 2j + 1: P0 rescaled to its maximum, handed over
        mbarrier.wait(sc1_ready, ph)
        sc1 = sc1_s.load(row_s)
        m_run = m_s.load(row_s)
        kc_s.index(0).store((p * sc1[:, None]).to(dt))
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(p0_ready, count=1)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(free.index(0), count=1)  # stage 0 part A (V0_L) read for the last time
        # O_L = O_L sc1 + P1 V1_L (P from shared memory)
        acc = acc * gl.convert_layout(sc1, row_o)[:, None]
        l_i = l_i * sc1
        mbarrier.wait(p1_ready, ph)
        acc_t = warpgroup_mma(kc_s.index(1), ka_s.index(1), acc, is_async=True)
        if EARLY:  # S of tile 2j + 2 issued behind P1 V1_L, before waiting for it
            if t0 + 2 < n_tiles:
                s_nxt = _ss_s_issue(q_lat_s, q_pe_s, ka_s, kb_s, kc_s, ready, t0 + 2, s_layout, BLOCK_M, BLOCK_N,
                                    HALF)
                acc = warpgroup_mma_wait(num_outstanding=3, deps=(acc_t, ))
                mbarrier.arrive(free.index(3), count=1)
                mbarrier.arrive(free.index(5), count=1)
                s = warpgroup_mma_wait(num_outstanding=0, deps=(s_nxt, ))
            else:
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc_t, ))
                mbarrier.arrive(free.index(3), count=1)
                mbarrier.arrive(free.index(5), count=1)
        else:
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc_t, ))
            mbarrier.arrive(free.index(3), count=1)  # stage 1 part A
            mbarrier.arrive(free.index(5), count=1)  # stage 1 part C (P1)
            if t0 + 2 < n_tiles:
                s = _ss_s(q_lat_s, q_pe_s, ka_s, kb_s, kc_s, ka_q, kb_q, ready,
                          t0 + 2, s_layout, BLOCK_M, BLOCK_N, HALF, PIECES)
    if n_tiles % 2 == 1:
        # the last tile has no partner: warpgroup 1 only rescales and adds its half of P V
        t0 = n_tiles - 1
        s = _ss_scores(s, t0, bits, offs_n0, start, end, prefix_len, qk_scale, BLOCK_N)
        m0 = gl.maximum(m_run, gl.max(s, axis=1))
        sc0 = gl.exp2(m_run - m0)
        p = gl.exp2(s - m0[:, None])
        l_i = l_i * sc0 + gl.sum(p, axis=1)
        m_run = m0
        sc0_s.store(sc0)
        p16 = p.to(dt)
        kc_s.index(0).store(p16)
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(sc0_ready, count=1)
        mbarrier.arrive(p0_ready, count=1)
        acc = acc * gl.convert_layout(sc0, row_o)[:, None]
        acc = warpgroup_mma(gl.convert_layout(p16, p_dot), ka_s.index(0), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(free.index(0), count=1)
    # l = l0 + l1, 1 / l to warpgroup 1
    mbarrier.wait(fin1, 0)
    l_i = l_i + l_s.load(row_s)
    inv_l = 1.0 / l_i
    gl.thread_barrier()
    l_s.store(inv_l)
    gl.thread_barrier()
    mbarrier.arrive(fin0, count=1)
    gl.store(LSE_part + pid_s * Hq + rows, m_run + gl.log2(l_i), mask=rows < Hq)
    out = acc * gl.convert_layout(inv_l, row_o)[:, None]
    rows_o = q0 + gl.arange(0, BLOCK_M, row_o)
    cols = gl.arange(0, HALF, col_o)
    ptr = O_part + pid_s * stride_ps + rows_o[:, None] * stride_pq + cols[None, :]
    gl.store(ptr, out, mask=(rows_o < Hq)[:, None])


@gluon.jit
def _ss_wg1(q_lat_s, q_pe_s, ka_s, kb_s, kc_s, ka_q, kb_q, m_s, sc0_s, sc1_s, l_s, q_bar, ready, free, hs,
            Bits, O_part, stride_ps, stride_pq, q0, pid_s, start, end, n_tiles, prefix_len, Hq, H, qk_scale,
            BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HALF: gl.constexpr, PIECES: gl.constexpr,
            PV0_FIRST: gl.constexpr):
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
    sc0_ready = hs.index(0)
    sc1_ready = hs.index(1)
    p0_ready = hs.index(2)
    p1_ready = hs.index(3)
    fin0 = hs.index(4)
    fin1 = hs.index(5)

    l_i = gl.zeros([BLOCK_M], gl.float32, row_s)
    acc = gl.zeros([BLOCK_M, HALF], gl.float32, o_layout)
    offs_n0 = gl.arange(0, BLOCK_N, col_s)
    rows = q0 + gl.arange(0, BLOCK_M, row_s)
    bits = gl.load(Bits + rows // H, mask=rows < Hq, other=-1)
    dt: gl.constexpr = ka_s.dtype
    mbarrier.wait(q_bar, 0)
    n_pairs = n_tiles // 2
    if n_pairs > 0:
        s = _ss_s(q_lat_s, q_pe_s, ka_s, kb_s, kc_s, ka_q, kb_q, ready, 1, s_layout, BLOCK_M, BLOCK_N, HALF, PIECES)
    else:
        s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    for j in range(n_pairs):
        ph = j & 1
        t1 = 2 * j + 1
        s = _ss_scores(s, t1, bits, offs_n0, start, end, prefix_len, qk_scale, BLOCK_N)
        mbarrier.wait(sc0_ready, ph)
        m0 = m_s.load(row_s)
        sc0 = sc0_s.load(row_s)
        m1 = gl.maximum(m0, gl.max(s, axis=1))
        sc1 = gl.exp2(m0 - m1)
        gl.thread_barrier()  # every thread has read m0 before m1 replaces it
        m_s.store(m1)
        sc1_s.store(sc1)
        gl.thread_barrier()
        mbarrier.arrive(sc1_ready, count=1)
        p = gl.exp2(s - m1[:, None])
        sc = sc0 * sc1
        l_i = l_i * sc + gl.sum(p, axis=1)
        p16 = p.to(dt)
        kc_s.index(1).store(p16)
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(p1_ready, count=1)
        # O_R = O_R sc0 sc1 + P1 V1_R (registers) + (P0 sc1) V0_R (shared memory)
        acc = acc * gl.convert_layout(sc, row_o)[:, None]
        if PV0_FIRST:  # P0 V0_R first: stage 0's parts B and C (the next even tile) are freed one P V earlier
            mbarrier.wait(p0_ready, ph)
            acc_t = warpgroup_mma(kc_s.index(0), kb_s.index(0), acc, is_async=True)
            acc_t = warpgroup_mma(gl.convert_layout(p16, p_dot), kb_s.index(1), acc_t, is_async=True)
            warpgroup_mma_wait(num_outstanding=1, deps=(acc_t, ))
            mbarrier.arrive(free.index(1), count=1)  # stage 0 part B
            mbarrier.arrive(free.index(2), count=1)  # stage 0 part C (P0)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc_t, ))
            mbarrier.arrive(free.index(4), count=1)  # stage 1 part B
        else:
            acc_t = warpgroup_mma(gl.convert_layout(p16, p_dot), kb_s.index(1), acc, is_async=True)
            mbarrier.wait(p0_ready, ph)
            acc_t = warpgroup_mma(kc_s.index(0), kb_s.index(0), acc_t, is_async=True)
            # (S of tile 2j + 3 cannot be issued before this wait: its part B needs stage 1's part B, which
            # this warpgroup frees here, and the loader fills stage 0 (freed here too) before stage 1)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc_t, ))
            mbarrier.arrive(free.index(1), count=1)  # stage 0 part B
            mbarrier.arrive(free.index(2), count=1)  # stage 0 part C (P0)
            mbarrier.arrive(free.index(4), count=1)  # stage 1 part B
        if t1 + 2 < n_tiles:
            s = _ss_s(q_lat_s, q_pe_s, ka_s, kb_s, kc_s, ka_q, kb_q, ready,
                      t1 + 2, s_layout, BLOCK_M, BLOCK_N, HALF, PIECES)
    if n_tiles % 2 == 1:
        mbarrier.wait(sc0_ready, n_pairs & 1)
        sc0 = sc0_s.load(row_s)
        l_i = l_i * sc0
        acc = acc * gl.convert_layout(sc0, row_o)[:, None]
        mbarrier.wait(p0_ready, n_pairs & 1)
        acc = warpgroup_mma(kc_s.index(0), kb_s.index(0), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(free.index(1), count=1)
        mbarrier.arrive(free.index(2), count=1)
    l_s.store(l_i)
    gl.thread_barrier()
    mbarrier.arrive(fin1, count=1)
    mbarrier.wait(fin0, 0)
    inv_l = l_s.load(row_o)
    out = acc * inv_l[:, None]
    rows_o = q0 + gl.arange(0, BLOCK_M, row_o)
    cols = HALF + gl.arange(0, HALF, col_o)
    ptr = O_part + pid_s * stride_ps + rows_o[:, None] * stride_pq + cols[None, :]
    gl.store(ptr, out, mask=(rows_o < Hq)[:, None])


@gluon.jit
def ws_seesaw_kernel(q_lat_d, q_pe_d, kh_d, k_pe_d, Bits, O_part, LSE_part, stride_ps, stride_pq,
                     prefix_len, R, chunk, Hq, H, qk_scale,
                     BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, V_DIM: gl.constexpr, PE_DIM: gl.constexpr,
                     PV_REGS: gl.constexpr, LOAD_REGS: gl.constexpr, FOLD: gl.constexpr, SEESAW: gl.constexpr):
    """The seesaw schedule (SEESAW 1; 2: warpgroup 0 issues S of its next tile behind its last P V instead
    of after it; 3: tiles loaded and S issued in 64-column pieces, each on its own ready barrier; 4: 3, and
    warpgroup 1 issues P0 V0_R before P1 V1_R); grid and partials as ws_prefix_kernel. kh_d: KV latent in
    [BLOCK_N, V_DIM / 2] blocks (the A and B parts of a tile; [BLOCK_N, 64] for SEESAW >= 3)."""
    pid_q = gl.program_id(0)
    pid_s = gl.program_id(1)
    q0 = pid_q * BLOCK_M
    start, end, n_tiles = _chunk_bounds(pid_s, chunk, prefix_len, R, BLOCK_N, FOLD)
    HALF: gl.constexpr = V_DIM // 2
    dt: gl.constexpr = kh_d.dtype

    q_lat_s = gl.allocate_shared_memory(dt, [BLOCK_M, V_DIM], q_lat_d.layout)
    q_pe_s = gl.allocate_shared_memory(dt, [BLOCK_M, PE_DIM], q_pe_d.layout)
    half_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HALF], dt)
    ka_s = gl.allocate_shared_memory(dt, [2, BLOCK_N, HALF], half_layout)
    kb_s = gl.allocate_shared_memory(dt, [2, BLOCK_N, HALF], half_layout)
    kc_s = gl.allocate_shared_memory(dt, [2, BLOCK_N, PE_DIM], k_pe_d.layout)
    # the same halves as 64-column pieces (a [64, 256] 128B-swizzled tile is four [64, 64] ones, 8 KB apart)
    ka_q = ka_s._reinterpret(dt, [2 * (HALF // 64), BLOCK_N, 64], k_pe_d.layout)
    kb_q = kb_s._reinterpret(dt, [2 * (HALF // 64), BLOCK_N, 64], k_pe_d.layout)
    vec: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])
    m_s = gl.allocate_shared_memory(gl.float32, [BLOCK_M], vec)
    sc0_s = gl.allocate_shared_memory(gl.float32, [BLOCK_M], vec)
    sc1_s = gl.allocate_shared_memory(gl.float32, [BLOCK_M], vec)
    l_s = gl.allocate_shared_memory(gl.float32, [BLOCK_M], vec)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    N_READY: gl.constexpr = 2 * (2 * (HALF // 64) + 1) if SEESAW >= 3 else 6
    ready = gl.allocate_shared_memory(gl.int64, [N_READY, 1], mbarrier.MBarrierLayout())
    free = gl.allocate_shared_memory(gl.int64, [6, 1], mbarrier.MBarrierLayout())
    hs = gl.allocate_shared_memory(gl.int64, [6, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for b in gl.static_range(N_READY):
        mbarrier.init(ready.index(b), count=1)
    for b in gl.static_range(6):
        mbarrier.init(free.index(b), count=1)
        mbarrier.init(hs.index(b), count=1)
    fence_async_shared()

    gl.warp_specialize([
        (_ss_wg0, (q_lat_s, q_pe_s, ka_s, kb_s, kc_s, ka_q, kb_q, m_s, sc0_s, sc1_s, l_s, q_bar, ready, free, hs,
                   Bits, O_part, LSE_part, stride_ps, stride_pq, q0, pid_s, start, end, n_tiles, prefix_len, Hq, H,
                   qk_scale, BLOCK_M, BLOCK_N, HALF, SEESAW == 2, SEESAW >= 3)),
        (_ss_wg1, (q_lat_s, q_pe_s, ka_s, kb_s, kc_s, ka_q, kb_q, m_s, sc0_s, sc1_s, l_s, q_bar, ready, free, hs,
                   Bits, O_part, stride_ps, stride_pq, q0, pid_s, start, end, n_tiles, prefix_len, Hq, H, qk_scale,
                   BLOCK_M, BLOCK_N, HALF, SEESAW >= 3, SEESAW == 4)),
        (_ss_loader, (q_lat_d, q_pe_d, kh_d, k_pe_d, q_lat_s, q_pe_s, ka_s, kb_s, kc_s, ka_q, kb_q, q_bar, ready,
                      free, q0, start, n_tiles, BLOCK_N, HALF, SEESAW >= 3)),
    ], [4, 1], [PV_REGS, LOAD_REGS])
