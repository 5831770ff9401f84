import csv
import json
from pathlib import Path

import pytest

from ddprobe.results import SCHEMA, Result, ResultWriter, RunMeta
from ddprobe.units import DDProbeError

FLOOR_ROWS = [{"ctx": 1, "kv_GB": 7e-5, "attn_floor_ms": 0.001, "floor_ms": 0.2}]


def test_run_meta_has_the_fields_a_report_needs():
    m = RunMeta.collect(command="ddprobe floor --ctx 1k")
    assert m.command == "ddprobe floor --ctx 1k"
    assert m.date_utc.endswith("+00:00") and m.ddprobe_version and m.python and m.host
    assert m.torch  # installed in every environment that runs the tests
    assert isinstance(m.gpus, list)


def test_round_trip(tmp_path):
    r = Result(kind="floor", meta=RunMeta.collect(command="x"), config={"model": "kimi-k2.6"},
               rows=[{"ctx": 1024, "kv_GB": 0.072, "attn_floor_ms": 0.04, "floor_ms": 0.31}], summary={"note": "n"})
    p = r.save(tmp_path / "sub" / "r.json")
    back = Result.load(p)
    assert back == r
    assert json.loads(p.read_text())["schema"] == SCHEMA


def test_writer_writes_every_row_as_it_goes(tmp_path):
    path, csv_path = tmp_path / "cells.json", tmp_path / "cells.csv"
    w = ResultWriter(Result(kind="commit", meta=RunMeta.collect(command="x")), path, csv_path)
    assert not path.exists()  # nothing measured yet: no file
    w.add({"ctx": 1024, "text": "predictable", "commit_len": 7.5})
    assert Result.load(path).rows == [{"ctx": 1024, "text": "predictable", "commit_len": 7.5}]
    w.add({"ctx": 2048, "text": "novel", "commit_len": 1.1, "extra": [1, 2]})
    assert len(Result.load(path).rows) == 2  # an interrupted run keeps both cells
    with csv_path.open() as f:
        rows = list(csv.DictReader(f))
    assert rows[1]["text"] == "novel" and rows[1]["extra"] == "[1, 2]" and rows[0]["extra"] == ""
    assert not list(tmp_path.glob(".*.tmp"))  # atomic writes leave no temp files


def test_load_errors_name_the_file(tmp_path):
    with pytest.raises(DDProbeError, match="cannot read results file .*missing.json"):
        Result.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(DDProbeError, match="bad.json: not valid JSON"):
        Result.load(bad)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"hello": 1}))
    with pytest.raises(DDProbeError, match="other.json: not a ddprobe results file"):
        Result.load(other)
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"schema": SCHEMA, "kind": "floor", "meta": {"date_utc": "x"}}))
    with pytest.raises(DDProbeError, match="broken.json: malformed results file"):
        Result.load(broken)


def test_non_finite_numbers_become_null(tmp_path):
    r = Result(kind="commit", meta=RunMeta.collect(command="x"), rows=[{"ctx": 1, "text": "novel",
                                                                         "commit_len": float("nan"),
                                                                         "gap": float("inf"), "ok": 1.5}])
    back = Result.load(r.save(tmp_path / "r.json"))
    assert back.rows == [{"ctx": 1, "text": "novel", "commit_len": None, "gap": None, "ok": 1.5}]


def test_files_follow_the_umask(tmp_path):
    import os
    old = os.umask(0o022)
    try:
        p = Result(kind="floor", meta=RunMeta.collect(command="x"), rows=FLOOR_ROWS).save(tmp_path / "a.json")
        assert p.stat().st_mode & 0o777 == 0o644  # mkstemp alone gives 0600
        os.umask(0o077)
        p = Result(kind="floor", meta=RunMeta.collect(command="x"), rows=FLOOR_ROWS).save(tmp_path / "b.json")
        assert p.stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(old)


def test_no_file_until_there_is_something_to_keep(tmp_path):
    path = tmp_path / "cells.json"
    w = ResultWriter(Result(kind="commit", meta=RunMeta.collect(command="x")), path)
    w.flush()
    assert not path.exists()  # a run that fails before its first cell leaves no 0-row file
    w.add({"ctx": 1024, "text": "novel", "commit_len": 1.5})
    assert Result.load(path).rows[0]["ctx"] == 1024


@pytest.mark.parametrize("kind,rows,msg", [
    ("commit", [{"ctx": 1024, "text": "novel", "commit_len": 1.5}, "garbage"], "row 2 is not an object"),
    ("commit", [{"ctx": "1k", "text": "novel", "commit_len": 1.5}], "row 1 of this commit file: 'ctx' is str '1k' \\(must be an integer in tokens\\)"),
    ("commit", [{"ctx": 1024, "text": "novel"}], "row 1 of this commit file: 'commit_len' is missing \\(required\\)"),
    ("gpu-util", [{"t_s": 0.0, "gpu": 0}, {"t_s": "soon", "gpu": 0}], "row 2 of this gpu-util file: 't_s' is str 'soon'"),
    ("floor", 7, "'rows' is not a list"),
])
def test_garbage_rows_name_the_file_and_row(tmp_path, kind, rows, msg):
    good = Result(kind=kind, meta=RunMeta.collect(command="x")).to_dict()
    good["rows"] = rows
    p = tmp_path / "g.json"
    p.write_text(json.dumps(good))
    with pytest.raises(DDProbeError, match=f"g.json: {msg}"):
        Result.load(p)


def test_non_utf8_file_is_one_line(tmp_path):
    p = tmp_path / "bin.json"
    p.write_bytes(b"\xff\xfe{\x00")
    with pytest.raises(DDProbeError, match="bin.json: not UTF-8"):
        Result.load(p)


def test_frame_with_pandas_or_one_line_without(tmp_path):
    from ddprobe import results
    rows = [{"ctx": 1024, "text": "predictable", "commit_len": 7.5}, {"ctx": 1024, "text": "novel", "commit_len": 1.6}]
    p = Result(kind="commit", meta=RunMeta.collect(command="x"), rows=rows).save(tmp_path / "c.json")
    try:
        import pandas  # noqa: F401  (not a dependency: either branch is the behaviour)
    except ImportError:
        with pytest.raises(DDProbeError, match="needs pandas"):
            results.load(p).frame()
        return
    df = results.load(p).frame()
    assert list(df["text"]) == ["predictable", "novel"] and df["commit_len"].sum() == pytest.approx(9.1)
    assert df.attrs["kind"] == "commit" and df.attrs["meta"]["command"] == "x"


def test_results_folder_is_ignored_by_git():
    from pathlib import Path
    lines = (Path(__file__).parent.parent / ".gitignore").read_text().split()
    assert "ddprobe-results/" in lines  # the commands' default output folder never lands in a commit


@pytest.mark.parametrize("cmd", [["gpu-util", "--replay"], ["report"]])
def test_cli_refuses_garbage_rows_naming_file_and_row(tmp_path, cmd):
    from typer.testing import CliRunner

    from ddprobe.cli import app
    d = Result(kind="gpu-util", meta=RunMeta.collect(command="x")).to_dict()
    d["rows"] = [{"t_s": 0.0, "gpu": 0}, {"t_s": "garbage", "gpu": 0}]
    p = tmp_path / "junk.json"
    p.write_text(json.dumps(d))
    args = [*cmd, str(p)] + (["-o", str(tmp_path / "r.md")] if cmd == ["report"] else [])
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 1 and "junk.json: row 2 of this gpu-util file: 't_s' is str 'garbage' (must be a number in s)" in r.output
    assert "Traceback" not in r.output


@pytest.mark.parametrize("field,value", [("config", []), ("summary", "x"), ("meta", [1])])
def test_sections_must_be_objects(tmp_path, field, value):
    d = Result(kind="gpu-util", meta=RunMeta.collect(command="x")).to_dict()
    d[field] = value
    p = tmp_path / "odd.json"
    p.write_text(json.dumps(d))
    with pytest.raises(DDProbeError, match=f"odd.json: '{field}' is not a JSON object"):
        Result.load(p)


def test_replay_with_a_list_config_is_one_line(tmp_path):
    from typer.testing import CliRunner

    from ddprobe.cli import app
    d = json.loads((Path(__file__).parent / "data" / "gpu-util-synthetic.json").read_text())
    d["config"] = []
    p = tmp_path / "f.json"
    p.write_text(json.dumps(d))
    r = CliRunner().invoke(app, ["gpu-util", "--replay", str(p)])
    assert r.exit_code == 1, r.output
    assert "f.json: 'config' is not a JSON object (got list)" in r.output and "Traceback" not in r.output
