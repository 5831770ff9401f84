import csv
import json

import pytest

from ddprobe.results import SCHEMA, Result, ResultWriter, RunMeta
from ddprobe.units import DDProbeError


def test_run_meta_has_the_fields_a_report_needs():
    m = RunMeta.collect(command="ddprobe floor --ctx 1k")
    assert m.command == "ddprobe floor --ctx 1k"
    assert m.date_utc.endswith("+00:00") and m.ddprobe_version and m.python and m.host
    assert m.torch  # installed in every environment that runs the tests
    assert isinstance(m.gpus, list)


def test_round_trip(tmp_path):
    r = Result(kind="floor", meta=RunMeta.collect(command="x"), config={"model": "kimi-k2.6"},
               rows=[{"ctx": 1024, "floor_ms": 0.04}], summary={"note": "n"})
    p = r.save(tmp_path / "sub" / "r.json")
    back = Result.load(p)
    assert back == r
    assert json.loads(p.read_text())["schema"] == SCHEMA


def test_writer_writes_every_row_as_it_goes(tmp_path):
    path, csv_path = tmp_path / "cells.json", tmp_path / "cells.csv"
    w = ResultWriter(Result(kind="commit", meta=RunMeta.collect(command="x")), path, csv_path)
    assert Result.load(path).rows == []
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
    r = Result(kind="commit", meta=RunMeta.collect(command="x"), rows=[{"commit_len": float("nan"),
                                                                         "gap": float("inf"), "ok": 1.5}])
    back = Result.load(r.save(tmp_path / "r.json"))
    assert back.rows == [{"commit_len": None, "gap": None, "ok": 1.5}]
