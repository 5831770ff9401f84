"""Compile `paged`'s tree-verify launch and SGLang's own for GPU targets on a machine without a GPU, and print what
each compiled kernel holds (docs/kernels.md, "Compiled against SGLang's kernel"). Needs an installed sglang (the
pinned 0.5.14: pip install --no-deps sglang==0.5.14) and Triton with its NVIDIA backend.

    PYTHONPATH=$PWD python benchmarks/compile_paged_vs_sglang.py [--caps 8.0,9.0,10.0,12.0] [--heads 8] [--rows 9]
"""
from __future__ import annotations

import argparse

import torch

from ddprobe.engine.kernels import _target_compile
from ddprobe.engine.kernels.trees import shape_mask

KEYS = ("ld_global", "ldg", "regs", "stack", "stl", "ldl", "shared", "num_warps", "num_stages")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--caps", default="8.0,9.0,10.0,12.0", help="compute capabilities, comma-separated")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--rows", type=int, default=9, help="tree rows R (budget + 1)")
    a = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    ctx = 1000
    q = torch.randn(a.rows, a.heads, 576, generator=g).bfloat16()
    kv = torch.randn(ctx + a.rows + 1, 576, generator=g).bfloat16()
    slots = 1 + torch.randperm(ctx + a.rows, generator=g)
    print("target  kernel  " + "  ".join(KEYS) + "  BLOCK_M/N  same PTX as sglang")
    for cap in (tuple(int(x) for x in c.split(".")) for c in a.caps.split(",")):
        launches = _target_compile.extend_launches(cap, q, kv, ctx, shape_mask("lopsided", a.rows - 1), slots, 512,
                                                   0.1)
        bodies = {}
        for name, (fn, args, kw) in launches.items():
            k = _target_compile.compile_launch(fn, cap, args, kw)
            rep, bodies[name] = _target_compile.code_report(k), _target_compile.ptx_body(k)
            print(f"sm_{cap[0]}{cap[1]}  {name:7s} " + "  ".join(str(rep[k]) for k in KEYS)
                  + f"  {kw['BLOCK_M']}/{kw['BLOCK_N']}  {bodies[name] == bodies['sglang']}")


if __name__ == "__main__":
    main()
