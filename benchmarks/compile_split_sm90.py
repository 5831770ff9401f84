"""Compile split's prefix kernel for sm_90a on a machine without a GPU and print its shared memory.

    pip install --no-deps --target /tmp/t36 triton==3.6.0     # the device's Triton, beside the local one
    TRITON36=/tmp/t36 python benchmarks/compile_split_sm90.py                       # the fp32 k2 case (2 heads x 9 rows)
    TRITON36=/tmp/t36 python benchmarks/compile_split_sm90.py --heads 8 --dtypes fp32 --tma 1
    TRITON36=/tmp/t36 python benchmarks/compile_split_sm90.py --dtypes bf16 --heads 8 --tail 1 --block-n 32

For each dtype and tma, compiles the config the tuning asks for (SplitTuning's block_n and num_stages, no shared
memory fit: what `split` launched before the fit) and, when it differs, the one split.choose_config picks under
the H200's limit (232,448 B), and prints a table: Triton's metadata.shared, split.prefix_smem's estimate, the
limit and whether it fits. The tuning options (--block-n, --stages, --block-q, --tail) replace SplitTuning fields.
A bad option is argparse's one-line usage error; a Triton that is not 3.6 is one line and exit 1; a config that
does not compile (e.g. ptxas out of registers) is one line in its row.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import sm90_offline  # benchmarks/sm90_offline.py: Triton 3.6 and a driver stub

DTYPES = ("fp32", "bf16", "fp16")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--rows", type=int, default=9, help="R, the new rows (budget + 1)")
    ap.add_argument("--v-dim", type=int, default=512)
    ap.add_argument("--rope", type=int, default=64)
    ap.add_argument("--prefix", type=int, default=4096, help="prefix length the config is planned for")
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--tma", default="1,0", help="SplitTuning.tma values to compile")
    ap.add_argument("--block-n", type=int)
    ap.add_argument("--stages", type=int)
    ap.add_argument("--block-q", type=int)
    ap.add_argument("--tail", type=int, choices=(0, 1, 2))
    args = ap.parse_args()
    dtypes = args.dtypes.split(",")
    if not set(dtypes) <= set(DTYPES):
        ap.error(f"--dtypes: pick from {','.join(DTYPES)}")
    tmas = [int(x) for x in args.tma.split(",")]
    triton = sm90_offline.triton36("compile_split_sm90")
    if triton is None:
        return 1
    import torch
    from triton.tools.tensor_descriptor import TensorDescriptor

    from ddprobe.engine.kernels import split
    from ddprobe.engine.kernels._common import dot_flags, next_pow2

    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    r, h, v, pe = args.rows, args.heads, args.v_dim, args.rope
    hq, width = r * h, v + pe
    over = {k: val for k, val in (("block_n", args.block_n), ("num_stages", args.stages), ("block_q", args.block_q),
                                  ("tail", args.tail)) if val is not None}

    def compile_shared(dt, cfg) -> str:
        """metadata.shared of the prefix kernel compiled for sm_90a with ``cfg`` (launched as split.run does)."""
        q = torch.zeros(r, h, width, dtype=dt)
        kv = torch.zeros(args.prefix + r, width, dtype=dt)
        ns = cfg["num_splits"]
        kd_lat = kd_pe = kv
        if cfg["tma"] and ns:
            kd_lat = TensorDescriptor(kv, [kv.shape[0], v], [kv.stride(0), 1], [cfg["block_n"], v])
            kd_pe = TensorDescriptor(kv[:, v:], [kv.shape[0], pe], [kv.stride(0), 1], [cfg["block_n"], pe])
        o_part, lse_part = torch.zeros(ns + 1, hq, v), torch.zeros(ns + 1, hq)
        upcast, prec = dot_flags(dt)
        try:
            k = split._split_prefix_kernel.warmup(
                q, kv, kd_lat, kd_pe, torch.zeros(r, dtype=torch.int64), o_part, lse_part,
                q.stride(0), q.stride(1), kv.stride(0), o_part.stride(0), o_part.stride(1),
                torch.zeros(1, dtype=torch.int32), r, cfg["block_n"], hq, h, 0.1,
                V_DIM=v, PE_DIM=pe, BLOCK_Q=cfg["block_q"], TAIL=cfg["tail"], TAIL_PROGRAM=cfg["tail_program"],
                TAIL_RATIO=cfg["tail_ratio"], BLOCK_N=cfg["block_n"], BLOCK_R=max(16, next_pow2(r)), UPCAST=upcast,
                PREC=prec, TMA=kd_lat is not kv, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
                grid=(cfg["n_qb"], ns + 1))
        except Exception as e:  # noqa: BLE001 - a config that does not compile is one line of the table
            lines = [ln.strip() for ln in str(e).splitlines() if "fatal" in ln or "out of resource" in ln]
            return f"error: {(lines or [type(e).__name__])[0][:90]}"
        return str(k.metadata.shared)

    print(f"split prefix kernel, sm_90a, Triton {triton.__version__}: {h} heads x {r} rows = {hq} folded rows, "
          f"kv rows {v}+{pe} = {width} wide, limit {split.SMEM_SM90} B")
    cols = f"{'dtype':5} {'tma':>3} {'config':6} {'block_q':>7} {'tail':>4} {'tail_prog':>9} {'block_n':>7} " \
           f"{'stages':>6} {'shared':>8} {'estimate':>8} {'fits':>4}"
    print(cols)
    print("-" * len(cols))
    for name in dtypes:
        dt = torch_dtype[name]
        for tma in tmas:
            t = dataclasses.replace(split.DEFAULT_TUNING, tma=tma, **over)
            plan_args = (args.prefix, hq, args.sms, t)
            asked = split.choose_config(*plan_args, dtype=dt, width=width, r=r, smem_limit=1 << 62)
            try:
                chosen = split.choose_config(*plan_args, dtype=dt, width=width, r=r, smem_limit=split.SMEM_SM90)
            except ValueError as e:
                chosen = str(e)
            rows = [("asked" if chosen != asked else "same", asked)]
            if isinstance(chosen, str):
                print(f"{name:5} {tma:>3} chosen {chosen}")
            elif chosen != asked:
                rows.append(("chosen", chosen))
            for label, cfg in rows:
                shared = compile_shared(dt, cfg)
                est = split.prefix_smem(cfg, r, width, dt.itemsize)
                fits = "yes" if shared.isdigit() and int(shared) <= split.SMEM_SM90 else "no"
                print(f"{name:5} {tma:>3} {label:6} {cfg['block_q']:>7} {cfg['tail']:>4} {cfg['tail_program']:>9} "
                      f"{cfg['block_n']:>7} {cfg['num_stages']:>6} {shared:>8} {est:>8} {fits:>4}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
