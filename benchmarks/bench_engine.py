"""The engine at GPU speed (issue 13): decode steps replayed as CUDA graphs vs eager, in one call.

  1. equality: tiny preset (fp32, shipped weights) with reference/paged/split, graphs vs eager:
     greedy tokens; k2 (bf16, random weights) short generate, graphs vs eager tokens.
  2. k2 preset, --heads heads, bf16, budget 8, random weights, a context of random latent rows at
     each --ctxs (a step's time does not depend on the values; no 128k prefill): per path, warm-up
     (compile + capture) timed on its own, then two cells of --steps steps each (first cell vs
     second); phase times from CUDA events, host ms per step from the step records.
  3. eager steps at the first context (the engine before graphs), same state.
  4. torch.profiler over graph-replayed steps: GPU time per step by kernel class and the step's
     wall time over the sum of its kernels.
  5. tiny preset on CUDA: two cells of a real prompt, graphs and eager.

With graphs the step builds the tree and walks on the device (one device-to-host copy per step);
--tree both also times the host tree (two copies per step) on the same captured state, and the
profile counts the device-to-host copies per step. Order: k2, equality, tiny.

    PYTHONPATH=$PWD python benchmarks/bench_engine.py --out $OUT/bench_engine.json
    # short: split only, compiled only, no tiny timing
    PYTHONPATH=$PWD python benchmarks/bench_engine.py --paths split --fuse on --skip tiny --out ...

    # the step's anatomy (k2 with its MoE, split, graphs): step and kernel classes at each context, the
    # non-attention part against the weight floor, the fitted marginal cost against the attention growth
    PYTHONPATH=$PWD python benchmarks/bench_engine.py --anatomy --ctxs 8k,32k,128k --out $OUT/anatomy.json

Writes the JSON as it goes; prints a short table last.
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ddprobe.engine import weights as shipped  # noqa: E402
from ddprobe.physics.presets import ModelConfig  # noqa: E402
from ddprobe.engine.generate import Engine  # noqa: E402
from ddprobe import verify_paths  # noqa: E402
import re  # noqa: E402

# every verify path's kernels (the table's ncu regexes): the profile's "attention" class
ATTN_RE = re.compile("|".join(p.ncu_regex for p in verify_paths.PATHS if p.ncu_regex))
from ddprobe.engine.kernels import get_path  # noqa: E402
from ddprobe.engine.loop import decode  # noqa: E402
from ddprobe.engine.runner import Caches  # noqa: E402
from ddprobe.engine.steps import DeviceTreeStep, EagerStep, HostTreeStep  # noqa: E402
from ddprobe.units import UnitError, parse_tokens  # noqa: E402

PHASES = ("draft_ms", "tree_ms", "verify_ms", "commit_ms")


def med(steps, key):
    vals = [getattr(s, key) for s in steps if getattr(s, key) is not None]
    return statistics.median(vals) if vals else None


def summary(steps) -> dict:
    out = {k: med(steps, k) for k in PHASES + ("host_ms", "d2h")}
    out["step_ms"] = statistics.median(s.step_ms for s in steps)
    out["n"] = len(steps)
    return out


def with_path(eng: Engine, attn: str) -> Engine:
    """The same weights behind another attention path (benchmark only: a shallow copy)."""
    e = copy.copy(eng)  # a new runner: the copy's step plan differs
    e.attn, e.path = attn, get_path(attn)
    e.kv_layout = "paged" if attn == "paged" else "contiguous"
    return e


def run_steps(eng: Engine, st, n: int, device_tree: bool = True, eager: bool = False) -> list:
    """n - 1 decode steps from bonus 1 over the static step's state: the device tree (when its graphs
    were captured), the host tree, or eager steps (host plans) on the same cache."""
    kind = EagerStep if eager else DeviceTreeStep if device_tree and st.device_ok else HostTreeStep
    return decode(eng.runner, eng.models, Caches(st.kv, st.dctx, None if eager else st), 1, n, strategy=kind)[1]


def synthetic(st, ctx: int) -> None:
    """A committed context of ctx random latent rows (and drafter K/V): timing only (graphs.StaticStep.synthetic)."""
    st.synthetic(ctx)


def equality(rec: dict) -> None:
    prompt = [(i * 37 + 11) % 256 for i in range(100)]
    for attn in ("reference", "paged", "split"):
        toks = {}
        for g in (False, True):
            eng = Engine("tiny", attn=attn, device="cuda", dtype=torch.float32, graphs=g, max_ctx=512)
            shipped.load_into(eng, "tiny")
            toks[g] = eng.generate(prompt, 96).tokens
        rec[f"tiny_{attn}_tokens_equal"] = toks[False] == toks[True]


def k2_engine(heads: int, cap: int, mlp: str = "moe") -> Engine:
    """The k2 preset on CUDA in bf16; ``mlp`` "dense": every layer the dense SwiGLU (n_experts 0), the preset
    before its MoE layer (what issue 34's engine targets were set on)."""
    cfg = ModelConfig.from_name("k2", heads=heads, **({"n_experts": 0} if mlp == "dense" else {}))
    cfg = cfg.with_overrides(max_ctx=cap)
    return Engine(cfg, attn="split", device="cuda", dtype=torch.bfloat16, seed=0, graphs=True)


def profile_steps(eng: Engine, st, ctx: int, steps: int, device_tree: bool = True) -> dict:
    from torch.profiler import ProfilerActivity, profile

    synthetic(st, ctx)
    run_steps(eng, st, 3, device_tree)  # settle
    synthetic(st, ctx)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        recs = run_steps(eng, st, steps + 1, device_tree)
        torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) * 1e3 / steps
    classes = {"attention": 0.0, "gemm": 0.0, "copy": 0.0, "other": 0.0}
    count, names, d2h = 0, {}, 0
    for ev in prof.events():
        if ev.device_type.name != "CUDA":
            continue
        if "DtoH" in ev.name or "Device -> Pageable" in ev.name or "Device -> Pinned" in ev.name:
            d2h += 1
        t = ev.device_time / 1e3 / steps
        n = ev.name
        low = n.lower()
        if ATTN_RE.search(n):
            c = "attention"
        elif any(k in low for k in ("gemm", "nvjet", "cutlass", "xmma", "gemv", "splitk")):
            c = "gemm"
        elif "memcpy" in low or "memset" in low:
            c = "copy"
        else:
            c = "other"
        classes[c] += t
        names[n] = names.get(n, 0.0) + t
        count += 1
    busy = sum(classes.values())
    cpu = sorted(((k.key, k.self_cpu_time_total / 1e3 / steps, k.count / steps) for k in prof.key_averages()),
                 key=lambda t: -t[1])[:12]
    top = sorted(names.items(), key=lambda kv: -kv[1])[:12]
    return {"ctx": ctx, "steps": steps, "device_tree": device_tree, "d2h_per_step": d2h / steps,
            "kernel_ms_per_step": busy, "by_class_ms": classes, "kernels_per_step": count / steps,
            "wall_ms_per_step": wall, "event_step_ms": summary(recs)["step_ms"], "wall_over_kernels": wall / busy if busy else None,
            "top_kernels_ms": top, "cpu_self_ms": cpu}


def run_k2(a, out: dict, save) -> None:
    ctxs = [parse_tokens(c) for c in a.ctxs.split(",")]
    cap = max(ctxs) + (a.steps + 2) * 9 + 64
    t0 = time.perf_counter()
    base = k2_engine(a.heads, cap, a.mlp)
    out["k2_mlp"] = a.mlp
    out["k2_init_s"] = time.perf_counter() - t0
    # equality on k2 (bf16): a short real prompt, graphs vs eager
    prompt = [(i * 7919 + 13) % base.config.target.vocab_size for i in range(64)]
    ge = base.generate(prompt, 12).tokens
    base.graphs = False
    ee = base.generate(prompt, 12).tokens
    base.graphs = True
    out["k2_split_tokens_equal"] = ge == ee
    out["k2_split_tokens"] = {"graphs": ge, "eager": ee}
    save()
    for attn in a.paths.split(","):
        for fuse in ((True, False) if attn == "split" and a.fuse == "both" else (True,)):
            eng = base if attn == "split" else with_path(base, attn)
            eng.fuse = fuse
            r = {"attn": attn, "fuse": fuse, "warmup": {}, "cells": {}, "cells_host_tree": {}, "profile": []}
            out["k2"].append(r)
            for ctx in (ctxs if fuse else ctxs[:1]):
                eng.release()
                # the state sized to the request (prompt + new tokens + rows), as generate() sizes it
                r["warmup"][ctx] = eng.warmup(capacity=ctx + (a.steps + 2) * 9 + 64)
                st = eng.runner.static
                r["compiled"], r["compile_error"] = bool(st.fused and st.fused.compiled), eng.compile_error
                r["device_tree_graphs"], r["device_error"] = st.device_ok, st.device_error
                n = a.steps if attn == "split" or ctx <= 32768 else max(4, a.steps // 3)
                modes = {"device": (True,), "host": (False,), "both": (True, False)}[a.tree]
                for dt in modes:  # the same captured graphs serve both
                    cells = []
                    for _ in range(2):
                        synthetic(st, ctx)
                        recs = run_steps(eng, st, n + 1, dt)
                        cells.append(summary(recs))
                    r["cells" if dt else "cells_host_tree"][ctx] = cells
                    save()
                if fuse and ctx == ctxs[0]:
                    r["logits_vs_plain"] = logits_check(eng, st, ctx)
                    synthetic(st, ctx)  # eager steps, same weights and state
                    recs = run_steps(eng, st, max(4, a.steps // 3) + 1, eager=True)
                    r["eager"] = {ctx: summary(recs)}
                r["profile"].append(profile_steps(eng, st, ctx, 5, modes[0]))
                if a.tree == "both" and ctx == ctxs[0]:
                    r["profile"].append(profile_steps(eng, st, ctx, 5, False))
                save()
            eng.release()


def run_kernel(a, out: dict, save) -> None:
    """split_ws run() on a device plan, per layer (k2 shapes, budget 8, bf16): host time of an eager call
    (time.perf_counter over 200 calls, no sync) and of its parts, the eager time (CUDA events around 200
    back-to-back calls) and the graph-replayed time (200 calls captured in one graph), at 8 and 64 heads, the
    contexts of --ctxs, with the merge fused into the prefix kernel's launch (the default) and as its own launch."""
    from ddprobe.engine.kernels import get_path

    m, n = get_path("split_ws"), 200

    def per_call(fn) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        us = (time.perf_counter() - t0) / n * 1e6
        torch.cuda.synchronize()
        return us

    def events(fn) -> float:
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        ev[0].record()
        fn()
        ev[1].record()
        torch.cuda.synchronize()
        return ev[0].elapsed_time(ev[1]) * 1e3 / n

    for heads in (8, 64):
        for ctx in (parse_tokens(c) for c in a.ctxs.split(",")):
            for kind, merge in ((-1, "fused"), (-2, "own launch")):
                kernel_cell(m, heads, ctx, kind, merge, per_call, events, n, out, save)


def kernel_cell(m, heads: int, ctx: int, kind: int, merge: str, per_call, events, n: int, out: dict, save) -> None:
    """One run_kernel cell: split_ws on a device plan whose merge is fused into the prefix launch (merge_kind -1)
    or its own launch (-2, the default)."""
    from ddprobe.engine.kernels import _cu, split_ws
    from ddprobe.engine.kernels.split import LOG2E
    from ddprobe.engine.kernels.trees import shape_mask

    q = torch.randn(9, heads, 576, device="cuda").to(torch.bfloat16)
    kv = torch.randn(ctx + 9 + 64, 576, device="cuda").to(torch.bfloat16)
    pt = torch.tensor([ctx], dtype=torch.int32, device="cuda")
    p = m.plan(pt, shape_mask("lopsided", 8, "cuda"), None, 512, heads=heads, max_prefix=ctx + 64,
               tuning=split_ws.WsTuning(merge_kind=kind))
    d, s0 = p.detail, _cu.stream_of(0)
    assert d.fused == (kind == -1), (kind, d.fused)
    call = lambda: m.run(q, kv, p, 0.0722)  # noqa: E731
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    host = [per_call(call) for _ in range(5)]
    o = torch.empty(9, heads, 512, dtype=torch.bfloat16, device="cuda")
    launches = {"prefix_launch": lambda: d.launcher(q, kv, 0.0722 * LOG2E, s0, o)} if d.fused else {
        "prefix_launch": lambda: d.launcher(q, kv, 0.0722 * LOG2E, s0), "merge_launch": lambda: d.merger(o, s0)}
    parts = {k: per_call(fn) for k, fn in (
        ("check", lambda: split_ws.check_inputs(q, kv, p)),
        *launches.items(),
        ("out", lambda: torch.empty(9, heads, 512, dtype=torch.bfloat16, device="cuda")),
        ("stream", lambda: _cu.stream_of(0)))}

    def loop():
        for _ in range(n):
            call()
    eager = [events(loop) for _ in range(3)]
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        loop()
    graph = [events(g.replay) for _ in range(3)]
    r = {"heads": heads, "ctx": ctx, "merge": merge, "host_us": statistics.median(host),
         "eager_us": statistics.median(eager), "graph_us": statistics.median(graph),
         "kernel": d.launcher.fused_report if d.fused else d.launcher.report,
         "merge_kernel": None if d.fused else d.merger.report, "host_parts_us": parts}
    r["eager_over_graph"] = r["eager_us"] / r["graph_us"]
    out["kernel"].append(r)
    print(f"kernel split_ws H={heads} ctx={ctx} merge {merge}: host {r['host_us']:.1f} us/call, eager "
          f"{r['eager_us']:.1f} us, graph {r['graph_us']:.1f} us (x{r['eager_over_graph']:.3f}); host "
          f"parts {', '.join(f'{k} {v:.1f}' for k, v in parts.items())}", flush=True)
    save()
    del g
    torch.cuda.empty_cache()


def logits_check(eng: Engine, st, ctx: int) -> dict:
    """One verify step on the same inputs: the captured graph (compiled layers) against the same
    static step run eagerly with the plain functions: relative error of the logits, argmax agreement."""
    from ddprobe.engine.tree import tree_from_topk

    synthetic(st, ctx)
    st.write_commit(list(range(st.rows)), ctx, 0, 1)
    vals, idx = st.run("draft")
    tree = tree_from_topk(vals.cpu(), idx.cpu(), eng.budget, 1, eng.tree_shape)
    widx = st.write_step(tree, ctx)
    graph = st.run("verify")[0].clone()
    fused, st.fused = st.fused, None
    plain = st.run("verify", eager=True)[0]
    st.fused = fused
    if st.paged:
        st.kv.give_back(widx)
    err = float((graph - plain).norm() / plain.norm())
    out = {"rel_err": err, "argmax_equal": float((graph.argmax(-1) == plain.argmax(-1)).float().mean())}
    if eng.config.target.n_experts:  # bf16-sized noise: outputs 0.51 apart after 60 layers (bench_moe.py --flips)
        out["note"] = ("MoE: the compiled and plain layers' bf16 rounding differs enough to flip top-k routing, so the "
                       "logits drift apart without a defect; --mlp dense makes this check meaningful")
    return out


def engine_weight_floor(eng: Engine, bw_Bps: float) -> dict:
    """The weights one k2 verify step reads besides the KV, as the step model counts them (``ddprobe.physics.step_model``,
    through ``engine_backend.target_step_weights``: the target's weights, routed experts as 9 rows touch them; the
    drafter is not counted), and their floor at ``bw_Bps``."""
    from ddprobe.probes.backends.engine import target_step_weights
    from ddprobe.physics.shapes import dtype_name

    w = target_step_weights(eng.config.target, eng.budget + 1, dtype_name(eng.dtype))
    return {"dense_B": w.dense_B, "routed_B": w.routed_B, "experts_per_layer": w.experts_per_layer,
            "moe_layers": w.moe_layers, "weight_floor_ms": w.total_B / bw_Bps * 1e3, "bw_Bps": bw_Bps,
            "counts": "the target's verify step (ddprobe.physics.step_model); the drafter is not counted"}


def run_anatomy(a, out: dict, save) -> None:
    """k2 (MoE), split, graphs, one capture at the longest context; per context: step, kernel classes."""
    from ddprobe.probes.bench.anatomy import fit_anatomy
    from ddprobe.physics.gpus import gpu_spec_for

    ctxs = sorted(parse_tokens(c) for c in a.ctxs.split(","))
    cap = max(ctxs) + (a.steps + 2) * 9 + 64
    t0 = time.perf_counter()
    eng = k2_engine(a.heads, cap)
    out["k2_init_s"] = time.perf_counter() - t0
    ex = eng.target.layers[1].mlp.experts
    out["moe_auto"] = ex.kernel  # what Experts chose on this GPU
    if a.moe_kernel != "auto":  # before the warm-up: compile and capture take this path
        for layer in eng.target.layers:
            if hasattr(layer.mlp, "experts"):
                layer.mlp.experts.kernel = a.moe_kernel
    out["moe"] = {"kernel": ex.kernel, "experts": ex.n, "top_k": eng.config.target.experts_per_tok}
    out["warmup"] = eng.warmup(capacity=cap)
    st = eng.runner.static
    out["compiled"], out["compile_error"] = bool(st.fused and st.fused.compiled), eng.compile_error
    gpu = gpu_spec_for(torch.cuda.get_device_name())
    bw = gpu.bw_Bps if gpu else 4.8e12
    out["weights"] = engine_weight_floor(eng, bw)
    kv_tok = eng.config.target.attn_shape.kv_bytes_per_token(eng.dtype)
    out["cells"] = []
    save()
    for ctx in ctxs:
        cells = []
        for _ in range(2):
            synthetic(st, ctx)
            recs = run_steps(eng, st, a.steps + 1)
            cells.append(summary(recs))
        prof = profile_steps(eng, st, ctx, 5)
        out["cells"].append({"ctx": ctx, "cells": cells, "profile": prof})
        save()
    steps = [c["cells"][1]["step_ms"] for c in out["cells"]]
    attn = [c["profile"]["by_class_ms"]["attention"] for c in out["cells"]]
    an = fit_anatomy(ctxs, steps, kv_B_per_token=kv_tok, bw_Bps=bw,
                     weight_floor_ms=out["weights"]["weight_floor_ms"])
    out["anatomy"] = an.to_dict()
    growth = [(a1 - a0) / (c1 - c0) * 1024 for (c0, a0), (c1, a1) in zip(zip(ctxs, attn), list(zip(ctxs, attn))[1:])]
    fit_attn = (attn[-1] - attn[0]) / (ctxs[-1] - ctxs[0]) * 1024
    out["check"] = {
        "non_attention_ms": [s - x for s, x in zip(steps, attn)],
        "non_attention_over_weight_floor": [(s - x) / out["weights"]["weight_floor_ms"] for s, x in zip(steps, attn)],
        "attention_ms": attn, "attention_ms_per_1k_intervals": growth, "attention_ms_per_1k": fit_attn,
        "anatomy_ms_per_1k": an.ms_per_1k, "anatomy_over_attention_growth": an.ms_per_1k / fit_attn if fit_attn else None,
    }
    save()


def run_tiny(out: dict, save) -> None:
    prompt = [(i * 37 + 11) % 256 for i in range(1024)]
    for attn in ("split", "paged"):
        for g in (True, False):
            eng = Engine("tiny", attn=attn, device="cuda", dtype=torch.bfloat16, graphs=g, max_ctx=2048)
            shipped.load_into(eng, "tiny")
            w = eng.warmup(capacity=1024 + 64 + 9)
            cells = [summary(eng.generate(prompt, 64).steps) for _ in range(2)]
            rec = {"attn": attn, "graphs": g, "warmup": w, "cells": cells,
                   "compiled": bool(eng.runner.fused and eng.runner.fused.compiled), "compile_error": eng.compile_error}
            if g:
                rec["profile"] = profile_steps(eng, eng.runner.static, 1024, 10)
            out["tiny"].append(rec)
            save()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ctxs", default="32k,128k")
    ap.add_argument("--paths", default="split,paged")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--out", default="bench_engine.json")
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: kernel,equality,k2,tiny")
    ap.add_argument("--fuse", choices=("both", "on"), default="both", help="split: compiled and plain, or compiled only")
    ap.add_argument("--tree", choices=("both", "device", "host"), default="both",
                    help="k2 cells with the tree on the device, on the host, or both")
    ap.add_argument("--mlp", choices=("moe", "dense"), default="moe",
                    help="k2 cells: the preset's MoE layers, or the dense SwiGLU in every layer")
    ap.add_argument("--anatomy", action="store_true", help="only the step anatomy of k2 with its MoE (split)")
    ap.add_argument("--moe-kernel", choices=("auto", "fused", "grouped", "batched"), default="auto",
                    help="--anatomy: the routed experts' path (engine/moe.py); auto: what Experts chose (fused on "
                         "CUDA where the Triton kernels work, else grouped where torch._grouped_mm runs, else batched)")
    a = ap.parse_args()
    try:
        [parse_tokens(c) for c in a.ctxs.split(",")]
    except UnitError as e:
        ap.error(str(e))
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU")
    out = {"meta": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
                    "command": " ".join(sys.argv)}, "equality": {}, "k2": [], "tiny": [], "kernel": []}
    try:
        import triton
        out["meta"]["triton"] = triton.__version__
    except ImportError:
        pass

    def save():
        Path(a.out).write_text(json.dumps(out, indent=1, default=str))

    skip = set(a.skip.split(","))
    if a.anatomy:
        with torch.no_grad():
            run_anatomy(a, out, save)
        print(json.dumps({k: out[k] for k in ("moe", "compiled", "weights", "check", "anatomy")}, indent=1,
                         default=str))
        return 0
    with torch.no_grad():
        if "kernel" not in skip:
            run_kernel(a, out, save)
        if "k2" not in skip:
            run_k2(a, out, save)
        if "equality" not in skip:
            equality(out["equality"])
            save()
        if "tiny" not in skip:
            run_tiny(out, save)
    print(json.dumps(out["equality"]))
    print(f"{'model':5} {'path':6} {'ctx':>7} {'graphs':>6} {'cell1 ms':>9} {'cell2 ms':>9} {'draft':>6} {'tree':>6} "
          f"{'verify':>7} {'commit':>7} {'host':>6} {'warmup s':>8}")
    for r in out["tiny"]:
        c1, c2 = r["cells"]
        print(f"{'tiny':5} {r['attn']:6} {'1k':>7} {str(r['graphs']):>6} {c1['step_ms']:9.2f} {c2['step_ms']:9.2f} "
              f"{c2['draft_ms']:6.2f} {c2['tree_ms']:6.2f} {c2['verify_ms']:7.2f} {c2['commit_ms']:7.2f} "
              f"{(c2['host_ms'] or 0):6.2f} {r['warmup']['warmup_s']:8.1f}")
    for r in out["tiny"]:
        if "profile" in r:
            p, c = r["profile"], r["profile"]["by_class_ms"]
            print(f"   profile tiny {r['attn']}: kernels {p['kernel_ms_per_step']:.2f} ms/step ({p['kernels_per_step']:.0f}): "
                  f"attn {c['attention']:.2f} gemm {c['gemm']:.2f} copy {c['copy']:.2f} other {c['other']:.2f}; "
                  f"event step {p['event_step_ms']:.2f}")
    for r in out["k2"]:
        for key, tag in (("cells", ""), ("cells_host_tree", "-ht")):
            for ctx, (c1, c2) in r.get(key, {}).items():
                print(f"{'k2':5} {r['attn'] + ('' if r['fuse'] else '-nf') + tag:9} {ctx:>7} {'True':>6} {c1['step_ms']:9.2f} "
                      f"{c2['step_ms']:9.2f} {c2['draft_ms']:6.2f} {c2['tree_ms']:6.2f} {c2['verify_ms']:7.2f} "
                      f"{c2['commit_ms']:7.2f} {c2['host_ms']:6.2f} {r['warmup'][ctx]['warmup_s']:8.1f} d2h {c2['d2h']}")
        if "logits_vs_plain" in r:
            print(f"   {r['attn']}: graph (compiled) vs plain static step logits: {r['logits_vs_plain']}")
        for ctx, e in r.get("eager", {}).items():
            print(f"{'k2':5} {r['attn']:6} {ctx:>7} {'False':>6} {e['step_ms']:9.2f} {'':>9} {e['draft_ms']:6.2f} "
                  f"{e['tree_ms']:6.2f} {e['verify_ms']:7.2f} {e['commit_ms']:7.2f}")
        for p in r.get("profile", []):
            c = p["by_class_ms"]
            print(f"   profile {r['attn']} {p['ctx']}: kernels {p['kernel_ms_per_step']:.2f} ms/step ({p['kernels_per_step']:.0f}): "
                  f"attn {c['attention']:.2f} gemm {c['gemm']:.2f} copy {c['copy']:.2f} other {c['other']:.2f}; "
                  f"wall {p['wall_ms_per_step']:.2f} (x{p['wall_over_kernels']:.2f}); device_tree {p['device_tree']} "
                  f"d2h copies/step {p['d2h_per_step']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
