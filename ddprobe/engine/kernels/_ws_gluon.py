"""Gluon kernel of the `split_ws` path: one prefix split (or the tree part) of 64 query rows, warp-specialized.

Written in Gluon (``triton.experimental.gluon``, Triton >= 3.6) because Triton 3.6 ignores
``warp_specialize`` on sm_90 and cannot express who waits on whom. One program = 64 folded query rows
(row hq = r * H + h) x one chunk of KV tokens, three partitions sharing shared memory:

  loader   (1 warp):  Q tile once, then each [64 tokens, 512 + 64] KV tile by TMA into a ring of STAGES
                      buffers; waits ``kv_free[s]``, signals ``kv_ready[s]`` (byte-count completion).
  softmax  (4 warps, the default partition, warpgroup 0): S = Q_lat K_lat^T + Q_pe K_pe^T (wgmma m64n64,
                      K = 576), the mask, the online softmax in base 2; hands P (bf16) and the rescale
                      factor alpha to warpgroup 1 through shared memory (a named barrier, bar.arrive here and
                      bar.sync there, with warpgroup 1 done with the previous P when the previous tile's
                      ``kv_free`` completes), then O[:, :256] = alpha O + P V[:, :256] with P from registers.
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


NAMED_BAR = 8  # the named barrier of the hand-off to warpgroup 1 (Gluon's partitions use ids 0-2)
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
def _softmax_step(s, i, gi, m_i, l_i, acc, bits, offs_n0, k_lat_s, p_s, a_s, kv_free, start, end,
                  prefix_len, qk_scale, o_layout: gl.constexpr, BLOCK_N: gl.constexpr, HALF: gl.constexpr,
                  STAGES: gl.constexpr, FFMA: gl.constexpr = False):
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
    # hand P and alpha to warpgroup 1 once it has finished with the previous ones: it is done with P(gi - 1) when
    # tile gi - 1's stage is free (kv_free, as the loader waits)
    if gi > 0:
        mbarrier.wait(kv_free.index((gi - 1) % STAGES), ((gi - 1) // STAGES) & 1)
    p_s.store(p16)
    a_s.store(alpha)
    fence_async_shared()
    _named_arrive()
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    p_dot: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    acc = acc * gl.convert_layout(alpha, row_o)[:, None]
    acc = warpgroup_mma(gl.convert_layout(p16, p_dot), k_lat.slice(0, HALF, dim=1), acc, is_async=True)
    return m_new, l_i, acc


@gluon.jit
def _tile(i, gi, m_i, l_i, acc, bits, offs_n0, q_lat_s, q_pe_s, k_lat_s, k_pe_s, p_s, a_s, q_free, kv_ready, kv_free,
          s_zero, start, end, prefix_len, qk_scale, o_layout: gl.constexpr, BLOCK_N: gl.constexpr,
          HALF: gl.constexpr, STAGES: gl.constexpr, FREE_Q: gl.constexpr, FFMA: gl.constexpr = False):
    """One tile: S (waited), the softmax and P V; FREE_Q: release Q (q_free) once S is done."""
    s = warpgroup_mma_wait(num_outstanding=0,
                           deps=(_issue_s(q_lat_s, q_pe_s, k_lat_s, k_pe_s, kv_ready, s_zero, gi, STAGES), ))
    if FREE_Q:
        mbarrier.arrive(q_free, count=1)
    m_i, l_i, acc = _softmax_step(s, i, gi, m_i, l_i, acc, bits, offs_n0, k_lat_s, p_s, a_s, kv_free, start,
                                  end, prefix_len, qk_scale, o_layout, BLOCK_N, HALF, STAGES, FFMA)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    mbarrier.arrive(kv_free.index(gi % STAGES), count=1)
    return m_i, l_i, acc


@gluon.jit
def _softmax_wg(q_lat_s, q_pe_s, k_lat_s, k_pe_s, p_s, a_s, l_s, q_bar, q_free, kv_ready, kv_free, Bits, O_part, LSE_part, stride_ps, stride_pq, chunk, prefix_len, R, Hq, H, tiles, programs, slots,
                qk_scale, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HALF: gl.constexpr, STAGES: gl.constexpr,
                FOLD: gl.constexpr, BALANCE: gl.constexpr, FFMA: gl.constexpr = False):
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
        if BALANCE:  # the piece's last tile peeled: once its S is done, the loader may bring the next Q
            for i in range(n_tiles - 1):
                m_i, l_i, acc = _tile(i, done + i, m_i, l_i, acc, bits, offs_n0, q_lat_s, q_pe_s, k_lat_s, k_pe_s,
                                      p_s, a_s, q_free, kv_ready, kv_free, s_zero, start, end, prefix_len, qk_scale,
                                      o_layout, BLOCK_N, HALF, STAGES, False, FFMA)
            m_i, l_i, acc = _tile(n_tiles - 1, done + n_tiles - 1, m_i, l_i, acc, bits, offs_n0, q_lat_s, q_pe_s,
                                  k_lat_s, k_pe_s, p_s, a_s, q_free, kv_ready, kv_free, s_zero, start, end, prefix_len,
                                  qk_scale, o_layout, BLOCK_N, HALF, STAGES, True, FFMA)
        else:
            for i in range(n_tiles):
                m_i, l_i, acc = _tile(i, i, m_i, l_i, acc, bits, offs_n0, q_lat_s, q_pe_s, k_lat_s, k_pe_s, p_s, a_s,
                                      q_free, kv_ready, kv_free, s_zero, start, end, prefix_len, qk_scale, o_layout,
                                      BLOCK_N, HALF, STAGES, False, FFMA)
        inv_l = 1.0 / l_i
        # 1 / l in l_s (a_s itself unless BALANCE: then the next piece's alpha must not overwrite it)
        if n_tiles > 0:
            mbarrier.wait(kv_free.index((done + n_tiles - 1) % STAGES), ((done + n_tiles - 1) // STAGES) & 1)
        l_s.store(inv_l)
        if BALANCE:  # sync, not arrive: the next piece's first arrive must not meet warpgroup 1 before this
            _named_sync()  # one's bar.sync (two arrives of warpgroup 0 would complete the barrier alone)
        else:
            _named_arrive()
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
def _pv_wg(k_lat_s, p_s, a_s, l_s, kv_free, O_part, stride_ps, stride_pq, chunk, prefix_len, R, Hq,
           tiles, programs, slots, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HALF: gl.constexpr,
           STAGES: gl.constexpr, FOLD: gl.constexpr, BALANCE: gl.constexpr):
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
            _named_sync()
            alpha = a_s.load(row_o)
            acc = acc * alpha[:, None]
            acc = warpgroup_mma(p_s, k_lat_s.index(st).slice(HALF, HALF, dim=1), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
            gl.thread_barrier()
            mbarrier.arrive(kv_free.index(st), count=1)
        _named_sync()
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
                     STAGES: gl.constexpr, PV_REGS: gl.constexpr, LOAD_REGS: gl.constexpr,
                     FOLD: gl.constexpr, BALANCE: gl.constexpr = False, FFMA: gl.constexpr = False):
    """Grid (cdiv(Hq, 64), num_splits) with FOLD (the last split also takes the R tree columns), else
    (cdiv(Hq, 64), num_splits + 1) with the tree part as split index num_splits; ``slots`` is the grid's
    second dimension. BALANCE (FOLD): grid (programs,), full chunks of ``chunk`` tokens aligned across
    row blocks plus programs sharing the remainders (_piece), each row block's partials in ``slots`` slots.
    FFMA (a positive scale): the softmax scale inside the exponent's FFMA."""
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
    mbarrier.init(q_bar, count=1)
    mbarrier.init(q_free, count=1)
    for st in gl.static_range(STAGES):
        mbarrier.init(kv_ready.index(st), count=1)
        mbarrier.init(kv_free.index(st), count=2)  # both warpgroups release a stage
    fence_async_shared()

    gl.warp_specialize([
        (_softmax_wg, (q_lat_s, q_pe_s, k_lat_s, k_pe_s, p_s, a_s, l_s, q_bar, q_free, kv_ready, kv_free,
                       Bits, O_part, LSE_part, stride_ps, stride_pq, chunk, prefix_len, R, Hq, H, tiles,
                       programs, slots, qk_scale, BLOCK_M, BLOCK_N, HALF, STAGES, FOLD, BALANCE, FFMA)),
        (_pv_wg, (k_lat_s, p_s, a_s, l_s, kv_free, O_part, stride_ps, stride_pq, chunk, prefix_len,
                  R, Hq, tiles, programs, slots, BLOCK_M, BLOCK_N, HALF, STAGES, FOLD, BALANCE)),
        (_loader, (q_lat_d, q_pe_d, k_lat_d, k_pe_d, q_lat_s, q_pe_s, k_lat_s, k_pe_s, q_bar, q_free, kv_ready,
                   kv_free, chunk, prefix_len, R, Hq, tiles, programs, slots, BLOCK_M, BLOCK_N, STAGES, FOLD,
                   BALANCE)),
    ], [4, 1], [PV_REGS, LOAD_REGS])


# Tile scores with the tree mask, shared with the tail kernel (_ws_tail).
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
