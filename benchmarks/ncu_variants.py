"""`split_ws` tuning variants side by side under Nsight Compute (issue 15): one launch of each prefix kernel.

    # on the H200 (PYTHONPATH=$PWD); -k regex:ws_ keeps only the Gluon prefix kernels
    ncu --clock-control none --profile-from-start off -k regex:ws_ --csv --section WarpStateStats \
        python benchmarks/ncu_variants.py --ctx 131072 --variants "balance=0;balance=1"

Per context and variant (';'-separated WsTuning overrides, as bench_verify's --ws-variants, parsed by
bench_merge.variants): 64 heads x 9 rows (budget 8, lopsided tree), bf16; every variant is compiled and run once outside the profiled window, then called
once inside it (cudaProfilerStart/Stop) in the order given. It prints each variant's grid and its largest
difference from the first. (benchmarks/ncu_balance_h200.sh runs it for the balanced and row-block grids.) A machine without a CUDA GPU gets one line and exit 1; a bad variant one line and exit 2.
"""
from __future__ import annotations

import argparse
import re
import sys

import torch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", default="131072", help="comma-separated prefix lengths")
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--variants", default="balance=0;balance=1", help="';'-separated WsTuning overrides")
    args = ap.parse_args()
    from bench_merge import label  # the one WsTuning-override parser
    from bench_merge import variants as parse_variants

    from ddprobe.engine.kernels.split_ws import WsTuning, check_tuning
    try:
        variants = [(label(over), over) for over in parse_variants(args.variants)]
        for _, over in variants:
            check_tuning(WsTuning(**over))
        if re.fullmatch(r"\d+(,\d+)*", args.ctx) is None:
            raise ValueError(f"--ctx must be comma-separated token counts, got {args.ctx!r}")
        ctxs = [int(c) for c in args.ctx.split(",")]
        if args.heads < 1:
            raise ValueError(f"--heads must be >= 1, got {args.heads}")
    except (ValueError, argparse.ArgumentTypeError) as e:
        print(f"ncu_variants: {e}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("ncu_variants: needs a CUDA GPU", file=sys.stderr)
        return 1
    from ddprobe.engine.kernels import get_path
    from ddprobe.engine.kernels.trees import shape_mask

    m = get_path("split_ws")
    mask = shape_mask("lopsided", 8, "cuda")
    todo = []
    for ctx in ctxs:
        g = torch.Generator(device="cuda").manual_seed(ctx)
        q = torch.randn(9, args.heads, 576, device="cuda", generator=g).to(torch.bfloat16)
        kv = torch.randn(ctx + 9, 576, device="cuda", generator=g).to(torch.bfloat16)
        first = None
        for name, over in variants:
            try:  # a combination the grid refuses (e.g. balance=1 with pipe=0): one line
                p = m.plan(ctx, mask, None, 512, heads=args.heads, tuning=WsTuning(**over))
            except ValueError as e:
                print(f"ncu_variants: {name}: {e}", file=sys.stderr)
                return 2
            out = m.run(q, kv, p, 0.0722).float()
            first = out if first is None else first
            c = p.extra["config"]
            grid = (c["programs"],) if c.get("balance") else (c["n_qb"], c["grid_splits"])
            print(f"ctx={ctx} {name}: grid {grid}, slots {c['grid_splits']}, chunk {c['chunk'] // 64} tiles, "
                  f"max |out - first| = {(out - first).abs().max():.2e}", flush=True)
            todo.append((f"{name} {ctx}", q, kv, p))
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
