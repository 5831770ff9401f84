"""The tiny pair at long context on a GPU (issue 14): the prefill path checked against the fp32 reference,
prefill time by context, then the user's commands end to end through the CLI, wall time included.

    PYTHONPATH=$PWD python benchmarks/bench_tiny_long.py --out $OUT

Prints a short table last; writes bench-tiny-long.json (and the CLI's results files) under --out.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch


def check_prefill(dev: str) -> list[dict]:
    """The prefill path against the reference path on fresh random inputs (both layouts, with a prefix)."""
    from ddprobe.engine.kernels import get_path

    ref, pf = get_path("reference"), get_path("prefill")
    out = []
    gen = torch.Generator().manual_seed(0)
    for dtype, tol in ((torch.float32, 2e-5), (torch.bfloat16, 2e-2)):
        for pre, r, paged in ((0, 1024, False), (3000, 1024, True), (70000, 512, False)):
            n = pre + r
            kv = torch.randn(n + 64, 96, generator=gen).to(dev, dtype)
            slots = torch.randperm(n + 64, generator=gen)[:n].to(dev) if paged else None
            q = torch.randn(r, 4, 96, generator=gen).to(dev, dtype)
            mask = torch.ones(r, r, dtype=torch.bool, device=dev).tril_()
            a = ref.run(q, kv, ref.plan(pre, mask, slots, 64), 0.1).float()
            b = pf.run(q, kv, pf.plan(pre, mask, slots, 64), 0.1).float()
            err = float((a - b).abs().max() / a.abs().max())
            out.append({"dtype": str(dtype), "prefix": pre, "rows": r, "paged": paged, "rel_err": err, "ok": err < tol})
    return out


def time_prefill(dev: str, ctxs: list[int]) -> list[dict]:
    """Tiny prefill alone (trained weights, bf16, the engine's defaults), after one warm call."""
    from ddprobe.probes.commit import prompt_ids
    from ddprobe.probes.engine_backend import EngineBackend

    be = EngineBackend(preset="tiny", attn="split", device=dev, dtype="bfloat16", max_ctx=max(ctxs) + 1024)
    eng = be.engine
    eng.prefill(eng.new_cache(2048), [i % 200 for i in range(2000)])  # warm outside the measured calls
    rows = []
    for c in ctxs:
        ids = prompt_ids(be, "novel", c)
        kv = eng.new_cache(c + 16)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        eng.prefill(kv, ids)
        torch.cuda.synchronize()
        rows.append({"ctx": c, "prefill_s": time.perf_counter() - t0})
        del kv
    return rows


def novel_logits_ab(dev: str, ctxs=(1024, 16384)) -> list[dict]:
    """Novel text in bf16 with the target's logits rounded to bf16 (fp32_logits off, k2's setting) and in fp32
    (the tiny preset's): commit length, how many prompt rows tie at the top of bf16 logits, the completion."""
    from ddprobe.probes.commit import prompt_ids
    from ddprobe.probes.engine_backend import EngineBackend

    rows = []
    for fp32 in (False, True):
        be = EngineBackend(preset="tiny", attn="reference", device=dev, dtype="bfloat16", max_ctx=max(ctxs) + 1024)
        eng = be.engine
        eng.target.fp32_logits = fp32  # before the first step: the captured step takes it as it is
        for c in ctxs:
            ids = prompt_ids(be, "novel", c)
            res = eng.generate(ids, 128)
            with torch.no_grad():
                h, _ = eng.target.forward_causal(torch.tensor([ids[-1024:]], device=dev))
                top2 = eng.target.lm_head(h[0]).float().topk(2, -1).values
            rows.append({"fp32_logits": fp32, "ctx": c, "commit_len": res.mean_commit_len,
                         "bf16_top_ties": float((top2[:, 0] == top2[:, 1]).float().mean()),
                         "completion": be.decode(list(res.tokens))[:300]})
            print(json.dumps(rows[-1]), flush=True)
        del be, eng
    return rows


def cli(args: list[str], out: Path, name: str) -> dict:
    """One ddprobe command in a child process, wall-timed; its results file kept under out."""
    cmd = [sys.executable, "-m", "ddprobe", *args, "--json", str(out / f"{name}.json")]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "COLUMNS": "120"})
    wall = time.perf_counter() - t0
    (out / f"{name}.log").write_text(p.stdout + "\n--- stderr ---\n" + p.stderr)
    print(p.stdout[-3000:], p.stderr[-1500:], sep="\n", flush=True)
    return {"name": name, "cmd": "ddprobe " + " ".join(args), "rc": p.returncode, "wall_s": wall}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    ap.add_argument("--skip-cli", action="store_true")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    dev = "cuda"
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}
    res["prefill_check"] = check_prefill(dev)
    print(json.dumps(res["prefill_check"]), flush=True)
    res["prefill_time"] = time_prefill(dev, [16384, 65536, 131072, 262144])
    print(json.dumps(res["prefill_time"]), flush=True)
    (a.out / "bench-tiny-long.json").write_text(json.dumps(res, indent=1))
    res["novel_logits_ab"] = novel_logits_ab(dev)
    (a.out / "bench-tiny-long.json").write_text(json.dumps(res, indent=1))
    if not a.skip_cli:
        runs = [
            (["commit", "--ctx", "1k,16k,64k,128k"], "commit-default"),
            (["commit", "--ctx", "64k,128k,256k", "--text", "predictable,novel,recall"], "commit-256k"),
            (["commit", "--ctx", "1k", "--dtype", "float32"], "commit-1k-fp32"),
        ]
        res["cli"] = []
        for args, name in runs:
            res["cli"].append(cli(args, a.out, name))
            (a.out / "bench-tiny-long.json").write_text(json.dumps(res, indent=1))
    print("\n| what | value |\n|---|---|")
    print(f"| prefill path vs reference | {'ok' if all(r['ok'] for r in res['prefill_check']) else 'FAIL'} "
          f"(max rel err {max(r['rel_err'] for r in res['prefill_check']):.1e}) |")
    for r in res["prefill_time"]:
        print(f"| tiny prefill {r['ctx'] // 1024}k, bf16 | {r['prefill_s']:.2f} s |")
    for r in res["novel_logits_ab"]:
        print(f"| novel {r['ctx'] // 1024}k bf16, {'fp32' if r['fp32_logits'] else 'bf16'} logits | commit "
              f"{r['commit_len']:.2f}, top ties in bf16 logits {r['bf16_top_ties']:.0%} |")
    for r in res.get("cli", []):
        print(f"| `{r['cmd']}` | {r['wall_s']:.1f} s wall, rc {r['rc']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
