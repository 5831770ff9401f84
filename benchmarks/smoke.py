"""Every command a user runs, with its defaults, each in a fresh process (the device run's ``smoke`` step):
exit code, wall time and warm-up (the ``warm-up X s`` line, where the command prints one) per command, as a
markdown table in <out>/smoke.md; exit 1 when any command exits non-zero.

    python benchmarks/smoke.py --out DIR [--only commit,floor,...]

The commands run in <out>/smoke-work (their default ddprobe-results/ and report folders land there); ``report``
reads the results files the run wrote, ``gate`` compares shipped files, ``serve`` gets one request from the openai
client. The README's GPU commands, as a newcomer types them.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WARMUP_RE = re.compile(r"^warm-up (\d+(?:\.\d+)?) s\b", re.M)
SERVE_START_S = 600.0  # the engine's build and warm-up, before the first request


@dataclass(frozen=True)
class Case:
    name: str  # the table's first column
    args: tuple[str, ...]  # after ``python -m ddprobe``
    timeout_s: float = 900.0


@dataclass
class Row:
    name: str
    command: str
    rc: int
    wall_s: float
    warmup_s: float | None
    tail: str  # the last line of stderr (what went wrong, when rc != 0)


def cases() -> list[Case]:
    """The user's commands, in the README's spelling (shipped files by their path in this repository)."""
    base = ROOT / "tests" / "data" / "bench-verify-h200-2026-11-29.json"  # the README's gate example
    return [
        Case("commit", ("commit", "--ctx", "1k,16k,64k,128k")),
        Case("commit again", ("commit", "--ctx", "1k,16k,64k,128k")),  # the compile caches the first run filled
        Case("gpu-util", ("gpu-util", "--prompt-len", "64k")),
        Case("gpu-util tiny", ("gpu-util", "--preset", "tiny")),
        Case("diagnose", ("diagnose",)),
        Case("diagnose k2", ("diagnose", "--preset", "k2")),
        Case("floor", ("floor", "--model", "kimi-k2.6", "--gpu", "rtx-pro-6000", "--tp", "8", "--ctx",
                       "32k,128k,185k", "--step-ms", "159,714,1430", "--expert-dtype", "int4")),
        Case("advise", ("advise", "--ctx", "32k,128k,185k", "--step-ms", "159,714,1430", "--commit-len",
                        "7.0,7.88,7.88", "--gpu", "rtx-pro-6000", "--tp", "8", "--expert-dtype", "int4", "--path",
                        "sglang", "--text", "predictable")),
        Case("report", ("report", "ddprobe-results", "-o", "report.html")),  # the files this run wrote
        Case("gate", ("gate", str(ROOT / "tests" / "data" / "bench-verify-h200-raw.json"), "--baseline", str(base),
                      "--paths", "split", "--ctx", "128k")),
        Case("bench verify", ("bench", "verify", "--quick")),
        Case("bench launch", ("bench", "launch")),  # the least time per kernel the step model's latency term reads
        Case("trace", ("trace", str(ROOT / "tests" / "data" / "traces" / "serve-tiny-cpu-TP-0.trace.json.gz"),
                       "--cpu-ops")),  # docs/trace.md's example on the shipped trace
        Case("serve", ("serve",)),
    ]


def parse_warmup(text: str) -> float | None:
    """The seconds of the first ``warm-up X s`` line in a command's output (None: it printed none)."""
    m = WARMUP_RE.search(text)
    return float(m.group(1)) if m else None


def _env() -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:160] if lines else ""


def run_case(case: Case, work: Path, log) -> Row:
    """One command in a fresh process in ``work``; its output appended to ``log``."""
    if case.args[:1] == ("serve",):
        return run_serve(case, work, log)
    cmd = [sys.executable, "-m", "ddprobe", *case.args]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=work, env=_env(), capture_output=True, text=True, timeout=case.timeout_s)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = 124, _text(e.stdout), _text(e.stderr) + f"\ntimed out after {case.timeout_s:.0f} s"
    wall = time.perf_counter() - t0
    log.write(f"== {case.name}: ddprobe {' '.join(case.args)} (rc {rc}, {wall:.1f} s)\n{out}{err}\n")
    tail = _last_line(err)
    noise = foreign_line(out + err)
    if noise and rc == 0:  # a third-party warning reached the user's terminal: the step fails on it (issue 54)
        rc, tail = FOREIGN_RC, f"a third-party warning reached the terminal: {noise[:120]}"
    return Row(case.name, "ddprobe " + " ".join(case.args), rc, wall, parse_warmup(err + out), tail)


FOREIGN_RC = 3  # the exit recorded for a command that succeeded but let a third-party warning through
# what a third-party warning looks like on a terminal: Python's "file:line: XWarning: ...", a C++ glog/Kineto line
FOREIGN_RE = re.compile(r"^(?:.*\.py:\d+: \w*Warning: .*|[WE]\d{4} \d\d:\d\d:.*|USDT:.*|INFO:\d{4}-.*)$", re.M)


def foreign_line(text: str) -> str:
    """The first line of ``text`` that is a third-party warning ("" when none)."""
    m = FOREIGN_RE.search(text)
    return m.group(0).strip() if m else ""


def _text(b) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_serve(case: Case, work: Path, log) -> Row:
    """``ddprobe serve`` on a free port, one completion from the openai client once it answers, then SIGINT."""
    port = _free_port()
    args = (*case.args, "--port", str(port))
    errf = (work / "serve.stderr").open("w+")
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "ddprobe", *args], cwd=work, env=_env(), stdout=errf,
                            stderr=subprocess.STDOUT, text=True)
    rc, why = 0, ""
    try:
        model = _wait_models(port, proc, case.timeout_s)
        import openai

        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=120.0)
        done = client.completions.create(model=model, prompt="the quick brown fox", max_tokens=16)
        if not done.choices or not done.choices[0].text:
            rc, why = 1, "the completion came back empty"
    except Exception as e:  # the row records it: the step fails on rc != 0
        rc, why = 1, f"{type(e).__name__}: {e}"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    wall = time.perf_counter() - t0
    errf.seek(0)
    text = errf.read()
    errf.close()
    log.write(f"== {case.name}: ddprobe {' '.join(args)} (rc {rc}, {wall:.1f} s)\n{text}\n{why}\n")
    return Row(case.name, "ddprobe " + " ".join(args) + " + 1 openai completion", rc, wall, parse_warmup(text),
               why or _last_line(text))


def _wait_models(port: int, proc, limit_s: float) -> str:
    """The served model's id, once /v1/models answers (RuntimeError when the server exits or never answers)."""
    t_end = time.monotonic() + min(limit_s, SERVE_START_S)
    while time.monotonic() < t_end:
        if proc.poll() is not None:
            raise RuntimeError(f"ddprobe serve exited with {proc.returncode} before answering")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2) as r:
                return json.load(r)["data"][0]["id"]
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"ddprobe serve did not answer within {min(limit_s, SERVE_START_S):.0f} s")


def table(rows: list[Row]) -> str:
    """The markdown table of the rows."""
    lines = ["| command | exit | wall s | warm-up s | last line (on failure) |", "|---|---:|---:|---:|---|"]
    for r in rows:
        warm = "-" if r.warmup_s is None else f"{r.warmup_s:.1f}"
        note = r.tail.replace("|", "\\|") if r.rc else ""
        lines.append(f"| `{r.command}` | {r.rc} | {r.wall_s:.1f} | {warm} | {note} |")
    return "\n".join(lines) + "\n"


def run_all(todo: list[Case], out: Path) -> list[Row]:
    """Every case in order, in out/smoke-work; the table in out/smoke.md (rewritten after each command, so a
    killed run keeps what it measured) and every output in out/smoke.log."""
    work = out / "smoke-work"
    work.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    with (out / "smoke.log").open("w") as log:
        for case in todo:
            rows.append(run_case(case, work, log))
            log.flush()
            (out / "smoke.md").write_text(table(rows))
            r = rows[-1]
            print(f"{r.name:<14} rc {r.rc:<4} {r.wall_s:7.1f} s  warm-up "
                  f"{'-' if r.warmup_s is None else f'{r.warmup_s:.1f} s'}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for smoke.md, smoke.log and smoke-work/")
    ap.add_argument("--only", default="", help="comma-separated command names (default: all)")
    a = ap.parse_args(argv)
    todo = cases()
    if a.only:
        want = [w.strip() for w in a.only.split(",") if w.strip()]
        unknown = [w for w in want if w not in {c.name for c in todo}]
        if unknown:
            print(f"error: unknown smoke command {unknown[0]!r}; known: {', '.join(c.name for c in todo)}",
                  file=sys.stderr)
            return 2
        todo = [c for c in todo if c.name in want]
    rows = run_all(todo, a.out)
    print(table(rows))
    failed = [r.name for r in rows if r.rc != 0]
    if failed:
        print(f"smoke FAILED: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
