"""Gluon kernel of the `split_ws` path: one prefix split (or the tree part) of 64 query rows, warp-specialized.

Written in Gluon (``triton.experimental.gluon``, Triton >= 3.6) because Triton 3.6 ignores
``warp_specialize`` on sm_90 and cannot express who waits on whom. One program = 64 folded query rows
(row hq = r * H + h) x one chunk of KV tokens, three partitions sharing shared memory:

  loader   (1 warp):  Q tile once, then each [64 tokens, 512 + 64] KV tile by TMA into a ring of STAGES
                      buffers; waits ``kv_free[s]``, signals ``kv_ready[s]`` (byte-count completion).
  softmax  (4 warps, the default partition, warpgroup 0): S = Q_lat K_lat^T + Q_pe K_pe^T (wgmma m64n64,
                      K = 576), the mask, the online softmax in base 2; hands P (bf16) and the rescale
                      factor alpha to warpgroup 1 through shared memory (``p_ready`` / ``p_free``), then
                      O[:, :256] = alpha O + P V[:, :256] with P from registers.
  pv       (4 warps, warpgroup 1): O[:, 256:] = alpha O + P V[:, 256:] with P from shared memory.
The 64 x 512 fp32 accumulator is split over the two warpgroups (128 registers each), so warpgroup 1
computes the second half of P V while warpgroup 0 already computes S of the next tile. At the end
warpgroup 0 passes 1 / l through the same handshake, both store their half of the normalized partial
(fp32), and warpgroup 0 stores the log2-sum-exp: the layout `split`'s merge kernel reads.
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
def _loader(q_lat_d, q_pe_d, k_lat_d, k_pe_d, q_lat_s, q_pe_s, k_lat_s, k_pe_s, q_bar, kv_ready, kv_free,
            q0, start, n_tiles, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    mbarrier.expect(q_bar, q_lat_d.block_type.nbytes + q_pe_d.block_type.nbytes)
    tma.async_copy_global_to_shared(q_lat_d, [q0, 0], q_bar, q_lat_s)
    tma.async_copy_global_to_shared(q_pe_d, [q0, 0], q_bar, q_pe_s)
    nbytes: gl.constexpr = k_lat_d.block_type.nbytes + k_pe_d.block_type.nbytes
    for i in range(n_tiles):
        st = i % STAGES
        mbarrier.wait(kv_free.index(st), ((i // STAGES) & 1) ^ 1)
        bar = kv_ready.index(st)
        mbarrier.expect(bar, nbytes)
        n0 = start + i * BLOCK_N
        tma.async_copy_global_to_shared(k_lat_d, [n0, 0], bar, k_lat_s.index(st))
        tma.async_copy_global_to_shared(k_pe_d, [n0, 0], bar, k_pe_s.index(st))


@gluon.jit
def _issue_s(q_lat_s, q_pe_s, k_lat_s, k_pe_s, kv_ready, s_zero, i, STAGES: gl.constexpr):
    """Wait for tile i, issue S = Q_lat K_lat^T + Q_pe K_pe^T asynchronously (a wgmma token)."""
    st = i % STAGES
    mbarrier.wait(kv_ready.index(st), (i // STAGES) & 1)
    s = warpgroup_mma(q_lat_s, k_lat_s.index(st).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    return warpgroup_mma(q_pe_s, k_pe_s.index(st).permute((1, 0)), s, is_async=True)


@gluon.jit
def _softmax_step(s, i, m_i, l_i, acc, bits, offs_n0, k_lat_s, p_s, a_s, p_ready, p_free, start, end, prefix_len,
                  qk_scale, o_layout: gl.constexpr, BLOCK_N: gl.constexpr, HALF: gl.constexpr,
                  STAGES: gl.constexpr):
    """Tile i's scores -> online softmax; P and alpha handed to warpgroup 1; O[:, :HALF] rescaled and
    P V[:, :HALF] issued asynchronously (returned as a wgmma token)."""
    n0 = start + i * BLOCK_N
    if n0 + BLOCK_N > gl.minimum(end, prefix_len):  # only tiles reaching the tree columns or the chunk's end
        offs_n = n0 + offs_n0
        c = gl.minimum(gl.maximum(offs_n - prefix_len, 0), 63).to(gl.int64)
        see = (offs_n < prefix_len)[None, :] | (((bits[:, None] >> c[None, :]) & 1) != 0)
        s = gl.where(see & (offs_n < end)[None, :], s * qk_scale, float("-inf"))
    else:
        s = s * qk_scale
    m_new = gl.maximum(m_i, gl.max(s, axis=1))
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + gl.sum(p, axis=1)
    k_lat = k_lat_s.index(i % STAGES)
    p16 = p.to(k_lat.dtype)
    # hand P and alpha to warpgroup 1 once it has finished with the previous ones
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
def _softmax_wg(q_lat_s, q_pe_s, k_lat_s, k_pe_s, p_s, a_s, q_bar, kv_ready, kv_free, p_ready, p_free,
                Bits, O_part, LSE_part, stride_ps, stride_pq, q0, pid_s, start, end, n_tiles, prefix_len, Hq, H,
                qk_scale, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HALF: gl.constexpr, STAGES: gl.constexpr,
                PIPE: gl.constexpr):
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HALF, 16])
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    col_o: gl.constexpr = gl.SliceLayout(0, o_layout)

    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_s)
    l_i = gl.zeros([BLOCK_M], gl.float32, row_s)
    acc = gl.zeros([BLOCK_M, HALF], gl.float32, o_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    offs_n0 = gl.arange(0, BLOCK_N, col_s)
    rows = q0 + gl.arange(0, BLOCK_M, row_s)
    # the ancestor bits of each row over the tree columns prefix_len + j (padded rows see them all: finite)
    bits = gl.load(Bits + rows // H, mask=rows < Hq, other=-1)
    mbarrier.wait(q_bar, 0)
    if PIPE == 1:
        # S of tile i + 1 is issued before the softmax of tile i, so the tensor cores compute it meanwhile
        s_cur = warpgroup_mma_wait(num_outstanding=0,
                                   deps=(_issue_s(q_lat_s, q_pe_s, k_lat_s, k_pe_s, kv_ready, s_zero, 0, STAGES), ))
        for i in range(n_tiles):
            if i + 1 < n_tiles:
                s_nxt = _issue_s(q_lat_s, q_pe_s, k_lat_s, k_pe_s, kv_ready, s_zero, i + 1, STAGES)
            else:
                s_nxt = warpgroup_mma_init(s_zero)
            m_i, l_i, acc = _softmax_step(s_cur, i, m_i, l_i, acc, bits, offs_n0, k_lat_s, p_s, a_s, p_ready, p_free,
                                          start, end, prefix_len, qk_scale, o_layout, BLOCK_N, HALF, STAGES)
            s_cur, acc = warpgroup_mma_wait(num_outstanding=0, deps=(s_nxt, acc))
            mbarrier.arrive(kv_free.index(i % STAGES), count=1)
    elif PIPE == 2:
        # S of tile i + 1 is issued right behind P V of tile i, before waiting for it (no issue gap)
        s = warpgroup_mma_wait(num_outstanding=0,
                               deps=(_issue_s(q_lat_s, q_pe_s, k_lat_s, k_pe_s, kv_ready, s_zero, 0, STAGES), ))
        for i in range(n_tiles):
            m_i, l_i, acc = _softmax_step(s, i, m_i, l_i, acc, bits, offs_n0, k_lat_s, p_s, a_s, p_ready, p_free,
                                          start, end, prefix_len, qk_scale, o_layout, BLOCK_N, HALF, STAGES)
            if i + 1 < n_tiles:
                s_nxt = _issue_s(q_lat_s, q_pe_s, k_lat_s, k_pe_s, kv_ready, s_zero, i + 1, STAGES)
            else:
                s_nxt = warpgroup_mma_init(s_zero)
            s, acc = warpgroup_mma_wait(num_outstanding=0, deps=(s_nxt, acc))
            mbarrier.arrive(kv_free.index(i % STAGES), count=1)
    else:
        for i in range(n_tiles):
            s = warpgroup_mma_wait(num_outstanding=0,
                                   deps=(_issue_s(q_lat_s, q_pe_s, k_lat_s, k_pe_s, kv_ready, s_zero, i, STAGES), ))
            m_i, l_i, acc = _softmax_step(s, i, m_i, l_i, acc, bits, offs_n0, k_lat_s, p_s, a_s, p_ready, p_free,
                                          start, end, prefix_len, qk_scale, o_layout, BLOCK_N, HALF, STAGES)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
            mbarrier.arrive(kv_free.index(i % STAGES), count=1)
    inv_l = 1.0 / l_i
    mbarrier.wait(p_free, (n_tiles & 1) ^ 1)
    a_s.store(inv_l)
    gl.thread_barrier()
    mbarrier.arrive(p_ready, count=1)
    gl.store(LSE_part + pid_s * Hq + rows, m_i + gl.log2(l_i), mask=rows < Hq)
    out = acc * gl.convert_layout(inv_l, row_o)[:, None]
    rows_o = q0 + gl.arange(0, BLOCK_M, row_o)
    cols = gl.arange(0, HALF, col_o)
    ptr = O_part + pid_s * stride_ps + rows_o[:, None] * stride_pq + cols[None, :]
    gl.store(ptr, out, mask=(rows_o < Hq)[:, None])


@gluon.jit
def _pv_wg(k_lat_s, p_s, a_s, kv_free, p_ready, p_free, O_part, stride_ps, stride_pq, q0, pid_s, n_tiles, Hq,
           BLOCK_M: gl.constexpr, HALF: gl.constexpr, STAGES: gl.constexpr):
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HALF, 16])
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    col_o: gl.constexpr = gl.SliceLayout(0, o_layout)
    acc = gl.zeros([BLOCK_M, HALF], gl.float32, o_layout)
    for i in range(n_tiles):
        st = i % STAGES
        mbarrier.wait(p_ready, i & 1)
        alpha = a_s.load(row_o)
        acc = acc * alpha[:, None]
        acc = warpgroup_mma(p_s, k_lat_s.index(st).slice(HALF, HALF, dim=1), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        gl.thread_barrier()
        mbarrier.arrive(p_free, count=1)
        mbarrier.arrive(kv_free.index(st), count=1)
    mbarrier.wait(p_ready, n_tiles & 1)
    inv_l = a_s.load(row_o)
    out = acc * inv_l[:, None]
    rows = q0 + gl.arange(0, BLOCK_M, row_o)
    cols = HALF + gl.arange(0, HALF, col_o)
    ptr = O_part + pid_s * stride_ps + rows[:, None] * stride_pq + cols[None, :]
    gl.store(ptr, out, mask=(rows < Hq)[:, None])


@gluon.jit
def ws_prefix_kernel(q_lat_d, q_pe_d, k_lat_d, k_pe_d, Bits, O_part, LSE_part, stride_ps, stride_pq,
                     prefix_len, R, chunk, Hq, H, qk_scale,
                     BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, V_DIM: gl.constexpr, PE_DIM: gl.constexpr,
                     STAGES: gl.constexpr, PV_REGS: gl.constexpr, LOAD_REGS: gl.constexpr, PIPE: gl.constexpr,
                     FOLD: gl.constexpr):
    """Grid (cdiv(Hq, 64), num_splits) with FOLD (the last split also takes the R tree columns), else
    (cdiv(Hq, 64), num_splits + 1) with the tree part as split index num_splits."""
    pid_q = gl.program_id(0)
    pid_s = gl.program_id(1)
    q0 = pid_q * BLOCK_M
    if FOLD:
        last = pid_s == gl.num_programs(1) - 1
        start = pid_s * chunk
        end = gl.where(last, prefix_len + R, gl.minimum(pid_s * chunk + chunk, prefix_len))
    else:
        is_tree = pid_s == gl.num_programs(1) - 1
        start = gl.where(is_tree, prefix_len, pid_s * chunk)
        end = gl.where(is_tree, prefix_len + R, gl.minimum(pid_s * chunk + chunk, prefix_len))
    n_tiles = gl.cdiv(end - start, BLOCK_N)
    HALF: gl.constexpr = V_DIM // 2
    dt: gl.constexpr = k_lat_d.dtype

    q_lat_s = gl.allocate_shared_memory(dt, [BLOCK_M, V_DIM], q_lat_d.layout)
    q_pe_s = gl.allocate_shared_memory(dt, [BLOCK_M, PE_DIM], q_pe_d.layout)
    k_lat_s = gl.allocate_shared_memory(dt, [STAGES, BLOCK_N, V_DIM], k_lat_d.layout)
    k_pe_s = gl.allocate_shared_memory(dt, [STAGES, BLOCK_N, PE_DIM], k_pe_d.layout)
    p_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_N], dt)
    p_s = gl.allocate_shared_memory(dt, [BLOCK_M, BLOCK_N], p_layout)
    a_s = gl.allocate_shared_memory(gl.float32, [BLOCK_M], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kv_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    p_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    p_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    mbarrier.init(p_ready, count=1)
    mbarrier.init(p_free, count=1)
    for st in gl.static_range(STAGES):
        mbarrier.init(kv_ready.index(st), count=1)
        mbarrier.init(kv_free.index(st), count=2)  # both warpgroups release a stage
    fence_async_shared()

    gl.warp_specialize([
        (_softmax_wg, (q_lat_s, q_pe_s, k_lat_s, k_pe_s, p_s, a_s, q_bar, kv_ready, kv_free, p_ready, p_free,
                       Bits, O_part, LSE_part, stride_ps, stride_pq, q0, pid_s, start, end, n_tiles, prefix_len,
                       Hq, H, qk_scale, BLOCK_M, BLOCK_N, HALF, STAGES, PIPE)),
        (_pv_wg, (k_lat_s, p_s, a_s, kv_free, p_ready, p_free, O_part, stride_ps, stride_pq, q0, pid_s, n_tiles,
                  Hq, BLOCK_M, HALF, STAGES)),
        (_loader, (q_lat_d, q_pe_d, k_lat_d, k_pe_d, q_lat_s, q_pe_s, k_lat_s, k_pe_s, q_bar, kv_ready, kv_free,
                   q0, start, n_tiles, BLOCK_N, STAGES)),
    ], [4, 1], [PV_REGS, LOAD_REGS])
