"""Verify-attention benchmark: build, check and time every path and peer in one call.

    PYTHONPATH=$PWD PYTHONUNBUFFERED=1 python benchmarks/bench_verify.py --out $OUT/bench_verify.json
    ... --ctx 32k,128k --heads 8 --quick --paths split --variants "tail=1;tail=0"

Per layer, for each context and head count: median time of `paged`, `split`, `split_ws` and the peers
(FlexAttention with a block mask, SDPA with a dense bool mask; the production MLA kernels FlashMLA and
FlashInfer fa3/fa2 from benchmarks/peers.py, skipped with the reason when not installed, checked against
the reference under the causal mask they run with), each under CUDA-graph replay
over several input sets so the caches do not fit in L2; bytes and FLOPs per call, GB/s,
TFLOP/s, the floor from ceilings measured in the same run, time over floor. Then the full
61-layer k2 verify step (attention only) at 8 heads. Writes JSON; prints a table last.
Without CUDA (smoke test) it only checks correctness on tiny shapes under the interpreter.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import statistics
import sys
import time

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from ddprobe.engine.kernels import get_path, reference  # noqa: E402
from ddprobe.engine.kernels.trees import shape_mask  # noqa: E402
from ddprobe.shapes import DEFAULT_L2_BYTES, KIMI_K2, dtype_bytes, floor_s, gpu_spec_for  # noqa: E402
from ddprobe.timing import copy_bandwidth_Bps, n_cache_sets, timed_graph  # noqa: E402
from ddprobe.units import UnitError, parse_token_list  # noqa: E402

import peers  # noqa: E402  (benchmarks/peers.py: FlashMLA and FlashInfer, imported lazily inside)


def token_list(text: str) -> list[int]:
    """argparse type: '1k,16k' -> [1024, 16384]; a bad value is argparse's one-line usage error."""
    try:
        return parse_token_list(text)
    except UnitError as e:
        raise argparse.ArgumentTypeError(str(e)) from None

K2 = KIMI_K2  # 61 layers, 64 heads, latent 512 + rope 64, sm_scale 1/sqrt(128 + 64)
DT = "bf16"
GENERIC = ("split_ws",)  # tuned through --ws-variants
BASE_TUNING: dict = {}  # path -> the run-wide tuning (--tune for split), set in main


def tuned(name: str, over: dict):
    """The path's frozen tuning dataclass: the run's base with ``over`` (strings from the command line) applied."""
    mod = get_path(name)
    base = BASE_TUNING.get(name, mod.DEFAULT_TUNING)
    try:
        return dataclasses.replace(base, **{k: int(v) for k, v in over.items()})
    except (TypeError, ValueError) as e:
        raise SystemExit(f"bench_verify: bad {name} tuning {over}: {e}") from None


def l2_bytes() -> int:
    spec = gpu_spec_for(torch.cuda.get_device_name())
    return spec.l2_bytes if spec else DEFAULT_L2_BYTES


def call_cost(ctx: int, heads: int, rows: int, layers: int = 1) -> tuple[float, float]:
    """(bytes, useful FLOPs) of verify attention over ctx + rows columns: KV rows read once, q read,
    out written; FLOPs scale with the heads timed (K2's count is per 64 heads)."""
    n = ctx + rows
    nbytes = K2.kv_bytes_per_token(DT, layers=layers) * n
    nbytes += layers * rows * heads * (K2.kv_row + K2.v_dim) * dtype_bytes(DT)
    flops = K2.attn_flops_per_token(rows, layers=layers) * n * heads / K2.num_heads
    return nbytes, flops


def floor_of(nbytes: float, flops: float, ceil: dict) -> float:
    return floor_s(nbytes, flops, bw_Bps=ceil["copy_GBps"] * 1e9, flops_per_s=ceil["bf16_mm_TFLOPs"] * 1e12)[0]


def ceilings() -> dict:
    copy_bw = copy_bandwidth_Bps(torch)
    torch.cuda.empty_cache()
    m = 8192
    x = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        x @ y
    torch.cuda.synchronize()
    ts = []
    for _ in range(20):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record(); x @ y; e1.record(); torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1) / 1e3)
    mm = 2 * m**3 / statistics.median(ts)
    del x, y
    torch.cuda.empty_cache()
    return {"copy_GBps": copy_bw / 1e9, "bf16_mm_TFLOPs": mm / 1e12}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    if not torch.isfinite(out).all():
        return float("nan")
    return float((out.float() - ref.float()).norm() / ref.float().norm())


# ---------------------------------------------------------------- one (ctx, heads) point
def bench_point(ctx, heads, args, ceil, results, flex_state):
    dev = "cuda"
    R = args.budget + 1
    D, V = K2.kv_row, K2.v_dim
    n = ctx + R
    layer_bytes = K2.kv_bytes_per_token(DT, layers=1) * n
    n_sets = n_cache_sets(int(layer_bytes), l2_bytes(), most=48 if args.quick else 96)
    g = torch.Generator(device=dev).manual_seed(ctx * 131 + heads)
    # rows padded to FlashMLA's 64-row pages; every path reads only the first n
    kvs = [torch.randn(peers.rows_for(n), D, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(n_sets)]
    qs = [torch.randn(R, heads, D, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(n_sets)]
    mask = shape_mask(args.tree, args.budget, dev)
    slots = torch.randperm(n, device=dev)  # shuffled page_size=1 allocation over the same rows
    sm_scale = K2.sm_scale
    bytes_call, flops_call = call_cost(ctx, heads, R)
    floor = floor_of(bytes_call, flops_call, ceil)
    ref = reference.run(qs[0], kvs[0], reference.plan(ctx, mask, None, V), sm_scale)
    ref_paged = reference.run(qs[0], kvs[0], reference.plan(ctx, mask, slots, V), sm_scale)
    causal = shape_mask("chain", args.budget, dev)  # the peers' mask: row i sees new rows 0..i
    ref_causal = reference.run(qs[0], kvs[0], reference.plan(ctx, causal, None, V), sm_scale)

    todo = []
    for name in args.paths:
        if name == "paged":
            mod = get_path("paged")
            for var in args.paged_variants:
                over = dict(kv_.split("=") for kv_ in var.split(",") if "=" in kv_)
                todo.append(("paged" if not over else "paged[" + var + "]", None, ("paged", over)))
        elif name == "split":
            for var in args.variants:
                over = dict(kv_.split("=") for kv_ in var.split(",") if "=" in kv_)
                label = "split" if not over else "split[" + var + "]"
                todo.append((label, None, ("split", over)))
        elif name in GENERIC:
            for var in args.ws_variants:
                over = dict(kv_.split("=") for kv_ in var.split(",") if "=" in kv_)
                todo.append((name if not over else f"{name}[{var}]", None, (name, over)))
        elif name in peers.PEERS:
            try:
                pf = peers.make(name, ctx, R, heads, V, D - V, sm_scale)
                todo.append((name, pf, "causal"))
            except peers.PeerUnavailable as e:
                results.append(dict(ctx=ctx, heads=heads, rows=R, path=name, skipped=str(e)))
                print(f"  ctx={ctx:>7} H={heads:>2} {name:<28} skipped: {e}", flush=True)
        elif name == "sdpa":
            pf = peers.sdpa_peer(ctx, mask, heads, V)
            todo.append(("sdpa", lambda q, kv, f=pf: f(q, kv, sm_scale), None))
        elif name == "flex":
            if flex_state["failed"] or flex_state["spent"] > args.flex_budget_s:
                continue
            try:
                t0 = time.time()
                pf = peers.flex_peer(ctx, mask, heads, V)
                todo.append(("flex", lambda q, kv, f=pf: f(q, kv, sm_scale), None))
                flex_state["spent"] += time.time() - t0
            except Exception as e:  # noqa: BLE001
                flex_state["failed"] = f"{type(e).__name__}: {str(e)[:300]}"
    for label, fn, over in todo:
        rec = dict(ctx=ctx, heads=heads, rows=R, path=label, n_sets=n_sets, bytes=bytes_call, flops=flops_call,
                   floor_us=floor * 1e6)
        mask_ref = over == "causal"
        if mask_ref:
            over = None
        mod = get_path(over[0]) if over is not None else None
        try:
            t0 = time.time()
            this_ref = ref_causal if mask_ref else ref
            kmeta = {}
            if over is not None:
                tun = tuned(over[0], over[1])
                rec["tuning"] = dataclasses.asdict(tun)
                if over[0] == "split":
                    pl = mod.plan(ctx, mask, None, V, tuning=tun, heads=heads)
                    rec["config"] = mod.config_for(pl, heads)
                elif over[0] in GENERIC:
                    pl = mod.plan(ctx, mask, None, V, tuning=tun, heads=heads)
                    rec["config"] = pl.extra["config"]
                else:
                    pl = mod.plan(ctx, mask, slots, V, tuning=tun, heads=heads)
                    this_ref = ref_paged
                fn = lambda q, kv, p=pl, m=mod: m.run(q, kv, p, sm_scale)  # noqa: E731
                mod.run(qs[0], kvs[0], pl, sm_scale, meta=kmeta)  # the compiled kernels' reports, once
            out = fn(qs[0], kvs[0])
            torch.cuda.synchronize()
            rec["rel_err"] = rel_err(out, this_ref)
            rec["ok"] = bool(rec["rel_err"] < 2e-2)
            if label == "flex":
                flex_state["spent"] += time.time() - t0

            def many(fn=fn):
                for i in range(n_sets):
                    fn(qs[i], kvs[i])
            t = timed_graph(many, n_sets, min_s=0.1 if args.quick else 0.3)
            rec.update(us=t * 1e6, GBps=bytes_call / t / 1e9, TFLOPs=flops_call / t / 1e12, gap=t / floor,
                       bw_frac=bytes_call / t / 1e9 / ceil["copy_GBps"], mm_frac=flops_call / t / 1e12 / ceil["bf16_mm_TFLOPs"])
            if kmeta:
                rec["kernels"] = kmeta
        except Exception as e:  # noqa: BLE001
            if isinstance(e, peers.PeerUnavailable):
                rec["skipped"] = str(e)
            rec["error"] = f"{type(e).__name__}: {str(e)[:400]}"
            if label == "flex":
                flex_state["failed"] = rec["error"]
        results.append(rec)
        print(f"  ctx={ctx:>7} H={heads:>2} {label:<28} " + (f"{rec['us']:9.1f} us {rec['GBps']:8.0f} GB/s {rec['TFLOPs']:6.1f} TF/s gap {rec['gap']:5.2f} err {rec['rel_err']:.1e}" if "us" in rec else rec.get("error", "")), flush=True)
    del kvs, qs
    torch.cuda.empty_cache()


def bench_step(args, ceil, results):
    """Full 61-layer k2 verify step at 8 heads (attention only) under CUDA-graph replay."""
    ctx = args.step_ctx
    heads = 8
    R = args.budget + 1
    D, V = K2.kv_row, K2.v_dim
    n = ctx + R
    g = torch.Generator(device="cuda").manual_seed(7)
    caches = [torch.randn(peers.rows_for(n), D, device="cuda", dtype=torch.bfloat16, generator=g)
              for _ in range(K2.num_layers)]
    q = torch.randn(R, heads, D, device="cuda", dtype=torch.bfloat16, generator=g)
    mask = shape_mask(args.tree, args.budget, "cuda")
    slots = torch.randperm(n, device="cuda")
    sm_scale = K2.sm_scale
    bytes_step, flops_step = call_cost(ctx, heads, R, layers=K2.num_layers)
    floor = floor_of(bytes_step, flops_step, ceil)
    todo = [(name, "") for name in args.paths if name in ("split", "paged") and name not in args.step_skip]
    todo += [("split", v) for v in args.step_variants if v]
    todo += [("split_ws", v) for v in args.ws_step_variants if v]
    for name in [p for p in args.paths if (p in GENERIC or p in peers.PEERS) and p not in args.step_skip]:
        try:
            if name in GENERIC:
                mod = get_path(name)
                pl = mod.plan(ctx, mask, None, V, heads=heads)
                fns = [lambda kv, m=mod, p=pl: m.run(q, kv, p, sm_scale)] * len(caches)
            else:
                fns = [lambda kv, f=peers.make(name, ctx, R, heads, V, D - V, sm_scale): f(q, kv)] * len(caches)

            def step(fns=fns):
                for f, kv in zip(fns, caches):
                    f(kv)
            t = timed_graph(step, 1, min_s=0.5, max_reps=10)
        except Exception as e:  # noqa: BLE001  (a peer that cannot run: recorded, not fatal)
            results.append(dict(kind="step61", ctx=ctx, heads=heads, path=name, skipped=f"{type(e).__name__}: {str(e)[:300]}"))
            print(f"  step61 ctx={ctx} {name:<8} skipped: {e}", flush=True)
            continue
        results.append(dict(kind="step61", ctx=ctx, heads=heads, path=name, step_ms=t * 1e3, floor_ms=floor * 1e3,
                            gap=t / floor, GBps=bytes_step / t / 1e9, bytes=bytes_step))
        print(f"  step61 ctx={ctx} {name:<8} {t*1e3:9.2f} ms floor {floor*1e3:.2f} ms gap {t/floor:.2f}", flush=True)
    for name, var in todo:
        mod = get_path(name)
        tun = tuned(name, dict(t.split("=") for t in var.split(",") if "=" in t))
        label = name if not var else f"{name}[{var}]"
        pl = mod.plan(ctx, mask, slots if name == "paged" else None, V, tuning=tun, heads=heads)

        def step(mod=mod, pl=pl):
            for kv in caches:
                mod.run(q, kv, pl, sm_scale)
        t = timed_graph(step, 1, min_s=0.5, max_reps=10)
        rec = dict(kind="step61", ctx=ctx, heads=heads, path=label, step_ms=t * 1e3, floor_ms=floor * 1e3, gap=t / floor,
                   GBps=bytes_step / t / 1e9, bytes=bytes_step)
        results.append(rec)
        print(f"  step61 ctx={ctx} {label:<8} {t*1e3:9.2f} ms floor {floor*1e3:.2f} ms gap {t/floor:.2f}", flush=True)
    del caches
    torch.cuda.empty_cache()


def smoke(args) -> int:
    """CPU: tiny shapes under the interpreter, every path vs reference."""
    bad = 0
    for ctx in (0, 17, 130):
        for name in ("paged", "split"):
            m = get_path(name)
            mask = shape_mask("fork", 8)
            n = ctx + 9
            kv = torch.randn(n, 96, dtype=torch.float16)
            q = torch.randn(9, 4, 96, dtype=torch.float16)
            slots = torch.arange(n) if name == "paged" else None
            out = m.run(q, kv, m.plan(ctx, mask, slots, 64), 0.125)
            ref = reference.run(q, kv, reference.plan(ctx, mask, None, 64), 0.125)
            e = rel_err(out, ref)
            bad += not e < 1e-2
            print(f"smoke {name} ctx={ctx} rel_err={e:.2e}")
    q, kv = torch.randn(9, 4, 576, dtype=torch.bfloat16), torch.randn(200, 576, dtype=torch.bfloat16)
    for name in GENERIC:
        print(f"smoke {name}: skipped, the path {get_path(name).supported(q, kv, 512)}")
    for name in peers.PEERS:
        try:
            peers.make(name, 100, 9, 4, 512, 64, 0.07)
        except peers.PeerUnavailable as e:
            print(f"smoke {name}: skipped, {e}")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", type=token_list, default="1k,4k,16k,32k,64k,128k,256k")
    ap.add_argument("--heads", default="8,64")
    ap.add_argument("--paths", default="paged,split,split_ws,flashmla,flashinfer-fa3,flashinfer-fa2,flex,sdpa")
    ap.add_argument("--variants", default="", help="';'-separated split tuning overrides (SplitTuning fields), e.g. 'tail=1;tail=0,block_n=32'")
    ap.add_argument("--ws-variants", default="", help="';'-separated split_ws tuning overrides (WsTuning fields), e.g. ';pipe=0'")
    ap.add_argument("--paged-variants", default="", help="';'-separated paged tuning overrides (PagedTuning fields), e.g. ';num_stages=2'")
    ap.add_argument("--tune", default="", help="split tuning for the whole run, e.g. 'tail_ratio=3'")
    ap.add_argument("--budget", type=int, default=8)
    ap.add_argument("--tree", default="lopsided")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-step", action="store_true")
    ap.add_argument("--step-ctx", type=token_list, default=[128 * 1024])
    ap.add_argument("--flex-budget-s", type=float, default=150)
    ap.add_argument("--paged-max-ctx", type=token_list, default=[256 * 1024])
    ap.add_argument("--paged-heads", default="", help="time paged only at these head counts (default: all)")
    ap.add_argument("--step-variants", default="", help="';'-separated split tuning overrides also timed in the 61-layer step")
    ap.add_argument("--ws-step-variants", default="", help="';'-separated split_ws tuning overrides also timed in the 61-layer step")
    ap.add_argument("--step-skip", default="", help="paths left out of the 61-layer step, e.g. 'paged'")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "bench_verify.json"))
    args = ap.parse_args()
    args.step_ctx = args.step_ctx[0]
    args.step_variants = args.step_variants.split(";") if args.step_variants else []
    args.ws_step_variants = args.ws_step_variants.split(";") if args.ws_step_variants else []
    args.step_skip = [p for p in args.step_skip.split(",") if p]
    paged_heads = [int(h) for h in args.paged_heads.split(",") if h]
    args.paths = [p for p in args.paths.split(",") if p]
    args.variants = [v for v in args.variants.split(";")] if args.variants else [""]
    args.paged_variants = [v for v in args.paged_variants.split(";")] if args.paged_variants else [""]
    args.ws_variants = [v for v in args.ws_variants.split(";")] if args.ws_variants else [""]
    if not torch.cuda.is_available():
        return smoke(args)
    import triton
    meta = dict(date=datetime.date.today().isoformat(), gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                triton=triton.__version__, python=platform.python_version(), command=" ".join(sys.argv),
                sm_count=torch.cuda.get_device_properties(0).multi_processor_count)
    BASE_TUNING["split"] = tuned("split", dict(t.split("=") for t in args.tune.split(",") if "=" in t))
    meta["split_tuning"] = dataclasses.asdict(BASE_TUNING["split"])
    ceil = ceilings()
    print(f"ceilings: copy {ceil['copy_GBps']:.0f} GB/s, bf16 mm {ceil['bf16_mm_TFLOPs']:.0f} TFLOP/s", flush=True)
    results: list[dict] = []
    flex_state = {"failed": None, "spent": 0.0}
    doc = dict(meta=meta, ceilings=ceil, results=results, flex=flex_state)
    for heads in [int(h) for h in args.heads.split(",")]:
        for ctx in args.ctx:
            keep = args.paths
            if ctx > args.paged_max_ctx[0] or (paged_heads and heads not in paged_heads):
                args.paths = [p for p in keep if p != "paged"]
            bench_point(ctx, heads, args, ceil, results, flex_state)
            args.paths = keep
            with open(args.out, "w") as f:
                json.dump(doc, f, indent=1, default=str)
    if not args.no_step:
        bench_step(args, ceil, results)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    # short table last
    print(f"\nceilings: copy {ceil['copy_GBps']:.0f} GB/s, bf16 mm {ceil['bf16_mm_TFLOPs']:.0f} TFLOP/s; flex: {flex_state['failed']}")
    print(f"{'ctx':>7} {'H':>3} {'path':<40} {'us':>9} {'GB/s':>7} {'TF/s':>6} {'floor':>7} {'gap':>6} {'err':>8}")
    for r in results:
        if r.get("kind") == "step61" and "skipped" in r:
            print(f"step61 {r['ctx']:>7} {r['path']:<10} skipped: {r['skipped'][:80]}")
        elif r.get("kind") == "step61":
            print(f"step61 {r['ctx']:>7} {r['path']:<10} {r['step_ms']:.2f} ms floor {r['floor_ms']:.2f} ms gap {r['gap']:.2f} {r['GBps']:.0f} GB/s")
        elif "us" in r:
            km = r.get("kernels", {}).get("prefix", {})
            res = f" regs {km.get('n_regs')} spill {km.get('n_spills')} smem {km.get('shared')}" if km else ""
            print(f"{r['ctx']:>7} {r['heads']:>3} {r['path']:<40} {r['us']:9.1f} {r['GBps']:7.0f} {r['TFLOPs']:6.1f} {r['floor_us']:7.1f} {r['gap']:6.2f} {r['rel_err']:8.1e}{res}")
        elif "skipped" in r:
            print(f"{r['ctx']:>7} {r['heads']:>3} {r['path']:<40} skipped: {r['skipped'][:80]}")
        else:
            print(f"{r['ctx']:>7} {r['heads']:>3} {r['path']:<40} ERROR {r.get('error','')[:80]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
