"""Gluon prefix kernel of the `split_ws` path for 65 to 72 folded query rows (8 heads x 9 rows) in ONE program.

The CUDA kernel (cuda/seesaw_sm90.cu) puts 64 folded rows on the MMA's M side, so 72 rows take two programs per
chunk and the second computes 64 rows for 8: half of the grid does 1/8 useful work, and each program streams
half as many tiles as it could. Here one program takes all 72 rows of a chunk: rows 0..63 on warpgroup 0 (and
half of their P V on warpgroup 1), and the 8 "tail" rows with the operands swapped (KV tokens on M, the 8 rows on
N, which wgmma allows in steps of 8) on warpgroup 1. With half as many programs per chunk the grid takes twice as
many splits, so each program streams half as many tiles. Per tile:

    S   [64, 64 tokens]  = Q_lat [64, 512] K_lat^T + Q_pe [64, 64] K_pe^T         (warpgroup 0)
    O[:, :256] += P V[:, :256]  (warpgroup 0, P from registers);  O[:, 256:] += P V[:, 256:]  (warpgroup 1)
    S_t^T [64 tokens, 8]  = K_lat [64, 512] Q_t_lat^T + K_pe [64, 64] Q_t_pe^T    (A = the tile, B = Q tail)
    O_t^T [512, 8]       += V^T [512, 64] P_t^T [64, 8]                           (A = the tile, transposed)

Partitions (shared memory: Q 72 KB + Q tail 9 KB + 2 x 72 KB of tiles + P tail 1 KB = 226 KB of the 227 KB):

  loader   (1 warp):  Q and the Q tail once, then each tile into the ring of 2 stages (kv_ready / kv_free).
  warpgroup 0 (the default partition): S = Q K^T of rows 0..63, the online softmax, O[:, :256] += P V[:, :256]
                      with P from registers; P (bf16) goes to warpgroup 1 in the tile's own K_pe buffer (dead
                      once both S products of the tile are computed; a [64, 64] bf16 wgmma operand already);
                      alpha in a 2-slot buffer. A tile that reaches past the last live row (prefix_len + R: a
                      device plan's cache may hold anything there, NaN too) has those rows of its latent part set
                      to zero first, so that P = 0 there meets no NaN in P V.
  warpgroup 1:        S_t^T of the tail rows (then releases the tile's K_pe buffer: ``pe_free``), their online
                      softmax along the tokens (axis 0), P_t^T to shared memory; then, once warpgroup 0's P is
                      there (``p_ready``), O[:, 256:] += P V[:, 256:] and O_t^T += V^T P_t^T; releases the stage.
At the end warpgroup 0 passes 1 / l through the alpha buffer (``fin``); both store their half of the normalized
partial of rows 0..63 and warpgroup 1 the tail rows' partial and log2-sum-exp, in `split`'s layout (fp32, or
the inputs' 16-bit type with WsTuning.part_bits 16), so the merge is unchanged.
The grid is (row blocks of 72, splits) sized for the plan's bound; each program reads the live prefix length from
device memory and derives its chunk (``_live_bounds``, the CUDA kernel's rule: split_ws.grid_piece mirrors it), so
one captured launch serves any length up to the bound; a split past the live length marks its slot empty
(lse -inf) and exits. The tree part (the R new rows, columns prefix_len .. prefix_len + R - 1, masked by the
per-row ancestor bitmask: bit j of row r set when row r sees new row j) rides on the last prefix split (FOLD),
whose partial therefore always has a finite log-sum-exp, or is one more split index of its own (FOLD = 0).
FUSE (WsTuning.tail_fuse 1): the merge runs inside the launch, as the CUDA kernel's does: every program, empty
ones too, arrives at a grid barrier on a counter of the plan's own after storing its partial (``_grid_barrier``),
then merges its share of the (row, 128-column slice) items into the output. The grid is one
wave (at most one 226 KB program per SM), so every program is resident and the wait ends.
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

# Gluon's names across Triton releases: 3.6 (the H200 machine) has tma.async_copy_global_to_shared and
# gl.thread_barrier, later ones tma.async_load and gl.barrier (the old names removed)
_tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
_sync_warps = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier
EMPTY_ROWS = gl.constexpr(128)  # the power of two above BLOCK_M + TAIL (an empty split's lse row block)
LANES = gl.constexpr(gl.BlockedLayout([1], [32], [1], [0]))  # one value per lane of one warp (the loader's)
MERGE_BATCH = gl.constexpr(64)  # partials per step of the fused merge: 16 four-value loads per thread in flight (32 KB
                                # per SM; 128 threads, one program per SM, need that many against L2's latency); no
                                # spills on Triton 3.6 (tests/test_ws_tail_compile.py)


@gluon.jit
def _tl_loader(q_lat_d, q_pe_d, qt_lat_d, qt_pe_d, k_lat_d, k_pe_d, q_lat_s, q_pe_s, qt_lat_s, qt_pe_s, k_lat_s,
               k_pe_s, idx_s, q_bar, kv_ready, kv_free, Queue, q0, start, n_tiles, BLOCK_M: gl.constexpr,
               BLOCK_N: gl.constexpr, STAGES: gl.constexpr, QUEUE: gl.constexpr):
    mbarrier.expect(q_bar, q_lat_d.block_type.nbytes + q_pe_d.block_type.nbytes + qt_lat_d.block_type.nbytes
                    + qt_pe_d.block_type.nbytes)
    _tma_load(q_lat_d, [q0, 0], q_bar, q_lat_s)
    _tma_load(q_pe_d, [q0, 0], q_bar, q_pe_s)
    _tma_load(qt_lat_d, [q0 + BLOCK_M, 0], q_bar, qt_lat_s.index(0))
    _tma_load(qt_pe_d, [q0 + BLOCK_M, 0], q_bar, qt_pe_s.index(0))
    if QUEUE:  # n_tiles: the tiles of the whole launch
        _queue_tiles(k_lat_d, k_pe_d, k_lat_s, k_pe_s, idx_s, kv_ready, kv_free, Queue, n_tiles, BLOCK_N, STAGES)
    else:
        _load_tiles(k_lat_d, k_pe_d, k_lat_s, k_pe_s, kv_ready, kv_free, start, n_tiles, BLOCK_N, STAGES)


@gluon.jit
def _load_tiles(k_lat_d, k_pe_d, k_lat_s, k_pe_s, kv_ready, kv_free, start, n_tiles, BLOCK_N: gl.constexpr,
                STAGES: gl.constexpr):
    """The loader's ring: each [BLOCK_N, 512 + 64] KV tile of the chunk by TMA into stage i % STAGES once both
    warpgroups have released it (``kv_free``), completing ``kv_ready`` by byte count."""
    nbytes: gl.constexpr = k_lat_d.block_type.nbytes + k_pe_d.block_type.nbytes
    for i in range(n_tiles):
        st = i % STAGES
        mbarrier.wait(kv_free.index(st), ((i // STAGES) & 1) ^ 1)
        bar = kv_ready.index(st)
        mbarrier.expect(bar, nbytes)
        n0 = start + i * BLOCK_N
        _tma_load(k_lat_d, [n0, 0], bar, k_lat_s.index(st))
        _tma_load(k_pe_d, [n0, 0], bar, k_pe_s.index(st))


@gluon.jit
def _grab(Queue, lane):
    """The next tile of the launch's queue (QUEUE): one atomic add on Queue[0] by lane 0 of the loader warp (``lane``:
    0..31 in LANES), its old value passed to every lane by a warp reduction (no shared memory, no barrier)."""
    old = gl.atomic_add(Queue + lane * 0, gl.full([32], 1, gl.int32, LANES), mask=lane == 0, sem="relaxed",
                        scope="gpu")
    return gl.max(gl.where(lane == 0, old, -1), axis=0)


@gluon.jit
def _put_tile(idx_s, st, t):
    """Tile index t (-1: none left) into stage st's index slot, for both warpgroups to read once the stage is ready
    (the slot is free: both warpgroups read it before releasing the stage's previous tile)."""
    lay: gl.constexpr = gl.BlockedLayout([4], [32], [1], [0])
    idx_s.index(st).store(gl.zeros([4], gl.int32, lay) + t)
    _sync_warps()  # every lane's store before the arrival that releases it


@gluon.jit
def _slot_tile(idx_s, st):
    """The tile index the loader put in stage st's index slot (each thread reads the same 4 values)."""
    lay: gl.constexpr = gl.BlockedLayout([4], [32], [4], [0])
    return gl.max(idx_s.index(st).load(lay), axis=0)


@gluon.jit
def _next_tile(kv_ready, idx_s, i, STAGES: gl.constexpr):
    """A warpgroup's i-th tile under QUEUE: its stage's ``kv_ready`` waited for, then the index there (-1: the end)."""
    mbarrier.wait(kv_ready.index(i % STAGES), (i // STAGES) & 1)
    return _slot_tile(idx_s, i % STAGES)


@gluon.jit
def _queue_tiles(k_lat_d, k_pe_d, k_lat_s, k_pe_s, idx_s, kv_ready, kv_free, Queue, n_total, BLOCK_N: gl.constexpr,
                 STAGES: gl.constexpr):
    """The loader's ring under QUEUE: the next tile of the launch from the queue (``_grab``, asked for while the
    stage it goes to may still be busy), its index put in the stage's index slot, the tile by TMA; once the queue
    is past the last tile, index -1 and a plain arrival on the next stage's ``kv_ready``: the warpgroups' end."""
    lane = gl.arange(0, 32, LANES)
    nbytes: gl.constexpr = k_lat_d.block_type.nbytes + k_pe_d.block_type.nbytes
    i = 0
    t = _grab(Queue, lane)
    while t < n_total:
        st = i % STAGES
        mbarrier.wait(kv_free.index(st), ((i // STAGES) & 1) ^ 1)
        _put_tile(idx_s, st, t)
        bar = kv_ready.index(st)
        mbarrier.expect(bar, nbytes)
        _tma_load(k_lat_d, [t * BLOCK_N, 0], bar, k_lat_s.index(st))
        _tma_load(k_pe_d, [t * BLOCK_N, 0], bar, k_pe_s.index(st))
        i += 1
        t = _grab(Queue, lane)
    st = i % STAGES
    mbarrier.wait(kv_free.index(st), ((i // STAGES) & 1) ^ 1)
    _put_tile(idx_s, st, t * 0 - 1)
    mbarrier.arrive(kv_ready.index(st), count=1)


@gluon.jit
def _queue_done(Queue):
    """After the program's partitions (its loader's last ask included): one acq_rel arrival on Queue[1]; the last
    program to arrive sets both words back to zero for the next launch or graph replay."""
    _sync_warps()
    done = gl.atomic_add(Queue + 1, 1, sem="acq_rel", scope="gpu")
    if done == gl.num_programs(0) * gl.num_programs(1) - 1:
        gl.atomic_xchg(Queue, 0, sem="relaxed", scope="gpu")
        gl.atomic_xchg(Queue + 1, 0, sem="relaxed", scope="gpu")


@gluon.jit
def _ss_scores(s, n0, bits, offs_n0, end, prefix_len, qk_scale, BLOCK_N: gl.constexpr):
    """The scores of the tile at column n0 in base 2, masked only where it reaches the tree columns or the end."""
    if n0 + BLOCK_N > gl.minimum(end, prefix_len):
        offs_n = n0 + offs_n0
        c = gl.minimum(gl.maximum(offs_n - prefix_len, 0), 63).to(gl.int64)
        see = (offs_n < prefix_len)[None, :] | (((bits[:, None] >> c[None, :]) & 1) != 0)
        s = gl.where(see & (offs_n < end)[None, :], s * qk_scale, float("-inf"))
    else:
        s = s * qk_scale
    return s


@gluon.jit
def _live_bounds(pid_s, n_splits, prefix_len, R, BLOCK_N: gl.constexpr, FOLD: gl.constexpr):
    """Columns [start, end) of split pid_s at the live prefix length, the CUDA kernel's rule (split_ws.grid_piece):
    n_splits prefix splits of whole tiles; FOLD: the last one also takes the R tree columns, else split n_splits is
    the tree part alone. start >= end: an empty split (past the live length)."""
    chunk = gl.maximum(gl.cdiv(gl.cdiv(prefix_len, n_splits), BLOCK_N) * BLOCK_N, BLOCK_N)
    start = gl.minimum(pid_s * chunk, prefix_len)
    end = gl.minimum(start + chunk, prefix_len)
    if FOLD:
        end = gl.where(pid_s == n_splits - 1, prefix_len + R, end)
    else:
        start = gl.where(pid_s == n_splits, prefix_len, start)
        end = gl.where(pid_s == n_splits, prefix_len + R, end)
    return start, end


@gluon.jit
def _mark_empty(LSE_part, pid_s, q0, Hq, ROWS: gl.constexpr):
    """An empty split's slot: lse -inf for its rows (the merge gives it weight 0 and never reads its O)."""
    lay: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    rows = q0 + gl.arange(0, EMPTY_ROWS, lay)
    gl.store(LSE_part + pid_s * Hq + rows, gl.full([EMPTY_ROWS], float("-inf"), gl.float32, lay),
             mask=(rows < q0 + ROWS) & (rows < Hq))


@gluon.jit
def _zero_rows(k_lat, first, BLOCK_N: gl.constexpr, V_DIM: gl.constexpr):
    """Rows [first, BLOCK_N) of a stage's latent tile set to zero, so that P = 0 there meets no NaN in P V."""
    lay: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    keep = (gl.arange(0, BLOCK_N, gl.SliceLayout(1, lay)) < first)[:, None]
    for c in gl.static_range(V_DIM // 64):  # 64 columns (128 bytes, one swizzle row) at a time
        piece = k_lat.slice(c * 64, 64, dim=1)
        x = piece.load(lay)
        piece.store(gl.where(keep, x, gl.zeros([BLOCK_N, 64], x.dtype, lay)))


@gluon.jit
def _wg0_tile(q_lat_s, q_pe_s, k_lat, k_pe, a_slot, p_ready_b, pe_free_b, kv_free_b, ph, n0, m_i, l_i, acc, s_zero,
              bits, offs_n0, end, prefix_len, live_end, qk_scale, BLOCK_N: gl.constexpr, HALF: gl.constexpr,
              V_DIM: gl.constexpr, o_layout: gl.constexpr, p_dot: gl.constexpr, GUARD: gl.constexpr):
    """Warpgroup 0 on one ready tile (at column n0): S, the online softmax, P to warpgroup 1, its half of P V.
    GUARD: a row may have seen no column yet after this tile (under QUEUE a program's first tile can be the last
    one, tree columns only, where a row without a descendant there sees nothing): exponents taken from 0, not
    NaN, as warpgroup 1 does for the tail rows (a fixed chunk starts with prefix columns, which every row sees)."""
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    if n0 + BLOCK_N > live_end:  # no fence before S: S may read the rows as they were, which is right only
        _zero_rows(k_lat, live_end - n0, BLOCK_N, V_DIM)  # because _ss_scores masks them; P V reads after the fence
    s = warpgroup_mma(q_lat_s, k_lat.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma(q_pe_s, k_pe.permute((1, 0)), s, is_async=True)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
    s = _ss_scores(s, n0, bits, offs_n0, end, prefix_len, qk_scale, BLOCK_N)
    m_new = gl.maximum(m_i, gl.max(s, axis=1))
    if GUARD:
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_use)
        p = gl.exp2(s - m_use[:, None])
    else:
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + gl.sum(p, axis=1)
    m_i = m_new
    p16 = p.to(k_lat.dtype)
    # P goes over the tile's K_pe once warpgroup 1 has computed the tail rows' scores from it
    mbarrier.wait(pe_free_b, ph)
    k_pe.store(p16)
    a_slot.store(alpha)
    fence_async_shared()
    _sync_warps()
    mbarrier.arrive(p_ready_b, count=1)
    acc = acc * gl.convert_layout(alpha, row_o)[:, None]
    acc = warpgroup_mma(gl.convert_layout(p16, p_dot), k_lat.slice(0, HALF, dim=1), acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    _sync_warps()
    mbarrier.arrive(kv_free_b, count=1)
    return m_i, l_i, acc


@gluon.jit
def _tl_wg0(q_lat_s, q_pe_s, k_lat_s, k_pe_s, a_s, idx_s, q_bar, kv_ready, kv_free, p_ready, pe_free, fin,
            Bits, O_part, LSE_part, stride_ps, stride_pq, q0, pid_s, start, end, n_tiles, prefix_len, live_end, Hq,
            H, qk_scale, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HALF: gl.constexpr, V_DIM: gl.constexpr,
            STAGES: gl.constexpr, QUEUE: gl.constexpr):
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HALF, 16])
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    p_dot: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)

    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_s)
    l_i = gl.zeros([BLOCK_M], gl.float32, row_s)
    acc = gl.zeros([BLOCK_M, HALF], gl.float32, o_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    offs_n0 = gl.arange(0, BLOCK_N, col_s)
    rows = q0 + gl.arange(0, BLOCK_M, row_s)
    bits = gl.load(Bits + rows // H, mask=rows < Hq, other=-1)  # padded rows see every tree column: finite
    mbarrier.wait(q_bar, 0)
    if QUEUE:  # tiles from the loader's queue until index -1 (each index read once its stage is ready)
        i = 0
        t = _next_tile(kv_ready, idx_s, i, STAGES)
        while t >= 0:
            st = i % STAGES
            m_i, l_i, acc = _wg0_tile(q_lat_s, q_pe_s, k_lat_s.index(st), k_pe_s.index(st), a_s.index(st),
                                      p_ready.index(st), pe_free.index(st), kv_free.index(st), (i // STAGES) & 1,
                                      t * BLOCK_N, m_i, l_i, acc, s_zero, bits, offs_n0, end, prefix_len, live_end,
                                      qk_scale, BLOCK_N, HALF, V_DIM, o_layout, p_dot, True)
            i += 1
            t = _next_tile(kv_ready, idx_s, i, STAGES)
        n_tiles = i
    else:
        for i in range(n_tiles):
            st = i % STAGES
            ph = (i // STAGES) & 1
            mbarrier.wait(kv_ready.index(st), ph)
            m_i, l_i, acc = _wg0_tile(q_lat_s, q_pe_s, k_lat_s.index(st), k_pe_s.index(st), a_s.index(st),
                                      p_ready.index(st), pe_free.index(st), kv_free.index(st), ph,
                                      start + i * BLOCK_N, m_i, l_i, acc, s_zero, bits, offs_n0, end, prefix_len,
                                      live_end, qk_scale, BLOCK_N, HALF, V_DIM, o_layout, p_dot, False)
    # 1 / l to warpgroup 1 in the alpha slot of tile n_tiles (its last reader, tile n_tiles - 2, is done: warpgroup
    # 1 released tile n_tiles - 1's K_pe, which it does only after finishing tile n_tiles - 2)
    inv_l = 1.0 / l_i
    if QUEUE:  # a row that saw no column here: 0, so its (never merged) partial is 0, not NaN
        inv_l = gl.where(l_i > 0, inv_l, 0.0)
    a_s.index(n_tiles % STAGES).store(inv_l)
    _sync_warps()
    mbarrier.arrive(fin, count=1)
    gl.store(LSE_part + pid_s * Hq + rows, m_i + gl.log2(l_i), mask=rows < Hq)
    if QUEUE:
        if n_tiles > 0:  # a program the queue gave nothing: lse -inf above, its O never read by the merge
            _wg0_store(O_part, acc, inv_l, q0, pid_s, stride_ps, stride_pq, Hq, BLOCK_M, HALF, o_layout)
    else:
        _wg0_store(O_part, acc, inv_l, q0, pid_s, stride_ps, stride_pq, Hq, BLOCK_M, HALF, o_layout)


@gluon.jit
def _wg0_store(O_part, acc, inv_l, q0, pid_s, stride_ps, stride_pq, Hq, BLOCK_M: gl.constexpr, HALF: gl.constexpr,
               o_layout: gl.constexpr):
    """Warpgroup 0's half of the normalized partial of rows 0..63."""
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    col_o: gl.constexpr = gl.SliceLayout(0, o_layout)
    out = acc * gl.convert_layout(inv_l, row_o)[:, None]
    rows_o = q0 + gl.arange(0, BLOCK_M, row_o)
    cols = gl.arange(0, HALF, col_o)
    ptr = O_part + pid_s * stride_ps + rows_o[:, None] * stride_pq + cols[None, :]
    gl.store(ptr, out.to(O_part.dtype.element_ty), mask=(rows_o < Hq)[:, None])


@gluon.jit
def _wg1_tile(qt_lat_s, qt_pe_s, k_lat, k_pe, a_slot, pt_s, p_ready_b, pe_free_b, kv_free_b, ph, i, n0, acc, acc_t,
              m_t, l_t, st_zero, bits, offs_t0, end, prefix_len, qk_scale, BLOCK_N: gl.constexpr,
              HALF: gl.constexpr, o_layout: gl.constexpr):
    """Warpgroup 1 on one ready tile (at column n0): the tail rows' S_t^T and softmax, then once warpgroup 0's P is
    there its half of P V and the tail rows' O_t^T."""
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    # (i >> 30) is 0; it keeps the compiler from hoisting the loop-invariant wgmma descriptors of the
    # Q tail and P_t buffers out of the loop, where they would be spilled
    z = i >> 30
    s = warpgroup_mma(k_lat, qt_lat_s.index(z).permute((1, 0)), st_zero, use_acc=False, is_async=True)
    s = warpgroup_mma(k_pe, qt_pe_s.index(z).permute((1, 0)), s, is_async=True)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
    _sync_warps()
    mbarrier.arrive(pe_free_b, count=1)
    if n0 + BLOCK_N > gl.minimum(end, prefix_len):
        offs_t = n0 + offs_t0
        c = gl.minimum(gl.maximum(offs_t - prefix_len, 0), 63).to(gl.int64)
        see = (offs_t < prefix_len)[:, None] | (((bits[None, :] >> c[:, None]) & 1) != 0)
        s = gl.where(see & (offs_t < end)[:, None], s * qk_scale, float("-inf"))
    else:
        s = s * qk_scale
    m_new = gl.maximum(m_t, gl.max(s, axis=0))
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen nothing yet: 0, not NaN
    alpha_t = gl.exp2(m_t - m_use)
    p = gl.exp2(s - m_use[None, :])
    l_t = l_t * alpha_t + gl.sum(p, axis=0)
    m_t = m_new
    pt = pt_s.index(z)
    pt.store(gl.permute(p.to(k_lat.dtype), (1, 0)))  # P_t^T kept as [TAIL, 64]: K-major for the wgmma
    fence_async_shared()
    _sync_warps()
    mbarrier.wait(p_ready_b, ph)
    alpha = a_slot.load(row_o)
    acc = acc * alpha[:, None]
    acc = warpgroup_mma(k_pe, k_lat.slice(HALF, HALF, dim=1), acc, is_async=True)  # P (in K_pe's buffer) V_R
    acc_t = acc_t * alpha_t[None, :]
    acc_t = warpgroup_mma(k_lat.permute((1, 0)), pt.permute((1, 0)), acc_t, is_async=True)
    acc, acc_t = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc_t))
    _sync_warps()
    mbarrier.arrive(kv_free_b, count=1)
    return acc, acc_t, m_t, l_t


@gluon.jit
def _tl_wg1(qt_lat_s, qt_pe_s, k_lat_s, k_pe_s, a_s, pt_s, idx_s, q_bar, kv_ready, kv_free, p_ready, pe_free, fin,
            Bits, O_part, LSE_part, stride_ps, stride_pq, q0, pid_s, start, end, n_tiles, prefix_len, Hq, H,
            qk_scale, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HALF: gl.constexpr, V_DIM: gl.constexpr,
            TAIL: gl.constexpr, STAGES: gl.constexpr, QUEUE: gl.constexpr):
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HALF, 16])
    t_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, TAIL, 16])
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    tok_t: gl.constexpr = gl.SliceLayout(1, t_layout)  # along the tile's tokens (S_t^T) or value dims (O_t^T)
    row_t: gl.constexpr = gl.SliceLayout(0, t_layout)  # along the tail rows
    acc = gl.zeros([BLOCK_M, HALF], gl.float32, o_layout)
    acc_t = gl.zeros([V_DIM, TAIL], gl.float32, t_layout)
    st_zero = gl.zeros([BLOCK_N, TAIL], gl.float32, t_layout)
    m_t = gl.full([TAIL], float("-inf"), gl.float32, row_t)
    l_t = gl.zeros([TAIL], gl.float32, row_t)
    offs_t0 = gl.arange(0, BLOCK_N, tok_t)
    rows_t = q0 + BLOCK_M + gl.arange(0, TAIL, row_t)
    bits = gl.load(Bits + rows_t // H, mask=rows_t < Hq, other=-1)
    mbarrier.wait(q_bar, 0)
    if QUEUE:  # tiles from the loader's queue until index -1 (see _tl_wg0)
        i = 0
        t = _next_tile(kv_ready, idx_s, i, STAGES)
        while t >= 0:
            st = i % STAGES
            acc, acc_t, m_t, l_t = _wg1_tile(qt_lat_s, qt_pe_s, k_lat_s.index(st), k_pe_s.index(st), a_s.index(st),
                                             pt_s, p_ready.index(st), pe_free.index(st), kv_free.index(st),
                                             (i // STAGES) & 1, i, t * BLOCK_N, acc, acc_t, m_t, l_t, st_zero, bits,
                                             offs_t0, end, prefix_len, qk_scale, BLOCK_N, HALF, o_layout)
            i += 1
            t = _next_tile(kv_ready, idx_s, i, STAGES)
        n_tiles = i
    else:
        for i in range(n_tiles):
            st = i % STAGES
            ph = (i // STAGES) & 1
            mbarrier.wait(kv_ready.index(st), ph)
            acc, acc_t, m_t, l_t = _wg1_tile(qt_lat_s, qt_pe_s, k_lat_s.index(st), k_pe_s.index(st), a_s.index(st),
                                             pt_s, p_ready.index(st), pe_free.index(st), kv_free.index(st), ph, i,
                                             start + i * BLOCK_N, acc, acc_t, m_t, l_t, st_zero, bits, offs_t0, end,
                                             prefix_len, qk_scale, BLOCK_N, HALF, o_layout)
    mbarrier.wait(fin, 0)
    inv_l = a_s.index(n_tiles % STAGES).load(row_o)
    if QUEUE:
        gl.store(LSE_part + pid_s * Hq + rows_t, m_t + gl.log2(l_t), mask=rows_t < Hq)
        if n_tiles > 0:  # a program the queue gave nothing: lse -inf above, its O never read by the merge
            _wg1_store_half(O_part, acc, inv_l, q0, pid_s, stride_ps, stride_pq, Hq, BLOCK_M, HALF, o_layout)
            _wg1_store_tail(O_part, acc_t, gl.where(l_t > 0, 1.0 / l_t, 0.0), rows_t, pid_s, stride_ps, stride_pq,
                            Hq, V_DIM, t_layout)
    else:
        _wg1_store_half(O_part, acc, inv_l, q0, pid_s, stride_ps, stride_pq, Hq, BLOCK_M, HALF, o_layout)
        gl.store(LSE_part + pid_s * Hq + rows_t, m_t + gl.log2(l_t), mask=rows_t < Hq)
        _wg1_store_tail(O_part, acc_t, 1.0 / l_t, rows_t, pid_s, stride_ps, stride_pq, Hq, V_DIM, t_layout)


@gluon.jit
def _wg1_store_half(O_part, acc, inv_l, q0, pid_s, stride_ps, stride_pq, Hq, BLOCK_M: gl.constexpr,
                    HALF: gl.constexpr, o_layout: gl.constexpr):
    """Warpgroup 1's half of the normalized partial of rows 0..63."""
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    col_o: gl.constexpr = gl.SliceLayout(0, o_layout)
    out = acc * inv_l[:, None]
    rows = q0 + gl.arange(0, BLOCK_M, row_o)
    cols = HALF + gl.arange(0, HALF, col_o)
    ptr = O_part + pid_s * stride_ps + rows[:, None] * stride_pq + cols[None, :]
    gl.store(ptr, out.to(O_part.dtype.element_ty), mask=(rows < Hq)[:, None])


@gluon.jit
def _wg1_store_tail(O_part, acc_t, inv_t, rows_t, pid_s, stride_ps, stride_pq, Hq, V_DIM: gl.constexpr,
                    t_layout: gl.constexpr):
    """The tail rows' normalized partial."""
    tok_t: gl.constexpr = gl.SliceLayout(1, t_layout)
    out_t = acc_t * inv_t[None, :]
    dims = gl.arange(0, V_DIM, tok_t)
    ptr_t = O_part + pid_s * stride_ps + rows_t[None, :] * stride_pq + dims[:, None]
    gl.store(ptr_t, out_t.to(O_part.dtype.element_ty), mask=(rows_t < Hq)[None, :])


@gluon.jit
def _grid_barrier(Counter, n_prog):
    """Every program of the launch arrives once (after its own stores) and waits until all n_prog have: a
    sense-reversing barrier on Counter [2] int32 (arrivals, generation). A program reads the generation, then
    arrives (acq_rel); the last to arrive sets the arrivals back to 0 and moves the generation on (release), the
    others wait (acquire) until it moves. No division (a 64-bit one is a call that spills), no reset between
    launches or graph replays; the generation wraps harmlessly (only compared for equality)."""
    _sync_warps()  # the program's stores are done before its arrival
    gen = gl.atomic_add(Counter + 1, 0, sem="acquire", scope="gpu")
    old = gl.atomic_add(Counter, 1, sem="acq_rel", scope="gpu")
    if old == n_prog - 1:
        gl.atomic_xchg(Counter, 0, sem="relaxed", scope="gpu")
        gl.atomic_add(Counter + 1, 1, sem="release", scope="gpu")
    else:
        now = gen
        while now == gen:
            now = gl.atomic_add(Counter + 1, 0, sem="acquire", scope="gpu")
    _sync_warps()


@gluon.jit
def _fused_merge(O_part, LSE_part, Out, stride_ps, stride_pq, stride_or, stride_oh, Counter, Hq, H, n_parts,
                 V_DIM: gl.constexpr, PARTS: gl.constexpr, BATCH: gl.constexpr):
    """After the grid barrier, item it = (row, 128-column slice) on program it mod grid: the weights
    2^(lse_s - max) of the row's n_parts partials, then the partials in [BATCH, 128] tiles (BATCH / 4 four-value
    loads per thread in flight; an empty split's weight is 0 and its O is never read) summed into out [R, H, V_DIM]. The
    partials are read through L2 (.cg: other SMs wrote them in this launch)."""
    n_prog = gl.num_programs(0) * gl.num_programs(1)
    pid = gl.program_id(0) + gl.program_id(1) * gl.num_programs(0)
    _grid_barrier(Counter, n_prog)
    one: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    tile: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [4, 1], [1, 0])
    s_all = gl.arange(0, PARTS, one)
    s_b = gl.arange(0, BATCH, gl.SliceLayout(1, tile))
    cols0 = gl.arange(0, 128, gl.SliceLayout(0, tile))
    for it in range(pid, Hq * (V_DIM // 128), n_prog):
        row = it // (V_DIM // 128)
        cols = (it % (V_DIM // 128)) * 128 + cols0
        lse = gl.load(LSE_part + s_all * Hq + row, mask=s_all < n_parts, other=float("-inf"), cache_modifier=".cg")
        m = gl.max(lse, axis=0)
        m = gl.where(m == float("-inf"), 0.0, m)
        total = gl.sum(gl.exp2(lse - m), axis=0)
        acc = gl.zeros([BATCH, 128], gl.float32, tile)
        src = O_part + row * stride_pq + cols[None, :]
        for s0 in range(0, n_parts, BATCH):
            s = s0 + s_b
            w = gl.exp2(gl.load(LSE_part + s * Hq + row, mask=s < n_parts, other=float("-inf"),
                                cache_modifier=".cg") - m)
            o = gl.load(src + s.to(gl.int64)[:, None] * stride_ps, mask=(w > 0)[:, None], other=0.0,
                        cache_modifier=".cg")
            acc += w[:, None] * o.to(gl.float32)
        out = gl.sum(acc, axis=0) / total
        dst = Out + (row // H) * stride_or + (row % H) * stride_oh + cols
        gl.store(dst, out.to(Out.dtype.element_ty))


@gluon.jit
def ws_tail_kernel(q_lat_d, q_pe_d, qt_lat_d, qt_pe_d, k_lat_d, k_pe_d, Bits, O_part, LSE_part, stride_ps,
                   stride_pq, Prefix, R, n_splits, Hq, H, qk_scale, Out, stride_or, stride_oh, Counter, Queue,
                   BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, V_DIM: gl.constexpr, PE_DIM: gl.constexpr,
                   TAIL: gl.constexpr, PV_REGS: gl.constexpr, LOAD_REGS: gl.constexpr, FOLD: gl.constexpr,
                   FUSE: gl.constexpr, PARTS: gl.constexpr, QUEUE: gl.constexpr):
    """Grid (1, n_splits) with FOLD (the last split also takes the R tree columns), else (1, n_splits + 1) with the
    tree part as split index n_splits; rows 0 .. BLOCK_M + TAIL - 1 (those below Hq written). Prefix: the [1]
    int32 live prefix length (at most the bound the grid and the descriptors were sized for). FUSE: the merge of
    the grid's partials (at most PARTS) into Out [R, H, V_DIM] (row and head strides stride_or, stride_oh) after a
    grid barrier on Counter ([2] int32, zeros before the first launch); without FUSE, Out and Counter are not
    read. QUEUE (tail_queue 1, not with FUSE): one program per SM, each taking the launch's tiles (the tree columns
    in the last) one at a time from Queue ([2] int32: the next tile, the programs done; zeros before and after a
    launch: ``_queue_done``) until none is left, its partial (over the tiles it took) in slot pid_s."""
    STAGES: gl.constexpr = 2
    pid_q = gl.program_id(0)
    pid_s = gl.program_id(1)
    q0 = pid_q * (BLOCK_M + TAIL)
    prefix_len = gl.load(Prefix)
    if QUEUE:  # the whole launch's columns, taken a tile at a time (n_tiles: the launch's tiles, for the loader)
        start = 0
        end = prefix_len + R
    else:
        start, end = _live_bounds(pid_s, n_splits, prefix_len, R, BLOCK_N, FOLD)
        n_parts = n_splits + 1 - FOLD
        if start >= end:
            _mark_empty(LSE_part, pid_s, q0, Hq, BLOCK_M + TAIL)
            if FUSE:
                _fused_merge(O_part, LSE_part, Out, stride_ps, stride_pq, stride_or, stride_oh, Counter, Hq, H,
                             n_parts, V_DIM, PARTS, MERGE_BATCH)
            return
    n_tiles = gl.cdiv(end - start, BLOCK_N)
    HALF: gl.constexpr = V_DIM // 2
    dt: gl.constexpr = k_lat_d.dtype

    q_lat_s = gl.allocate_shared_memory(dt, [BLOCK_M, V_DIM], q_lat_d.layout)
    q_pe_s = gl.allocate_shared_memory(dt, [BLOCK_M, PE_DIM], q_pe_d.layout)
    qt_lat_s = gl.allocate_shared_memory(dt, [1, TAIL, V_DIM], qt_lat_d.layout)
    qt_pe_s = gl.allocate_shared_memory(dt, [1, TAIL, PE_DIM], qt_pe_d.layout)
    k_lat_s = gl.allocate_shared_memory(dt, [STAGES, BLOCK_N, V_DIM], k_lat_d.layout)
    k_pe_s = gl.allocate_shared_memory(dt, [STAGES, BLOCK_N, PE_DIM], k_pe_d.layout)
    pt_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([TAIL, BLOCK_N], dt)
    pt_s = gl.allocate_shared_memory(dt, [1, TAIL, BLOCK_N], pt_layout)
    a_s = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
    if QUEUE:  # each stage's tile index (32 B, in the 64 B the kernel left: it fills the 232,448 B a block gets)
        idx_s = gl.allocate_shared_memory(gl.int32, [STAGES, 4], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
    else:
        idx_s = a_s  # not read
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    fin = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kv_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    p_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    pe_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    mbarrier.init(fin, count=1)
    for st in gl.static_range(STAGES):
        mbarrier.init(kv_ready.index(st), count=1)
        mbarrier.init(kv_free.index(st), count=2)  # both warpgroups release a stage
        mbarrier.init(p_ready.index(st), count=1)
        mbarrier.init(pe_free.index(st), count=1)
    fence_async_shared()

    gl.warp_specialize([
        (_tl_wg0, (q_lat_s, q_pe_s, k_lat_s, k_pe_s, a_s, idx_s, q_bar, kv_ready, kv_free, p_ready, pe_free, fin,
                   Bits, O_part, LSE_part, stride_ps, stride_pq, q0, pid_s, start, end, n_tiles, prefix_len,
                   prefix_len + R, Hq, H, qk_scale, BLOCK_M, BLOCK_N, HALF, V_DIM, STAGES, QUEUE)),
        (_tl_wg1, (qt_lat_s, qt_pe_s, k_lat_s, k_pe_s, a_s, pt_s, idx_s, q_bar, kv_ready, kv_free, p_ready, pe_free,
                   fin, Bits, O_part, LSE_part, stride_ps, stride_pq, q0, pid_s, start, end, n_tiles, prefix_len, Hq,
                   H, qk_scale, BLOCK_M, BLOCK_N, HALF, V_DIM, TAIL, STAGES, QUEUE)),
        (_tl_loader, (q_lat_d, q_pe_d, qt_lat_d, qt_pe_d, k_lat_d, k_pe_d, q_lat_s, q_pe_s, qt_lat_s, qt_pe_s,
                      k_lat_s, k_pe_s, idx_s, q_bar, kv_ready, kv_free, Queue, q0, start, n_tiles, BLOCK_M, BLOCK_N,
                      STAGES, QUEUE)),
    ], [4, 1], [PV_REGS, LOAD_REGS])
    if QUEUE:
        _queue_done(Queue)
    if FUSE:
        _fused_merge(O_part, LSE_part, Out, stride_ps, stride_pq, stride_or, stride_oh, Counter, Hq, H, n_parts,
                     V_DIM, PARTS, MERGE_BATCH)
