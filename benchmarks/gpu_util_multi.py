"""gpu-util on a machine with several GPUs: every GPU sampled while a load runs on some of them, and the
sampler's own cost. Run on a GPU machine (two H200s for the recorded files):

    PYTHONPATH=. python3 benchmarks/gpu_util_multi.py --out DIR

Writes DIR/gpu-util-<n>gpu-one-busy.json (bf16 matmul loop on GPU 0, the others idle) and, with two GPUs or
more, DIR/gpu-util-<n>gpu-both-busy.json (matmul on GPU 0 and a streaming read on GPU 1 at the same time), each a
``gpu-util`` results file that ``ddprobe gpu-util --replay`` re-analyses, and DIR/sampler-overhead.json:
the cost of one sampler tick over every GPU, and the median decode step of the tiny engine on GPU 0 with
the sampler running (period 0.2 s) and without, alternating runs.
"""
from __future__ import annotations

import argparse
import statistics
import threading
import time
from pathlib import Path

import torch

from ddprobe import signals
from ddprobe.gpu_verdict import analyze
from ddprobe.probes.sampler import Sampler
from ddprobe.results import Result, RunMeta

LOAD_S, IDLE_S, PERIOD_S = 3.0, 0.8, 0.2


def matmul_load(dev: str, stop: threading.Event) -> None:
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    while not stop.is_set():
        for _ in range(8):
            a @ b
        torch.cuda.synchronize(dev)


def stream_load(dev: str, stop: threading.Event) -> None:
    x = torch.ones(1 << 30, device=dev, dtype=torch.bfloat16)  # 2 GiB read per sum, far beyond L2
    while not stop.is_set():
        for _ in range(8):
            x.sum()
        torch.cuda.synchronize(dev)


def timeline(loads: dict[str, callable], label: str, out: Path) -> dict:
    """idle, then the loads together (phase "request"), then idle; every GPU sampled throughout."""
    s = Sampler(PERIOD_S).start()
    assert s.available, s.sources
    time.sleep(IDLE_S)
    stop = threading.Event()
    threads = [threading.Thread(target=fn, args=(dev, stop)) for dev, fn in loads.items()]
    s.mark("request")
    for t in threads:
        t.start()
    time.sleep(LOAD_S)
    stop.set()
    for t in threads:
        t.join()
    s.mark("idle")
    time.sleep(IDLE_S)
    rows = s.stop()
    res = Result(kind="gpu-util", meta=RunMeta.collect(command=f"benchmarks/gpu_util_multi.py ({label})"),
                 config={"load": {dev: fn.__name__ for dev, fn in loads.items()}, "period_s": PERIOD_S,
                         "load_s": LOAD_S, "sources": dict(s.sources), "sampled_gpus": s.gpus,
                         "gpm": any(v.startswith("ok") for k, v in s.sources.items() if k in signals.PROFILING)},
                 rows=rows)
    res.summary = {**analyze(rows, {}, s.sources), "request": {},
                   "markers": [[round(t, 4), p] for t, p in s.markers]}
    res.save(out / f"gpu-util-{label}.json")
    return res.summary


def tick_cost(n: int = 50) -> float:
    s = Sampler(60).start()  # the thread waits 60 s: time the ticks by hand
    t0 = time.perf_counter()
    for _ in range(n):
        s._tick()
    dt = (time.perf_counter() - t0) / n
    s.stop()
    return dt


def step_overhead(runs: int = 3) -> dict:
    from ddprobe.probes.commit import prompt_ids
    from ddprobe.probes.engine_backend import EngineBackend

    be = EngineBackend(preset="tiny", device="cuda:0")
    ids = prompt_ids(be, "novel", 512)
    be.generate(ids, 16)  # compile outside the measured runs
    with_s, without = [], []
    for i in range(2 * runs):
        sampled = i % 2 == 0
        s = Sampler(PERIOD_S).start() if sampled else None
        st = be.generate(ids, 64)
        if s:
            s.stop()
        (with_s if sampled else without).append(statistics.median(st.step_times_s) * 1e3)
    w, wo = statistics.median(with_s), statistics.median(without)
    return {"step_ms_with_sampler": w, "step_ms_without": wo, "runs_each": runs, "overhead_pct": 100 * (w - wo) / wo,
            "per_run_with": with_s, "per_run_without": without}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    out = Path(ap.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    n = torch.cuda.device_count()
    print(f"{n} GPU(s): {[torch.cuda.get_device_name(i) for i in range(n)]}", flush=True)
    plans = [("one-busy", {"cuda:0": matmul_load})]
    if n >= 2:
        plans.append(("both-busy", {"cuda:0": matmul_load, "cuda:1": stream_load}))
    for label, loads in plans:
        summ = timeline(loads, f"{n}gpu-{label}", out)
        for d in summ["per_phase"]:
            print(label, d["gpu"], d["phase"], d["samples"], d["verdict"], "|", d["evidence"], flush=True)
    tick = tick_cost()
    over = step_overhead()
    over.update(tick_ms=tick * 1e3, period_s=PERIOD_S, gpus=n,
                tick_share_of_period_pct=100 * tick / PERIOD_S)
    Result(kind="sampler-overhead", meta=RunMeta.collect(command="benchmarks/gpu_util_multi.py"),
           rows=[over]).save(out / "sampler-overhead.json")
    print("sampler:", {k: v for k, v in over.items() if not k.startswith("per_run")}, flush=True)


if __name__ == "__main__":
    main()
