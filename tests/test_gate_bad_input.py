"""The gate against a baseline it cannot believe (issue 65): a baseline entry without a time, impossible numbers, an
empty --paths, two baselines for one card. Each is one line naming the entry, the field or the option, never a pass."""
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddprobe.cli import app

DATA = Path(__file__).parent / "data"
BASE = DATA / "bench-verify-synthetic.json"
SHIPPED = Path(__file__).parent.parent / "examples" / "baselines" / "bench-verify-h200.json"
runner = CliRunner()


def _write(tmp_path, name, edit) -> Path:
    d = json.loads(BASE.read_text())
    edit(d)
    p = tmp_path / name
    p.write_text(json.dumps(d))
    return p


def _split_128k(d) -> dict:
    return next(r for r in d["rows"] if r["path"] == "split" and r["ctx"] == 131072 and r["heads"] == 8
                and r.get("kind") is None)


def gate_cli(*args):
    return runner.invoke(app, ["gate", *map(str, args)])


def test_a_baseline_entry_without_a_time_is_refused_not_within_10_percent(tmp_path):
    """Today's bug: an untimed baseline entry was "ok" and counted within 10%, so the current run's 10x slower entry
    passed. Now that entry is REFUSED (exit 1), the others still compared and shown."""
    def untimed(d):
        r = _split_128k(d)
        r.pop("time_us"), r.pop("GBps")
        r["error"] = "out of memory"

    def ten_x(d):
        r = _split_128k(d)
        r["time_us"] *= 10
        r["GBps"] /= 10

    base, cur = _write(tmp_path, "base.json", untimed), _write(tmp_path, "cur.json", ten_x)
    r = gate_cli(cur, "--baseline", base, "--paths", "split")
    assert r.exit_code == 1, r.output
    assert "REFUSED: split heads=8 ctx=128k" in r.output and "the baseline entry has no time (out of memory)" \
        in r.output and "gate FAILED: 1 of" in r.output and "1 REFUSED" in r.output
    assert "within 10%" not in r.output and "Traceback" not in r.output
    assert r.output.count(" ok ") >= 3  # the other split entries still gated and shown


def test_a_baseline_entry_that_failed_its_output_check_is_refused(tmp_path):
    def wrong(d):
        _split_128k(d)["ok"] = False

    r = gate_cli(BASE, "--baseline", _write(tmp_path, "base.json", wrong), "--paths", "split")
    assert r.exit_code == 1 and "REFUSED: split heads=8 ctx=128k" in r.output, r.output
    assert "failed its output check against the reference: not a baseline" in r.output


def test_a_peers_untimed_baseline_entry_stays_a_reference(tmp_path):
    """The shipped H200 baseline has untimed peers (sglang's own kernel, FlashInfer FA3 on a runner without it):
    they are recorded beside the paths, never gated, so the baseline gates against itself."""
    r = gate_cli(SHIPPED, "--baseline", SHIPPED)
    assert r.exit_code == 0 and "gate passed" in r.output and "REFUSED" not in r.output, r.output


@pytest.mark.parametrize("field, value, said", [
    ("time_us", 1e-4, "'us' is 0.0001 us, not a measured time (must be between 1 us and 1 h)"),
    ("time_us", 4e9, "'us' is 4e+09 us, not a measured time (must be between 1 us and 1 h)"),
    ("GBps", 1e9, "'GBps' is 1e+09 GB/s (must be between 1 MB/s and 1 PB/s (1000 TB/s))"),
    ("heads", 0, "'heads' is 0 (must be a whole number >= 1)"),
    ("floor_us", 1e12, "'floor_us' is 1e+12 us (a kernel floor is above 0 and at most 1 h)"),
])
@pytest.mark.parametrize("which", ["baseline", "current"])
def test_impossible_numbers_in_either_file_are_one_line_naming_the_field(tmp_path, field, value, said, which):
    def edit(d):
        _split_128k(d)[field] = value

    bad = _write(tmp_path, "bad.json", edit)
    args = (BASE, "--baseline", bad) if which == "baseline" else (bad, "--baseline", BASE)
    r = gate_cli(*args)
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1 and said in r.output
    # a time is refused as the file is read (any reader of results files: the file and its row named), the rest by
    # the gate (the file's role and the entry named)
    assert "bad.json: row 22 (split ctx=131072)" in r.output if field == "time_us" else \
        r.output.startswith(f"error: {which} results: split heads={value if field == 'heads' else 8} ctx=128k")


@pytest.mark.parametrize("value", ["", " ", ",", " , "])
def test_empty_paths_is_refused_not_everything(value):
    r = gate_cli(BASE, "--baseline", BASE, "--paths", value)
    assert r.exit_code == 1 and "--paths" in r.output and "no path names" in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1


def test_two_baselines_for_one_card_are_refused_naming_both(tmp_path):
    """A folder with two H200 verify baselines: which one gates is not guessed (the first by name won, unsaid)."""
    folder = tmp_path / "baselines"
    folder.mkdir()
    shutil.copy(SHIPPED, folder / "bench-verify-h200.json")
    shutil.copy(SHIPPED, folder / "bench-verify-h200-old.json")
    shutil.copy(SHIPPED.parent / "bench-verify-h100.json", folder / "bench-verify-h100.json")
    r = gate_cli(SHIPPED, "--baseline", folder)
    assert r.exit_code == 1 and len(r.output.strip().splitlines()) == 1, r.output
    assert "holds 2 bench-verify baselines for NVIDIA H200: bench-verify-h200-old.json, bench-verify-h200.json" \
        in r.output and "give the file with --baseline" in r.output
    h100 = SHIPPED.parent / "bench-verify-h100.json"  # the card with one baseline there still gates
    assert gate_cli(h100, "--baseline", folder).exit_code == 0
