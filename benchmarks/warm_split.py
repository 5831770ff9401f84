"""Compile `split`'s kernels for several tunings at once, in parallel processes, before a timed run, so that
``ddprobe bench verify --variant split:...`` spends its time timing rather than compiling (Triton's cache is
shared by the processes and the later run):

    PYTHONPATH=$PWD python benchmarks/warm_split.py --heads 8,64 --variant tail_ratio=3 --variant tail=3 ...

Each process builds a host plan for one (tuning, heads) with the benchmark's shapes (k2 rows, bf16, 9 rows, the
lopsided tree; kv rows padded as bench verify pads them) and runs it once at two contexts. Needs CUDA.
"""
import argparse
import dataclasses
import time
from concurrent.futures import ProcessPoolExecutor


def _one(job: tuple[dict, int]) -> str:
    import torch

    from ddprobe.engine.kernels import split
    from ddprobe.engine.kernels.trees import shape_mask
    from ddprobe.probes.peers import rows_for

    over, heads = job
    t0 = time.time()
    tun = dataclasses.replace(split.default_tuning(), **over)  # as bench verify applies --variant
    try:
        for ctx in (8 * 1024, 128 * 1024):
            n = ctx + 9
            q = torch.randn(9, heads, 576, device="cuda", dtype=torch.bfloat16)
            kv = torch.randn(rows_for(n), 576, device="cuda", dtype=torch.bfloat16)
            p = split.plan(ctx, shape_mask("lopsided", 8, "cuda"), None, 512, tuning=tun, heads=heads)
            meta: dict = {}
            split.run(q, kv, p, 0.1, meta=meta)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001  (a tuning that does not compile here: said, the others go on)
        return f"{over} heads {heads}: {type(e).__name__}: {str(e)[:200]}"
    pm = meta["prefix"]
    return (f"{over} heads {heads}: {time.time() - t0:.1f} s, config {split.config_for(p, heads)}, prefix regs "
            f"{pm.get('n_regs')} spills {pm.get('n_spills')} shared {pm.get('shared')} wgmma {pm.get('wgmma')}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", default="8,64")
    ap.add_argument("--variant", action="append", default=[], help="field=value[,field=value] (SplitTuning)")
    ap.add_argument("--procs", type=int, default=8)
    a = ap.parse_args()
    overs = [{}] + [{k: int(v) for k, v in (kv.split("=") for kv in s.split(","))} for s in a.variant]
    jobs = [(o, int(h)) for o in overs for h in a.heads.split(",")]
    with ProcessPoolExecutor(a.procs) as ex:
        for line in ex.map(_one, jobs):
            print("warm", line, flush=True)


if __name__ == "__main__":
    import multiprocessing as mp

    mp.set_start_method("spawn")
    main()
