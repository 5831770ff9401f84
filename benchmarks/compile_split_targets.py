"""Compile `split`'s two launches (the prefix kernel with its tree part, and the merge) for GPU targets on a machine
without a GPU, with the configuration its plan chooses for each GPU (split.ARCHS), and print what each compiled
kernel holds (docs/kernels.md, "split on other GPUs"). Needs Triton with its NVIDIA backend.

    PYTHONPATH=$PWD python benchmarks/compile_split_targets.py [--caps 8.0,8.9,9.0,12.0] [--heads 8,64] [--rows 9]
"""
from __future__ import annotations

import argparse

from ddprobe.engine.kernels import _target_compile, split

KEYS = ("regs", "stack", "stl", "ldl", "shared", "num_warps", "num_stages")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--caps", default="8.0,8.9,9.0,12.0", help="compute capabilities, comma-separated")
    ap.add_argument("--heads", default="8,64")
    ap.add_argument("--rows", type=int, default=9, help="tree rows R (budget + 1)")
    a = ap.parse_args()
    print("target  heads  kernel  rows/tokens  " + "  ".join(KEYS) + "  block limit  sm_90-only")
    for cap in (tuple(int(x) for x in c.split(".")) for c in a.caps.split(",")):
        arch = split.arch_for(cap)
        for heads in (int(h) for h in a.heads.split(",")):
            for part, (fn, args, kw) in _target_compile.split_launches(cap, heads, a.rows).items():
                k = _target_compile.compile_launch(fn, cap, args, kw)
                rep = _target_compile.code_report(k)
                tiles = f"{kw.get('BLOCK_Q', kw.get('BLOCK_M'))}/{kw.get('BLOCK_N', kw.get('BLOCK_V'))}"
                print(f"{arch.name}  {heads}  {part:6s}  {tiles}  " + "  ".join(str(rep[k]) for k in KEYS)
                      + f"  {arch.smem}  {','.join(_target_compile.hopper_only(k)) or '-'}", flush=True)


if __name__ == "__main__":
    main()
