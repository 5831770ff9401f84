"""benchmarks/smoke.py (the device run's smoke step) on real subprocesses: each command in a fresh process,
its exit code, wall time and warm-up line in the table, a failure recorded and failing the run."""
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("ddprobe_smoke", ROOT / "benchmarks" / "smoke.py")
smoke = sys.modules.setdefault("ddprobe_smoke", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(smoke)


def test_warmup_parsed_from_the_line_the_commands_print():
    assert smoke.parse_warmup("engine: device cuda\nwarm-up 12.3 s: compile, capture\n") == 12.3
    assert smoke.parse_warmup("warm-up 4 s: x") == 4.0
    assert smoke.parse_warmup("warm-up request (256 tokens, 3 new): kernels compile") is None
    assert smoke.parse_warmup("") is None


def test_readme_floor_and_help_in_fresh_processes(tmp_path):
    floor = next(c for c in smoke.cases() if c.name == "floor")
    bad = smoke.Case("bad gpu", ("floor", "--gpu", "no-such-gpu", "--ctx", "1k"))
    rows = smoke.run_all([floor, smoke.Case("help", ("--help",)), bad], tmp_path)
    assert [(r.name, r.rc) for r in rows] == [("floor", 0), ("help", 0), ("bad gpu", 1)]
    assert all(r.wall_s > 0 and r.warmup_s is None for r in rows)  # none of these warms an engine up
    assert "no-such-gpu" in rows[2].tail  # the one-line error is the failure's note
    md = (tmp_path / "smoke.md").read_text()
    assert md.splitlines()[0].startswith("| command | exit | wall s | warm-up s |")
    assert "| `ddprobe floor --model kimi-k2.6 --gpu rtx-pro-6000 --tp 8" in md and "| `ddprobe --help` | 0 |" in md
    assert "| `ddprobe floor --gpu no-such-gpu --ctx 1k` | 1 |" in md
    assert "== floor:" in (tmp_path / "smoke.log").read_text()


def test_only_and_exit_code(tmp_path, capsys):
    assert smoke.main(["--out", str(tmp_path), "--only", "floor"]) == 0
    assert len((tmp_path / "smoke.md").read_text().splitlines()) == 3  # header, rule, floor
    assert smoke.main(["--out", str(tmp_path), "--only", "flor"]) == 2
    assert "unknown smoke command 'flor'" in capsys.readouterr().err
    names = [c.name for c in smoke.cases()]
    for want in ("commit", "gpu-util", "gpu-util tiny", "diagnose", "diagnose k2", "floor", "advise", "report", "gate",
                 "bench verify", "serve"):
        assert want in names
    assert names.index("commit again") == names.index("commit") + 1  # the second run: warm compile caches
    assert names.index("report") > names.index("commit")  # report reads the files commit wrote
