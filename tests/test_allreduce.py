"""`ddprobe bench allreduce` with two real gloo processes on the CPU, its results file, and ``load_allreduce``
(the points the step model reads for --allreduce-from; ``step_model.interpolate`` is tested with the step model):
one-line refusals, the measured file through `ddprobe floor --allreduce-from`."""
from __future__ import annotations

import json
import pytest
from typer.testing import CliRunner

from ddprobe.cli import app
from ddprobe.probes.bench.allreduce import load_allreduce, step_messages
from ddprobe.results import Result, RunMeta
from ddprobe.units import DDProbeError

runner = CliRunner()
ROW = 7168 * 2  # one Kimi K2 hidden row in bf16


from test_bench_cli import _error_line  # noqa: E402  (one line, exit 1, no traceback)


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    out = tmp_path_factory.mktemp("ar") / "allreduce.json"
    res = runner.invoke(app, ["bench", "allreduce", "--device", "cpu", "--ranks", "2", "--budget", "4", "--bytes",
                              "1MiB", "--calls", "3", "--samples", "5", "--out", str(out)])
    assert res.exit_code == 0, res.output
    return out, res


def test_two_gloo_ranks_write_the_verify_and_decode_sizes(measured):
    out, res = measured
    d = json.loads(out.read_text())
    assert d["kind"] == "allreduce" and d["schema"] == "ddprobe.result/2" and d["meta"]["command"]
    c = d["config"]
    assert (c["ranks"], c["backend"], c["device"], c["graphs"], c["model"], c["budget"]) == \
        (2, "gloo", "cpu", False, "kimi-k2.6", 4)
    assert [(r["bytes"], r["label"]) for r in d["rows"]] == [(5 * ROW, "verify (5 rows)"), (ROW, "decode (1 row)"),
                                                           (1 << 20, "given")]
    for r in d["rows"]:
        assert 0 < r["p10_us"] <= r["us"] <= r["p90_us"] and r["samples"] == 5 and r["calls"] == 3
        assert r["graphs"] is False and r["algbw_GBps"] == pytest.approx(r["bytes"] / r["us"] / 1e3)
    assert "verify (5 rows)" in res.stdout and "results written to" in res.stdout
    assert load_allreduce(out, 2) == sorted((float(r["bytes"]), r["us"]) for r in d["rows"])


def test_the_measured_file_feeds_the_floor(measured):
    """`ddprobe floor --tp 2 --allreduce-from FILE` counts the measured latency; --tp 4 refuses the 2-rank file."""
    out, _ = measured
    d = json.loads(out.read_text())
    us = next(r["us"] for r in d["rows"] if r["label"].startswith("verify"))
    res = runner.invoke(app, ["floor", "--model", "kimi-k2.6", "--gpu", "h200", "--tp", "2", "--budget", "4", "--ctx",
                              "32k", "--allreduce-from", str(out)])
    assert res.exit_code == 0, res.output
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("communication:"))
    assert f"{us:.3g} us each" in line and f"measured: {out}" in line
    # a gloo file measured on the CPU feeding an H200's floor: said on the communication line
    assert f"measured: {out} (gloo on the CPU: a CPU measurement, not the h200's interconnect" in line
    refused = _error_line(runner.invoke(app, ["floor", "--model", "kimi-k2.6", "--tp", "4", "--ctx", "32k",
                                              "--allreduce-from", str(out)]))
    assert "measured on 2 ranks, the model asks for 4" in refused


def test_a_file_from_another_rank_count_or_kind_is_refused(measured, tmp_path):
    out, _ = measured
    with pytest.raises(DDProbeError, match="measured on 2 ranks, the model asks for 8") as e:
        load_allreduce(out, 8)
    assert "\n" not in str(e.value)
    other = tmp_path / "commit.json"
    Result(kind="commit", meta=RunMeta.collect(probe_gpu=False)).save(other)
    with pytest.raises(DDProbeError, match="not an all-reduce file"):
        load_allreduce(other, 2)
    junk = tmp_path / "junk.json"
    junk.write_text("{not json")
    with pytest.raises(DDProbeError):
        load_allreduce(junk, 2)
    bad = tmp_path / "bad.json"
    d = Result(kind="allreduce", meta=RunMeta.collect(probe_gpu=False), config={"ranks": 2}).to_dict()
    bad.write_text(json.dumps({**d, "rows": [{"bytes": "1k", "us": 3.0}]}))
    with pytest.raises(DDProbeError, match="bad.json: row 1 of this allreduce file: 'bytes' is str '1k'"):
        load_allreduce(bad, 2)


def test_points_sorted_one_per_size(tmp_path):
    path = tmp_path / "ar.json"
    rows = [{"bytes": 100000, "us": 30.0}, {"bytes": 1000, "us": 10.0}, {"bytes": 1000, "us": 12.0}]
    Result(kind="allreduce", meta=RunMeta.collect(probe_gpu=False), config={"ranks": 8}, rows=rows).save(path)
    assert load_allreduce(path, 8) == [(1000.0, 10.0), (100000.0, 30.0)]  # the fastest of a size measured twice
    Result(kind="allreduce", meta=RunMeta.collect(probe_gpu=False), config={"ranks": 8},
           rows=[{"bytes": 1000, "us": 0.0}]).save(path)
    with pytest.raises(DDProbeError, match="row 1 \\(1000 B\\): 'us' is 0 us, not a measured time"):
        load_allreduce(path, 8)
    Result(kind="allreduce", meta=RunMeta.collect(probe_gpu=False), config={"ranks": 8}).save(path)
    with pytest.raises(DDProbeError, match="no rows"):
        load_allreduce(path, 8)


def test_message_sizes():
    assert [m.bytes for m in step_messages(7168, 8, "bf16", [4096.0])] == [9 * ROW, ROW, 4096]
    assert step_messages(4096, 1, "fp32")[1].bytes == 4096 * 4


@pytest.mark.parametrize("args, says", [
    (["--ranks", "0", "--device", "cpu"], "--ranks must be 1..1024"),
    (["--budget", "0"], "--budget must be in 1..1024"),
    (["--model", "nope"], "unknown model 'nope'"),
    (["--bytes", "0"], "bad --bytes '0': must be greater than zero"),
    (["--device", "tpu"], "unknown device 'tpu'"),
    (["--dtype", "fp8"], "bf16, fp16 or fp32"),
    (["--calls", "0"], "--calls"),
    (["--bytes", "1.5B"], "bad --bytes '1.5B': 1.5 B is not a whole number of bytes"),  # measured 4 B before
    (["--bytes", "4KB,1.0001KB"], "1000.1 B is not a whole number of bytes"),
    (["--bytes", "6", "--device", "cpu"], "6 B is not a whole number of 4-byte elements"),
    (["--bytes", "4KB,"], "empty item in --bytes list"),
])
def test_bad_input_one_line_nothing_written(tmp_path, args, says):
    out = tmp_path / "ar.json"
    line = _error_line(runner.invoke(app, ["bench", "allreduce", *args, "--out", str(out)]))
    assert says in line
    assert not out.exists()


def test_a_run_past_its_timeout_stops_in_one_line_and_writes_nothing(tmp_path):
    from ddprobe.probes.bench.allreduce import AllreduceOptions, run_allreduce
    from ddprobe.results import ResultWriter

    out = tmp_path / "ar.json"
    w = ResultWriter(Result(kind="allreduce", meta=RunMeta.collect(probe_gpu=False), config={"ranks": 2}), out)
    with pytest.raises(DDProbeError, match=r"took longer than 0.5 s; 0 of 2 sizes measured"):
        run_allreduce(AllreduceOptions(2, step_messages(64, 1, "fp32"), timeout_s=0.5), w)
    assert not out.exists()


def test_cuda_without_a_gpu_is_refused(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    line = _error_line(runner.invoke(app, ["bench", "allreduce", "--device", "cuda", "--out", str(tmp_path / "a")]))
    assert "no CUDA GPU" in line


def test_an_earlier_results_file_is_kept_without_force(measured, tmp_path):
    """Issue 65: `bench allreduce -o` replaced an earlier results file. Now one line, nothing measured, the file as it
    was; --force replaces it."""
    out, _ = measured
    before = out.read_text()
    line = _error_line(runner.invoke(app, ["bench", "allreduce", "--device", "cpu", "--out", str(out)]))
    assert "already holds results measured earlier" in line and "--force" in line
    assert out.read_text() == before
    again = tmp_path / "again.json"
    again.write_text(before)
    res = runner.invoke(app, ["bench", "allreduce", "--device", "cpu", "--ranks", "2", "--calls", "1", "--samples",
                              "1", "--force", "--out", str(again)])
    assert res.exit_code == 0, res.output
    assert len(json.loads(again.read_text())["rows"]) == 2  # the verify and decode sizes of this run alone


def _file(tmp_path, rows, config=None):
    path = tmp_path / "ar.json"
    d = Result(kind="allreduce", meta=RunMeta.collect(probe_gpu=False), config=config or {"ranks": 2}).to_dict()
    path.write_text(json.dumps({**d, "rows": rows}))
    return path


@pytest.mark.parametrize("rows, config, says", [
    ([{"bytes": 1000, "us": 1e-4}], None, "row 1 (1000 B): 'us' is 0.0001 us, not a measured time (must be between "
                                          "1 us and 1 h)"),
    ([{"bytes": 1000, "us": 1e10}], None, "'us' is 1e+10 us, not a measured time"),
    ([{"bytes": 1000, "us": 10.0, "p10_us": 12.0, "p90_us": 20.0}], None, "p10_us 12 <= us 10 <= p90_us 20 does not"),
    ([{"bytes": 0, "us": 10.0}], None, "'bytes' is 0 (an all-reduce message is at least 1 B)"),
    ([{"bytes": 1 << 40, "us": 10.0}], None, "'bytes' is 1099511627776 (must be 1 B..16 GiB)"),
    ([{"bytes": 1000, "us": 10.0, "samples": 0}], None, "'samples' is 0 (must be at least 1)"),
    ([{"bytes": 1000, "us": None}], None, "'us' is null (no latency measured)"),
    ([{"bytes": 1000, "us": 10.0}], {"ranks": 0}, "config 'ranks' is 0 (must be a whole number 1..1024)"),
    ([{"bytes": 1000, "us": 10.0}], {"ranks": "2"}, "config 'ranks' is '2'"),
])
def test_impossible_numbers_in_an_allreduce_file_are_one_line_naming_the_field(tmp_path, rows, config, says):
    with pytest.raises(DDProbeError) as e:
        load_allreduce(_file(tmp_path, rows, config), 2)
    assert says in str(e.value) and "\n" not in str(e.value)
    # the floor reads it through --allreduce-from: the same line, exit 1, no traceback
    line = _error_line(runner.invoke(app, ["floor", "--model", "kimi-k2.6", "--ctx", "1k", "--tp", "2",
                                           "--allreduce-from", str(tmp_path / "ar.json")]))
    assert says in line
