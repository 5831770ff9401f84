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
    res = runner.invoke(app, ["floor", "--model", "kimi-k2.6", "--gpu", "h200", "--tp", "2", "--queries", "5", "--ctx",
                              "32k", "--allreduce-from", str(out)])
    assert res.exit_code == 0, res.output
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("communication:"))
    assert f"{us:.3g} us each" in line and f"measured: {out}" in line
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
    with pytest.raises(DDProbeError, match="no positive latency"):
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
    (["--bytes", "0"], "size"),
    (["--device", "tpu"], "unknown device 'tpu'"),
    (["--dtype", "fp8"], "bf16, fp16 or fp32"),
    (["--calls", "0"], "--calls"),
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
