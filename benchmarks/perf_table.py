"""Render bench_verify.json as the markdown tables in docs/perf.md.

    python benchmarks/perf_table.py benchmarks/results/bench_verify_h200_2026-11-29.json
"""
from __future__ import annotations

import json
import sys


def fmt_ctx(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def main(path: str) -> None:
    d = json.load(open(path))
    c = d["ceilings"]
    print(f"Ceilings measured in the same run: copy {c['copy_GBps']:.0f} GB/s (read + write), bf16 matmul {c['bf16_mm_TFLOPs']:.0f} TFLOP/s.\n")
    for heads in sorted({r["heads"] for r in d["results"] if "heads" in r and r.get("kind") != "step61"}):
        print(f"#### {heads} heads ({heads * 9} folded query rows)\n")
        print("| ctx | path | us/layer | GB/s | TFLOP/s | floor us | gap | % copy BW | % mm rate | rel err |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in d["results"]:
            if r.get("kind") == "step61" or r["heads"] != heads:
                continue
            if "us" not in r:
                print(f"| {fmt_ctx(r['ctx'])} | {r['path']} | failed: {r.get('error', '')[:60]} | | | | | | | |")
                continue
            print(f"| {fmt_ctx(r['ctx'])} | {r['path']} | {r['us']:.1f} | {r['GBps']:.0f} | {r['TFLOPs']:.1f} | {r['floor_us']:.1f} | {r['gap']:.2f} | "
                  f"{100 * r['bw_frac']:.0f}% | {100 * r['mm_frac']:.0f}% | {r['rel_err']:.1e} |")
        print()
    steps = [r for r in d["results"] if r.get("kind") == "step61"]
    if steps:
        print("#### 61-layer k2 verify step, 8 heads, attention only, CUDA-graph replay\n")
        print("| ctx | path | step ms | floor ms | gap | GB/s |")
        print("|---|---|---:|---:|---:|---:|")
        for r in steps:
            print(f"| {fmt_ctx(r['ctx'])} | {r['path']} | {r['step_ms']:.2f} | {r['floor_ms']:.2f} | {r['gap']:.2f} | {r['GBps']:.0f} |")


if __name__ == "__main__":
    main(sys.argv[1])
