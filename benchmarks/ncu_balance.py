"""`split_ws`'s balanced grid beside its row-block grid under Nsight Compute (issue 15): one launch of each.

    # on the H200 (PYTHONPATH=$PWD); the kernel name filter keeps only the prefix kernels
    ncu --clock-control none --profile-from-start off -k regex:ws_prefix --csv \
        --metrics gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,sm__cycles_active.max,... \
        python benchmarks/ncu_balance.py --ctx 65536,131072

Per context: 64 heads x 9 rows (budget 8, lopsided tree), bf16, `split_ws` planned with WsTuning(balance=1) and
WsTuning(balance=0); both are compiled and run once outside the profiled window, then called once each inside it
(cudaProfilerStart/Stop), balanced first. Without ncu it prints each plan's grid and the two outputs' difference.
A machine without a CUDA GPU gets one line and exit 1.
"""
from __future__ import annotations

import argparse
import sys

import torch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", default="131072", help="comma-separated prefix lengths")
    ap.add_argument("--heads", type=int, default=64)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("ncu_balance: needs a CUDA GPU", file=sys.stderr)
        return 1
    from ddprobe.engine.kernels import get_path
    from ddprobe.engine.kernels.split_ws import WsTuning
    from ddprobe.engine.kernels.trees import shape_mask

    m = get_path("split_ws")
    mask = shape_mask("lopsided", 8, "cuda")
    todo = []
    for ctx in (int(c) for c in args.ctx.split(",")):
        g = torch.Generator(device="cuda").manual_seed(ctx)
        q = torch.randn(9, args.heads, 576, device="cuda", generator=g).to(torch.bfloat16)
        kv = torch.randn(ctx + 9, 576, device="cuda", generator=g).to(torch.bfloat16)
        outs = {}
        for name, b in (("balanced", 1), ("rowblocks", 0)):
            p = m.plan(ctx, mask, None, 512, heads=args.heads, tuning=WsTuning(balance=b))
            outs[name] = m.run(q, kv, p, 0.0722).float()
            c = p.extra["config"]
            print(f"ctx={ctx} {name}: grid {(c['programs'],) if c.get('balance') else (c['n_qb'], c['grid_splits'])}"
                  f", slots {c['grid_splits']}, chunk {c['chunk'] // 64} tiles", flush=True)
            todo.append((f"{name} {ctx}", q, kv, p))
        print(f"ctx={ctx} max |balanced - rowblocks| = {(outs['balanced'] - outs['rowblocks']).abs().max():.2e}")
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for name, q, kv, p in todo:
        torch.cuda.nvtx.range_push(name)
        m.run(q, kv, p, 0.0722)
        torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
