"""Where does an engine decode step go on the GPU? Host work vs kernel time, per attention path.

For each path: a `k2` engine (random weights, bf16) with a prompt of --ctx tokens, then
  1. `generate` of --tokens tokens: medians of the step records (draft, tree, verify, commit ms);
  2. the verify forward alone (9 rows, lopsided tree) --iters times: host time until the call
     returns (launch work) and wall time after a synchronize;
  3. torch.profiler over a few forwards: GPU kernel time per step, grouped by kernel name;
  4. cProfile of a few forwards: the Python functions with the most own time.

    PYTHONPATH=$PWD python benchmarks/profile_engine_step.py --ctx 8k --paths paged,split --out $OUT/profile.json

Prints a short table last; the JSON holds everything (the cProfile text too). Parts 2-4 profile the eager
forward (host plans, no graphs): what the engine did before CUDA graphs. `generate` in part 1 uses graphs
unless --no-graphs. Decode steps replayed as CUDA graphs, their host time and kernel mix:
benchmarks/bench_engine.py.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ddprobe.engine.config import ModelConfig  # noqa: E402
from ddprobe.engine.generate import Engine  # noqa: E402
from ddprobe.engine.kernels.trees import shape_mask  # noqa: E402
from ddprobe.units import UnitError, parse_tokens  # noqa: E402


def forward_once(eng: Engine, kv, rows: int, mask) -> None:
    ctx = kv.committed
    tokens = torch.randint(0, eng.config.target.vocab_size, (rows,), device=eng.device)
    pos = torch.arange(ctx, ctx + rows, device=eng.device)
    eng.runner.forward(eng.target, kv, tokens, pos, mask, eng.path)
    kv.commit([0])


def profile_path(attn: str, ctx: int, tokens: int, iters: int, heads: int, graphs: bool = True) -> dict:
    cfg = ModelConfig.from_name("k2", heads=heads).with_overrides(max_ctx=ctx + tokens + iters + 64)
    eng = Engine(cfg, attn=attn, device="cuda", dtype=torch.bfloat16, seed=0, graphs=graphs)
    prompt = torch.randint(0, cfg.target.vocab_size, (ctx,), generator=torch.Generator().manual_seed(0)).tolist()
    t0 = time.perf_counter()
    res = eng.generate(prompt, tokens)  # compiles the kernels too
    gen_s = time.perf_counter() - t0
    steps = res.steps[2:] or res.steps
    med = {k: statistics.median(getattr(s, k) for s in steps) for k in ("draft_ms", "tree_ms", "verify_ms", "commit_ms")}

    rows = eng.budget + 1
    mask = shape_mask("lopsided", eng.budget, eng.device)
    kv = eng.new_cache(ctx + iters + 64)
    eng.prefill(kv, prompt)
    with torch.no_grad():
        for _ in range(3):
            forward_once(eng, kv, rows, mask)
        torch.cuda.synchronize()
        host, wall = [], []
        for _ in range(iters):
            t0 = time.perf_counter()
            forward_once(eng, kv, rows, mask)
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            host.append((t1 - t0) * 1e3)
            wall.append((t2 - t0) * 1e3)
        n_prof = 3
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(n_prof):
                forward_once(eng, kv, rows, mask)
            torch.cuda.synchronize()
        kernels: dict[str, float] = {}
        launches = 0
        for ev in prof.events():
            if ev.device_type.name == "CUDA":
                kernels[ev.name] = kernels.get(ev.name, 0.0) + ev.device_time / 1e3 / n_prof  # ms per step
                launches += 1
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(n_prof):
            forward_once(eng, kv, rows, mask)
        torch.cuda.synchronize()
        pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30)
    top = sorted(kernels.items(), key=lambda kv_: -kv_[1])[:15]
    return {"attn": attn, "ctx": ctx, "heads": heads, "generate_s": gen_s, "commit_len": res.mean_commit_len, "step_median_ms": med,
            "forward_host_ms": statistics.median(host), "forward_wall_ms": statistics.median(wall),
            "gpu_kernel_ms_per_step": sum(kernels.values()), "launches_per_step": launches / n_prof,
            "top_kernels_ms": top, "cprofile": s.getvalue()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ctx", default="8k")
    ap.add_argument("--paths", default="paged,split")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--out", default="profile_engine_step.json")
    ap.add_argument("--graphs", action=argparse.BooleanOptionalAction, default=True,
                    help="generate with CUDA graphs (part 1); the forward profile is always eager")
    a = ap.parse_args()
    try:
        ctx = parse_tokens(a.ctx)
    except UnitError as e:
        ap.error(str(e))  # one usage line, exit 2
    out = {"meta": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                    "date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv)}, "results": []}
    for attn in a.paths.split(","):
        r = profile_path(attn, ctx, a.tokens, a.iters, a.heads, a.graphs)
        out["results"].append(r)
        Path(a.out).write_text(json.dumps(out, indent=1))
        print(r["cprofile"][:4000])
    print(f"{'path':8} {'verify med ms':>13} {'draft':>7} {'tree':>7} {'commit':>7} {'fwd host':>9} {'fwd wall':>9} "
          f"{'gpu ms':>7} {'launches':>8}")
    for r in out["results"]:
        m = r["step_median_ms"]
        print(f"{r['attn']:8} {m['verify_ms']:13.2f} {m['draft_ms']:7.2f} {m['tree_ms']:7.2f} {m['commit_ms']:7.2f} "
              f"{r['forward_host_ms']:9.2f} {r['forward_wall_ms']:9.2f} {r['gpu_kernel_ms_per_step']:7.2f} "
              f"{r['launches_per_step']:8.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
