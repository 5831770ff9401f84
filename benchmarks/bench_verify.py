"""Verify-attention benchmark: build, check and time every path and peer in one call.

    PYTHONPATH=$PWD PYTHONUNBUFFERED=1 python benchmarks/bench_verify.py --out $OUT/bench_verify.json
    ... --ctx 32k,128k --heads 8 --quick --paths split --variants "tail=1;tail=0"

Per layer, for each context and head count: median time of `paged`, `split` and the peers
(FlexAttention with a block mask, SDPA with a dense bool mask), each under CUDA-graph replay
over several input sets so the caches do not fit in L2; bytes and FLOPs per call, GB/s,
TFLOP/s, the floor from ceilings measured in the same run, time over floor. Then the full
61-layer k2 verify step (attention only) at 8 heads. Writes JSON; prints a table last.
Without CUDA (smoke test) it only checks correctness on tiny shapes under the interpreter.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
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
from ddprobe.timing import n_cache_sets, timed_graph  # noqa: E402
from ddprobe.units import UnitError, parse_token_list  # noqa: E402


def token_list(text: str) -> list[int]:
    """argparse type: '1k,16k' -> [1024, 16384]; a bad value is argparse's one-line usage error."""
    try:
        return parse_token_list(text)
    except UnitError as e:
        raise argparse.ArgumentTypeError(str(e)) from None

K2 = dict(layers=61, v_dim=512, rope=64)
L2_BYTES = 50 * 2**20


def ceilings() -> dict:
    n = 2**30 // 2
    a = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    ts = []
    for _ in range(20):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record(); b.copy_(a); e1.record(); torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1) / 1e3)
    copy_bw = 2 * a.numel() * 2 / statistics.median(ts)
    del a, b
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


# ---------------------------------------------------------------- peers (benchmark only)
def sdpa_peer(prefix, mask, heads, v_dim):
    """SDPA over the contiguous cache with a dense bool mask; heads x rows folded (MQA)."""
    import torch.nn.functional as F
    full = torch.cat([torch.ones(mask.shape[0], prefix, dtype=torch.bool, device=mask.device), mask], 1)
    dense = full.repeat_interleave(heads, dim=0)[None, None]  # [1,1,Hq,n] row hq = r*H+h

    def run(q, kv, sm_scale):
        r, h, d = q.shape
        n = prefix + r
        qf = q.reshape(1, 1, r * h, d)
        k = kv[:n].view(1, 1, n, d)
        v = kv[:n, :v_dim].unsqueeze(0).unsqueeze(0)
        o = F.scaled_dot_product_attention(qf, k, v, attn_mask=dense, scale=sm_scale)
        return o.view(r, h, v_dim)
    return run


def flex_peer(prefix, mask, heads, v_dim):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    r = mask.shape[0]
    n = prefix + r
    tree = mask

    def mask_mod(b, h, qi, ki):
        row = qi // heads
        col = (ki - prefix).clamp(min=0)
        return (ki < prefix) | tree[row, col]
    bm = create_block_mask(mask_mod, 1, 1, r * heads, n, device=mask.device)
    fa = torch.compile(flex_attention, dynamic=False)

    def run(q, kv, sm_scale):
        rr, h, d = q.shape
        qf = q.reshape(1, 1, rr * h, d)
        k = kv[:n].view(1, 1, n, d)
        v = kv[:n, :v_dim].unsqueeze(0).unsqueeze(0)
        o = fa(qf, k, v, block_mask=bm, scale=sm_scale, kernel_options={"BLOCK_M": 32, "BLOCK_N": 32, "num_stages": 1})
        return o.view(rr, h, v_dim)
    return run


# ---------------------------------------------------------------- one (ctx, heads) point
def bench_point(ctx, heads, args, ceil, results, flex_state):
    dev = "cuda"
    R = args.budget + 1
    D = K2["v_dim"] + K2["rope"]
    V = K2["v_dim"]
    n = ctx + R
    layer_bytes = n * D * 2
    n_sets = n_cache_sets(layer_bytes, L2_BYTES, most=48 if args.quick else 96)
    g = torch.Generator(device=dev).manual_seed(ctx * 131 + heads)
    kvs = [torch.randn(n, D, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(n_sets)]
    qs = [torch.randn(R, heads, D, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(n_sets)]
    mask = shape_mask(args.tree, args.budget, dev)
    slots = torch.randperm(n, device=dev)  # shuffled page_size=1 allocation over the same rows
    sm_scale = 1.0 / math.sqrt(192)  # K2: qk_nope 128 + rope 64
    hq = R * heads
    bytes_call = layer_bytes + qs[0].numel() * 2 + R * heads * V * 2
    flops_call = 2 * hq * n * (D + V)
    floor = max(bytes_call / (ceil["copy_GBps"] * 1e9), flops_call / (ceil["bf16_mm_TFLOPs"] * 1e12))
    ref = reference.run(qs[0], kvs[0], reference.plan(ctx, mask, None, V), sm_scale)
    ref_paged = reference.run(qs[0], kvs[0], reference.plan(ctx, mask, slots, V), sm_scale)

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
        elif name == "sdpa":
            pf = sdpa_peer(ctx, mask, heads, V)
            todo.append(("sdpa", lambda q, kv, f=pf: f(q, kv, sm_scale), None))
        elif name == "flex":
            if flex_state["failed"] or flex_state["spent"] > args.flex_budget_s:
                continue
            try:
                t0 = time.time()
                pf = flex_peer(ctx, mask, heads, V)
                todo.append(("flex", lambda q, kv, f=pf: f(q, kv, sm_scale), None))
                flex_state["spent"] += time.time() - t0
            except Exception as e:  # noqa: BLE001
                flex_state["failed"] = f"{type(e).__name__}: {str(e)[:300]}"
    for label, fn, over in todo:
        rec = dict(ctx=ctx, heads=heads, rows=R, path=label, n_sets=n_sets, bytes=bytes_call, flops=flops_call,
                   floor_us=floor * 1e6)
        mod = get_path(over[0]) if over is not None else None
        saved = dict(mod.TUNING) if mod is not None else {}
        try:
            t0 = time.time()
            this_ref = ref
            if over is not None:
                for k_, v_ in over[1].items():
                    mod.TUNING[k_] = int(v_)
                if over[0] == "split":
                    pl = mod.plan(ctx, mask, None, V)
                    rec["config"] = mod._config(pl, heads)
                else:
                    pl = mod.plan(ctx, mask, slots, V)
                    this_ref = ref_paged
                fn = lambda q, kv, p=pl, m=mod: m.run(q, kv, p, sm_scale)  # noqa: E731
                mod.LAST_META.clear()
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
            if over is not None:
                rec["kernels"] = dict(mod.LAST_META)
        except Exception as e:  # noqa: BLE001
            rec["error"] = f"{type(e).__name__}: {str(e)[:400]}"
            if label == "flex":
                flex_state["failed"] = rec["error"]
        finally:
            if mod is not None:
                mod.TUNING.clear(); mod.TUNING.update(saved)
        results.append(rec)
        print(f"  ctx={ctx:>7} H={heads:>2} {label:<28} " + (f"{rec['us']:9.1f} us {rec['GBps']:8.0f} GB/s {rec['TFLOPs']:6.1f} TF/s gap {rec['gap']:5.2f} err {rec['rel_err']:.1e}" if "us" in rec else rec.get("error", "")), flush=True)
    del kvs, qs
    torch.cuda.empty_cache()


def bench_step(args, ceil, results):
    """Full 61-layer k2 verify step at 8 heads (attention only) under CUDA-graph replay."""
    ctx = args.step_ctx
    heads = 8
    R = args.budget + 1
    D, V = K2["v_dim"] + K2["rope"], K2["v_dim"]
    n = ctx + R
    g = torch.Generator(device="cuda").manual_seed(7)
    caches = [torch.randn(n, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(K2["layers"])]
    q = torch.randn(R, heads, D, device="cuda", dtype=torch.bfloat16, generator=g)
    mask = shape_mask(args.tree, args.budget, "cuda")
    slots = torch.randperm(n, device="cuda")
    sm_scale = 1.0 / math.sqrt(192)
    bytes_step = K2["layers"] * (n * D * 2 + q.numel() * 2 + R * heads * V * 2)
    flops_step = K2["layers"] * 2 * R * heads * n * (D + V)
    floor = max(bytes_step / (ceil["copy_GBps"] * 1e9), flops_step / (ceil["bf16_mm_TFLOPs"] * 1e12))
    todo = [(name, "") for name in args.paths if name in ("split", "paged") and name not in args.step_skip]
    todo += [("split", v) for v in args.step_variants if v]
    for name, var in todo:
        mod = get_path(name)
        saved = dict(mod.TUNING)
        for kv_ in [t for t in var.split(",") if "=" in t]:
            k_, v_ = kv_.split("=")
            mod.TUNING[k_] = int(v_)
        label = name if not var else f"{name}[{var}]"
        try:
            pl = mod.plan(ctx, mask, slots if name == "paged" else None, V)

            def step(mod=mod, pl=pl):
                for kv in caches:
                    mod.run(q, kv, pl, sm_scale)
            t = timed_graph(step, 1, min_s=0.5, max_reps=10)
        finally:
            mod.TUNING.clear(); mod.TUNING.update(saved)
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
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", type=token_list, default="1k,4k,16k,32k,64k,128k,256k")
    ap.add_argument("--heads", default="8,64")
    ap.add_argument("--paths", default="paged,split,flex,sdpa")
    ap.add_argument("--variants", default="", help="';'-separated split TUNING overrides, e.g. 'tail=1;tail=0,block_n=32'")
    ap.add_argument("--paged-variants", default="", help="';'-separated paged TUNING overrides, e.g. ';num_stages=2'")
    ap.add_argument("--tune", default="", help="split TUNING defaults for the whole run, e.g. 'tail_ratio=3'")
    ap.add_argument("--budget", type=int, default=8)
    ap.add_argument("--tree", default="lopsided")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-step", action="store_true")
    ap.add_argument("--step-ctx", type=token_list, default=[128 * 1024])
    ap.add_argument("--flex-budget-s", type=float, default=150)
    ap.add_argument("--paged-max-ctx", type=token_list, default=[256 * 1024])
    ap.add_argument("--paged-heads", default="", help="time paged only at these head counts (default: all)")
    ap.add_argument("--step-variants", default="", help="';'-separated split TUNING overrides also timed in the 61-layer step")
    ap.add_argument("--step-skip", default="", help="paths left out of the 61-layer step, e.g. 'paged'")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "bench_verify.json"))
    args = ap.parse_args()
    args.step_ctx = args.step_ctx[0]
    args.step_variants = args.step_variants.split(";") if args.step_variants else []
    args.step_skip = [p for p in args.step_skip.split(",") if p]
    paged_heads = [int(h) for h in args.paged_heads.split(",") if h]
    args.paths = [p for p in args.paths.split(",") if p]
    args.variants = [v for v in args.variants.split(";")] if args.variants else [""]
    args.paged_variants = [v for v in args.paged_variants.split(";")] if args.paged_variants else [""]
    if not torch.cuda.is_available():
        return smoke(args)
    import triton
    meta = dict(date=datetime.date.today().isoformat(), gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                triton=triton.__version__, python=platform.python_version(), command=" ".join(sys.argv),
                sm_count=torch.cuda.get_device_properties(0).multi_processor_count,
                split_tuning=dict(get_path("split").TUNING))
    for kv_ in [t for t in args.tune.split(",") if "=" in t]:
        k_, v_ = kv_.split("=")
        get_path("split").TUNING[k_] = int(v_)
    meta["split_tuning"] = dict(get_path("split").TUNING)
    get_path("split").COLLECT_META = True
    get_path("paged").COLLECT_META = True
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
        if r.get("kind") == "step61":
            print(f"step61 {r['ctx']:>7} {r['path']:<10} {r['step_ms']:.2f} ms floor {r['floor_ms']:.2f} ms gap {r['gap']:.2f} {r['GBps']:.0f} GB/s")
        elif "us" in r:
            km = r.get("kernels", {}).get("prefix", {})
            res = f" regs {km.get('n_regs')} spill {km.get('n_spills')} smem {km.get('shared')}" if km else ""
            print(f"{r['ctx']:>7} {r['heads']:>3} {r['path']:<40} {r['us']:9.1f} {r['GBps']:7.0f} {r['TFLOPs']:6.1f} {r['floor_us']:7.1f} {r['gap']:6.2f} {r['rel_err']:8.1e}{res}")
        else:
            print(f"{r['ctx']:>7} {r['heads']:>3} {r['path']:<40} ERROR {r.get('error','')[:80]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
