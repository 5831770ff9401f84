"""Does a tiny target copy the recall passage? Teacher-forced copy accuracy on the probe's recall layout (as in
benchmarks/induction_sweep.py) and greedy DDTree generations (commit length, passage words written back, how
much the output repeats itself) for the shipped weights or a weights folder from examples/train_tiny.py.

    PYTHONPATH=$PWD python benchmarks/tiny_copy_check.py --weights shipped --out $OUT/shipped.json
    PYTHONPATH=$PWD python benchmarks/tiny_copy_check.py --weights DIR --gen recall:1024,recall:16384 --out X.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from induction_sweep import copy_acc  # noqa: E402

from ddprobe.probes.backends import GenStats  # noqa: E402
from ddprobe.probes.commit import output_repeats, prompt_ids, recall_copied  # noqa: E402
from ddprobe.probes.engine_backend import EngineBackend  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", default="shipped", help="'shipped' or a folder with model.safetensors")
    ap.add_argument("--copy-ctx", default="256,512,1024,4096")
    ap.add_argument("--gen", default="recall:1024,recall:16384,novel:1024,novel:16384",
                    help="kind:ctx cells to generate (128 new tokens, greedy DDTree)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    cells = [(k, int(c)) for k, c in (x.split(":") for x in a.gen.split(",") if x)]
    be = EngineBackend(preset="tiny", device=a.device, max_ctx=max([c for _, c in cells] + [4096]) + 1024,
                       weights="auto" if a.weights == "shipped" else "random")
    if a.weights != "shipped":
        from safetensors.torch import load_file

        be.engine.load_state_dict(load_file(str(Path(a.weights) / "model.safetensors")))
    eng = be.engine
    out = {"weights": a.weights, "device": a.device, "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
           "copy_acc": {}, "cells": []}
    for n in (int(c) for c in a.copy_ctx.split(",") if c):
        out["copy_acc"][n] = copy_acc(eng.target, n, 8, eng.device)
        print("teacher-forced copy accuracy", n, round(out["copy_acc"][n], 3), flush=True)
    for kind, ctx in cells:
        ids = prompt_ids(be, kind, ctx)
        t0 = time.perf_counter()
        res = eng.generate(ids, 128)
        st = GenStats(prompt_tokens=len(ids), completion_tokens=len(res.tokens), verify_steps=len(res.steps),
                      tokens=list(res.tokens))
        cp = recall_copied(be, st) if kind == "recall" else None
        out["cells"].append({"text": kind, "ctx": ctx, "commit_len": res.mean_commit_len,
                             "recall_copied_words": cp[0] if cp else None, "output_repeats": output_repeats(res.tokens),
                             "s": time.perf_counter() - t0, "output": be.decode(list(res.tokens))})
        print(json.dumps({k: v for k, v in out["cells"][-1].items() if k != "output"}), flush=True)
        a.out.write_text(json.dumps(out, indent=1))
    a.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
