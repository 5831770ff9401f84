"""Gluon "swap-AB" prefix kernel of the `split_ws` path, for few folded query rows (8 heads: 72).

The default kernel (`_ws_gluon.ws_prefix_kernel`) puts 64 folded query rows on the MMA's M side, so 8 heads
x 9 rows = 72 rows take two programs of 64 rows per chunk, the second computing 64 rows for 8. Here the
roles are swapped: the 64 KV tokens of a tile are M and the program's BLOCK_Q <= 40 query rows are N (wgmma
takes N in steps of 8), so 72 rows are two programs of 40 and 32 and each tile costs

    S^T [64 tokens, BLOCK_Q]  = K_lat [64, 512] Q_lat^T + K_pe [64, 64] Q_pe^T       (A = the tile, B = Q)
    O^T [512, BLOCK_Q]       += V^T [512, 64] P^T [64, BLOCK_Q]                       (A = the tile, transposed)

2.9 + 2.6 MFLOP at BLOCK_Q = 40 instead of 4.7 + 4.2 for 64 rows. The softmax runs along the tokens (axis 0,
across the warpgroup's four warps). The O^T accumulator (512 x 40 fp32: 160 registers a thread) fills a
warpgroup, so the two consumer warpgroups do not split the columns: they take alternate tiles ("ping-pong"),
each with its own running maximum, sum and O^T, and never wait on each other inside the loop; one's softmax
runs under the other's MMAs. Partitions:

  warpgroup 0 (the default partition): tiles 0, 2, 4, ... from ring stage 0; at the end it combines its state
                    with warpgroup 1's (through the then idle KV buffers) and writes the normalized partial
                    and its log2-sum-exp in `split`'s layout, so the merge is unchanged.
  warpgroup 1:      tiles 1, 3, 5, ... from stage 1.
  loader (1 warp):  Q once, then each tile into stage i % 2 (the `_ws_gluon` loader, STAGES = 2).

Shared memory at BLOCK_Q = 40: Q 46 KB + 2 x 72 KB of tiles + 2 x 5 KB of P. Masks only on the tiles that reach
the tree columns or the chunk's end, as in the default kernel; the tree part is its own program or rides on
the last split (FOLD), as there.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from ._ws_gluon import _loader


@gluon.jit
def _sw_tiles(me: gl.constexpr, q_lat_s, q_pe_s, k_lat_s, k_pe_s, p_s, q_bar, kv_ready, kv_free, Bits,
              q0, start, end, n_tiles, prefix_len, Hq, H, qk_scale,
              BLOCK_Q: gl.constexpr, BLOCK_N: gl.constexpr, V_DIM: gl.constexpr):
    """Warpgroup ``me``'s tiles (me, me + 2, ...) from ring stage ``me``: returns its running maximum, sum
    and unnormalized O^T [V_DIM, BLOCK_Q] (base 2; maximum -inf and zeros when it had no tile)."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_Q, 16])
    tok_l: gl.constexpr = gl.SliceLayout(1, s_layout)
    col_l: gl.constexpr = gl.SliceLayout(0, s_layout)
    m_i = gl.full([BLOCK_Q], float("-inf"), gl.float32, col_l)
    l_i = gl.zeros([BLOCK_Q], gl.float32, col_l)
    acc = gl.zeros([V_DIM, BLOCK_Q], gl.float32, s_layout)
    s_zero = gl.zeros([BLOCK_N, BLOCK_Q], gl.float32, s_layout)
    offs_t0 = gl.arange(0, BLOCK_N, tok_l)
    rows = q0 + gl.arange(0, BLOCK_Q, col_l)
    # the ancestor bits of each query row over the tree columns (padded rows see them all: finite)
    bits = gl.load(Bits + rows // H, mask=rows < Hq, other=-1)
    mbarrier.wait(q_bar, 0)
    for j in range((n_tiles + 1 - me) // 2):
        # the stage is always ``me``, and Q's buffer index always 0; (j >> 30) is 0 but hides that from the
        # compiler, which would otherwise hoist the wgmma smem descriptors out of the loop and spill them
        st = me + (j >> 30)
        k_lat = k_lat_s.index(st)
        k_pe = k_pe_s.index(st)
        p_me = p_s.index(st)
        mbarrier.wait(kv_ready.index(me), j & 1)
        s = warpgroup_mma(k_lat, q_lat_s.index(j >> 30).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma(k_pe, q_pe_s.index(j >> 30).permute((1, 0)), s, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
        n0 = start + (2 * j + me) * BLOCK_N
        if n0 + BLOCK_N > gl.minimum(end, prefix_len):  # only tiles reaching the tree columns or the chunk's end
            offs_t = n0 + offs_t0
            c = gl.minimum(gl.maximum(offs_t - prefix_len, 0), 63).to(gl.int64)
            see = (offs_t < prefix_len)[:, None] | (((bits[None, :] >> c[:, None]) & 1) != 0)
            s = gl.where(see & (offs_t < end)[:, None], s * qk_scale, float("-inf"))
        else:
            s = s * qk_scale
        m_new = gl.maximum(m_i, gl.max(s, axis=0))
        # a warpgroup's first tile may hide every column from a row (its tiles alternate: tile 1 can hold only
        # tree columns that row does not see): keep its maximum -inf but subtract 0, so alpha and P are 0, not NaN
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_use)
        p = gl.exp2(s - m_use[None, :])
        l_i = l_i * alpha + gl.sum(p, axis=0)
        m_i = m_new
        p_me.store(gl.permute(p.to(k_lat.dtype), (1, 0)))  # P^T kept as [BLOCK_Q, 64]: K-major for the wgmma
        fence_async_shared()
        gl.thread_barrier()
        acc = acc * alpha[None, :]
        acc = warpgroup_mma(k_lat.permute((1, 0)), p_me.permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        gl.thread_barrier()
        mbarrier.arrive(kv_free.index(me), count=1)
    return m_i, l_i, acc


@gluon.jit
def _sw_wg0(q_lat_s, q_pe_s, k_lat_s, k_pe_s, p_s, x_s, xm_s, xl_s, q_bar, kv_ready, kv_free, done0, done1,
            Bits, O_part, LSE_part, stride_ps, stride_pq, q0, pid_s, start, end, n_tiles, prefix_len, Hq, H,
            qk_scale, BLOCK_Q: gl.constexpr, BLOCK_N: gl.constexpr, V_DIM: gl.constexpr):
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_Q, 16])
    col_l: gl.constexpr = gl.SliceLayout(0, s_layout)
    dim_l: gl.constexpr = gl.SliceLayout(1, s_layout)
    m0, l0, acc = _sw_tiles(0, q_lat_s, q_pe_s, k_lat_s, k_pe_s, p_s, q_bar, kv_ready, kv_free, Bits, q0, start,
                            end, n_tiles, prefix_len, Hq, H, qk_scale, BLOCK_Q, BLOCK_N, V_DIM)
    gl.thread_barrier()
    mbarrier.arrive(done0, count=1)  # stage 0 is no longer read: warpgroup 1 may write its state over the tiles
    mbarrier.wait(done1, 0)
    m1 = xm_s.load(col_l)
    l1 = xl_s.load(col_l)
    m = gl.maximum(m0, m1)  # m0 is finite: warpgroup 0 always has tile 0, which every row sees part of
    w0 = gl.exp2(m0 - m)
    w1 = gl.exp2(m1 - m)   # 0 when warpgroup 1 had no tile (m1 = -inf)
    l = l0 * w0 + l1 * w1
    acc = (acc * w0[None, :] + x_s.load(s_layout) * w1[None, :]) * (1.0 / l)[None, :]
    rows = q0 + gl.arange(0, BLOCK_Q, col_l)
    gl.store(LSE_part + pid_s * Hq + rows, m + gl.log2(l), mask=rows < Hq)
    dims = gl.arange(0, V_DIM, dim_l)
    ptr = O_part + pid_s * stride_ps + rows[None, :] * stride_pq + dims[:, None]
    gl.store(ptr, acc.to(O_part.dtype.element_ty), mask=(rows < Hq)[None, :])


@gluon.jit
def _sw_wg1(q_lat_s, q_pe_s, k_lat_s, k_pe_s, p_s, x_s, xm_s, xl_s, q_bar, kv_ready, kv_free, done0, done1,
            Bits, q0, start, end, n_tiles, prefix_len, Hq, H, qk_scale,
            BLOCK_Q: gl.constexpr, BLOCK_N: gl.constexpr, V_DIM: gl.constexpr):
    m1, l1, acc = _sw_tiles(1, q_lat_s, q_pe_s, k_lat_s, k_pe_s, p_s, q_bar, kv_ready, kv_free, Bits, q0, start,
                            end, n_tiles, prefix_len, Hq, H, qk_scale, BLOCK_Q, BLOCK_N, V_DIM)
    mbarrier.wait(done0, 0)
    fence_async_shared()  # the wgmma reads of the tiles (async proxy) before these plain stores over them
    x_s.store(acc)
    xm_s.store(m1)
    xl_s.store(l1)
    gl.thread_barrier()
    mbarrier.arrive(done1, count=1)


@gluon.jit
def ws_swap_kernel(q_lat_d, q_pe_d, k_lat_d, k_pe_d, Bits, O_part, LSE_part, stride_ps, stride_pq,
                   prefix_len, R, chunk, Hq, H, qk_scale,
                   BLOCK_Q: gl.constexpr, BLOCK_N: gl.constexpr, V_DIM: gl.constexpr, PE_DIM: gl.constexpr,
                   WG1_REGS: gl.constexpr, LOAD_REGS: gl.constexpr, FOLD: gl.constexpr):
    """Grid (cdiv(Hq, BLOCK_Q), num_splits) with FOLD (the last split also takes the R tree columns), else
    (cdiv(Hq, BLOCK_Q), num_splits + 1) with the tree part as split index num_splits."""
    pid_q = gl.program_id(0)
    pid_s = gl.program_id(1)
    q0 = pid_q * BLOCK_Q
    if FOLD:
        last = pid_s == gl.num_programs(1) - 1
        start = pid_s * chunk
        end = gl.where(last, prefix_len + R, gl.minimum(pid_s * chunk + chunk, prefix_len))
    else:
        is_tree = pid_s == gl.num_programs(1) - 1
        start = gl.where(is_tree, prefix_len, pid_s * chunk)
        end = gl.where(is_tree, prefix_len + R, gl.minimum(pid_s * chunk + chunk, prefix_len))
    n_tiles = gl.cdiv(end - start, BLOCK_N)
    dt: gl.constexpr = k_lat_d.dtype

    q_lat_s = gl.allocate_shared_memory(dt, [1, BLOCK_Q, V_DIM], q_lat_d.layout)
    q_pe_s = gl.allocate_shared_memory(dt, [1, BLOCK_Q, PE_DIM], q_pe_d.layout)
    k_lat_s = gl.allocate_shared_memory(dt, [2, BLOCK_N, V_DIM], k_lat_d.layout)
    k_pe_s = gl.allocate_shared_memory(dt, [2, BLOCK_N, PE_DIM], k_pe_d.layout)
    p_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_Q, BLOCK_N], dt)
    p_s = gl.allocate_shared_memory(dt, [2, BLOCK_Q, BLOCK_N], p_layout)
    # warpgroup 1's final state goes over the KV tiles (2 x 64 x 512 x 2 B >= 512 x BLOCK_Q x 4 B)
    x_s = k_lat_s._reinterpret(gl.float32, [V_DIM, BLOCK_Q], gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0]))
    vec: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])
    xm_s = gl.allocate_shared_memory(gl.float32, [BLOCK_Q], vec)
    xl_s = gl.allocate_shared_memory(gl.float32, [BLOCK_Q], vec)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kv_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    kv_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    done0 = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    done1 = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    mbarrier.init(done0, count=1)
    mbarrier.init(done1, count=1)
    for st in gl.static_range(2):
        mbarrier.init(kv_ready.index(st), count=1)
        mbarrier.init(kv_free.index(st), count=1)  # only the warpgroup that owns the stage releases it
    fence_async_shared()

    gl.warp_specialize([
        (_sw_wg0, (q_lat_s, q_pe_s, k_lat_s, k_pe_s, p_s, x_s, xm_s, xl_s, q_bar, kv_ready, kv_free, done0, done1,
                   Bits, O_part, LSE_part, stride_ps, stride_pq, q0, pid_s, start, end, n_tiles, prefix_len, Hq, H,
                   qk_scale, BLOCK_Q, BLOCK_N, V_DIM)),
        (_sw_wg1, (q_lat_s, q_pe_s, k_lat_s, k_pe_s, p_s, x_s, xm_s, xl_s, q_bar, kv_ready, kv_free, done0, done1,
                   Bits, q0, start, end, n_tiles, prefix_len, Hq, H, qk_scale, BLOCK_Q, BLOCK_N, V_DIM)),
        (_loader, (q_lat_d, q_pe_d, k_lat_d, k_pe_d, q_lat_s.index(0), q_pe_s.index(0), k_lat_s, k_pe_s, q_bar, kv_ready, kv_free,
                   q0, start, n_tiles, BLOCK_N, 2)),
    ], [4, 1], [WG1_REGS, LOAD_REGS])
