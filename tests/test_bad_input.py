"""Bad input, as a table: each case is a command line, the exit code it must give and a pattern its one-line
message must match, run through the real CLI (Typer's runner: the same parsing, callbacks and error wrapper as
the console script). None may print a traceback, and none that would measure may get as far as measuring: every
case here fails before an engine step (the checks run before the model is built, or while the options are
parsed), so the table stays fast. The next audit starts from this table (issue 36).
"""
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddprobe.cli import app

DATA = Path(__file__).parent / "data"
REPLAY = str(DATA / "gpu-util-synthetic.json")
RESULTS = str(DATA / "commit-tiny-cpu.json")
RAW = str(DATA / "bench-verify-h200-raw.json")
BASE = str(Path(__file__).parent.parent / "examples" / "baselines" / "bench-verify-h200.json")


def _cases(tmp: Path):
    """(id, args, exit code, message pattern). ``tmp`` holds a folder ``dir``, a file ``file`` and a folder named
    like a report file (``dir.html``)."""
    d, f, dh = str(tmp / "dir"), str(tmp / "file"), str(tmp / "dir.html")
    return [
        # tracebacks before
        ("floor ctx 1e400", ["floor", "--ctx", "1e400"], 1, r"bad token count '1e400': too large"),
        ("commit ctx 1e400", ["commit", "--ctx", "1e400"], 1, r"bad token count '1e400': too large"),
        ("serve max-ctx 1e400", ["serve", "--max-ctx", "1e400", "--port", "39217"], 1,
         r"bad token count '1e400': too large"),
        ("floor bw 1e300TB/s", ["floor", "--bw", "1e300TB/s", "--step-ms", "100"], 1,
         r"--bw: bad bandwidth '1e300TB/s': must be between 1 MB/s and 1 PB/s"),
        ("commit device tpu", ["commit", "--device", "tpu", "--ctx", "256"], 1,
         r"unknown device 'tpu'; known: auto, cpu, cuda, cuda:N"),
        ("timeout nan, sglang", ["commit", "--timeout", "nan", "--backend", "sglang", "--url", "http://127.0.0.1:9"],
         1, r"--timeout: must be in 0.001\.\.604800 s, got nan"),
        ("timeout nan, engine", ["commit", "--timeout", "nan", "--ctx", "256"], 1, r"--timeout: must be in"),
        ("budget 100000", ["commit", "--budget", "100000", "--ctx", "256"], 1, r"--budget: must be in 1\.\.1024"),
        # silent accepts before
        ("json = csv", ["commit", "--ctx", "256", "--json", f + ".x", "--csv", f + ".x"], 1,
         r"--csv .*file\.x is the same file as --json"),
        ("url with engine", ["commit", "--ctx", "256", "--url", "http://127.0.0.1:9"], 1,
         r"--url is for --backend sglang or vllm"),
        ("replay with backend", ["gpu-util", "--replay", REPLAY, "--backend", "sglang", "--json", d + "/g.json"], 1,
         r"--replay re-analyses a saved file: --backend would be ignored"),
        ("replay with prompt-len", ["gpu-util", "--replay", REPLAY, "--prompt-len", "1k", "--json", d + "/g.json"], 1,
         r"--prompt-len would be ignored"),
        ("replay with compile", ["gpu-util", "--replay", REPLAY, "--compile", "--json", d + "/g.json"], 1,
         r"--compile would be ignored"),
        ("floor step 1e-300", ["floor", "--step-ms", "1e-300"], 1, r"--step-ms: bad step time '1e-300'"),
        ("floor budget 1e9", ["floor", "--budget", "1000000000"], 1, r"--budget: must be in 1..4096, got 1000000000"),
        ("floor bw 1e-300GB/s", ["floor", "--bw", "1e-300GB/s"], 1, r"--bw: bad bandwidth '1e-300GB/s'"),
        ("floor tflops inf", ["floor", "--tflops", "inf"], 1, r"--tflops: bad FLOP rate inf"),
        # outputs checked before anything is measured
        ("commit json is a dir", ["commit", "--ctx", "256", "--json", d], 1, r"--json .*dir: is a directory"),
        ("commit csv under a file", ["commit", "--ctx", "256", "--json", d + "/c.json", "--csv", f + "/c.csv"], 1,
         r"--csv .*file/c\.csv: .*file is not a directory"),
        ("gpu-util json is a dir", ["gpu-util", "--replay", REPLAY, "--json", d], 1, r"--json .*dir: is a directory"),
        ("floor out is a dir", ["floor", "-o", d], 1, r"--out .*dir: is a directory"),
        ("report out is a dir", ["report", RESULTS, "-o", dh], 1, r"--out .*dir\.html: is a directory"),
        ("diagnose out-dir is a file", ["diagnose", "--ctx", "256", "--out-dir", f], 1,
         r"--out-dir .*file: is a file, not a folder"),
        # outputs never harm what they name (issue 44): special files, links, system folders, inputs, earlier results
        ("commit json a char device", ["commit", "--ctx", "256", "--json", str(tmp / "null")], 1,
         r"--json .*null: is a character device, not a regular file$"),
        ("commit csv a FIFO", ["commit", "--ctx", "256", "--json", d + "/c.json", "--csv", str(tmp / "fifo")], 1,
         r"--csv .*fifo: is a FIFO, not a regular file$"),
        ("gpu-util json a symlink", ["gpu-util", "--replay", REPLAY, "--json", str(tmp / "link")], 1,
         r"--json .*link: is a symbolic link"),
        ("floor out a symlink loop", ["floor", "-o", str(tmp / "loop")], 1, r"--out .*loop: is a symbolic link"),
        ("report out a char device", ["report", RESULTS, "-o", str(tmp / "null")], 1,
         r"--out .*null: is a character device"),
        ("commit json under /proc", ["commit", "--ctx", "256", "--json", "/proc/self/ddprobe-never.json"], 1,
         r"--json /proc/self/ddprobe-never\.json: is under /proc"),
        ("gpu-util json under /sys", ["gpu-util", "--replay", REPLAY, "--json", "/sys/ddprobe-never.json"], 1,
         r"is under /sys"),
        ("commit json earlier results", ["commit", "--ctx", "256", "--json", str(tmp / "s.json")], 1,
         r"--json .*s\.json: already holds results measured earlier \(give another path, or --force"),
        ("floor out = steps-from", ["floor", "--steps-from", str(tmp / "s.json"), "--out", str(tmp / "s.json")], 1,
         r"--out .*s\.json is also the input --steps-from: writing it would replace what is read"),
        ("gpu-util json = replay", ["gpu-util", "--replay", str(tmp / "g.json"), "--json", str(tmp / "g.json"),
                                    "--force"], None, None),
        ("report out = an input", ["report", str(tmp / "s.json"), "-o", str(tmp / "s.json")], 1,
         r"--out .*s\.json is also the input RESULTS"),
        ("diagnose out-dir with earlier results", ["diagnose", "--ctx", "256", "--out-dir", str(tmp / "earlier")], 1,
         r"--out-dir .*earlier: already holds commit\.json from an earlier run \(give another path, or --force"),
        ("diagnose out-dir empty", ["diagnose", "--ctx", "256", "--out-dir", ""], 1, r"--out-dir: empty path"),
        # inputs: regular files only (a FIFO is refused at once, not read), JSON nested at most 64 deep
        ("floor config a FIFO", ["floor", "--config", str(tmp / "fifo")], 1, r"config .*fifo is a FIFO: give a regular"),
        ("floor steps-from a FIFO", ["floor", "--steps-from", str(tmp / "fifo")], 1, r"fifo is a FIFO"),
        ("gpu-util replay a FIFO", ["gpu-util", "--replay", str(tmp / "fifo"), "--json", d + "/g.json"], 1,
         r"fifo is a FIFO"),
        ("report a FIFO", ["report", str(tmp / "fifo"), "-o", d + "/r.html"], 1, r"fifo is a FIFO"),
        ("report deep JSON", ["report", str(tmp / "deep.json"), "-o", d + "/r.html"], 1,
         r"deep\.json: JSON nested deeper than 64 levels"),
        ("gate deep JSON", ["gate", str(tmp / "deep.json"), "-b", RESULTS], 1, r"nested deeper than 64"),
        ("replay deep JSON", ["gpu-util", "--replay", str(tmp / "deep.json"), "--json", d + "/g.json"], 1,
         r"nested deeper than 64"),
        ("floor steps-from deep JSON", ["floor", "--steps-from", str(tmp / "deep.json")], 1, r"nested deeper than 64"),
        # the audit's one-liners (issue 44): options twice, empty strings, options another backend ignores
        ("option given twice", ["floor", "--ctx", "1k", "--ctx", "2k"], 1,
         r"--ctx given more than once: give each option once \(only the last would count\)"),
        ("option given twice with =", ["commit", "--ctx=256", "--budget", "4", "--budget=8"], 1,
         r"--budget given more than once"),
        ("flag pair given twice", ["commit", "--ctx", "256", "--graphs", "--no-graphs"], 1,
         r"--graphs/--no-graphs given more than once"),
        ("floor gpu empty", ["floor", "--gpu", ""], 1, r"unknown GPU ''"),
        ("diagnose gpu empty", ["diagnose", "--ctx", "256", "--gpu", ""], 1, r"unknown GPU ''"),
        ("serve max-ctx empty", ["serve", "--max-ctx", "", "--port", "39218"], 1, r"bad token count ''"),
        ("serve max-body bad", ["serve", "--max-body", "12x", "--port", "39218"], 1,
         r"--max-body: bad byte count '12x'"),
        ("preset budget with sglang", ["commit", "--backend", "sglang", "--url", "http://127.0.0.1:9", "--preset",
                                       "k2", "--budget", "4"], 1,
         r"--preset, --budget: engine options, ignored with --backend sglang .*: drop them$"),
        ("attn with vllm", ["diagnose", "--backend", "vllm", "--url", "http://127.0.0.1:9", "--attn", "split"], 1,
         r"--attn: engine option, ignored with --backend vllm"),
        ("model with the engine", ["diagnose", "--ctx", "256", "--model", "kimi-k2"], 1,
         r"--model: the engine backend's floor uses the engine's own model"),
        ("diagnose max-new-tokens 0", ["diagnose", "--ctx", "256", "--max-new-tokens", "0"], 1,
         r"--max-new-tokens must be at least 2, got 0"),
        # numbers in results files: report and gate refuse what floor --steps-from refuses (one check)
        ("report commit length -3", ["report", str(tmp / "neg.json"), "-o", d + "/r.html"], 1,
         r"neg\.json: row 1 of this commit file: 'commit_len' is -3\.0 tokens/step \(must be >= 1\)$"),
        ("floor steps-from commit length -3", ["floor", "--steps-from", str(tmp / "neg.json")], 1,
         r"neg\.json: row 1 of this commit file: 'commit_len' is -3\.0 tokens/step \(must be >= 1\)$"),
        ("report commit length 99999", ["report", str(tmp / "huge.json"), "-o", d + "/r.html"], 1,
         r"huge\.json: row 1 of this commit file: 'commit_len' is 99999 tokens/step \(must be <= max_new_tokens, 16\)$"),
        ("report negative step time", ["report", str(tmp / "negtime.json"), "-o", d + "/r.html"], 1,
         r"negtime\.json: row 1 of this commit file: 'decode_ms_per_step' is -0\.5 ms \(must be >= 0\)$"),
        ("gate commit length -3", ["gate", str(tmp / "neg.json"), "-b", RESULTS], 1, r"neg\.json: row 1 of this commit file: 'commit_len' is -3\.0 tokens/step \(must be >= 1\)$"),
        # the review of 2026-12-06: refused before anything is measured or written
        ("advise unknown path", ["advise", "--device", "cpu", "--paths", "foo", "--ctx", "1k"], 1,
         r"--paths: unknown attention path 'foo'; known: reference, paged"),
        ("advise steps 0", ["advise", "--device", "cpu", "--steps", "0", "--ctx", "1k,4k"], 1,
         r"steps must be at least 1, got 0$"),
        ("advise preset foo", ["advise", "--device", "cpu", "--preset", "foo", "--ctx", "1k"], 1,
         r"unknown preset 'foo'"),
        ("advise heads 0", ["advise", "--device", "cpu", "--heads", "0", "--ctx", "1k"], 1, r"heads must be >= 1, got 0"),
        ("advise empty path label", ["advise", "--step-ms", "100", "--commit-len", "4", "--ctx", "8k", "--path", ""], 1,
         r"--path: an empty label: give a name"),
        ("advise blank text label", ["advise", "--step-ms", "100", "--commit-len", "4", "--ctx", "8k", "--text", " "], 1,
         r"--text: an empty label: give a name"),
        ("floor out earlier results", ["floor", "--ctx", "1k", "-o", str(tmp / "s.json")], 1,
         r"--out .*s\.json: already holds results written earlier \(give another path, or --force"),
        ("report out another file", ["report", RESULTS, "-o", str(tmp / "r.html")], 1,
         r"--out .*r\.html: already holds a file that is not a ddprobe report \(give another path, or --force"),
        ("floor ctx twice", ["floor", "--ctx", "32k,32k"], 1, r"--ctx: a context is given twice \(32k\): give each"),
        ("bench ctx twice", ["bench", "verify", "--ctx", "1k,1024"], 1, r"--ctx: a context is given twice \(1k\)"),
        ("diagnose ctx twice", ["diagnose", "--ctx", "4k,4k"], 1, r"--ctx: a context is given twice \(4k\)"),
        ("advise ctx twice", ["advise", "--ctx", "8k,8k", "--step-ms", "100,110", "--commit-len", "4"], 1,
         r"--ctx: a context is given twice \(8k\)"),
        ("gate ctx twice", ["gate", RAW, "-b", BASE, "--ctx", "1k,1k"], 1, r"--ctx: a context is given twice \(1k\): give each context once$"),
        ("floor ctx twice with steps", ["floor", "--ctx", "32k,32k", "--step-ms", "100,110"], 1,
         r"--ctx: a context is given twice"),
        ("gate heads 0", ["gate", RAW, "-b", BASE, "--heads", "0"], 1, r"--heads: bad head count '0': expected a whole"),
        ("advise from at another budget", ["advise", "--from", RESULTS, "--budget", "4", "--decode-ms", "5"], 1,
         r"--budget 4: .*commit-tiny-cpu\.json was measured at tree budget 8 \(config\.budget\): drop --budget$"),
        ("floor config and model", ["floor", "--config", str(tmp / "s.json"), "--model", "nope"], 1,
         r"give --model or --config, not both"),
        ("report a file twice", ["report", RESULTS, RESULTS, "-o", d + "/r.html"], 1,
         r"commit-tiny-cpu\.json: given twice \(as .*commit-tiny-cpu\.json too\): give each results file once$"),
        # the audit of 2026-12-07: usage errors in one line (not click's usage block and boxed message), a gpu-util
        # file's context checked where its step time is
        ("usage: unknown option", ["floor", "--bogus"], 2, r"No such option: --bogus .*\(see \S*.*floor --help\)$"),
        ("usage: not an integer", ["floor", "--tp", "abc"], 2, r"Invalid value for '--tp'.*\(see .*floor --help\)$"),
        ("usage: no such command", ["nosuchcmd"], 2, r"No such command 'nosuchcmd'\. \(see .* --help\)$"),
        ("usage: missing argument", ["report"], 2, r"Missing argument 'RESULTS\.\.\.'|Missing argument"),
        ("usage: option without its value", ["bench", "verify", "--ctx"], 2, r"Option '--ctx' requires an argument"),
        ("floor steps-from gpu-util prompt_len 'x'", ["floor", "--steps-from", str(tmp / "plen.json")], 1,
         r"plen\.json: this gpu-util file's config\.prompt_len is 'x': not a context \(1 to 2\^30 tokens\)$"),
        ("report commit_len_p10 1e308", ["report", str(tmp / "p10huge.json"), "-o", d + "/r.html"], 1,
         r"p10huge\.json: row 1 of this commit file: 'commit_len_p10' is 1e\+308 tokens/step \(must be <= 9, as the "
         r"tree budget is 8\)$"),
        ("gate accepted_depth 9 at budget 8", ["gate", str(tmp / "depthhuge.json"), "-b", RESULTS], 1,
         r"'accepted_depth' is 9 tokens/step \(must be <= 8, as the tree budget is 8\)$"),
        ("report tokens_per_s 1e308", ["report", str(tmp / "tpshuge.json"), "-o", d + "/r.html"], 1,
         r"'tokens_per_s' is 1e\+308 tokens/s \(must be <= 1e\+07\)$"),
        ("bench allreduce graphs on the cpu", ["bench", "allreduce", "--graphs", "--device", "cpu", "-o", d + "/a.json"],
         1, r"--graphs replays CUDA graphs: it needs --device cuda \(gloo on the CPU runs eager\)$"),
        ("diagnose max-new-tokens below one step", ["diagnose", "--ctx", "256", "--max-new-tokens", "2"], 1,
         r"--max-new-tokens 2: too few for a commit length at budget 8 \(the first token is the prefill's, a step "
         r"commits up to 9\): give 10 or more$"),
        ("advise from cells shorter than one step", ["advise", "--from", str(tmp / "short.json"), "--decode-ms", "5",
                                                     "-o", d + "/a.json"], 1,
         r"short\.json: its cells decoded 2 tokens, too few for a commit length at budget 8 \(one verify step needs "
         r"10 with the prefill's token\): measure it again with more --max-new-tokens$"),
        ("gate paths with an empty name", ["gate", RAW, "-b", BASE, "--paths", "split,,paged"], 1,
         r"--paths 'split,,paged': an empty name between commas; give names like split,paged$"),
        ("advise from a file of budget -1", ["advise", "--from", str(tmp / "bneg.json"), "--decode-ms", "5", "-o",
                                             d + "/a.json"], 1,
         r"bneg\.json: this commit file's config\.budget is -1: not a whole number >= 1$"),
        ("advise from a file of budget 2000", ["advise", "--from", str(tmp / "bbig.json"), "--decode-ms", "5", "-o",
                                               d + "/a.json"], 1,
         r"bbig\.json: config\.budget is 2000: not a tree budget \(1\.\.1024\)$"),
        # messages
        ("seed overflow", ["commit", "--ctx", "256", "--seed", "99999999999999999999999"], 1,
         r"--seed: must be in 0\.\.18446744073709551615"),
        ("unknown attn lists verify paths", ["commit", "--ctx", "256", "--attn", "nope"], 1,
         r"known: auto, reference, paged, sglang, split, split_ws, flashmla$"),
    ]


@pytest.fixture
def tmp(tmp_path):
    """Also, all inside ``tmp_path`` (never the machine's /dev): a page ``r.html`` (not a report), a character device
    ``null`` (1:3, as /dev/null),
    a FIFO, a symlink to ``file``, a symlink loop, a results file ``s.json``, a gpu-util file ``g.json``, JSON
    nested 100 deep and a diagnose folder ``earlier`` holding a ``commit.json``."""
    import os
    import shutil
    import stat

    (tmp_path / "dir").mkdir()
    (tmp_path / "dir.html").mkdir()
    (tmp_path / "file").write_text("not a folder\n")
    (tmp_path / "r.html").write_text("<html>a page of the user's, not a report</html>\n")
    os.mknod(tmp_path / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    os.mkfifo(tmp_path / "fifo")
    os.symlink(tmp_path / "file", tmp_path / "link")
    os.symlink(tmp_path / "loop", tmp_path / "loop")
    shutil.copy(DATA / "commit-tiny-cpu.json", tmp_path / "s.json")
    shutil.copy(REPLAY, tmp_path / "g.json")
    (tmp_path / "deep.json").write_text("[" * 100 + "]" * 100)
    for name, change in (("neg.json", {"commit_len": -3.0}), ("huge.json", {"commit_len": 99999.0}),
                         ("negtime.json", {"decode_ms_per_step": -0.5}), ("p10huge.json", {"commit_len_p10": 1e308}),
                         ("depthhuge.json", {"accepted_depth": 9.0}), ("tpshuge.json", {"tokens_per_s": 1e308})):
        d = json.loads((DATA / "commit-tiny-cpu.json").read_text())
        d["rows"][0].update(change)
        (tmp_path / name).write_text(json.dumps(d))
    c = json.loads((DATA / "commit-tiny-cpu.json").read_text())
    for row in c["rows"]:  # cells of 2 tokens: a commit length of 1.00 whatever the drafter
        row.update(max_new_tokens=2, commit_len=1.0, ran_commit_len=None, spine_commit_len=None)
    (tmp_path / "short.json").write_text(json.dumps(c))
    c["config"]["budget"] = -1
    (tmp_path / "bneg.json").write_text(json.dumps(c))
    c["config"]["budget"] = 2000
    (tmp_path / "bbig.json").write_text(json.dumps(c))
    g = json.loads(Path(REPLAY).read_text())
    g["config"]["prompt_len"] = "x"
    (tmp_path / "plen.json").write_text(json.dumps(g))
    (tmp_path / "earlier").mkdir()
    shutil.copy(DATA / "commit-tiny-cpu.json", tmp_path / "earlier" / "commit.json")
    return tmp_path


def _kinds(tmp: Path) -> dict:
    """What each special file is, to check that a refused run left it as it was."""
    import os

    return {p.name: os.lstat(p).st_mode for p in tmp.iterdir()}


@pytest.mark.parametrize("case", [c[0] for c in _cases(Path("/x"))])
def test_bad_input(case, tmp):
    _, args, code, pattern = next(c for c in _cases(tmp) if c[0] == case)
    before, kinds = sorted(p.name for p in tmp.rglob("*")), _kinds(tmp)
    r = CliRunner().invoke(app, args, env={"COLUMNS": "400", "OMP_NUM_THREADS": "1"})
    text = r.stderr + r.stdout
    if code is None:  # a case that must succeed (--force given)
        assert r.exit_code == 0, (args, text)
        return
    assert _kinds(tmp) == kinds  # every device, FIFO and link still what it was
    assert r.exit_code == code, (args, r.exit_code, text)
    assert r.exception is None or isinstance(r.exception, SystemExit), (args, repr(r.exception))
    assert "Traceback" not in text
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) >= 1 and re.search(pattern, lines[-1]), (pattern, r.stderr)
    assert lines[-1].startswith("error: ")
    if code == 2:  # a usage error: that one line is all
        assert len(lines) == 1, r.stderr
    assert sorted(p.name for p in tmp.rglob("*")) == before  # refused before anything was written


def test_graphs_on_cpu_refused():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: --graphs is valid here")
    r = CliRunner().invoke(app, ["commit", "--ctx", "256", "--graphs"], env={"OMP_NUM_THREADS": "1"})
    assert r.exit_code == 1 and "--graphs replays CUDA graphs: it needs --device cuda" in r.stderr


def test_auto_only_beside_what_was_automatic(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    r = CliRunner().invoke(app, ["commit", "--ctx", "256", "--text", "predictable", "--max-new-tokens", "2",
                                 "--dtype", "fp32", "--json", str(tmp_path / "c.json")], env={"OMP_NUM_THREADS": "1"})
    assert r.exit_code == 0, r.output
    assert "engine: device cpu (auto), dtype fp32, attn reference (auto), 1 thread (OMP_NUM_THREADS)" in r.stderr
    assert "attn reference: the fastest path that runs this model on the CPU in fp32 (the Triton paths run on " \
           "the CPU only under TRITON_INTERPRET, slowly)" in r.stderr  # why auto chose it, in one line


def test_piped_output_ends_in_a_newline_without_a_blank_line(tmp_path):
    """stdout a pipe: the table once, each line ending in a newline, no line of spaces at the end."""
    import os

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1])}
    p = subprocess.run([sys.executable, "-m", "ddprobe", "commit", "--ctx", "256", "--text", "predictable",
                        "--max-new-tokens", "2", "--json", str(tmp_path / "c.json")], capture_output=True, text=True,
                       env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.endswith("\n") and p.stdout.count("commit length, batch 1 (") == 1
    last_lines = p.stdout.rstrip("\n").split("\n")[-3:]
    assert all(line.strip() for line in last_lines), repr(last_lines)
    assert last_lines[-1].endswith("written to " + str(tmp_path / "c.json"))


def test_attention_paths_listed_from_one_table():
    """--help, the README and the error list the same verify paths, from ``ddprobe.verify_paths``."""
    from ddprobe import verify_paths
    from ddprobe.engine import kernels

    names = verify_paths.verify_names()
    assert "prefill" not in names and set(names) < set(kernels.available())
    r = CliRunner().invoke(app, ["commit", "--help"], env={"COLUMNS": "400"})
    flat = " ".join(r.stdout.replace("│", " ").split())
    assert " ".join(verify_paths.attn_help().split()) in flat
    readme = " ".join((Path(__file__).parents[1] / "README.md").read_text().split())
    assert "--attn auto|" + "|".join(names) in readme
    r = CliRunner().invoke(app, ["commit", "--attn", "nope", "--ctx", "1k"])
    assert r.exit_code == 1 and ", ".join(names) in r.output


def test_report_error_names_the_report_not_its_temporary_file(tmp_path):
    """A report that cannot be written (a folder of that name, found only at write time) names the report."""
    from ddprobe.reports.render import build, write
    from ddprobe.units import DDProbeError

    target = tmp_path / "r.html"
    target.mkdir()
    with pytest.raises(DDProbeError, match=r"cannot write report .*r\.html: it is a directory") as e:
        write(build([RESULTS]), target)
    assert ".tmp" not in str(e.value) and not list(tmp_path.glob(".*.tmp"))


# ---- numbers that cannot be right --------------------------------------------------------------------------

def test_fp16_rmsnorm_does_not_overflow():
    """fp16 squares overflow above 256: the norm of a residual in the thousands must still match fp32's."""
    import torch

    from ddprobe.engine.layers import RMSNorm

    x = torch.randn(4, 256, generator=torch.Generator().manual_seed(1)) * 3000
    norm = RMSNorm(256)
    ref = norm(x)
    got = norm(x.half())
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.float(), ref, rtol=2e-3, atol=2e-3)


def test_fp16_on_the_cpu_decodes_what_fp32_decodes():
    """The tiny preset's trained weights in fp16 on the CPU: the same greedy tokens as fp32 (they were all id 0
    before the norm's variance moved to fp32), and no cell flagged."""
    from ddprobe.probes.commit import prompt_ids
    from ddprobe.probes.backends.engine import EngineBackend
    from ddprobe.probes.backends.sanity import suspect

    outs = {}
    for dtype in ("fp32", "fp16"):
        be = EngineBackend(dtype=dtype, device="cpu", max_ctx=1024, threads=1)
        ids = prompt_ids(be, "predictable", 512)
        st = be.generate(ids, 24)
        outs[dtype] = st.tokens
        assert suspect(st.tokens, be.logits_problem(ids + st.tokens)) is None
    assert outs["fp16"] == outs["fp32"] and len(set(outs["fp32"])) > 1


def test_broken_weights_flag_the_cell(tmp_path):
    """An engine whose lm_head went non-finite: the commit probe still writes the cell, flagged ``suspect`` with
    both reasons, and the CLI marks it."""
    import torch

    from ddprobe.probes.commit import run_commit_probe
    from ddprobe.probes.backends.engine import EngineBackend
    from ddprobe.probes.backends.sanity import suspect_notes
    from ddprobe.results import Result, ResultWriter, RunMeta

    be = EngineBackend(dtype="fp32", device="cpu", max_ctx=1024, threads=1)
    with torch.no_grad():
        be.engine.target.lm_head.weight.fill_(math.nan)
    w = ResultWriter(Result(kind="commit", meta=RunMeta.collect(probe_gpu=False)), tmp_path / "c.json")
    rows = run_commit_probe(be, [256], ["novel"], 16, w)
    why = rows[0]["suspect"]
    assert why and "every one of its 16 output tokens is id" in why and "logits are not finite" in why
    assert Result.load(tmp_path / "c.json").rows[0]["suspect"] == why
    assert suspect_notes(rows)[0].startswith("novel @ 256 is suspect: ")

    import io

    from rich.console import Console

    from ddprobe.cli.commit import commit_table

    table, add = commit_table("t", narrow=False)
    add(rows[0])
    shown = io.StringIO()
    Console(file=shown, width=200).print(table)
    assert re.search(r"novel +256 .* 1\.\d\d ! ", shown.getvalue()), shown.getvalue()


def test_healthy_cells_are_not_flagged():
    from ddprobe.probes.backends.sanity import logits_problem, suspect

    import torch

    assert suspect([5, 6, 5, 6, 5, 6, 5, 6]) is None and suspect([3] * 4) is None  # short outputs: no call
    assert suspect([3] * 8) == "every one of its 8 output tokens is id 3"
    assert logits_problem(torch.zeros(10)) == "all equal"
    assert logits_problem(torch.tensor([0.0, math.inf])) == "not finite"
    assert logits_problem(torch.tensor([0.0, 1.0])) is None


@pytest.mark.parametrize("args, says", [
    (["--attn", "split_ws"], "--attn split_ws cannot run the tiny preset here: split_ws takes MLA rows of 512 + 64; "
                             "this model's are 64 + 32"),
    (["--attn", "flash"], "--attn: unknown attention path 'flash'; known: auto, reference"),
    (["--weights", "trained", "--preset", "k2"], "--weights trained: the k2 preset ships no trained weights"),
    (["--ctx", "300k"], "context 300k (307,200 tokens) + 128 new tokens is beyond the 270,336 tokens the tiny preset"),
])
def test_engine_refusals_come_before_the_engine_is_built(tmp_path, args, says):
    """What the engine would refuse is refused in one line before it is built: no warm-up, no results file."""
    r = CliRunner().invoke(app, ["commit", *args, "--json", str(tmp_path / "c.json")], env={"OMP_NUM_THREADS": "1"})
    assert r.exit_code == 1 and says in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "warm-up" not in r.stderr
    assert not (tmp_path / "c.json").exists()


def test_atomic_write_never_replaces_a_special_file(tmp):
    """The atomic write itself (every results file, CSV and report goes through it) refuses what the output
    checks refuse: a command that skipped them still cannot turn a device, FIFO or link into a regular file."""
    import stat

    from ddprobe.jsonfile import write_text_atomic
    from ddprobe.units import DDProbeError

    for name, why in (("null", "is a character device"), ("fifo", "is a FIFO"), ("link", "is a symbolic link"),
                      ("loop", "is a symbolic link")):
        before = os.lstat(tmp / name).st_mode
        with pytest.raises(DDProbeError, match=why):
            write_text_atomic(tmp / name, "x\n")
        assert os.lstat(tmp / name).st_mode == before and not stat.S_ISREG(before)
    with pytest.raises(DDProbeError, match="is under /proc"):
        write_text_atomic("/proc/self/ddprobe-never.json", "x\n")
    assert not [p for p in tmp.iterdir() if p.name.endswith(".tmp")]  # no temporary file left behind


def test_force_replaces_an_input_on_purpose(tmp):
    """--force is the one way to write over an input: floor --steps-from s.json --out s.json --force replaces the
    commit file with the floor's (the user asked)."""
    r = CliRunner().invoke(app, ["floor", "--steps-from", str(tmp / "s.json"), "--out", str(tmp / "s.json"),
                                 "--force"], env={"COLUMNS": "400"})
    assert r.exit_code == 0, r.output
    assert json.loads((tmp / "s.json").read_text())["kind"] == "floor"


def test_report_renders_again_over_its_own_report_only(tmp_path):
    """`report -o` writes over a report ddprobe wrote (re-rendering after more results is the normal loop), html and
    md alike; a file that is no report needs --force (results files are refused as inputs or by their kind)."""
    for name in ("r.html", "r.md"):
        out = tmp_path / name
        for _ in range(2):
            r = CliRunner().invoke(app, ["report", RESULTS, "-o", str(out)], env={"COLUMNS": "200"})
            assert r.exit_code == 0, r.output
    page = tmp_path / "page.html"
    page.write_text("<html>mine</html>\n")
    r = CliRunner().invoke(app, ["report", RESULTS, "-o", str(page)])
    assert r.exit_code == 1 and page.read_text() == "<html>mine</html>\n"
    assert CliRunner().invoke(app, ["report", RESULTS, "-o", str(page), "--force"]).exit_code == 0


def test_md_report_images_never_replace_a_file_it_did_not_write(tmp_path):
    """A .md report's images go to ``<stem>_files/``: a file there of the user's name-alike is kept (one line, exit 1,
    nothing written) unless --force; rendering again over its own report replaces its own images and removes the
    ones the new render no longer has (the audit of 2026-12-07: a user's PNG was replaced silently, stale ones
    stayed)."""
    floor = str(DATA / "floor-rtx-pro-6000-tp8.json")
    out, folder = tmp_path / "r.md", tmp_path / "r_files"
    r = CliRunner().invoke(app, ["report", RESULTS, floor, "-o", str(out)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    both = sorted(p.name for p in folder.iterdir())
    assert len(both) >= 2, both
    r = CliRunner().invoke(app, ["report", RESULTS, "-o", str(out)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    one = sorted(p.name for p in folder.iterdir())
    assert len(one) == 1 and set(one) < set(both), (one, both)  # the floor's images left with the floor
    assert f"r_files/{one[0]}" in out.read_text()
    mine = tmp_path / "mine.md"
    (tmp_path / "mine_files").mkdir()
    user = tmp_path / "mine_files" / one[0]
    user.write_bytes(b"the user's own picture")
    r = CliRunner().invoke(app, ["report", RESULTS, "-o", str(mine)], env={"COLUMNS": "400"})
    assert r.exit_code == 1 and not mine.exists() and user.read_bytes() == b"the user's own picture", r.output
    assert re.search(r"^error: report .*mine\.md: .*mine_files/.*\.png is there and no earlier render of this report "
                     r"wrote it \(give another --out, or --force to replace it\)$", r.stderr.strip()), r.stderr
    assert CliRunner().invoke(app, ["report", RESULTS, "-o", str(mine), "--force"]).exit_code == 0
    assert user.read_bytes().startswith(b"\x89PNG")


def test_a_group_without_its_command_shows_its_help():
    """``ddprobe`` and ``ddprobe bench`` alone show their help (click's exit 2), not a usage error line: the one-line
    usage errors leave the no-arguments help as it was."""
    for args in ([], ["bench"]):
        r = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
        assert r.exit_code == 2, (args, r.output)
        assert "Usage:" in r.output and "error:" not in r.output, r.output
        assert ("verify" if args else "floor") in r.output
