"""Typed results: one schema per kind (ddprobe/schema.py), checked when a probe writes and when a command reads;
older files upgraded on load; a file that breaks the schema refused in one line naming the file, row and field."""
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddprobe import schema
from ddprobe.cli import app
from ddprobe.reports.load import load_one
from ddprobe.results import Result, ResultWriter, RunMeta
from ddprobe.units import DDProbeError

ROOT = Path(__file__).parent.parent
SHIPPED = sorted((ROOT / "examples").rglob("*.json")) + sorted((ROOT / "tests" / "data").glob("*.json"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_file_loads_typed_and_saves_as_today(path, tmp_path):
    """Version-1 files (and the raw `bench verify` document) load with every row typed, and save again as
    version 2 with the same rows."""
    r = load_one(path)
    assert r.schema == schema.SCHEMA
    recs = r.records
    assert len(recs) == len(r.rows) and all(isinstance(x, schema.KINDS[r.kind]) for x in recs)
    back = Result.load(r.save(tmp_path / "again.json"))
    assert back.rows == r.rows and json.loads((tmp_path / "again.json").read_text())["schema"] == "ddprobe.result/2"


def test_old_keys_are_upgraded_on_load():
    floor = Result.load(ROOT / "examples/diagnose-h200/k2/floor.json")  # v1: floor_ms was the attention's
    old = json.loads((ROOT / "examples/diagnose-h200/k2/floor.json").read_text())["rows"][0]
    assert floor.records[0].attn_floor_ms == old["floor_ms"] and floor.records[0].floor_ms is None
    verify = Result.load(ROOT / "examples/diagnose-h200/k2/verify.json")  # v1 diagnose: time_us
    old = json.loads((ROOT / "examples/diagnose-h200/k2/verify.json").read_text())["rows"][0]
    assert verify.records[0].us == old["time_us"] and "time_us" not in verify.rows[0]
    raw = load_one(ROOT / "tests/data/bench-verify-h200-2026-11-29.json")  # a step row's kernel floor was floor_ms
    step = next(x for x in raw.records if x.kind == "step61" and x.step_ms)
    doc = json.loads((ROOT / "tests/data/bench-verify-h200-2026-11-29.json").read_text())
    was = next(x for x in doc["results"] if x.get("kind") == "step61" and x["path"] == step.path
               and x["ctx"] == step.ctx)
    assert step.floor_us == pytest.approx(was["floor_ms"] * 1e3) and "floor_ms" not in raw.rows[0]


def test_every_number_says_its_unit_and_the_docs_list_every_field():
    for kind, cls in schema.KINDS.items():
        for f in schema.fields_of(cls):
            if f.base in (int, float):
                assert f.unit is not None, (kind, f.name)
    docs = (ROOT / "docs" / "results.md").read_text()
    assert docs.endswith(schema.markdown())  # regenerate with `python -m ddprobe.schema`
    assert all(f"- `{line}`" in docs for kind in schema.KINDS for line in schema.describe(kind))


def test_a_probe_that_writes_a_bad_row_raises_and_keeps_what_it_measured(tmp_path):
    path = tmp_path / "c.json"
    w = ResultWriter(Result(kind="commit", meta=RunMeta.collect(probe_gpu=False), config={"budget": 8}), path)
    w.add({"ctx": 1024, "text": "novel", "commit_len": 1.2, "decode_ms_per_step": 3.0})
    cases = [({"ctx": 2048, "text": "novel", "commit_len": 9.5},
              "row 2: a measured commit row refused, not written: 'commit_len' is 9.5 tokens/step (must be <= "
              "budget + 1, 9)"),
             ({"ctx": 2048, "text": "novel", "commit_len": 1.5, "prefill_s": -0.1},
              "row 2: a measured commit row refused, not written: 'prefill_s' is -0.1 s (must be >= 0)"),
             ({"ctx": 0, "text": "novel", "commit_len": 1.5}, "'ctx' is 0 tokens (must be >= 1)"),
             ({"ctx": 2048, "commit_len": 1.5}, "'text' is missing (required)")]
    for row, msg in cases:
        with pytest.raises(DDProbeError) as e:
            w.add(row)
        assert str(e.value) == f"{path}: {msg}" if msg.startswith("row") else msg in str(e.value)
    assert len(Result.load(path).rows) == 1  # the measured cell stays; nothing bad was written
    with pytest.raises(DDProbeError, match="no schema for kind 'mystery'"):
        ResultWriter(Result(kind="mystery", meta=RunMeta.collect(probe_gpu=False)), None).add({"x": 1})


def test_a_kind_without_a_schema_still_loads_unchecked():
    r = Result.load(ROOT / "tests/data/h200/sampler-overhead.json")
    assert r.kind == "sampler-overhead" and r.rows and r.records == []


def _broken(tmp_path: Path, src: str, row: int, key: str, value, name: str) -> Path:
    d = json.loads((ROOT / src).read_text())
    rows = d["rows"] if "rows" in d else d["results"]
    rows[row - 1][key] = value
    p = tmp_path / name
    p.write_text(json.dumps(d))
    return p


def _floor_file(tmp_path: Path) -> Path:
    out = tmp_path / "made" / "floor.json"
    r = CliRunner().invoke(app, ["floor", "--ctx", "1k,4k,16k", "--step-ms", "2,3,5", "-o", str(out)])
    assert r.exit_code == 0, r.output
    return out


BAD = [  # (what, how the file is made, args before the file / after, message after "FILE: ")
    ("report floor", "floor", (["report"], ["-o", "{tmp}/r.html"]),
     "row 2 of this floor file: 'floor_ms' is -1.0 ms (must be >= 0)"),
    ("report commit", "commit", (["report"], ["-o", "{tmp}/r.md"]),
     "row 3 of this commit file: 'decode_ms_per_step' is -1.0 ms (must be >= 0)"),
    ("gate current", "verify", (["gate"], ["-b", str(ROOT / "examples/diagnose-h200/k2/verify.json")]),
     "row 3 of this bench-verify file: 'floor_us' is -1.0 us (must be >= 0)"),
    ("gate baseline", "verify", (["gate", str(ROOT / "examples/diagnose-h200/k2/verify.json"), "-b"], []),
     "row 3 of this bench-verify file: 'floor_us' is -1.0 us (must be >= 0)"),
    ("floor --steps-from", "commit", (["floor", "--steps-from"], []),
     "row 3 of this commit file: 'decode_ms_per_step' is -1.0 ms (must be >= 0)"),
    ("advise --from", "commit", (["advise", "--from"], []),
     "row 3 of this commit file: 'decode_ms_per_step' is -1.0 ms (must be >= 0)"),
    ("gpu-util --replay", "gpu-util", (["gpu-util", "--replay"], []),
     "row 3 of this gpu-util file: 'power_W' is -1.0 W (must be >= 0)"),
]


@pytest.mark.parametrize("what,make,args,msg", BAD, ids=[b[0] for b in BAD])
def test_every_reader_refuses_a_file_that_breaks_the_schema_in_one_line(tmp_path, what, make, args, msg):
    if make == "floor":
        p = _broken(tmp_path, str(_floor_file(tmp_path)), 2, "floor_ms", -1.0, "floor.json")
    elif make == "commit":
        p = _broken(tmp_path, "examples/commit-tiny-cpu-long-2026-12-02.json", 3, "decode_ms_per_step", -1.0,
                    "commit.json")
    elif make == "verify":
        p = _broken(tmp_path, "examples/diagnose-h200/k2/verify.json", 3, "floor_us", -1.0, "verify.json")
    else:
        p = _broken(tmp_path, "examples/diagnose-h200/tiny/gpu-util.json", 3, "power_W", -1.0, "gpu-util.json")
    before, after = args
    argv = [*before, str(p), *[a.format(tmp=tmp_path) for a in after]]
    r = CliRunner().invoke(app, argv, env={"COLUMNS": "400"})
    assert r.exit_code == 1, (argv, r.output)
    assert "Traceback" not in r.output and (r.exception is None or isinstance(r.exception, SystemExit))
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert lines == [f"error: {p}: {msg}"], r.stderr
    assert not (tmp_path / "r.html").exists() and not (tmp_path / "r.md").exists()


def test_the_one_line_names_the_field_not_a_python_error(tmp_path):
    d = json.loads((ROOT / "examples/diagnose-h200/tiny/floor.json").read_text())
    d["rows"][0]["ctx"] = "131072"
    p = tmp_path / "f.json"
    p.write_text(json.dumps(d))
    with pytest.raises(DDProbeError) as e:
        Result.load(p)
    assert str(e.value) == f"{p}: row 1 of this floor file: 'ctx' is str '131072' (must be an integer in tokens)"
    assert re.search(r"\n", str(e.value)) is None


def test_bench_verify_checks_each_row_it_keeps():
    """`bench verify` writes its own document (not a ResultWriter): each row is checked as it is kept. Bench()
    measures ceilings on a GPU, so the row keeper is called on a bare instance."""
    from ddprobe.probes.bench.verify import Bench

    b = Bench.__new__(Bench)
    b.results, seen = [], []
    b.on_row, b.progress = seen.append, None
    b._keep({"kind": "step61", "ctx": 131072, "heads": 8, "path": "split", "step_ms": 2.9, "floor_us": 1900.0,
             "rel_err": float("nan")})  # NaN is written as null
    with pytest.raises(DDProbeError, match=r"^bench verify: row 2 of this bench-verify file: 'us' is -3.0 us "
                                           r"\(must be >= 0\)$"):
        b._keep({"ctx": 1024, "heads": 8, "path": "paged", "us": -3.0})
    assert len(b.results) == 1 and seen == b.results


# ---- issue 65: the summary parts a report reads whole, and measured times, held like typed ones
TRACES = ROOT / "tests" / "data" / "traces"


def _made(tmp_path, *args) -> dict:
    """A results file a real command writes (a fresh process), as JSON."""
    import subprocess
    import sys

    out = tmp_path / "made.json"
    r = subprocess.run([sys.executable, "-m", "ddprobe", *map(str, args), "-o", out], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(out.read_text())


DECISION = {"path": "typed", "text": "typed", "ctx": 32768, "batch": 1, "choice": "chain@4", "margin": 1.2,
            "ddtree_budget": 8, "chain_depth": 4, "ddtree_tok_s": 10.0, "chain_tok_s": 12.0, "plain_tok_s": 9.0}


@pytest.mark.parametrize("decisions,says", [
    ("abc", "summary.decisions is str, not a list"),
    ([dict(DECISION, ctx="abc")], "summary.decisions[1]: 'ctx' is str 'abc'"),
    ([{"chain_tok_s": 3.0}], "summary.decisions[1]: 'path' is missing"),
    ([dict(DECISION, chain_tok_s=1e300)], "'chain_tok_s' is 1e+300 tokens/s (must be <= 1e+09)"),
    ([dict(DECISION, ddtree_tok_s=-5.0)], "'ddtree_tok_s' is -5.0 tokens/s (must be >= 0)"),
    ([dict(DECISION, margin="x")], "'margin' is str 'x'"),
])
def test_an_advise_files_decisions_are_typed_on_load(decisions, says, tmp_path):
    """summary.decisions was read by the report as it stood: 1e300 tok/s printed, a ctx of 'abc' a traceback."""
    doc = _made(tmp_path, "advise", "--ctx", "32k", "--step-ms", "159", "--commit-len", "3")
    good = tmp_path / "good.json"
    good.write_text(json.dumps(dict(doc, summary=dict(doc["summary"], decisions=[DECISION]))))
    assert Result.load(good).summary["decisions"] == [DECISION]
    doc["summary"]["decisions"] = decisions
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(DDProbeError, match=re.escape(says)):
        Result.load(bad)
    doc["summary"].update(decisions=[], verdicts="x")
    bad.write_text(json.dumps(doc))
    with pytest.raises(DDProbeError, match=re.escape("summary.verdicts is str, not a list")):
        Result.load(bad)


@pytest.mark.parametrize("change,says", [
    (lambda d: d.update(diff="x"), "summary.diff is not an object"),
    (lambda d: d["diff"].update(step_after_ms=-1e12), "'step_after_ms' is -1000000000000.0 ms (must be >= 0.001)"),
    (lambda d: d["diff"].update(step_before_ms="x"), "'step_before_ms' is str 'x'"),
    (lambda d: d["diff"].update(step_delta_ms=5.0), "'step_delta_ms' 5 is not after - before"),
    (lambda d: d["diff"].update(kernels={"a": 1}), "'kernels' is dict"),
    (lambda d: d["diff"].update(classes=[{"cls": "attention"}]), "summary.diff.classes[1]: 'before_ms' is missing"),
    (lambda d: d["diff"]["classes"][0].update(cls="nosuch"), "'cls' is 'nosuch' (must be one of attention"),
    (lambda d: d["diff"]["kernels"][0].update(after_ms=1e9), "'delta_ms'"),
    (lambda d: d["diff"].update(added=[5]), "'added'/'gone' hold 5"),
])
def test_a_trace_diffs_summary_is_typed_on_load(change, says, tmp_path):
    doc = _made(tmp_path, "trace", "diff", TRACES / "h100-sglang-graphs-32k.trace.json.gz",
                TRACES / "h100-split_ws-graphs-32k.trace.json.gz")
    good = tmp_path / "good.json"
    good.write_text(json.dumps(doc))
    assert Result.load(good).summary["diff"]["classes"]  # what the command writes loads
    change(doc["summary"])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(DDProbeError, match=re.escape(says)):
        Result.load(bad)


@pytest.mark.parametrize("src,change,says", [
    ("commit-tiny-cpu.json", lambda d: d["rows"][0].update(decode_ms_per_step=1e12),
     "'decode_ms_per_step' is 1e+12 ms, not a measured time (must be between 1 us and 1 h)"),
    ("commit-tiny-cpu.json", lambda d: d["rows"][0].update(verify_ms_mean=1e-300), "'verify_ms_mean' is 1e-300 ms"),
    ("floor-rtx-pro-6000-tp8.json", lambda d: d["rows"][0].update(gap=1e-9),
     "'attn_gap' is 1e-09, not step / floor"),
    ("floor-rtx-pro-6000-tp8.json", lambda d: d["rows"][0].update(step_ms=-1.0), "'step_ms' is -1.0 ms"),
    ("gpu-util-synthetic.json", lambda d: d["summary"].update(decode_step_ms=1e300),
     "decode_step_ms is 1e+300: not a measured step (1 us to 1 h)"),
    ("commit-tiny-cpu.json", lambda d: d["config"].update(max_new_tokens=-1),
     "this commit file's config.max_new_tokens is -1: not a whole number >= 1"),
    ("commit-tiny-cpu.json", lambda d: d["config"].update(budget="8"),
     "this commit file's config.budget is '8': not a whole number >= 1"),
])
def test_impossible_times_in_a_file_are_refused_by_every_reader(src, change, says, tmp_path):
    """One check for every number that enters from a file: report, floor --steps-from and advise --from all load
    through Result.from_dict, so each refuses the file in one line naming the field."""
    import subprocess
    import sys

    doc = json.loads((ROOT / "tests" / "data" / src).read_text())
    change(doc)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(DDProbeError, match=re.escape(says)):
        Result.load(bad)
    r = subprocess.run([sys.executable, "-m", "ddprobe", "report", bad, "-o", tmp_path / "r.html"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "r.html").exists()
    if src.startswith("commit"):
        for cmd in (["floor", "--steps-from", bad], ["advise", "--from", bad]):
            r = subprocess.run([sys.executable, "-m", "ddprobe", *map(str, cmd)], capture_output=True, text=True,
                               timeout=300)
            assert r.returncode == 1 and says in r.stderr and "Traceback" not in r.stderr, (cmd, r.stderr)
