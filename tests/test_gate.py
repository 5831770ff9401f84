"""`ddprobe gate`: equal results pass, a planted 20% drop and a missing entry fail with exit 1 and name
the entry; absolute floors; filters; bad inputs."""
import copy
import json
import os
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddprobe.cli import app
from ddprobe.reports import gate
from ddprobe.results import Result
from ddprobe.units import DDProbeError, parse_fraction

BASE = Path(__file__).parent / "data" / "bench-verify-synthetic.json"
runner = CliRunner()


def _write(tmp_path, name, edit=None) -> Path:
    d = json.loads(BASE.read_text())
    if edit:
        edit(d)
    p = tmp_path / name
    p.write_text(json.dumps(d))
    return p


def _row(d, path="split", ctx=131072, heads=8, kind=None):
    return next(r for r in d["rows"] if r["path"] == path and r["ctx"] == ctx and r["heads"] == heads
                and r.get("kind") == kind)


def _slow(factor, **where):
    def edit(d):
        r = _row(d, **where)
        r["time_us"] *= factor
        r["GBps"] /= factor
        r.get("TFLOPs") and r.update(TFLOPs=r["TFLOPs"] / factor)
    return edit


def gate_cli(*args):
    return runner.invoke(app, ["gate", *map(str, args)])


def test_equal_results_pass(tmp_path):
    cur = _write(tmp_path, "cur.json")
    r = gate_cli(cur, "--baseline", BASE)
    assert r.exit_code == 0, r.output
    rows = json.loads(BASE.read_text())["rows"]
    peers = sum(1 for x in rows if x["path"] in ("flex", "sdpa"))  # PyTorch's attention: recorded, not gated
    n = len(rows) - peers
    assert peers and f"gate passed: {n} entries within 10% ({peers} peer entries for reference, not gated)" \
        in r.output and "REGRESSED" not in r.output
    assert r.output.count(" ok ") >= n and r.output.count(" ref ") >= peers  # every entry with its change


def test_planted_20_percent_drop_fails(tmp_path):
    cur = _write(tmp_path, "cur.json", _slow(1.25))  # 1.25x the time = 20% less bandwidth
    r = gate_cli(cur, "--baseline", BASE)
    assert r.exit_code == 1
    assert ("REGRESSED: split heads=8 ctx=128k on NVIDIA H200: 20.0% less throughput than the baseline (time +25.0%; "
            "limit 10%)") in r.output
    assert "gate FAILED: 1 of" in r.output and "-20.0%" in r.output and "+25.0%" in r.output
    assert gate_cli(cur, "--baseline", BASE, "--max-drop", "25%").exit_code == 0
    assert gate_cli(cur, "--baseline", BASE, "--paths", "paged").exit_code == 0  # filter leaves it out


def test_small_drop_and_speedup_pass(tmp_path):
    cur = _write(tmp_path, "cur.json", lambda d: (_slow(1.05)(d), _slow(0.5, path="paged")(d)))
    assert gate_cli(cur, "--baseline", BASE).exit_code == 0


def test_missing_entry_fails_and_names_it(tmp_path):
    def drop(d):
        d["rows"].remove(_row(d, path="paged", ctx=32768, heads=64))
    cur = _write(tmp_path, "cur.json", drop)
    r = gate_cli(cur, "--baseline", BASE)
    assert r.exit_code == 1
    assert "MISSING: paged heads=64 ctx=32k on NVIDIA H200: baseline entry missing in the current run" in r.output
    # the reverse (a new entry in the current run) passes
    assert gate_cli(BASE, "--baseline", cur).exit_code == 0


def test_failed_entry_and_step_regression(tmp_path):
    def edit(d):
        r = _row(d, path="paged", ctx=1024, heads=8)
        r.pop("time_us")
        r["error"] = "OutOfMemoryError: CUDA out of memory"
        _slow(1.5, kind="step")(d)
    r = gate_cli(_write(tmp_path, "cur.json", edit), "--baseline", BASE)
    assert r.exit_code == 1
    assert "FAILED: paged heads=8 ctx=1k on NVIDIA H200: failed in the current run: OutOfMemoryError" in r.output
    assert "REGRESSED: step split heads=8 ctx=128k" in r.output


def test_absolute_floors(tmp_path):
    cur = _write(tmp_path, "cur.json")
    ok = gate_cli(cur, "--baseline", BASE, "--paths", "split", "--ctx", "128k,256k", "--min-bw", "0.5TB/s")
    assert ok.exit_code == 0, ok.output
    r = gate_cli(cur, "--baseline", BASE, "--paths", "split", "--ctx", "128k", "--min-bw", "3.5TB/s")
    gbps = _row(json.loads(BASE.read_text()))["GBps"]  # split, 8 heads, 128k: the entry under the floor
    assert gbps < 3500 and r.exit_code == 1 and f"{gbps / 1e3:.3g} TB/s under --min-bw 3.5 TB/s" in r.output
    assert gate_cli(cur, "--baseline", BASE, "--paths", "split", "--heads", "64", "--ctx", "128k", "--min-bw",
                    "0.5TB/s").exit_code == 0
    assert gate_cli(cur, "--baseline", BASE, "--paths", "split", "--heads", "8", "--ctx", "128k", "--min-bw",
                    "3.5TB/s").exit_code == 1
    r = gate_cli(cur, "--baseline", BASE, "--paths", "split", "--min-fraction-of-floor", "0.8")
    assert r.exit_code == 1 and "of the floor under --min-fraction-of-floor 0.8" in r.output
    assert gate_cli(cur, "--baseline", BASE, "--paths", "split", "--min-fraction-of-floor", "0.02").exit_code == 0


def test_other_gpu_matches_nothing(tmp_path):
    cur = _write(tmp_path, "cur.json", lambda d: d["meta"]["gpus"][0].update(name="NVIDIA H100 80GB HBM3"))
    r = gate_cli(cur, "--baseline", BASE)
    assert r.exit_code == 1 and "baseline ran on NVIDIA H200, the current run on NVIDIA H100 80GB HBM3" in r.output


@pytest.mark.parametrize("args, message", [
    (["--max-drop", "150%"], "bad --max-drop"), (["--max-drop", "ten"], "bad --max-drop"),
    (["--min-bw", "fast"], "bad bandwidth"), (["--min-fraction-of-floor", "2"], "must be in (0, 1]"),
    (["--paths", "nosuch"], "no benchmark entries matching"),
])
def test_bad_options(args, message):
    r = gate_cli(BASE, "--baseline", BASE, *args)
    assert r.exit_code == 1 and message in r.output and "Traceback" not in r.output


def test_bad_files(tmp_path):
    r = gate_cli(tmp_path / "missing.json", "--baseline", BASE)
    assert r.exit_code == 1 and "missing.json" in r.output
    floor = Path(__file__).parent / "data" / "floor-rtx-pro-6000-tp8.json"
    r = gate_cli(floor, "--baseline", BASE)
    assert r.exit_code == 1 and "of kind 'floor'" in r.output


def test_library_outcome():
    base = Result.load(BASE)
    cur = copy.deepcopy(base)
    next(r for r in cur.rows if r["path"] == "split" and r["heads"] == 64 and r["ctx"] == 4096)["GBps"] *= 0.8
    out = gate.compare(cur, base, max_drop=0.1)
    assert not out.passed and [r.label for r in out.failures] == ["split heads=64 ctx=4k on NVIDIA H200"]
    assert out.failures[0].drop == pytest.approx(0.2)
    assert parse_fraction("0.1") == parse_fraction("10%") == pytest.approx(0.1)
    with pytest.raises(DDProbeError, match="bad --max-drop '10': must be at least 0 and below 100%"):
        parse_fraction("10", "--max-drop")


def test_real_h200_benchmark_gates_against_itself_and_a_slower_copy(tmp_path):
    real = Path(__file__).parent / "data" / "bench-verify-h200-raw.json"
    assert gate_cli(real, "--baseline", real).exit_code == 0
    d = json.loads(real.read_text())
    slowed = 0
    for r in d["results"]:
        if r["path"] == "split" and r.get("kind") is None:
            r["us"] *= 1.25
            r["GBps"] /= 1.25
            slowed += 1
    (tmp_path / "slow.json").write_text(json.dumps(d))
    r = gate_cli(tmp_path / "slow.json", "--baseline", real)
    entries = sum(1 for x in d["results"] if "path" in x and x.get("ctx") is not None  # every timed entry of a path
                  and not gate.is_peer(x["path"]))
    assert slowed >= 2 and r.exit_code == 1 and f"gate FAILED: {slowed} of {entries} entries" in r.output


def test_path_names_with_brackets_print_as_text(tmp_path):
    """Variant rows (split_ws[fold_tree=0]) are names, not rich markup: the table shows them whole."""
    def rename(d):
        for r in d["rows"]:
            if r["path"] == "split":
                r["path"] = "split_ws[fold_tree=0]"
    cur = _write(tmp_path, "cur.json", rename)
    r = runner.invoke(app, ["gate", str(cur), "--baseline", str(cur)], env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.output
    assert "split_ws[fold_tree=0]" in r.output


def test_failed_output_check_fails(tmp_path):
    def edit(d):
        _row(d).update(ok=False, rel_err=0.5)
    r = gate_cli(_write(tmp_path, "cur.json", edit), "--baseline", BASE)
    assert r.exit_code == 1, r.output
    assert ("FAILED: split heads=8 ctx=128k on NVIDIA H200: output check against the reference failed in the "
            "current run (rel_err 5.0e-01)") in r.output


@pytest.mark.parametrize("value", ["NaN", "Infinity"])
def test_non_finite_number_refuses_the_file(tmp_path, value):
    """NaN/Infinity are not JSON: the gate refuses the file as ``floor --steps-from`` does (one reader)."""
    cur = _write(tmp_path, "cur.json")
    cur.write_text(cur.read_text().replace('"GBps": ' + str(_row(json.loads(BASE.read_text()))["GBps"]),
                                           f'"GBps": {value}', 1))
    assert value in cur.read_text()
    r = gate_cli(cur, "--baseline", BASE)
    assert r.exit_code == 1, r.output
    assert f"cur.json: {value} is not valid JSON" in r.output and "Traceback" not in r.output


def test_duplicate_entries_are_an_error(tmp_path):
    cur = _write(tmp_path, "cur.json", lambda d: d["rows"].append(copy.deepcopy(_row(d))))
    r = gate_cli(cur, "--baseline", BASE)
    assert r.exit_code != 0 and "Traceback" not in r.output
    assert "current results have two rows for split heads=8 ctx=128k on NVIDIA H200" in r.output
    assert len(r.output.strip().splitlines()) == 1


SHIPPED = Path(__file__).parent.parent / "examples" / "baselines" / "bench-verify-h200.json"
OLD = Path(__file__).parent / "data" / "bench-verify-h200-2026-11-29.json"  # the baseline before split_ws was gated


def _with_split_ws_and_peers(tmp_path, name, edit=None) -> Path:
    """The 2026-11-29 H200 baseline plus what `bench verify --paths paged,split,split_ws,flashmla,flashinfer-fa3,sdpa`
    adds to it: split_ws rows (device plans, the kernel recorded) and the production peers beside them, derived from
    the split rows (times scaled: the gate reads only times and bandwidths), so the file has the real file's shape."""
    d = json.loads(OLD.read_text())
    extra = []
    for r in d["results"]:
        if r["path"] != "split":
            continue
        for path, f, more in (("split_ws", 0.5, dict(plan="device", kernel="cuda")), ("flashmla", 0.6, {}),
                              ("flashinfer-fa3", 0.7, {})):
            x = dict(copy.deepcopy(r), path=path, **more)
            if "us" in x:
                x.update(us=x["us"] * f, GBps=x["GBps"] / f)
            else:
                x.update(step_ms=x["step_ms"] * f, GBps=x["GBps"] / f)
            extra.append(x)
    d["results"] += extra
    if edit:
        edit(d)
    p = tmp_path / name
    p.write_text(json.dumps(d))
    return p


def test_a_baseline_with_split_ws_rows_gates_them_and_records_the_peers_beside(tmp_path):
    """The gate's baseline holds split_ws rows with FlashMLA and FlashInfer recorded beside them: split_ws is gated
    like paged and split; the peers (and SDPA) are shown for reference and never fail the gate, slower, failed or
    missing from a runner without them."""
    base = _with_split_ws_and_peers(tmp_path, "base.json")
    d = json.loads(base.read_text())
    peers = sum(1 for r in d["results"] if r["path"] in ("flashmla", "flashinfer-fa3", "sdpa"))
    gated = len(d["results"]) - peers
    assert sum(1 for r in d["results"] if r["path"] == "split_ws") == 7 and peers == 20  # 6 layers + the step
    r = gate_cli(base, "--baseline", base)
    assert r.exit_code == 0, r.output
    assert f"gate passed: {gated} entries within 10% ({peers} peer entries for reference, not gated)" in r.output

    def peers_worse(d):
        d["results"] = [x for x in d["results"] if x["path"] != "flashinfer-fa3"]  # not installed on the runner
        for x in d["results"]:
            if x["path"] == "flashmla" and "us" in x:
                x.update(us=x["us"] * 2, GBps=x["GBps"] / 2)
            if x["path"] == "sdpa" and x["ctx"] == 1024:
                x.pop("us")
                x["error"] = "OutOfMemoryError: CUDA out of memory"
    r = gate_cli(_with_split_ws_and_peers(tmp_path, "peers.json", peers_worse), "--baseline", base)
    assert r.exit_code == 0, r.output
    assert "REGRESSED" not in r.output and "MISSING" not in r.output and " ref " in r.output

    def slower(d):
        x = next(x for x in d["results"] if x["path"] == "split_ws" and x["ctx"] == 131072 and x.get("heads") == 8
                 and x.get("kind") is None)
        x.update(us=x["us"] * 1.25, GBps=x["GBps"] / 1.25)
    r = gate_cli(_with_split_ws_and_peers(tmp_path, "slow.json", slower), "--baseline", base)
    assert r.exit_code == 1
    assert "REGRESSED: split_ws heads=8 ctx=128k on NVIDIA H200: 20.0% less throughput than the baseline" in r.output
    assert f"gate FAILED: 1 of {gated} entries" in r.output
    r = gate_cli(OLD, "--baseline", base)  # a run without split_ws (the old arguments) misses its rows
    assert r.exit_code == 1 and "MISSING: split_ws heads=64 ctx=16k" in r.output


def test_peers_are_the_paths_ddprobe_does_not_own():
    """Gated: ddprobe's own verify paths (variants count as their path); shown for reference: the peers and SGLang's
    own kernels (another project's code, measured beside ddprobe's), so a runner without sglang still passes."""
    assert [gate.is_peer(p) for p in ("paged", "split", "split_ws", "split_ws[tail=0]")] == [False] * 4
    assert [gate.is_peer(p) for p in ("sglang", "flashmla", "flashinfer-fa3", "sdpa", "flex")] == [True] * 5


def _no_variants(args: str) -> str:
    return re.sub(r" --variant \S+", "", args)


def test_the_shipped_baseline_gates_the_kernel_the_engine_runs():
    """The committed baseline is a real run of the workflow's benchmark (examples/ci-gpu.yml's BENCH_ARGS): split_ws,
    split and paged rows planned as the engine plans them (device plans), each split_ws row on the kernel
    ``split_ws.choose`` gives its shape (the tail kernel for 8 heads from a 64k bound, else the CUDA kernel), the
    step included, and split's portable builds (``split[build=...]``, proxies of the sm_120 and sm_80 code) beside
    them; FlashMLA and the other peers recorded beside them pass as references (sglang and FlashInfer were not
    installed for this run: skipped rows, which pass)."""
    import re

    from ddprobe.engine.kernels import split_ws

    d = json.loads(SHIPPED.read_text())
    args = re.search(r"^ *BENCH_ARGS: *(.+)$", (SHIPPED.parent.parent / "ci-gpu.yml").read_text(), re.M).group(1)
    assert d["meta"]["command"] == f"ddprobe bench verify {args} --out examples/baselines/{SHIPPED.name}"
    ws = [r for r in d["results"] if r["path"] == "split_ws"]
    assert len(ws) == 11 and all(r["plan"] == "device" for r in ws)  # 5 contexts x 2 head counts + the step
    rows = {r["rows"] for r in d["results"] if "rows" in r}  # query rows per head (the budget + 1), one per run
    assert len(rows) == 1
    (r_per_head,) = rows
    assert all(r["kernel"] == split_ws.choose(r["heads"] * r_per_head, r["ctx"])[1] for r in ws)
    assert {r["kernel"] for r in ws} == {"cuda", "tail"}
    assert all(r.get("plan") == "device" for r in d["results"] if r["path"] in ("paged", "split") and "us" in r)
    assert all("us" in r or "step_ms" in r for r in d["results"] if r["path"] == "flashmla")  # measured
    port = [r for r in d["results"] if r["path"].startswith("split[build=")]
    assert len(port) == 20 and all(r["proxy"].startswith("proxy: ") and r["ok"] for r in port)
    assert {r["kernel"] for r in port} == {"portable sm_120", "portable sm_80"}
    r = gate_cli(SHIPPED, "--baseline", SHIPPED)
    assert r.exit_code == 0, r.output
    assert "gate passed: 53 entries within 10% (43 peer entries for reference, not gated)" in r.output
    r = gate_cli(SHIPPED, "--baseline", SHIPPED, "--paths", "flashmla")  # peers alone: nothing would be guarded
    assert r.exit_code == 1 and "the baseline has only peers' entries matching --paths/--ctx/--heads" in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_the_baselines_command_is_the_workflows_and_parses(tmp_path):
    """examples/baselines/README.md gives the command that regenerates the baseline: the same benchmark arguments as
    the workflow's BENCH_ARGS (the gate matches entries, so the two must not drift), split_ws and the peers among
    them; `bench verify` accepts every option (on the CPU it gets as far as the CUDA check)."""
    import re
    import shlex

    examples = SHIPPED.parent.parent
    workflow = re.search(r"^ +BENCH_ARGS: (.+)$", (examples / "ci-gpu.yml").read_text(), re.M).group(1).split()
    text = (SHIPPED.parent / "README.md").read_text().replace("\\\n", " ")
    command = shlex.split(re.search(r"ddprobe bench verify (.+)", text).group(1))
    i = command.index("--out")
    assert re.fullmatch(r"examples/baselines/bench-verify-h[12]00\.json", command[i + 1])
    assert command[:i] + command[i + 2:] == workflow
    assert {"paged", "split", "split_ws", "flashmla", "flashinfer-fa3"} <= set(workflow[workflow.index("--paths") + 1]
                                                                               .split(","))
    import torch
    if not torch.cuda.is_available():
        r = runner.invoke(app, ["bench", "verify", *workflow, "--out", str(tmp_path / "b.json")])
        assert r.exit_code == 1 and "needs a CUDA GPU" in r.output, r.output


def test_a_folder_of_baselines_gates_against_the_card_the_run_used(tmp_path):
    """``--baseline FOLDER``: the baseline whose GPU (the name in its meta) is the current run's; a run on a card the
    folder has no baseline for is one line naming the cards it has; JSON that is no results file is passed over, a
    damaged file is named."""
    import shutil

    folder = tmp_path / "baselines"
    folder.mkdir()
    for f in SHIPPED.parent.glob("*.json"):  # the shipped baselines, one per card
        shutil.copy(f, folder / f.name)
    (folder / "notes.json").write_text("{}")
    # another benchmark kind of the same card, sorted first (the H100's real `bench launch` file): never a verify baseline
    shutil.copy(Path(__file__).parent / "data" / "launch" / "bench-launch-h100.json", folder / "a-launch-h100.json")
    d = json.loads(SHIPPED.read_text())
    d["meta"]["gpu"] = "NVIDIA Made-Up 1"
    (tmp_path / "other.json").write_text(json.dumps(d))
    cards = {}
    for f in sorted(SHIPPED.parent.glob("bench-verify-*.json")):
        gpu = json.loads(f.read_text())["meta"]["gpu"]
        cards[gpu] = f
        assert gate.baseline_for(gate.load_one(f), folder).name == f.name
        r = gate_cli(f, "--baseline", folder)
        assert r.exit_code == 0 and "gate passed" in r.output, r.output
    assert len(cards) == len(list(SHIPPED.parent.glob("bench-verify-*.json")))  # one file per card
    r = gate_cli(tmp_path / "other.json", "--baseline", folder)
    assert r.exit_code == 1 and len(r.output.strip().splitlines()) == 1
    assert "no bench-verify baseline in" in r.output and "NVIDIA Made-Up 1" in r.output and "NVIDIA H200" in r.output
    assert "NVIDIA H100 80GB HBM3 (bench-verify-h100.json)" in r.output and "a-launch" not in r.output
    # a damaged file there (a truncated copy of a baseline) is named, never passed over: it may be this card's
    (folder / "bench-verify-h200.json").write_text(SHIPPED.read_text()[:500])
    for cur in sorted(SHIPPED.parent.glob("bench-verify-*.json")):
        r = gate_cli(cur, "--baseline", folder)
        assert r.exit_code == 1 and len(r.output.strip().splitlines()) == 1, r.output
        assert re.search(r"baselines holds a file that cannot be read: .*bench-verify-h200\.json: not valid JSON",
                         " ".join(r.output.split())), r.output


def test_variant_names_are_printed_as_they_are(tmp_path):
    """A variant's name (split[build=sm_120]) is text, not terminal markup: every line names it whole, and the
    verdict counts the failures by kind."""
    root = Path(__file__).parent.parent
    r = runner.invoke(app, ["gate", str(root / "tests/data/bench-verify-h200-raw.json"), "--baseline",
                            str(root / "examples/baselines/bench-verify-h200.json"), "--heads", "8", "--ctx", "1k"],
                      env={"COLUMNS": "400"})
    assert r.exit_code == 1, r.output
    assert "MISSING: split[build=sm_120] heads=8 ctx=1k on NVIDIA H200" in r.stderr, r.stderr
    assert "MISSING: split[build=sm_80] heads=8 ctx=1k on NVIDIA H200" in r.stderr
    assert "\\[" not in r.output  # no markup escapes shown
    assert "gate FAILED: 4 of 5 entries (1 REGRESSED, 3 MISSING)" in r.stdout


def test_entries_never_compared_are_counted_apart_not_as_within(tmp_path):
    """A baseline of one entry against the shipped H200 baseline: one entry is within 10%, the other 52 gated
    entries are new (nothing to compare them with), said so, not counted as within 10%. In a fresh process."""
    import subprocess
    import sys

    d = json.loads(SHIPPED.read_text())
    one = next(r for r in d["results"] if r["path"] == "split" and "us" in r)
    d["results"] = [one]
    base = tmp_path / "one.json"
    base.write_text(json.dumps(d))
    p = subprocess.run([sys.executable, "-m", "ddprobe", "gate", str(SHIPPED), "--baseline", str(base)],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert p.returncode == 0, p.stdout + p.stderr
    last = p.stdout.strip().splitlines()[-1]
    assert last == ("gate passed: 1 entry within 10%, 52 new (not compared) (43 peer entries for reference, not "
                    "gated)"), last
