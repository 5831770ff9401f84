"""Verify-attention benchmark: ``ddprobe bench verify`` as a script (the comparison is ddprobe/probes/verify_bench.py,
the peers ddprobe/probes/peers.py). Every option of the command is accepted here:

    PYTHONPATH=$PWD PYTHONUNBUFFERED=1 python benchmarks/bench_verify.py --out $OUT/bench-verify.json
    ... --ctx 32k,128k --heads 8 --quick --paths split --variant split:tma=0 --variant split:block_n=32,num_stages=3

Per layer, for each context and head count: every verify path and peer, checked against the fp32 reference and
timed under CUDA-graph replay, next to the floor from ceilings measured in the same run; then the 61-layer k2
verify step at 8 heads. Writes JSON (``ddprobe report`` and ``ddprobe gate`` read it); prints a table last.
Two options more than the command, for the CUDA kernel of split_ws (cu_variant.py): --cubin PATH (a schedule
variant's build) and --l2-promotion 0..3.
"""
import argparse
import sys

from cu_variant import add_options, apply

from ddprobe.cli import app

if __name__ == "__main__":
    ap = argparse.ArgumentParser(add_help=False, prog="bench_verify.py")
    add_options(ap)
    known, rest = ap.parse_known_args()
    variant = apply(known, ap)
    if variant:
        print(f"split_ws CUDA kernel: {variant}", file=sys.stderr)
    app(["bench", "verify", *rest], prog_name="bench_verify.py")
