"""Timeline of `split_ws`'s seesaw with no loader (WsTuning.seesaw = 5, _ws_seesaw) from in-kernel cycle stamps.

    PYTHONPATH=$PWD python benchmarks/seesaw_trace.py --ctx 131072 --heads 64       # on the H200

Launches ws_seesaw5_kernel with TRACE (each warpgroup writes the SM's clock64 at eight points of every pair of
tiles: _ws_seesaw._stamp), checks the output against the untraced kernel, and prints, over the pairs of the
middle third of every program, the median cycles from warpgroup 0's "S of tile 2j done" to each event of both
warpgroups, and the median period of a pair. Timing study only: the stamps add stores to the loop.
A machine without a CUDA GPU gets one line and exit 1.
"""
from __future__ import annotations

import argparse
import sys

import torch

EVENTS = {
    0: ["S(2j) done", "softmax 2j done, P0 + SC0 handed", "st0 0-3 refilled, SC1 passed", "rescaled",
        "P1 passed", "P1 V1_L done", "S pieces 0-8 issued", "S pieces 0-4 issued"],
    1: ["S(2j+1) done", "SC0 passed", "SC1 arrived", "P1 V1_R issued, P1 handed", "P1 V1_R done",
        "P0 V0_R done", "S pieces 4-7, 0-3 issued", "stage 0 pieces 4-8 refilled"],
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", type=int, default=131072)
    ap.add_argument("--heads", type=int, default=64)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("seesaw_trace: needs a CUDA GPU", file=sys.stderr)
        return 1
    from ddprobe.engine.kernels import get_path, split_ws
    from ddprobe.engine.kernels._ws_seesaw import TRACE_EVENTS, TRACE_PAIRS, ws_seesaw5_kernel
    from ddprobe.engine.kernels.split import LOG2E
    from ddprobe.engine.kernels.trees import shape_mask

    m = get_path("split_ws")
    mask = shape_mask("lopsided", 8, "cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(9, args.heads, 576, device="cuda", generator=g).to(torch.bfloat16)
    kv = torch.randn(args.ctx + 9, 576, device="cuda", generator=g).to(torch.bfloat16)
    p = m.plan(args.ctx, mask, None, 512, heads=args.heads, tuning=split_ws.WsTuning(seesaw=5))
    ref = m.run(q, kv, p, 0.0722).float()
    cfg = p.extra["config"]
    o_part, lse_part = p.extra["partials"]
    r, h, d = q.shape
    hq = r * h
    q2 = q.reshape(hq, d)
    descs = split_ws._descs(q2, kv, p, 5, False)
    grid = (cfg["n_qb"], cfg["grid_splits"])
    programs = grid[0] * grid[1]
    trace = torch.zeros(programs, 2, int(TRACE_PAIRS), int(TRACE_EVENTS), dtype=torch.int64, device="cuda")

    def launch():
        ws_seesaw5_kernel[grid](*descs, p.extra["bits"], o_part, lse_part, o_part.stride(0), o_part.stride(1),
                                p.prefix_len, r, cfg["chunk"], hq, h, 0.0722 * LOG2E, BLOCK_M=64, BLOCK_N=64,
                                V_DIM=512, PE_DIM=64, WG1_REGS=split_ws.SEESAW5_REGS, FOLD=cfg["fold"], FFMA=True,
                                Trace=trace, TRACE=True, num_warps=4)
    launch()
    out = split_ws.launch_merge((o_part, lse_part), cfg["grid_splits"] - 1,
                                torch.empty(r, h, 512, dtype=q.dtype, device="cuda"), p).float()
    print(f"traced output vs untraced: max |diff| {(out - ref).abs().max():.2e}")
    trace.zero_()
    ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ev0.record()
    launch()
    ev1.record()
    torch.cuda.synchronize()
    tiles = cfg["chunk"] // 64
    pairs = min(tiles // 2, int(TRACE_PAIRS))
    lo, hi = pairs // 3, 2 * pairs // 3
    print(f"ctx {args.ctx}, {args.heads} heads: grid {grid}, {tiles} tiles a split, traced kernel "
          f"{ev0.elapsed_time(ev1) * 1e3:.1f} us; pairs {lo}..{hi - 1} of every program")
    t = trace.cpu()
    t = t[t[:, 0, hi, 0] != 0]  # programs whose split reaches pair hi (a row block's last split may be shorter)
    base = t[:, 0, lo:hi, 0:1]
    period = (t[:, 0, lo + 1:hi + 1, 0] - t[:, 0, lo:hi, 0]).float()
    print(f"period of a pair: median {period.median():.0f} cycles (p10 {period.quantile(0.1):.0f}, "
          f"p90 {period.quantile(0.9):.0f})")
    for wg in (0, 1):
        rel = (t[:, wg, lo:hi, :] - base).float()
        for e, name in enumerate(EVENTS[wg]):
            if name == "-":
                continue
            x = rel[..., e]
            print(f"  wg{wg} e{e} {name:32s} {x.median():8.0f}   (p10 {x.quantile(0.1):7.0f}, p90 {x.quantile(0.9):7.0f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
