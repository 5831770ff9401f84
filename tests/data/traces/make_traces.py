"""Record the engine's verify step with torch.profiler (CPU and CUDA activities), through each attention path, CUDA
graphs on and off, and keep a small cut of each trace (its GPU kernels, memcpys, runtime launches and step markers;
the CPU operators dropped) for tests/data/traces/. How the shipped cuts were made: tests/data/traces/README.md.

On the GPU (one device call, from the repository root, sglang 0.5.14 installed for the ``sglang`` path):
    python tests/data/traces/make_traces.py --out $OUT/traces --ctx 64k --paths sglang,split_ws,paged
On the CPU (a check of this script only: tiny preset, fp32, the reference path):
    python tests/data/traces/make_traces.py --out /tmp/tr --preset tiny --device cpu --ctx 512 --paths reference

Per path and mode: the steps timed without the profiler first (CUDA events, the engine's own step records: what
``gpu-util`` reports), then ``--steps`` steps under the profiler. Writes ``<path>-<graphs|eager>-<ctx>.trace.json.gz``
and ``notes.json`` (the step times, the trace sizes, what was skipped and why) into --out.
"""
from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
KEEP = ("kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver", "user_annotation",
        "gpu_user_annotation")


def bench_engine():
    spec = importlib.util.spec_from_file_location("bench_engine", ROOT / "benchmarks" / "bench_engine.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def cut(src: Path, dst: Path) -> dict:
    """The trace at ``src`` without its CPU operators and Python events, gzipped to ``dst``."""
    doc = json.loads(src.read_text())
    ev = doc.get("traceEvents", [])
    doc["traceEvents"] = [e for e in ev if e.get("cat") in KEEP or e.get("ph") == "M"]
    with gzip.open(dst, "wt", compresslevel=9) as f:
        json.dump(doc, f, separators=(",", ":"))
    kernels = sum(1 for e in doc["traceEvents"] if e.get("cat") == "kernel")
    return {"events_full": len(ev), "events_kept": len(doc["traceEvents"]), "kernels": kernels,
            "bytes_full": src.stat().st_size, "bytes_cut": dst.stat().st_size}


def record(be, eng, st, ctx: int, steps: int, eager: bool, tmp: Path) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    be.synthetic(st, ctx)
    be.run_steps(eng, st, 3, eager=eager)  # settle (first replay, allocator)
    be.synthetic(st, ctx)
    sync()
    recs = be.run_steps(eng, st, steps + 1, eager=eager)
    step_ms = [r.step_ms for r in recs]
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    be.synthetic(st, ctx)
    sync()
    with profile(activities=acts) as prof:
        be.run_steps(eng, st, steps + 1, eager=eager)
        sync()
    prof.export_chrome_trace(str(tmp))
    return {"step_ms": step_ms, "step_ms_median": statistics.median(step_ms)}


def engine(a):
    import torch

    from ddprobe.physics.presets import ModelConfig
    from ddprobe.engine.generate import Engine

    cfg = ModelConfig.from_name(a.preset, **({"heads": a.heads} if a.heads else {}))
    cfg = cfg.with_overrides(max_ctx=a.ctx + (a.steps + 8) * 9 + 64)
    dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
    return Engine(cfg, attn=a.paths.split(",")[0], device=a.device, dtype=dtype, seed=0, graphs=True)


def main() -> int:
    from ddprobe.units import parse_tokens

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--preset", default="k2")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--device", default="cuda")
    p.add_argument("--ctx", default="64k")
    p.add_argument("--paths", default="sglang,split_ws,paged")
    p.add_argument("--modes", default="graphs,eager")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--budget-s", type=float, default=150.0, help="skip what would start after this many seconds")
    a = p.parse_args()
    a.ctx = parse_tokens(a.ctx)
    a.heads = a.heads if a.preset != "tiny" else None
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    be = bench_engine()
    notes: dict = {"preset": a.preset, "heads": a.heads, "ctx": a.ctx, "steps": a.steps, "device": a.device,
                   "runs": [], "skipped": []}
    base = engine(a)
    notes["init_s"] = time.perf_counter() - t0
    for attn in a.paths.split(","):
        if time.perf_counter() - t0 > a.budget_s:
            notes["skipped"].append(f"{attn}: past --budget-s {a.budget_s:g}")
            continue
        try:
            eng = base if attn == base.attn else be.with_path(base, attn)
            w = eng.warmup(capacity=a.ctx + (a.steps + 8) * 9 + 64)
            st = eng.runner.static
        except Exception as e:  # a path that does not run here: said, the others go on
            notes["skipped"].append(f"{attn}: {type(e).__name__}: {e}"[:300])
            continue
        for mode in a.modes.split(","):
            if time.perf_counter() - t0 > a.budget_s:
                notes["skipped"].append(f"{attn} {mode}: past --budget-s {a.budget_s:g}")
                continue
            name = f"{attn}-{mode}-{a.ctx // 1024}k.trace.json"
            tmp = out / ("full-" + name)
            rec = record(be, eng, st, a.ctx, a.steps, mode == "eager", tmp)
            rec.update(attn=attn, mode=mode, file=name + ".gz", warmup=w, graphs_device_tree=bool(st.device_ok))
            rec.update(cut(tmp, out / (name + ".gz")))
            tmp.unlink()
            notes["runs"].append(rec)
            print(json.dumps({k: v for k, v in rec.items() if k != "warmup"}), flush=True)
            (out / "notes.json").write_text(json.dumps(notes, indent=1) + "\n")  # kept if a later run is cut off
        eng.release()
    notes["total_s"] = time.perf_counter() - t0
    (out / "notes.json").write_text(json.dumps(notes, indent=1) + "\n")
    return 0 if notes["runs"] else 1


if __name__ == "__main__":
    sys.exit(main())
