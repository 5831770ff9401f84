"""Write the synthetic fixtures beside this file: bench-verify and gpu-util results shaped like the H200's.

    python tests/data/make_synthetic.py

The numbers follow docs/device-facts (H200: copy ceiling about 4.24 TB/s, bf16 matmul about 790 TFLOP/s,
paged verify about 25 GB/s at every context, decode power about 20% of the limit). They are NOT measurements:
the file names say "synthetic"; real H200 files sit beside them when recorded.
"""
import json
import math
from pathlib import Path

HERE = Path(__file__).resolve().parent
COPY_GBPS, MM_TFLOPS = 4240.0, 790.0
META = {"date_utc": "2026-11-29T10:00:00+00:00", "host": "synthetic", "ddprobe_version": "0.1.0", "git_sha": None,
        "python": "3.12.3", "torch": "2.11.0+cu130", "triton": "3.6.0", "platform": "Linux-x86_64 (synthetic)",
        "gpus": [{"index": 0, "name": "NVIDIA H200", "driver": "580.159.04"}]}


def doc(kind, meta, config, rows, summary):
    return {"kind": kind, "meta": meta, "config": config, "rows": rows, "summary": summary,
            "schema": "ddprobe.result/1"}


def bench():
    rows = []
    for heads in (8, 64):
        for ctx in [k * 1024 for k in (1, 4, 16, 32, 64, 128, 256)]:
            n, R = ctx + 9, 9
            nbytes = n * 576 * 2 + R * heads * 576 * 2 + R * heads * 512 * 2
            flops = 2 * R * heads * n * (576 + 512)
            floor = max(nbytes / (COPY_GBPS * 1e9), flops / (MM_TFLOPS * 1e12))
            times = {
                "paged": nbytes / 25e9 * (1.0 if heads == 8 else 1.1) + 12e-6,
                "split": (floor * 1.25 + 9e-6) if heads == 8 else flops / (0.72 * MM_TFLOPS * 1e12) + 11e-6,
                "flex": (floor * 1.9 + 20e-6) if heads == 8 else flops / (400e12) + 25e-6,
                "sdpa": (floor * 3.1 + 30e-6) if heads == 8 else flops / (300e12) + 40e-6,
            }
            for path, t in times.items():
                rows.append({"path": path, "ctx": ctx, "heads": heads, "rows": R, "time_us": t * 1e6, "bytes": nbytes,
                             "flops": flops, "GBps": nbytes / t / 1e9, "TFLOPs": flops / t / 1e12,
                             "floor_us": floor * 1e6, "gap": t / floor,
                             "rel_err": 3.1e-3 if path != "sdpa" else 2.2e-3})
    ctx, heads = 128 * 1024, 8
    for path in ("paged", "split"):
        layer = next(r for r in rows if r["path"] == path and r["ctx"] == ctx and r["heads"] == heads)
        rows.append({"path": path, "ctx": ctx, "heads": heads, "rows": 9, "layers": 61, "kind": "step",
                     "time_us": 61 * layer["time_us"], "floor_us": 61 * layer["floor_us"],
                     "bytes": 61 * layer["bytes"], "GBps": layer["GBps"], "gap": layer["gap"]})
    meta = dict(META, command="python benchmarks/bench_verify.py --out bench-verify.json (synthetic fixture)")
    config = {"budget": 8, "tree": "lopsided", "copy_GBps": COPY_GBPS, "matmul_TFLOPs": MM_TFLOPS}
    summary = {"copy_GBps": COPY_GBPS, "matmul_TFLOPs": MM_TFLOPS}
    return doc("bench-verify", meta, config, rows, summary)


def gpu_util():
    rows = []
    profile = {  # phase: (power_W, sm_clock, util_gpu, util_mem, gpm_sm, gpm_tensor, gpm_dram)
        "idle": (124, 1980, 0, 0, 0, 0, 0),
        "prefill": (610, 1755, 100, 38, 93, 61, 31),
        "decode": (142, 1980, 100, 1, 5.3, 0.8, 0.5),
    }
    for gpu in (0, 1):
        for i in range(81):
            t = i * 0.25
            phase = "idle" if t < 2 or t >= 18 else ("prefill" if t < 8 else "decode")
            p, clk, ug, um, sm, tn, dr = profile[phase]
            wob = 1 + 0.04 * math.sin(i * 0.7 + gpu)
            rows.append({"t_s": t, "gpu": gpu, "phase": phase, "power_W": round(p * wob, 1), "power_limit_W": 700,
                         "sm_clock_MHz": clk, "util_gpu_pct": ug, "util_mem_pct": um,
                         "sm_active_pct": round(sm * wob, 2), "tensor_active_pct": round(tn * wob, 2),
                         "dram_active_pct": round(dr * wob, 2)})
    per_phase = []
    for gpu in (0, 1):
        per_phase.append({"gpu": gpu, "phase": "prefill", "verdict": "compute-bound",
                          "evidence": "tensor pipes 61%, DRAM 31%, power 87% of the limit"})
        per_phase.append({"gpu": gpu, "phase": "decode", "verdict": "latency-bound (busy but idle)",
                          "evidence": "nvidia-smi 100% busy, yet SM 5.3%, tensor 0.8%, DRAM 0.5%, "
                                      "power 20% of the limit"})
    meta = dict(META, command="ddprobe gpu-util --url http://127.0.0.1:30000 (synthetic fixture)",
                gpus=[{"index": i, "name": "NVIDIA H200", "driver": "580.159.04"} for i in (0, 1)])
    return doc("gpu-util", meta, {"interval_s": 0.25, "gpm": True}, rows, {"per_phase": per_phase})


if __name__ == "__main__":
    for name, d in (("bench-verify-synthetic.json", bench()), ("gpu-util-synthetic.json", gpu_util())):
        (HERE / name).write_text(json.dumps(d, indent=1) + "\n")
        print("wrote", HERE / name)
