"""Benchmark (not a test): ``ddprobe trace`` on a trace of about 200 MB, made by replicating a real trace's events
(each copy shifted in time past the last, correlation ids offset), in a fresh process; prints the wall time and the
peak resident memory of the analysis.

    python tests/data/traces/bench_read.py tests/data/traces/sglang-eager-64k.trace.json.gz --mb 200
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def replicate(src: Path, dst: Path, mb: float) -> dict:
    doc = json.loads(gzip.open(src, "rt").read() if src.suffix == ".gz" else src.read_text())
    events = doc.pop("traceEvents")
    timed = [e for e in events if "ts" in e]
    t0 = min(float(e["ts"]) for e in timed)
    span = max(float(e["ts"]) + float(e.get("dur", 0)) for e in timed) - t0 + 1000.0
    corr = max(int((e.get("args") or {}).get("correlation", 0) or 0) for e in events) + 1
    head = json.dumps(doc)[:-1]
    n, copies, written = 0, 0, 0
    with gzip.open(dst, "wt", compresslevel=1) as f:
        f.write(head + (", " if doc else "") + '"traceEvents": [\n')
        while written < mb * 1e6:
            for e in events:
                e = dict(e)
                if "ts" in e:
                    e["ts"] = float(e["ts"]) + copies * span
                args = e.get("args")
                if isinstance(args, dict) and "correlation" in args:
                    e["args"] = dict(args, correlation=int(args["correlation"]) + copies * corr)
                line = ("" if n == 0 else ",\n") + json.dumps(e)
                f.write(line)
                written += len(line)
                n += 1
            copies += 1
        f.write("\n]}\n")
    return {"events": n, "copies": copies, "json_MB": written / 1e6, "gz_MB": dst.stat().st_size / 1e6}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace")
    p.add_argument("--mb", type=float, default=200.0)
    p.add_argument("--cpu-ops", action="store_true")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp) / "big-TP-0.trace.json.gz"
        made = replicate(Path(a.trace), big, a.mb)
        print(json.dumps(made), flush=True)
        code = ("import resource, sys, time; t = time.perf_counter(); "
                "from ddprobe.probes.trace import run_trace; "
                f"res, ranks = run_trace([{str(big)!r}], cpu_ops={a.cpu_ops}); "
                "print('steps', res.rows[0]['steps'], res.rows[0]['method']); "
                "print('wall_s %.1f peak_rss_MB %.0f' % (time.perf_counter() - t, "
                "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))")
        t0 = time.perf_counter()
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        print(r.stdout.strip(), r.stderr.strip()[-500:], f"process_s {time.perf_counter() - t0:.1f}")
    return r.returncode


if __name__ == "__main__":
    sys.exit(main())
