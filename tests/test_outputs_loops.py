"""Symbolic link loops (made in the test's own folder) as inputs and outputs of every command that checks its files
(issue 65: `Path.resolve()` raised RuntimeError, a traceback in six commands). Each is one line naming the option or
the file, exit 1, nothing written."""
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddprobe.cli import app
from ddprobe.cli.outputs import _same, check_file

DATA = Path(__file__).parent / "data"
runner = CliRunner()


@pytest.fixture
def loop(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    return tmp_path


CASES = [  # (args, what the line says); L = the loop, D = the test's folder
    (["report", "L", "-o", "D/r.html"], "cannot read results file"),
    (["report", "L/x.json", "-o", "D/r.html"], "cannot read results file"),
    (["report", str(DATA / "bench-verify-h200-raw.json"), "-o", "L"], "--out"),
    (["report", str(DATA / "bench-verify-h200-raw.json"), "-o", "L/r.html"], "--out"),
    (["floor", "--steps-from", "L", "--out", "D/s.json"], "L"),
    (["floor", "--config", "L", "--ctx", "1k", "--out", "D/s.json"], "L"),
    (["advise", "--from", "L", "--out", "D/s.json"], "cannot read results file"),
    (["advise", "--ctx", "32k", "--step-ms", "159", "--commit-len", "7", "--gpu", "rtx-pro-6000", "--tp", "8",
      "--allreduce-from", "L", "--out", "D/s.json"], "cannot read results file"),
    (["gpu-util", "--replay", "L", "--json", "D/s.json"], "cannot read results file"),
    (["gpu-util", "--replay", str(DATA / "gpu-util-h200-paged.json"), "--json", "L"], "--json"),
    (["commit", "--json", "D/s.json", "--csv", "L"], "--csv"),
    (["gate", "L", "--baseline", str(DATA / "bench-verify-h200-raw.json")], "cannot read results file"),
    (["gate", str(DATA / "bench-verify-h200-raw.json"), "--baseline", "L"], "cannot read results file"),
    (["bench", "allreduce", "--device", "cpu", "-o", "L/x.json"], "--out"),
    (["diagnose", "--out-dir", "L"], "--out-dir"),
    (["trace", "--url", "http://127.0.0.1:9", "--dir", "L", "-o", "D/t.json"], "--dir"),  # before any request
    (["floor", "--ctx", "1k", "--out", "L"], "--out L: is a symbolic link loop (give another name)"),
    (["gpu-util", "--replay", str(DATA / "gpu-util-h200-paged.json"), "--json", "L"],
     "--json L: is a symbolic link loop (give another name)"),  # never "give the file it points to": there is none
    (["trace", "L"], "cannot read trace file L: Too many levels of symbolic links"),  # not "no such file"
    (["trace", "L", "-o", "D/t.json"], "cannot read trace file L: Too many levels of symbolic links"),
]


@pytest.mark.parametrize("args, says", CASES, ids=[" ".join(a[:3]) + f" {i}" for i, (a, _) in enumerate(CASES)])
def test_a_loop_is_one_line_never_a_traceback(loop, args, says):
    args = [a.replace("L", str(loop / "a"), 1) if a.startswith("L") else a.replace("D/", f"{loop}/", 1)
            for a in args]
    r = runner.invoke(app, args)
    assert r.exit_code == 1 and (r.exception is None or isinstance(r.exception, SystemExit)), r.output
    assert "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert r.output.startswith("error: ") and says.replace("L", str(loop / "a")) in r.output, r.output
    assert sorted(os.listdir(loop)) == ["a", "b"]  # nothing written


def test_same_file_resolves_a_loop_without_raising(loop):
    a = loop / "a"
    assert _same(a, a) and not _same(a / "x", loop / "y") and not _same(a, loop / "b")
    with pytest.raises(Exception, match="is also the input --steps-from"):
        check_file("--out", loop / "new.json", inputs=[("--steps-from", loop / "new.json")])


@pytest.mark.parametrize("content, says", [
    ("hello\n", "holds a file that is not a ddprobe results file"),
    ('{"rows": []}', "holds a file that is not a ddprobe results file"),
    ((DATA / "commit-tiny-cpu.json").read_text(), "already holds results written earlier"),
])
def test_an_output_file_already_there_is_said_for_what_it_holds(tmp_path, content, says):
    """`floor -o F` keeps F unless --force, and says what F holds: earlier results only where it is a ddprobe
    results file. In a fresh process; F is left as it was."""
    import subprocess
    import sys

    f = tmp_path / "f.json"
    f.write_text(content)
    p = subprocess.run([sys.executable, "-m", "ddprobe", "floor", "--ctx", "1k", "-o", str(f)], capture_output=True,
                       text=True, timeout=120)
    said = " ".join((p.stdout + p.stderr).split())
    assert p.returncode == 1 and len((p.stdout + p.stderr).strip().splitlines()) == 1, said
    assert f"--out {f}: {says} (give another path, or --force to replace it)" in said, said
    assert f.read_text() == content
