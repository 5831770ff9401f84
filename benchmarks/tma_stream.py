"""How fast can the H200 stream split_ws's KV tiles into shared memory by TMA, with no math? (issue 15)

    PYTHONPATH=$PWD python benchmarks/tma_stream.py --ctx 131072 --row-blocks 9 --splits 14     # on the H200

A Gluon kernel with the prefix kernel's grid (row blocks x splits: every row block of a split reads the same
tiles, as 64 heads x 9 rows do) and its load path: one loader warp puts each [64, 512 + 64] bf16 tile by TMA into
a ring of STAGES buffers, and a consumer (4 warps, the default partition) waits for each tile and frees it at
once, or after spinning `hold` cycles on clock64 as the attention kernels hold a stage while they compute on it.
Times it (CUDA events, median of 20 launches after a warm-up) for 1, 2 and 3 stages, for the grid with one row
block (no tile shared through L2), and with holds of 1000-3000 cycles; prints the bytes moved from L2 to the SMs
per second and the time per tile. If 2 stages with no math already took about as long as the attention kernels,
the 64-head prefix would be bound by delivering tiles (2026-12-01: it is not; docs/perf.md, eighth session).
A machine without a CUDA GPU (or without Triton's Gluon) gets one line and exit 1; bad sizes one line and exit 2.
"""
from __future__ import annotations

import argparse
import sys

import torch

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
except ImportError as e:  # pragma: no cover - a machine without Triton's Gluon
    print(f"tma_stream: needs Triton with Gluon ({e})", file=sys.stderr)
    raise SystemExit(1)


@gluon.jit
def _load(k_lat_d, k_pe_d, k_lat_s, k_pe_s, ready, free, start, n_tiles, STAGES: gl.constexpr):
    nbytes: gl.constexpr = k_lat_d.block_type.nbytes + k_pe_d.block_type.nbytes
    for i in range(n_tiles):
        st = i % STAGES
        mbarrier.wait(free.index(st), ((i // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(st), nbytes)
        tma.async_copy_global_to_shared(k_lat_d, [start + i * 64, 0], ready.index(st), k_lat_s.index(st))
        tma.async_copy_global_to_shared(k_pe_d, [start + i * 64, 0], ready.index(st), k_pe_s.index(st))


@gluon.jit
def _clock():
    return gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)


@gluon.jit
def _use(ready, free, n_tiles, hold, STAGES: gl.constexpr):
    for i in range(n_tiles):
        st = i % STAGES
        mbarrier.wait(ready.index(st), (i // STAGES) & 1)
        t0 = _clock()
        while _clock() - t0 < hold:  # the stage held as if its tile were being computed on
            pass
        mbarrier.arrive(free.index(st), count=1)


@gluon.jit
def stream_kernel(k_lat_d, k_pe_d, chunk, prefix_len, hold, STAGES: gl.constexpr):
    pid_s = gl.program_id(1)
    start = pid_s * chunk
    n_tiles = gl.cdiv(gl.minimum(start + chunk, prefix_len) - start, 64)
    dt: gl.constexpr = k_lat_d.dtype
    k_lat_s = gl.allocate_shared_memory(dt, [STAGES, 64, 512], k_lat_d.layout)
    k_pe_s = gl.allocate_shared_memory(dt, [STAGES, 64, 64], k_pe_d.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for st in gl.static_range(STAGES):
        mbarrier.init(ready.index(st), count=1)
        mbarrier.init(free.index(st), count=1)
    fence_async_shared()
    gl.warp_specialize([(_use, (ready, free, n_tiles, hold, STAGES)),
                        (_load, (k_lat_d, k_pe_d, k_lat_s, k_pe_s, ready, free, start, n_tiles, STAGES))],
                       [1], [40])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", type=int, default=131072)
    ap.add_argument("--row-blocks", type=int, default=9)
    ap.add_argument("--splits", type=int, default=14)
    args = ap.parse_args()
    if args.ctx < 64 or args.splits < 1 or args.row_blocks < 1 or args.splits > args.ctx // 64:
        print(f"tma_stream: needs --ctx >= 64, 1 <= --splits <= ctx / 64 and --row-blocks >= 1, got {args.ctx}, "
              f"{args.splits} and {args.row_blocks}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("tma_stream: needs a CUDA GPU", file=sys.stderr)
        return 1
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    kernel = stream_kernel
    kv = torch.randn(args.ctx + 64, 576, device="cuda").to(torch.bfloat16)

    def desc(t, shape, block):
        return TensorDescriptor(t, shape, [t.stride(0), 1], block,
                                gl.NVMMASharedLayout.get_default_for(block, gl.bfloat16))
    kd_lat = desc(kv, [kv.shape[0], 512], [64, 512])
    kd_pe = desc(kv[:, 512:], [kv.shape[0], 64], [64, 64])
    chunk = -(-args.ctx // args.splits // 64) * 64
    print(f"ctx {args.ctx}: {args.splits} splits of {chunk // 64} tiles; tile 73,728 B")
    cases = [(args.row_blocks, st, 0) for st in (1, 2, 3)] + [(1, 2, 0)]
    cases += [(args.row_blocks, 2, h) for h in (1000, 2000, 3000)] + [(args.row_blocks, 3, h) for h in (2000, 3000)]
    for rbs, stages, hold in cases:
        grid = (rbs, args.splits)
        launch = lambda: kernel[grid](kd_lat, kd_pe, chunk, args.ctx, hold, STAGES=stages, num_warps=4)  # noqa: E731
        launch()
        torch.cuda.synchronize()
        times = []
        for _ in range(20):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            launch()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1e3)
        us = sorted(times)[len(times) // 2]
        moved = rbs * args.ctx * 1152
        print(f"  row blocks {rbs}, stages {stages}, hold {hold:4d} cycles: {us:7.1f} us, L2 -> SM "
              f"{moved / us / 1e6:5.2f} TB/s, {us * 1e3 / (chunk // 64):5.0f} ns a tile per program")
    return 0


if __name__ == "__main__":
    sys.exit(main())
