"""`split_ws` beside FlashMLA under Nsight Compute: one launch of each at 64 heads x 9 rows (issue 15).

    # plain (sanity): CUDA-graph timings over rotating caches, kernel names and device times, errors
    PYTHONPATH=$PWD PYTHONUNBUFFERED=1 python benchmarks/ncu_64h_peers.py [--ctx 131072] [--heads 64]
    # under ncu: warm up each, then ONE call of each between cudaProfilerStart/Stop
    ncu --clock-control none --profile-from-start off --nvtx ... python benchmarks/ncu_64h_peers.py --ncu
    # the explicit metrics ncu knows on this GPU, from a `ncu --query-metrics` listing (no GPU needed)
    python benchmarks/ncu_64h_peers.py --pick-metrics listing.txt

The case is bench_verify.py's for `split_ws` (its default tuning, the lopsided tree of budget 8) and for
FlashMLA (peers.make: causal over the 9 new rows, 64-row pages over the same contiguous cache): bf16, kv rows
of 576 (latent 512 + rope 64), prefix ``--ctx`` tokens + 9 new rows, padded to FlashMLA's pages. Under ncu the
measured window holds, in order, `split_ws` (the prefix kernel `ws_prefix_kernel`, then the merge) inside the
NVTX range "split_ws", then FlashMLA (all its launches of one call) inside "flashmla"; everything before it is
warm-up outside the window (run ncu with --profile-from-start off). Exits non-zero with one line when there is
no CUDA GPU or FlashMLA cannot run here.
"""
from __future__ import annotations

import argparse
import os
import re
import sys

import torch

# explicit metrics wanted beside the sections (only those the device's ncu lists are passed: --pick-metrics)
METRICS = (
    "gpu__time_duration.sum",
    "sm__cycles_elapsed.avg.per_second",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__pipe_shared_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__inst_executed_pipe_tensor_op_gmma.sum",
    "sm__inst_executed_pipe_tensor_op_hmma.sum",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "sm__inst_issued.avg.pct_of_peak_sustained_active",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "lts__t_bytes.sum",
    "lts__t_bytes.sum.per_second",
    "lts__t_bytes.sum.pct_of_peak_sustained_elapsed",
    "lts__t_sectors_srcunit_tex_op_read.sum",
    "lts__t_sectors_srcunit_tex_op_read.sum.per_second",
    "lts__t_sectors_srcunit_tex_op_read.sum.pct_of_peak_sustained_elapsed",
    "lts__t_sectors_srcunit_tex.avg.pct_of_peak_sustained_elapsed",
    "lts__t_sector_hit_rate.pct",
    "l1tex__m_xbar2l1tex_read_bytes.sum",
    "l1tex__m_xbar2l1tex_read_bytes.sum.per_second",
    "l1tex__m_xbar2l1tex_read_bytes.sum.pct_of_peak_sustained_elapsed",
    "l1tex__throughput.avg.pct_of_peak_sustained_elapsed",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",
    "dram__bytes_read.sum",
    "dram__bytes_read.sum.per_second",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "smsp__warps_active.avg.pct_of_peak_sustained_active",
)


def pick_metrics(listing_path: str) -> str:
    """METRICS whose base name (before the first '.') appears in an `ncu --query-metrics` listing, comma-joined;
    the others are named on stderr."""
    with open(listing_path) as f:
        text = f.read()
    known = set(re.findall(r"\b([a-z0-9]+__[A-Za-z0-9_]+)\b", text))
    keep = [m for m in METRICS if m.split(".")[0] in known]
    dropped = [m for m in METRICS if m not in keep]
    if dropped:
        print(f"ncu_64h_peers: not listed by this ncu, left out: {', '.join(dropped)}", file=sys.stderr)
    return ",".join(keep)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ctx", type=int, default=131072, help="prefix tokens (default 131072)")
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--budget", type=int, default=8, help="tree budget: rows = budget + 1 (bench_verify's 8)")
    ap.add_argument("--tree", default="lopsided", help="split_ws's tree mask (bench_verify's default)")
    ap.add_argument("--ncu", action="store_true", help="one set; warm up, then one call of each inside "
                    "cudaProfilerStart/Stop and NVTX ranges; no timing")
    ap.add_argument("--pick-metrics", metavar="LISTING", help="print the METRICS this ncu listing knows and exit")
    args = ap.parse_args()
    if args.pick_metrics:
        print(pick_metrics(args.pick_metrics))
        return 0
    if not torch.cuda.is_available():
        print("ncu_64h_peers: no CUDA GPU here (needs an H200/H100 with FlashMLA installed)", file=sys.stderr)
        return 2

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_verify as bv  # the same case, constants and helpers as the benchmark
    import peers
    from ddprobe.engine.kernels import get_path, reference
    from ddprobe.engine.kernels.trees import shape_mask
    from ddprobe.timing import n_cache_sets, timed_graph

    dev = "cuda"
    ctx, heads = args.ctx, args.heads
    R = args.budget + 1
    D, V = bv.K2.kv_row, bv.K2.v_dim
    n = ctx + R
    sm_scale = bv.K2.sm_scale
    try:
        fm = peers.make("flashmla", ctx, R, heads, V, D - V, sm_scale)
    except peers.PeerUnavailable as e:
        print(f"ncu_64h_peers: FlashMLA cannot run here: {e}", file=sys.stderr)
        return 3
    mod = get_path("split_ws")
    n_sets = 1 if args.ncu else n_cache_sets(int(bv.K2.kv_bytes_per_token(bv.DT, layers=1) * n), bv.l2_bytes())
    g = torch.Generator(device=dev).manual_seed(ctx * 131 + heads)
    kvs = [torch.randn(peers.rows_for(n), D, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(n_sets)]
    qs = [torch.randn(R, heads, D, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(n_sets)]
    why = mod.supported(qs[0], kvs[0], V)
    if why:
        print(f"ncu_64h_peers: split_ws cannot run here: the path {why}", file=sys.stderr)
        return 4
    mask = shape_mask(args.tree, args.budget, dev)
    tun = bv.tuned("split_ws", {})
    pl = mod.plan(ctx, mask, None, V, tuning=tun, heads=heads)
    cfg = pl.extra["config"]
    kmeta: dict = {}
    ws = lambda q, kv: mod.run(q, kv, pl, sm_scale)  # noqa: E731
    mod.run(qs[0], kvs[0], pl, sm_scale, meta=kmeta)
    fm(qs[0], kvs[0])
    torch.cuda.synchronize()
    print(f"{torch.cuda.get_device_name()}: ctx {ctx} + {R} rows, {heads} heads ({R * heads} folded rows), "
          f"bf16; split_ws tuning {tun}; config {cfg}", flush=True)
    pm = kmeta.get("prefix", {})
    print(f"split_ws prefix kernel: regs {pm.get('n_regs')} spills {pm.get('n_spills')} smem {pm.get('shared')}; "
          f"merge: {kmeta.get('merge')}", flush=True)

    if args.ncu:
        for _ in range(2):  # warm (compiled, loaded, FlashMLA's scheduler metadata built)
            ws(qs[0], kvs[0])
            fm(qs[0], kvs[0])
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        with torch.cuda.nvtx.range("split_ws"):
            ws(qs[0], kvs[0])
            torch.cuda.synchronize()
        with torch.cuda.nvtx.range("flashmla"):
            fm(qs[0], kvs[0])
            torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        print("ncu_64h_peers: measured one call of split_ws and one of flashmla", flush=True)
        return 0

    # correctness (bench_verify's references: the tree mask for split_ws, causal for FlashMLA)
    ref = reference.run(qs[0], kvs[0], reference.plan(ctx, mask, None, V), sm_scale)
    causal = shape_mask("chain", args.budget, dev)
    ref_c = reference.run(qs[0], kvs[0], reference.plan(ctx, causal, None, V), sm_scale)
    e_ws, e_fm = bv.rel_err(ws(qs[0], kvs[0]), ref), bv.rel_err(fm(qs[0], kvs[0]), ref_c)
    del ref, ref_c
    print(f"rel_err: split_ws {e_ws:.2e}, flashmla {e_fm:.2e}", flush=True)

    # kernel names and device times of one call each (what ncu will see)
    from torch.profiler import ProfilerActivity, profile
    for label, fn in (("split_ws", ws), ("flashmla", fm)):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn(qs[0], kvs[0])
            torch.cuda.synchronize()
        for ev in prof.events():
            if ev.device_type.name == "CUDA":
                print(f"kernel {label:<9} {ev.device_time:8.1f} us  {ev.name[:160]}", flush=True)

    # CUDA-graph timings over the rotating caches (bench_verify's method), per layer
    parts, n_part = mod.launch_prefix(qs[0], kvs[0], pl, sm_scale)
    out = torch.empty(R, heads, V, dtype=torch.bfloat16, device=dev)

    def over_sets(fn):
        def many():
            for i in range(n_sets):
                fn(qs[i], kvs[i])
        return many
    rows = [("split_ws (prefix + merge)", over_sets(ws)),
            ("split_ws prefix kernel alone", over_sets(lambda q, kv: mod.launch_prefix(q, kv, pl, sm_scale))),
            ("split_ws merge alone", over_sets(lambda q, kv: mod.launch_merge(parts, n_part, out, pl))),
            ("flashmla (all its launches)", over_sets(fm))]
    nbytes, flops = bv.call_cost(ctx, heads, R)
    print(f"\n{n_sets} cache sets; per layer: {nbytes / 1e6:.1f} MB, {flops / 1e9:.1f} GFLOP")
    for label, fn in rows:
        t = timed_graph(fn, n_sets, min_s=0.3)
        print(f"{label:<30} {t * 1e6:8.1f} us  {nbytes / t / 1e9:7.0f} GB/s  {flops / t / 1e12:6.1f} TFLOP/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
