"""`ddprobe diagnose` end to end on the CPU with the shipped tiny model: every claim present or marked skipped,
results written as they are measured, the report renders (and loads in headless Chromium), interruption keeps
what was measured."""
import json
import re

import pytest
from typer.testing import CliRunner

from ddprobe.cli import app
from ddprobe.cli.diagnose import run_and_report
from ddprobe.probes.diagnose import Diagnose, DiagnoseOptions
from ddprobe.probes.backends.engine import EngineBackend
from ddprobe.reports.diagnosis import TOPICS
from ddprobe.results import Result
from ddprobe.units import fmt_ratio
from test_fleet import Endpoint, _free_port, nodes, prom  # noqa: F401  (the fleet: recorded dcgm-exporter
# endpoints on 127.0.0.1, and a real Prometheus scraping them)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("diag")
    # from 1k on: below about 1k tokens of novel prose the tiny target's greedy continuation can fall into a
    # repeated phrase that its drafter then predicts (docs/tiny-model.md)
    r = CliRunner().invoke(app, ["diagnose", "--ctx", "1k,2k", "--max-new-tokens", "32", "--bw", "20GB/s",
                                 "--out-dir", str(out)])
    assert r.exit_code == 0, r.output
    return out, r.output


def claims_of(html: str) -> dict[str, tuple[str, str]]:
    found = re.findall(r'<div class="claim" data-topic="(\w+)" data-status="(\w+)"><strong>.*?</strong>\s*<p>(.*?)</p>',
                       html, flags=re.S)
    return {t: (s, text) for t, s, text in found}


def test_every_claim_present_or_skipped_with_reason(run_dir):
    out, printed = run_dir
    assert sorted(p.name for p in out.iterdir()) == ["advise.json", "commit.json", "diagnose.json", "floor.json",
                                                     "report.html"]
    steps = {r["step"]: r for r in Result.load(out / "diagnose.json").rows}
    assert [steps[s]["status"] for s in ("commit", "gpu-util", "floor", "advise", "verify")] == \
        ["ok", "skipped", "ok", "ok", "skipped"]
    # speculation on or off: every commit cell's tokens/s against plain decoding at the engine's one-row floor
    adv = Result.load(out / "advise.json")
    commit = Result.load(out / "commit.json")
    for cell in commit.rows:
        p = next(r for r in adv.rows if r["text"] == cell["text"] and r["ctx"] == cell["ctx"]
                 and (r["tree"], r["budget"]) == (cell["tree"], cell["budget"]))
        assert p["spec_tok_s"] == pytest.approx(cell["commit_len"] / cell["decode_ms_per_step"] * 1e3)
    assert {v["text"] for v in adv.summary["verdicts"]} == {"predictable", "novel"}
    assert "no NVIDIA GPU" in steps["gpu-util"]["reason"] and "CPU" in steps["verify"]["reason"]
    claims = claims_of((out / "report.html").read_text())
    assert set(claims) == set(TOPICS)
    status, text = claims["drafter"]
    # 32 new tokens: the first comes from prefill, the other 31 from verify steps committing the whole block of 8
    # on predictable text, the last step cut by the limit: 4 steps, 31 / 4 = 7.75 per step
    assert status == "ok" and "accepts well at every context" in text and f"{31 / 4:.2f} / {31 / 4:.2f} at 1k / 2k" in text
    assert "Novel text is simply unpredictable" in text
    assert claims["gpu"][0] == "skipped" and "no NVIDIA GPU visible" in claims["gpu"][1]
    status, text = claims["floor"]
    fl = Result.load(out / "floor.json")
    floor = fl.rows[-1]
    assert status == "ok" and [r["ctx"] for r in fl.rows] == [1024, 2048] and floor["step_ms"] > 0
    # where the step goes: the anatomy of the two measured novel steps, worked out by hand (or why it is missing)
    (c0, t0), (c1, t1) = [(r["ctx"], r["step_ms"]) for r in fl.rows]
    if "anatomy" in fl.summary:
        assert fl.summary["anatomy"]["intervals"][0]["ms_per_1k"] == pytest.approx((t1 - t0) / (c1 - c0) * 1024)
        assert "Where the step goes" in (out / "report.html").read_text()
        assert fl.summary["anatomy"]["weight_floor_ms"] == pytest.approx(fl.rows[0]["weight_floor_ms"])
    else:
        assert t1 < t0 and "step times decrease with context" in fl.summary["anatomy_error"]
    # the tiny engine on the CPU runs fp32: 4 layers x (64 latent + 32 rope) x 4 bytes = 1536 B per token;
    # 2048 tokens of it at the 20 GB/s given is 157.3 us
    assert floor["kv_B_per_token"] == 4 * (64 + 32) * 4 == 1536
    assert floor["attn_floor_ms"] == pytest.approx(2048 * 1536 / 20e9 * 1e3)
    assert floor["attn_gap"] == pytest.approx(floor["step_ms"] / (2048 * 1536 / 20e9 * 1e3))
    # the whole step: the engine's own weights, the tiny target in fp32 for 9 verify rows, 3,090,432 B
    # (tests/test_floor.py works them out), at 20 GB/s 154.5 us beside the 157.3 us of KV at 2k: the floor
    assert floor["weight_floor_ms"] == pytest.approx(3090432 / 20e9 * 1e3)
    assert floor["floor_ms"] == pytest.approx((2048 * 1536 + 3090432) / 20e9 * 1e3)
    assert floor["gap"] == pytest.approx(floor["step_ms"] / floor["floor_ms"])
    assert f"{fmt_ratio(floor['gap'])} the floor" in text and f"attention gap {fmt_ratio(floor['attn_gap'])}" in text
    assert floor["binds"] == fl.rows[0]["binds"] == "bandwidth"  # KV at 2k, weights at 1k (1k of KV is 1.57 MB)
    assert floor["kv_floor_ms"] > floor["weight_floor_ms"] > fl.rows[0]["kv_floor_ms"]
    status, text = claims["help"]
    assert "batch more requests" in text and "no telemetry here" in text
    assert "Speculation on or off (against measured plain decoding): with reference, speculation" in text
    # like with like: the plain side is the same engine's one-row step, measured, and never below its floor
    adv = Result.load(out / "advise.json")
    assert adv.summary["decode_source"].startswith("measured: the engine's plain one-row decode step")
    assert all(p["decode_ms"] >= fl.rows[0]["decode_floor_ms"] for p in adv.rows)
    assert "skipped: the embedded engine runs on the CPU" in text
    # the same claims on the terminal
    assert "Is the drafter broken at long context? No: on predictable text" in " ".join(printed.split())


def test_report_loads_in_headless_chromium(run_dir, load_in_browser):
    out, _ = run_dir
    got = load_in_browser((out / "report.html").read_text(), 390)
    assert got["sections"][:2] == ["diagnosis", "summary"]
    assert got["images"] >= 1 and got["loaded"] == got["images"]


def test_interrupted_run_keeps_partial_results(tmp_path):
    class CtrlC(EngineBackend):  # the real engine; the user presses Ctrl-C during the fourth cell
        calls = 0  # (cells run per kind, contexts increasing: predictable 128, 256, novel 128, then novel 256)

        def generate(self, ids, n):
            CtrlC.calls += 1
            if CtrlC.calls == 4:
                raise KeyboardInterrupt
            return super().generate(ids, n)

    be = CtrlC(preset="tiny", max_ctx=1024)
    d = Diagnose(be, DiagnoseOptions(ctxs=[128, 256], max_new_tokens=16), tmp_path, say=lambda m: None)
    with pytest.raises(KeyboardInterrupt):
        run_and_report(d, tmp_path / "report.html")
    assert len(Result.load(tmp_path / "commit.json").rows) == 3
    assert Result.load(tmp_path / "diagnose.json").rows[0]["status"] == "interrupted"
    claims = claims_of((tmp_path / "report.html").read_text())
    assert claims["drafter"][0] == "ok" and "at 128" in claims["drafter"][1]
    # the third cell, novel text at 128 tokens, measured before the interrupt, is in the claim
    assert "Novel text is simply unpredictable: commit length" in claims["drafter"][1]
    assert "at 128." in claims["drafter"][1].split("Novel text")[1]


def test_bad_input_is_one_line(tmp_path):
    for args, msg in [(["--ctx", "1q"], "bad token count"), (["--gpu", "tpu"], "unknown GPU"),
                      (["--ctx", "512k"], "context 512k (524,288 tokens) + 64 new"), (["--backend", "vllm"], "needs --url")]:
        r = CliRunner().invoke(app, ["diagnose", *args, "--out-dir", str(tmp_path / "x")])
        assert r.exit_code == 1 and msg in r.output and "Traceback" not in r.output, (args, r.output)
    assert not (tmp_path / "x").exists()


def _fleet_diagnosis(tmp_path, *source_args):
    out = tmp_path / "d"
    r = CliRunner().invoke(app, ["diagnose", "--ctx", "1k", "--max-new-tokens", "16", *source_args,
                                 "--out-dir", str(out)])
    assert r.exit_code == 0, r.output
    steps = {row["step"]: row for row in Result.load(out / "diagnose.json").rows}
    assert steps["gpu-util"]["status"] == "ok", steps["gpu-util"]
    util = Result.load(out / "gpu-util.json")
    assert len({row["gpu"] for row in util.rows}) == 8 and {g["node"] for g in util.config["sampled_gpus"]} == {
        "node-0", "node-1"}
    # no NVML here and no --gpu/--bw: the floor compares with the GPUs the telemetry read (modelName NVIDIA H200)
    assert Result.load(out / "floor.json").config["gpu"] == "h200" and steps["floor"]["status"] == "ok"
    return out, util, claims_of((out / "report.html").read_text())


def test_diagnose_reads_a_fleet_through_dcgm_exporter(nodes, tmp_path):  # noqa: F811
    out, util, claims = _fleet_diagnosis(tmp_path, "--source", "dcgm-exporter", "--exporter-url",
                                         ",".join(e.url for e in nodes))
    assert util.config["source"] == "dcgm-exporter"
    dec = [d for d in util.summary["per_phase"] if d["phase"] == "decode"]
    assert len(dec) == 8 and {d["basis"] for d in dec} == {"dcgm"}
    assert util.summary["agree"] == "all 8 GPUs agree: latency-bound (2 nodes)"
    assert claims["gpu"][0] == "ok" and "All 8 GPUs agree: latency-bound (2 nodes)." in claims["gpu"][1]


def test_diagnose_reads_a_fleet_through_prometheus(prom, tmp_path):  # noqa: F811
    url, _ = prom
    out, util, claims = _fleet_diagnosis(tmp_path, "--source", "prometheus", "--prom-url", url)
    assert util.config["source"] == "prometheus"
    # the tiny engine's request lasts about a second: one or two of Prometheus's 1 s scrapes fall in its window
    assert claims["gpu"][0] == "ok" and "latency-bound" in claims["gpu"][1]
    assert {d["basis"] for d in util.summary["per_phase"]} == {"dcgm"}


def test_bad_telemetry_options_are_one_line(tmp_path):
    port = _free_port()
    for args, msg in [(["--prom-url", "http://127.0.0.1:9090"], "--prom-url and --match go with --source "
                                                                 "prometheus"),
                      (["--source", "dcgm"], "--source must be one of nvml, prometheus, dcgm-exporter"),
                      (["--source", "dcgm-exporter"], "needs --exporter-url"),
                      (["--source", "dcgm-exporter", "--exporter-url", f"http://127.0.0.1:{port}"], "cannot connect")]:
        r = CliRunner().invoke(app, ["diagnose", *args, "--out-dir", str(tmp_path / "x")])
        assert r.exit_code == 1 and msg in r.output and "Traceback" not in r.output, (args, r.output)
    assert not (tmp_path / "x").exists()  # nothing built, nothing measured


def test_claims_from_recorded_h200_and_investigation_files():
    from ddprobe.reports.diagnosis import diagnose

    data = [Result.load(f"tests/data/{n}") for n in
            ("commit-tiny-cpu.json", "floor-rtx-pro-6000-tp8.json", "gpu-util-h200-paged.json")]
    claims = {c.topic: c for c in diagnose(data)}
    assert claims["gpu"].status == "ok" and "latency-bound" in claims["gpu"].text
    assert "nvidia-smi says 95% busy" in claims["gpu"].text
    assert claims["floor"].status == "ok" and "192x the attention's floor" in claims["floor"].text  # 1430 ms, 185k
    assert "telemetry says the GPU is latency-bound" in claims["help"].text


def test_missing_gpm_metrics_are_not_zero():
    from ddprobe import signals
    from ddprobe.reports import findings

    r = Result.load("tests/data/gpu-util-h200-paged.json")
    r.summary = {}
    for row in r.rows:
        for k in row:
            if k in signals.PROFILING:  # the file's gpm_* keys, renamed at load
                row[k] = None
    text = " ".join(findings.gpu_util(r))
    assert "GPM SM, tensor, DRAM missing" in text and "tensor pipes 0" not in text


def test_summary_and_diagnosis_judge_the_drafter_alike():
    from ddprobe.reports import findings
    from ddprobe.reports.diagnosis import drafter
    from ddprobe.results import RunMeta

    rows = [{"text": "predictable", "ctx": c, "commit_len": v} for c, v in ((1024, 8.0), (16384, 4.0), (65536, 7.9))]
    rows += [{"text": "novel", "ctx": c, "commit_len": v} for c, v in ((1024, 5.0), (65536, 1.2))]
    r = Result(kind="commit", meta=RunMeta.collect(command="t", probe_gpu=False), rows=rows)
    lines = " ".join(findings.commit(r))
    claim = drafter(r, None).text
    assert "degrades on predictable text from 16k" in lines and "Yes, from 16k" in claim  # a mid-context dip
    assert "repeats itself" in lines and "repeats itself" in claim  # novel text that loops is called out by both


def test_cells_too_short_for_a_step_are_not_called_a_broken_drafter():
    """Cells that decoded fewer tokens than one whole verify step (budget + 2 with the prefill's) measure a commit
    length capped by their length (1.00 at --max-new-tokens 2, whatever the drafter): the summary and the diagnosis
    both say "not measured" and what to give, never "untrained drafter" (the audit of 2026-12-07)."""
    from ddprobe.reports import findings
    from ddprobe.reports.diagnosis import drafter
    from ddprobe.results import RunMeta

    rows = [{"text": t, "ctx": c, "commit_len": 1.0, "max_new_tokens": 2} for t in ("predictable", "novel")
            for c in (256, 512)]
    r = Result(kind="commit", meta=RunMeta.collect(command="t", probe_gpu=False), rows=rows, config={"budget": 8})
    claim, lines = drafter(r, None), " ".join(findings.commit(r))
    for text in (claim.text, lines):
        assert "Not measured: the commit cells decoded 2 tokens each" in text and "--max-new-tokens 10 or more" in text
        assert "untrained" not in text and "does not accept" not in text and "NOT accepting" not in text
    assert claim.status == "skipped"
    for row in r.rows:  # one whole step decoded: judged as before
        row["max_new_tokens"] = 10
    assert "does not accept even at short context" in drafter(r, None).text


@pytest.mark.parametrize("run, want", [
    # k2 shapes (61 layers, 8 heads, random weights) with the paged path: the investigation's picture
    ("k2", {"drafter": "does not accept even at short context", "gpu": "nvidia-smi says 94% busy",
            "floor": "349x the attention's floor", "help": "56.3x faster than the page_size=1 (paged) path at 32k"}),
    # the shipped tiny pair: the drafter claim answers "no"
    # the shipped tiny pair: the drafter claim answers "no". Its engine ran fp32: 4 layers x 96 x 4 B = 1536 B
    # per token, so 24k tokens are 37.7 MB, 7.86 us at 4.8 TB/s; the 20.9 ms step is 2,659x that.
    ("tiny", {"drafter": "commit length 8.00 / 8.00 / 8.00 at 1k / 8k / 24k", "gpu": "latency-bound",
              "floor": f"{20.907825 / (24576 * 1536 / 4.8e12 * 1e3):,.0f}x the attention's floor", "help": "43.6x faster"}),
])
def test_recorded_h200_diagnose_runs(run, want):
    """The two H200 runs of docs/diagnose.md: every step ran, and the claims rebuilt from their files say
    what the recorded first screen says (the report.html beside them holds the same text)."""
    from pathlib import Path

    from ddprobe.reports.diagnosis import diagnose

    folder = Path(__file__).parents[1] / "examples" / "diagnose-h200" / run
    results = [Result.load(f) for f in sorted(folder.glob("*.json"))]
    record = next(r for r in results if r.kind == "diagnose")
    assert [(r["step"], r["status"]) for r in record.rows] == [
        ("commit", "ok"), ("gpu-util", "ok"), ("floor", "ok"), ("verify", "ok")]
    assert record.meta.gpus[0]["name"] == "NVIDIA H200"
    claims = {c.topic: c for c in diagnose(results)}
    html = claims_of((folder / "report.html").read_text())
    for topic, text in want.items():
        assert claims[topic].status == "ok" and text in claims[topic].text, claims[topic].text
        # the recorded page predates the step model: it called the attention's floor "the floor"
        assert html[topic][0] == "ok" and text.split(" the attention")[0] in html[topic][1]


def _server_floor(tmp_path, **sharding):
    """The floor step of a diagnosis of an SGLang server (a loopback server; its /get_model_info is a 404) whose
    novel-text steps took 100 and 159 ms at 1k and 4k (as the commit probe records them)."""
    from ddprobe.probes.backends.sglang import SGLangBackend
    from test_backends import replay

    srv, url = replay({})
    try:
        d = Diagnose(SGLangBackend(url), DiagnoseOptions(ctxs=[1024, 4096], gpu="h200", **sharding), tmp_path,
                     say=lambda m: None)
        d.commit_rows = [{"text": "novel", "ctx": c, "decode_ms_per_step": t} for c, t in ((1024, 100.0),
                                                                                          (4096, 159.0))]
        status = d.floor()
    finally:
        srv.shutdown()
    return status, Result.load(tmp_path / "floor.json")


def test_server_floor_uses_the_servers_sharding(tmp_path):
    # K2.6 on 8 GPUs, INT4 experts: 10.1 ms of bf16 weights at tp 8 shrink to a few ms; tp 1 bf16 would be 77 ms
    status, f = _server_floor(tmp_path / "tp8", tp=8, ep=8, weight_dtype="bf16", expert_dtype="int4")
    assert status is None and f.config["tp"] == 8 and f.config["ep"] == 8 and f.config["expert_dtype"] == "int4"
    assert all(r["below_floor"] is False for r in f.rows) and f.rows[0]["weight_floor_ms"] < 10
    status, f1 = _server_floor(tmp_path / "tp1")  # the defaults: one GPU holding all of K2.6 in bf16
    assert f1.config["tp"] == 1 and f1.rows[0]["weight_floor_ms"] == pytest.approx(77.4, abs=0.1)
    assert f1.rows[1]["floor_ms"] > 77 and not f1.rows[1]["below_floor"]


def test_server_floor_says_a_step_below_it(tmp_path):
    # 100 ms at 1k is above the one-GPU floor at the H200's 4.8 TB/s (77 ms), below it at 2 TB/s (186 ms)
    from ddprobe.probes.backends.sglang import SGLangBackend
    from test_backends import replay

    srv, url = replay({})
    try:
        d = Diagnose(SGLangBackend(url), DiagnoseOptions(ctxs=[1024], bw_Bps=2e12), tmp_path / "slow",
                     say=lambda m: None)
        d.commit_rows = [{"text": "novel", "ctx": 1024, "decode_ms_per_step": 100.0}]
        assert d.floor() == ("ok", "step below the floor: check --tp/--ep/--weight-dtype/--expert-dtype")
    finally:
        srv.shutdown()
    assert Result.load(tmp_path / "slow" / "floor.json").rows[0]["below_floor"] is True


def test_sharding_options_on_the_engine_are_refused(tmp_path):
    for args, msg in [(["--tp", "8"], "--tp: the engine backend's floor uses the engine's own weights"),
                      (["--backend", "sglang", "--url", "http://127.0.0.1:9", "--ep", "5"], "--ep 5"),
                      (["--backend", "sglang", "--url", "http://127.0.0.1:9", "--expert-dtype", "int9"],
                       "--expert-dtype: unknown dtype 'int9'")]:
        r = CliRunner().invoke(app, ["diagnose", *args, "--out-dir", str(tmp_path / "x")])
        assert r.exit_code == 1 and msg in r.output and "Traceback" not in r.output, (args, r.output)
    assert not (tmp_path / "x").exists()


def test_a_launch_bound_tiny_step_is_said_with_what_would_help():
    """The tiny engine on an H100 (bf16): its step's bytes are about 0.7 us, so 400 kernels at the H100's measured
    0.982 us each (``bench launch``, shapes.KERNEL_TIMES: 0.39 ms) set its floor; a 0.697 ms step is 1.77x that floor,
    launch-bound, and what helps says so."""
    from ddprobe.probes.backends.engine import preset_step_model
    from ddprobe.probes.floor import floor_result
    from ddprobe.reports.diagnosis import floor_claim, help_claim
    from ddprobe.physics.gpus import kernel_time
    from ddprobe.physics.step_model import with_launches

    model = with_launches(preset_step_model("tiny", None, "bf16", 3.35e12, 989e12), "h100", 400,
                          counted="counted on the GPU")
    result, rows = floor_result(model, [1024], [0.697], queries=9,
                                config={"launches": model.kernel_source, "bw_Bps": 3.35e12})
    fl = Result.from_dict(json.loads(result.to_json()))  # as the report reads it back
    r, kt = rows[0], kernel_time("h100")
    assert kt.measured and r.binds == "launch" and r.floor_ms == pytest.approx(400 * kt.graph_us / 1e3)
    assert r.gap == pytest.approx(0.697 / r.floor_ms)
    text = floor_claim(fl, None).text
    us = kt.graph_us  # the shipped h100 launch table's least kernel time (0.779 us on 2026-12-06)
    assert f"400 kernels x {us:.3g} us = {400 * us:.3g} us, {400 * us / 697:.0%} of the measured step" in text
    assert "the step is launch-bound" in text
    assert "measured by ddprobe bench launch on NVIDIA H100" in text
    help_text = help_claim(None, fl, None, None).text
    assert f"The step is launch-bound: 400 kernels at least {us:.3g} us each are {400 * us:.3g} us of its 697 us" \
        in help_text
    assert "fewer kernels per step" in help_text and "CUDA graphs" in help_text and "batching" in help_text
