"""Compile split_ws's Gluon prefix kernel for sm_90a on a machine without a GPU (no driver needed).

    pip install --no-deps --target /tmp/t36 triton==3.6.0     # the device's Triton, beside the local one
    TRITON36=/tmp/t36 python benchmarks/compile_ws_sm90.py --pipe 0 --fold 1 --out /tmp/ws
    TRITON36=/tmp/t36 python benchmarks/compile_ws_sm90.py --seesaw 1 --fold 0 --out /tmp/ws_seesaw
    TRITON36=/tmp/t36 python benchmarks/compile_ws_sm90.py --tail 8 --fold 0 --out /tmp/ws_tail   # 8 heads x 9 rows

Prints the shared memory, the wgmma count, the named barriers and setmaxnreg budgets of the PTX, and ptxas's
registers, stack and spills; writes the PTX, TTGIR and cubin (for cuobjdump -sass) to --out. A bad option is
argparse's one-line usage error; a Triton that is not 3.6 or a missing ptxas is one line and exit 1.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

import sm90_offline  # benchmarks/sm90_offline.py: Triton 3.6 and a driver stub


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pipe", type=int, choices=(0, 1, 2, 3), default=3, help="WsTuning.pipe (3: the default kernel)")
    ap.add_argument("--fold", type=int, choices=(0, 1), default=1)
    ap.add_argument("--balance", type=int, choices=(0, 1), default=0, help="WsTuning.balance: the balanced grid")
    ap.add_argument("--ffma", type=int, choices=(0, 1), default=1, help="WsTuning.ffma (1: the default)")
    ap.add_argument("--seesaw", type=int, choices=(0, 1, 2, 3, 4), default=0,
                    help="WsTuning.seesaw: 1-4 compile the seesaw kernel (--pipe is then unused)")
    ap.add_argument("--trigger", type=int, choices=(0, 1), default=0, help="1: griddepcontrol.launch_dependents at the start (WsTuning.pdl=2)")
    ap.add_argument("--tail", type=int, default=0, help="compile the one-program kernel of 64 + TAIL rows (_ws_tail; 8)")
    ap.add_argument("--pv-regs", type=int, default=232, help="registers of warpgroup 1 (setmaxnreg)")
    ap.add_argument("--load-regs", type=int, default=40, help="registers of the loader warp (setmaxnreg)")
    ap.add_argument("--out", default="/tmp/ws_sm90")
    args = ap.parse_args()
    triton = sm90_offline.triton36("compile_ws_sm90")
    if triton is None:
        return 1
    import torch
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from ddprobe.engine.kernels import _ws_gluon

    hq, v, pe, rows = 72, 512, 64, 4096
    q2 = torch.zeros(hq, v + pe, dtype=torch.bfloat16)
    kv = torch.zeros(rows, v + pe, dtype=torch.bfloat16)

    def desc(t, shape, block):
        return TensorDescriptor(t, shape, [t.stride(0), 1], block, gl.NVMMASharedLayout.get_default_for(block, gl.bfloat16))
    kv_w = (64 if args.seesaw >= 3 else v // 2) if args.seesaw else v  # as split_ws._descs
    args_ = (desc(q2, [hq, v], [64, v]), desc(q2[:, v:], [hq, pe], [64, pe]),
             desc(kv, [rows, v], [64, kv_w]), desc(kv[:, v:], [rows, pe], [64, pe]),
             torch.zeros(9, dtype=torch.int64), torch.zeros(3, hq, v), torch.zeros(3, hq), hq * v, v, 4000, 9, 2048,
             hq, 8, 0.1, 64, 132, 16)  # ... qk_scale, then tiles, programs, slots (ws_prefix_kernel's balanced grid)
    if args.tail:
        from ddprobe.engine.kernels import _ws_tail
        tl_ = args.tail
        targs = args_[:2] + (desc(q2, [hq, v], [tl_, v]), desc(q2[:, v:], [hq, pe], [tl_, pe])) + args_[2:-3]
        k = _ws_tail.ws_tail_kernel.warmup(*targs, grid=(1, 3), BLOCK_M=64, BLOCK_N=64, V_DIM=v, PE_DIM=pe,
                                           TAIL=tl_, PV_REGS=args.pv_regs, LOAD_REGS=args.load_regs, FOLD=args.fold,
                                           num_warps=4)
    elif args.seesaw:
        k = _ws_gluon.ws_seesaw_kernel.warmup(*args_[:-3], grid=(2, 3), BLOCK_M=64, BLOCK_N=64, V_DIM=v, PE_DIM=pe,
                                              PV_REGS=args.pv_regs, LOAD_REGS=args.load_regs, FOLD=args.fold,
                                              SEESAW=args.seesaw, num_warps=4)
    else:
        k = _ws_gluon.ws_prefix_kernel.warmup(*args_, grid=(2, 3), BLOCK_M=64, BLOCK_N=64, V_DIM=v, PE_DIM=pe,
                                              STAGES=2, PV_REGS=args.pv_regs, LOAD_REGS=args.load_regs, PIPE=args.pipe,
                                              FOLD=args.fold, TRIGGER=bool(args.trigger),
                                              BALANCE=bool(args.balance), FFMA=bool(args.ffma), num_warps=4)
    os.makedirs(args.out, exist_ok=True)
    ptx = k.asm["ptx"]
    for name, data in (("ws.ptx", ptx), ("ws.ttgir", k.asm["ttgir"])):
        with open(os.path.join(args.out, name), "w") as f:
            f.write(data)
    with open(os.path.join(args.out, "ws.cubin"), "wb") as f:
        f.write(k.asm["cubin"])
    bars = sorted(set(re.findall(r"bar\.sync\s+([^;]+);", ptx)))
    regs = sorted(set(re.findall(r"setmaxnreg[.\w]+\s+(\d+)", ptx)), key=int)
    print(f"shared {k.metadata.shared} B, {k.metadata.num_warps} warps, wgmma {ptx.count('wgmma.mma_async')}, "
          f"named barriers {bars}, setmaxnreg {regs}")
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    if not os.path.exists(ptxas):
        print(f"compile_ws_sm90: no ptxas at {ptxas}", file=sys.stderr)
        return 1
    out = subprocess.run([ptxas, "-arch=sm_90a", "-v", os.path.join(args.out, "ws.ptx"), "-o",
                          os.path.join(args.out, "ptxas.cubin")], capture_output=True, text=True)
    print("\n".join(line.strip() for line in (out.stdout + out.stderr).splitlines() if "spill" in line or "Used" in line))
    return out.returncode


if __name__ == "__main__":
    sys.exit(main())
