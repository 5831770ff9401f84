"""Look inside the split prefix kernel on the GPU: its SASS and an instruction histogram.

(--path paged runs the paged kernel instead, e.g. under ncu.)

Runs `split` at one shape (--iters launches, so `ncu` can pick one), then, with --sass-out,
disassembles every compiled `_split_prefix_kernel` cubin found in TRITON_CACHE_DIR with
`cuobjdump -sass` and counts instruction classes (HGMMA = Hopper warpgroup MMA, HMMA = mma.sync,
UTMALDG = TMA tile load, SYNCS = mbarrier ops, BAR = CTA barriers, WARPGROUP.DEPBAR = waits on
outstanding wgmma, MUFU.EX2 = exponentials, LDS/STS = shared memory, SHFL = warp shuffles).

    export TRITON_CACHE_DIR=$(mktemp -d)
    PYTHONPATH=$PWD python benchmarks/inspect_split.py --ctx 128k --heads 8 --sass-out $OUT/split_sass
    ncu --clock-control none -k regex:_split_prefix_kernel --launch-skip 2 --launch-count 1 \\
        --section WarpStateStats --section SpeedOfLight python benchmarks/inspect_split.py --ctx 128k --heads 8
"""
from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ddprobe.engine.kernels import get_path, split  # noqa: E402
from ddprobe.engine.kernels.trees import shape_mask  # noqa: E402
from ddprobe.units import UnitError, parse_tokens  # noqa: E402

CLASSES = ["HGMMA", "HMMA", "UTMALDG", "LDGSTS", "LDG", "SYNCS", "BAR", "WARPGROUP.DEPBAR", "WARPGROUP.ARRIVE",
           "MUFU.EX2", "LDS", "LDSM", "STS", "SHFL", "FMUL", "FFMA", "FADD", "FMNMX", "BRA"]


def histogram(sass: str) -> dict[str, int]:
    counts: collections.Counter = collections.Counter()
    for line in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", line)
        if not m:
            continue
        op = m.group(1)
        for c in CLASSES:
            if op == c or op.startswith(c + "."):
                counts[c] += 1
                break
        counts["total"] += 1
    return dict(counts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ctx", default="128k")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--path", default="split", help="split, or paged (a shuffled page_size=1 pool) to profile it")
    ap.add_argument("--sass-out", default=None, help="folder for <kernel>.sass.gz and histogram.json")
    a = ap.parse_args()
    try:
        ctx = parse_tokens(a.ctx)
    except UnitError as e:
        ap.error(str(e))  # one usage line, exit 2
    rows, d, v = 9, 576, 512
    g = torch.Generator(device="cuda").manual_seed(0)
    kv = torch.randn(ctx + rows, d, device="cuda", dtype=torch.bfloat16, generator=g)
    q = torch.randn(rows, a.heads, d, device="cuda", dtype=torch.bfloat16, generator=g)
    path = get_path(a.path)
    slots = torch.randperm(ctx + rows, device="cuda") if path.layout == "paged" else None
    plan = path.plan(ctx, shape_mask("lopsided", rows - 1, "cuda"), slots, v)
    for _ in range(a.iters):
        path.run(q, kv, plan, 192 ** -0.5)
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    ev[0].record()
    path.run(q, kv, plan, 192 ** -0.5)
    ev[1].record()
    torch.cuda.synchronize()
    print(f"{a.path}: one call {ev[0].elapsed_time(ev[1]) * 1e3:.1f} us (events, L2 warm)")
    if a.path == "split":
        print("config:", json.dumps(split.choose_config(ctx, rows * a.heads, plan.extra["sm_count"])))
    if not a.sass_out:
        return 0
    cache = Path(os.environ.get("TRITON_CACHE_DIR", Path.home() / ".triton" / "cache"))
    cuobjdump = shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump"
    out = Path(a.sass_out)
    out.mkdir(parents=True, exist_ok=True)
    hist = {}
    for cubin in sorted(cache.rglob("*.cubin")):
        sass = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
        key = f"{cubin.stem}-{cubin.parent.name[:8]}"
        hist[key] = histogram(sass)
        with gzip.open(out / f"{key}.sass.gz", "wt") as f:
            f.write(sass)
    (out / "histogram.json").write_text(json.dumps(hist, indent=1))
    for k, h in hist.items():
        print(k, " ".join(f"{c}={h.get(c, 0)}" for c in ["total"] + CLASSES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
