"""Tables fit the terminal (cli/tables.py): at 80 columns every table keeps its key columns with whole cells
(never ``2.…``) and names what it left out; wide, nothing is left out. Real processes with COLUMNS set, as a
user's shell sets it."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddprobe.cli.tables import Col, fitted_table, kept

ROOT = Path(__file__).resolve().parent.parent
README_FLOOR = ["floor", "--model", "kimi-k2.6", "--gpu", "rtx-pro-6000", "--tp", "8", "--ctx", "32k,128k,185k",
                "--step-ms", "159,714,1430", "--expert-dtype", "int4"]


def ddprobe(args, columns: int, cwd=ROOT):
    env = dict(os.environ, COLUMNS=str(columns), PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "ddprobe", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def table_lines(text: str, header_start: str) -> list[str]:
    lines = text.splitlines()
    i = next(k for k, ln in enumerate(lines) if ln.split()[:1] == [header_start])
    return lines[i:i + 6]


def test_readme_floor_example_at_80_columns():
    r = ddprobe(README_FLOOR, 80)
    assert r.returncode == 0, r.stderr
    lines = table_lines(r.stdout, "ctx")[:5]
    head, rule, *rows = lines
    assert head.split()[:1] == ["ctx"] and {"floor", "step", "gap"} <= set(head.split())
    assert [row.split()[0] for row in rows] == ["32k", "128k", "185k"]  # the context column, whole
    assert "…" not in r.stdout and all(len(ln.rstrip()) <= 80 for ln in lines)
    assert "159 ms" in rows[0] and "1430 ms" in rows[2]  # the steps typed, whole, with their units
    assert all(row.count(" ms") >= 4 and row.rstrip().endswith("x") for row in rows)  # floors, gaps: whole cells
    said = " ".join(r.stdout.split())  # the line naming what was left out wraps at 80 like any other
    assert "(narrow terminal: KV, weights, compute" in said and "left out; widen it, or COLUMNS=200)" in said


def test_readme_floor_example_wide_keeps_every_column():
    r = ddprobe(README_FLOOR, 200)
    assert r.returncode == 0, r.stderr
    head = table_lines(r.stdout, "ctx")[0].split()
    assert head[:3] == ["ctx", "KV", "weights"] and "re-read" in head and "narrow terminal" not in r.stdout


def test_a_pipe_gets_every_column_whole():
    """No terminal and no COLUMNS (a pipe, a CI log): nothing to fit, so every column, none cut."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env["PYTHONPATH"] = str(ROOT)
    r = subprocess.run([sys.executable, "-m", "ddprobe", "floor", "--ctx", "128k", "--bw", "1.8TB/s", "--step-ms",
                        "714"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    head = table_lines(r.stdout, "ctx")[0].split()
    assert head[:3] == ["ctx", "KV", "weights"] and head[-1] == "re-read" and "…" not in r.stdout
    assert "narrow terminal" not in r.stdout


@pytest.mark.parametrize("args, key", [
    (["gate", "tests/data/bench-verify-h200-raw.json", "--baseline", "tests/data/bench-verify-h200-2026-11-29.json",
      "--paths", "split", "--ctx", "128k"], "status"),
    (["gpu-util", "--replay", "tests/data/gpu-util-h200-split.json", "--json", "{tmp}/r.json"], "GPU"),
])
def test_gate_and_gpu_util_at_80_columns(tmp_path, args, key):
    r = ddprobe([a.replace("{tmp}", str(tmp_path)) for a in args], 80)
    assert r.returncode == 0, r.stderr
    lines = table_lines(r.stdout, key)
    assert "…" not in r.stdout and all(len(ln.rstrip()) <= 80 for ln in lines)
    head = lines[0].split()
    want = {"status": {"status", "path", "heads", "ctx", "time", "bw"}, "GPU": {"phase", "tensor", "DRAM", "verdict"}}
    assert want[key] <= set(head), head


def test_priorities_decide_what_goes():
    cols = [Col("key"), Col("nice", 1), Col("extra", 2), Col("more", 2)]
    rows = [["k" * 10, "n" * 10, "e" * 10, "m" * 10]]
    assert kept(cols, rows, 200) == [0, 1, 2, 3]
    assert kept(cols, rows, 38) == [0, 1, 2]  # the rightmost of the highest priority goes first
    assert kept(cols, rows, 25) == [0, 1] and kept(cols, rows, 5) == [0]  # key columns stay, however narrow
    _, gone = fitted_table("t", cols, rows, 25)
    assert gone == ["extra", "more"]
