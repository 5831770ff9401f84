"""Where `split_ws`'s layer time goes: its prefix kernel alone, its merge alone (per merge variant), the layer,
and layer variants (the merge launched as a programmatic dependent, other merge shapes). One call on the H200:

    PYTHONPATH=$PWD PYTHONUNBUFFERED=1 python benchmarks/bench_merge.py --out $OUT/bench_merge.json

Method as benchmarks/bench_verify.py: CUDA-graph replay, median per call; the prefix kernel and the layer cycle
through enough caches to hold 3x the L2; the merge alone replays over one plan's partials (in L2, as they are when
the prefix kernel has just written them). Every variant's layer output is checked against the fp32 reference.
Writes JSON after every point; prints a table last. Needs an sm_90 GPU (one line and exit 1 elsewhere).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import sys

import torch

from ddprobe.engine.kernels import reference, split_ws
from ddprobe.engine.kernels.trees import shape_mask
from ddprobe.shapes import KIMI_K2
from ddprobe.timing import n_cache_sets, timed_graph
from ddprobe.units import UnitError, parse_token_list

K2 = KIMI_K2
MERGE_VARIANTS = ";merge_kind=0;merge_kind=1;merge_kind=3;merge_kind=0,merge_block_m=8;pdl=1"
LAYER_VARIANTS = ";merge_kind=0;pdl=1"


def variants(text: str) -> list[dict]:
    out = []
    for var in text.split(";"):
        try:
            out.append({k: int(v) for k, v in (kv.split("=") for kv in var.split(",") if kv)})
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad variant {var!r}: want field=int[,field=int]") from None
    for over in out:
        bad = set(over) - {f.name for f in dataclasses.fields(split_ws.WsTuning)}
        if bad:
            raise argparse.ArgumentTypeError(f"not a WsTuning field: {', '.join(sorted(bad))}")
    return out


def label(over: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in over.items()) or "default"


def rel_err(out, ref) -> float:
    return float((out.float() - ref.float()).norm() / ref.float().norm())


def point(ctx: int, heads: int, args, results: list) -> None:
    R, D, V = args.budget + 1, K2.kv_row, K2.v_dim
    n = ctx + R
    n_sets = n_cache_sets(int(K2.kv_bytes_per_token("bf16", layers=1) * n), most=48)
    g = torch.Generator(device="cuda").manual_seed(ctx * 7 + heads)
    kvs = [torch.randn(n, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(n_sets)]
    qs = [torch.randn(R, heads, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(n_sets)]
    mask = shape_mask("lopsided", args.budget, "cuda")
    sc = K2.sm_scale
    ref = reference.run(qs[0], kvs[0], reference.plan(ctx, mask, None, V), sc)

    def rec(kind, over, t, **kw):
        r = dict(ctx=ctx, heads=heads, kind=kind, variant=label(over), us=t * 1e6, **kw)
        results.append(r)
        print(f"  ctx={ctx:>7} H={heads:>2} {kind:<7} {label(over):<40} {t * 1e6:8.1f} us "
              + " ".join(f"{k}={v:.1e}" if isinstance(v, float) else f"{k}={v}" for k, v in kw.items()), flush=True)

    def failed(kind, over, e):  # a variant that cannot run here (e.g. too much shared memory): recorded, not fatal
        results.append(dict(ctx=ctx, heads=heads, kind=kind, variant=label(over), error=f"{type(e).__name__}: {str(e)[:200]}"))
        print(f"  ctx={ctx:>7} H={heads:>2} {kind:<7} {label(over):<40} failed: {str(e)[:120]}", flush=True)

    for over in args.prefix_variants:
        try:
            pp = split_ws.plan(ctx, mask, None, V, heads=heads, tuning=split_ws.WsTuning(**over))

            def prefixes(pp=pp):
                for i in range(n_sets):
                    split_ws.launch_prefix(qs[i], kvs[i], pp, sc)
            rec("prefix", over, timed_graph(prefixes, n_sets, min_s=0.1), config=pp.extra["config"])
        except Exception as e:  # noqa: BLE001
            failed("prefix", over, e)

    for over in args.layer_variants:
        try:
            pl = split_ws.plan(ctx, mask, None, V, heads=heads, tuning=split_ws.WsTuning(**over))
            err = rel_err(split_ws.run(qs[0], kvs[0], pl, sc), ref)

            def layers(pl=pl):
                for i in range(n_sets):
                    split_ws.run(qs[i], kvs[i], pl, sc)
            rec("layer", over, timed_graph(layers, n_sets, min_s=0.1), rel_err=err,
                merge=pl.extra["merge"])
        except Exception as e:  # noqa: BLE001
            failed("layer", over, e)
    for over in args.merge_variants:
        try:
            pl = split_ws.plan(ctx, mask, None, V, heads=heads, tuning=split_ws.WsTuning(**over))
            parts, ns = split_ws.launch_prefix(qs[0], kvs[0], pl, sc)
            out = torch.empty(R, heads, V, dtype=torch.bfloat16, device="cuda")
            err = rel_err(split_ws.launch_merge(parts, ns, out, pl), ref)

            def merges(pl=pl, parts=parts, ns=ns, out=out):
                for _ in range(20):
                    split_ws.launch_merge(parts, ns, out, pl)
            mc = pl.extra["merge"]
            rec("merge", over, timed_graph(merges, 20, min_s=0.1), rel_err=err, grid=f"{mc['n_mb']}x{V // mc['bv']}",
                partials=ns + 1, merge=mc)
        except Exception as e:  # noqa: BLE001
            failed("merge", over, e)
    del kvs, qs
    torch.cuda.empty_cache()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", default="1k,8k,32k,128k")
    ap.add_argument("--heads", default="8,64")
    ap.add_argument("--budget", type=int, default=8)
    ap.add_argument("--prefix-variants", type=variants, default=variants(""),
                    help="';'-separated WsTuning overrides whose prefix kernel is timed alone ('' = the default)")
    ap.add_argument("--merge-variants", type=variants, default=variants(MERGE_VARIANTS))
    ap.add_argument("--layer-variants", type=variants, default=variants(LAYER_VARIANTS))
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "bench_merge.json"))
    args = ap.parse_args()
    try:
        ctxs = parse_token_list(args.ctx)
        heads = [int(h) for h in args.heads.split(",")]
    except (UnitError, ValueError) as e:
        ap.error(str(e))
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("bench_merge: needs an sm_90 GPU (split_ws is a Gluon kernel for H100/H200)", file=sys.stderr)
        return 1
    import triton
    results: list[dict] = []
    doc = dict(meta=dict(date=datetime.date.today().isoformat(), gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                         triton=triton.__version__, python=platform.python_version(), command=" ".join(sys.argv)),
               results=results)
    for h in heads:
        for ctx in ctxs:
            point(ctx, h, args, results)
            with open(args.out, "w") as f:
                json.dump(doc, f, indent=1, default=str)
    print(f"\n{'H':>3} {'ctx':>7} {'kind':<7} {'variant':<40} {'us':>8} {'err':>8}")
    for r in results:
        if "error" in r:
            print(f"{r['heads']:>3} {r['ctx']:>7} {r['kind']:<7} {r['variant']:<40} failed: {r['error'][:60]}")
        else:
            print(f"{r['heads']:>3} {r['ctx']:>7} {r['kind']:<7} {r['variant']:<40} {r['us']:8.1f} {r.get('rel_err', float('nan')):8.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
