"""gpu-util: NVML reader (fake NVML), sampler and phases, verdicts on recorded timelines, the probe end to end
on the tiny engine with a fake reader, and the CLI (live mode without a GPU, --replay)."""
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from ddprobe.cli import app
from ddprobe import gpu_verdict as gv
from ddprobe.probes.gpu_util import parse_ncu_csv, replay, run_gpu_util
from ddprobe.physics.gpus import gpu_spec_for
from ddprobe.probes.telemetry.sampler import Sampler, assign_phases, phase_at
from ddprobe.probes.telemetry.nvml import GPM_METRICS, NvmlReader, NvmlUnavailable
from ddprobe.results import Result, ResultWriter, RunMeta

DATA = Path(__file__).parent / "data"
SYNTH = DATA / "gpu-util-synthetic.json"


# ---- a fake pynvml ------------------------------------------------------------------------------
class FakeNvml:
    """Enough of pynvml for NvmlReader: 2 GPUs, GPM with FP16_UTIL unsupported, no average-power field."""
    NVML_FI_DEV_POWER_INSTANT, NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_GPM_METRICS_GET_VERSION = 186, 0, 2, 1

    def __init__(self, gpm=True):
        self.gpm, self.t = gpm, 0
        for j, (_, cname) in enumerate(GPM_METRICS):
            setattr(self, cname, 100 + j)

    def nvmlInit(self): pass
    def nvmlShutdown(self): pass
    def nvmlDeviceGetCount(self): return 2
    def nvmlDeviceGetHandleByIndex(self, i): return i
    def nvmlDeviceGetName(self, h): return b"NVIDIA H200"

    def nvmlDeviceGetFieldValues(self, h, ids):
        return [SimpleNamespace(nvmlReturn=0, valueType=1, value=SimpleNamespace(uiVal=142000)) for _ in ids]

    def nvmlDeviceGetEnforcedPowerLimit(self, h): return 700000
    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        self.t += 1
        return 1000 * self.t * 142
    def nvmlDeviceGetClockInfo(self, h, which): return 1980 if which == 0 else 3201
    def nvmlDeviceGetCurrentClocksEventReasons(self, h): return 0x4  # power cap
    def nvmlDeviceGetUtilizationRates(self, h): return SimpleNamespace(gpu=100, memory=1)
    def nvmlDeviceGetMemoryInfo(self, h): return SimpleNamespace(used=40e9)

    def nvmlGpmQueryDeviceSupport(self, h):
        if not self.gpm:
            raise RuntimeError("NVMLError_NotSupported: Not Supported")
        return SimpleNamespace(isSupportedDevice=1)

    def nvmlGpmSampleAlloc(self): return object()
    def nvmlGpmSampleGet(self, h, s): return s
    def nvmlGpmSampleFree(self, s): pass

    def c_nvmlGpmMetricsGet_t(self):
        return SimpleNamespace(metrics=[SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(8)])

    def nvmlGpmMetricsGet(self, mg):
        for m in mg.metrics[:mg.numMetrics]:
            unsupported = m.metricId == self.NVML_GPM_METRIC_FP16_UTIL
            m.nvmlReturn, m.value = (3, 0.0) if unsupported else (0, float(m.metricId - 99))
        return mg


def test_reader_records_each_metric_or_why_it_is_missing():
    r = NvmlReader(FakeNvml())
    first, second = r.read(0), r.read(0)
    assert first["sm_active_pct"] is None  # the first tick only opens the GPM window
    assert second["sm_active_pct"] == 1.0 and second["tensor_active_pct"] == 3.0
    assert second["fp16_active_pct"] is None  # its own nvmlReturn failed: missing, not 0
    assert "code 3" in r.sources["fp16_active_pct"] and r.sources["sm_active_pct"].startswith("ok")
    assert second["power_W"] == 142.0 and second["power_limit_W"] == 700.0 and second["sm_clock_MHz"] == 1980
    assert second["clock_reasons"] == "power_cap" and second["util_gpu_pct"] == 100.0
    assert second["power_avg_W"] is None  # FakeNvml has no NVML_FI_DEV_POWER_AVERAGE constant


def test_reader_without_gpm_keeps_gpm_null_and_says_why():
    r = NvmlReader(FakeNvml(gpm=False))
    r.read(1)
    row = r.read(1)
    assert all(row[k] is None for k, _ in GPM_METRICS)
    assert "NotSupported" in r.sources["gpm"]


def test_no_nvml_on_this_machine_is_recorded_not_raised():
    s = Sampler(0.05).start()
    if s.available:
        s.stop()
        pytest.skip("an NVIDIA GPU is visible here")
    s.stop()
    assert s.sources["nvml"].startswith("missing: no NVIDIA GPU visible to NVML")
    assert s.rows == []


# ---- sampler and phases -------------------------------------------------------------------------
class FakeReader:
    def __init__(self):
        self.handles, self.sources, self.t = [0, 1], {"gpm": "ok"}, 0.0

    def name(self, i): return "NVIDIA H200"
    def open(self): return [{"index": i, "name": self.name(i)} for i in self.handles]
    def sample(self): return [self.read(i) for i in self.handles]
    def close(self): pass

    def read(self, i):
        self.t += 1
        return {"power_W": 140.0, "power_limit_W": 700.0, "energy_J": self.t * 10, "util_gpu_pct": 100.0,
                "util_mem_pct": 1.0, "sm_active_pct": 5.0, "tensor_active_pct": 0.8,
                "dram_active_pct": 0.5, "fp32_active_pct": 1.0, "fp16_active_pct": None}


def test_sampler_thread_ticks_every_gpu_and_assigns_phases():
    import time
    s = Sampler(0.01, reader_factory=FakeReader).start()
    s.mark("prefill")
    time.sleep(0.05)
    s.mark("decode")
    time.sleep(0.05)
    s.mark("idle")
    rows = s.stop()
    assert {r["gpu"] for r in rows} == {0, 1}
    assert {r["phase"] for r in rows} >= {"prefill", "decode"}
    assert all(r["phase"] == phase_at(r["t_s"] - r["window_s"] / 2, s.markers) for r in rows)


def test_phase_from_window_middle():
    markers = [(1.0, "prefill"), (3.0, "decode"), (6.0, "idle")]
    rows = [{"t_s": t, "window_s": 0.5} for t in (0.5, 1.2, 3.2, 3.3, 6.1, 6.3)]
    assert [r["phase"] for r in assign_phases(rows, markers)] == ["idle", "idle", "prefill", "decode", "decode",
                                                                 "idle"]


# ---- verdicts -----------------------------------------------------------------------------------
def _rows(n=8, **sig):
    base = {"util_gpu_pct": 100.0, "util_mem_pct": 1.0, "power_W": 140.0, "power_limit_W": 700.0,
            "sm_active_pct": 5.3, "tensor_active_pct": 0.8, "dram_active_pct": 0.5,
            "fp32_active_pct": 1.0, "fp16_active_pct": 0.5, "window_s": 0.2}
    base.update(sig)
    return [dict(base, t_s=i * 0.2, gpu=0, phase="decode", energy_J=1000 + 28 * i) for i in range(n)]


@pytest.mark.parametrize("sig, want", [
    ({}, "latency-bound"),  # the paged verify on the H200
    (dict(tensor_active_pct=93.7, sm_active_pct=96.5, dram_active_pct=17, power_W=700), "compute-bound"),
    (dict(tensor_active_pct=0.04, sm_active_pct=73.7, dram_active_pct=61.6, power_W=590),
     "bandwidth-bound"),
    (dict(tensor_active_pct=43.1, sm_active_pct=92.1, dram_active_pct=25.3, power_W=682), "compute-bound"),
    (dict(util_gpu_pct=0, sm_active_pct=0, tensor_active_pct=0, dram_active_pct=0, power_W=124), "idle"),
    (dict(sm_active_pct=60, tensor_active_pct=20, dram_active_pct=25, power_W=400), "mixed"),
    (dict(fp32_active_pct=70, sm_active_pct=90, tensor_active_pct=0, dram_active_pct=10, power_W=500),
     "compute-bound"),
])
def test_each_verdict_with_gpm(sig, want):
    d = gv.analyze(_rows(**sig))["per_phase"][0]
    assert d["verdict"] == want and d["basis"] == "gpm"
    assert want in d["evidence"]


def test_latency_sentence_names_the_contradiction():
    ev = gv.analyze(_rows())["per_phase"][0]["evidence"]
    assert ev.startswith("nvidia-smi says 100% busy, but") and "tensor pipes 0.8%" in ev and "power 20% of the " \
                                                                                           "limit" in ev


NO_GPM = {k: None for k, _ in GPM_METRICS}


@pytest.mark.parametrize("sig, want", [
    (dict(util_mem_pct=1.0), "latency-bound"),
    (dict(util_mem_pct=79.0, power_W=590), "bandwidth-bound"),
    (dict(util_mem_pct=24.0, power_W=700), "compute-bound"),
    (dict(util_gpu_pct=0.0, power_W=124), "idle"),
])
def test_each_verdict_without_gpm_says_what_was_missing(sig, want):
    d = gv.analyze(_rows(**{**NO_GPM, **sig}), sources={"gpm": "missing: NotSupported"})["per_phase"][0]
    assert d["verdict"] == want and d["basis"] == "power+nvml"
    assert "GPM SM, tensor, DRAM missing (NotSupported)" in d["evidence"]
    if want != "idle":
        assert "probably" in d["evidence"]
    assert d["signals"]["tensor_active_pct"] == {"median": None, "p90": None, "n": 0}


def test_null_is_never_read_as_zero():
    # busy by nvidia-smi, low power, memory controller 40%, GPM missing: read as 0, SM/tensor/DRAM would
    # say latency-bound with GPM evidence; read as missing, it is the weaker power+nvml "mixed"
    d = gv.analyze(_rows(**{**NO_GPM, "util_mem_pct": 40.0}))["per_phase"][0]
    assert d["verdict"] == "mixed" and d["basis"] == "power+nvml"
    assert "tensor pipes 0" not in d["evidence"]


@pytest.mark.parametrize("gone, want", [
    (dict(sm_active_pct=None), "latency-bound"),  # tensor, DRAM and power measured low: enough without SM
    (dict(power_W=None), "latency-bound"),  # SM, tensor and DRAM measured low: enough without power
    (dict(sm_active_pct=None, power_W=None), "mixed"),  # neither measured: not read as low
    (dict(sm_active_pct=None, power_W=600.0), "mixed"),  # power high: one measured unit is not low
])
def test_missing_sm_or_power_stays_unknown(gone, want):
    """A missing SM or power value is never read as low: 'every unit low' needs the ones measured low and at
    least one of SM and power measured."""
    d = gv.analyze(_rows(**gone))["per_phase"][0]
    assert d["verdict"] == want, d["evidence"]
    if gone.get("power_W", 0) is None:
        assert "power missing" in d["evidence"]


def test_missing_memory_util_is_not_low_without_gpm():
    # power low, nvidia-smi busy, NVML memory util missing: not "probably latency-bound" on a missing value
    d = gv.analyze(_rows(**{**NO_GPM, "util_mem_pct": None}))["per_phase"][0]
    assert d["verdict"] == "mixed" and "memory util missing" in d["evidence"]


def test_missing_samples_within_a_metric_are_skipped():
    rows = _rows()
    for r in rows[:5]:
        r["tensor_active_pct"] = None
    for r in rows[5:]:
        r["tensor_active_pct"] = 2.0
    s = gv.analyze(rows)["per_phase"][0]["signals"]["tensor_active_pct"]
    assert s["median"] == 2.0 and s["n"] == 3


def test_request_numbers_bandwidth_energy_floor():
    req = {"prompt_tokens": 32768, "completion_tokens": 49, "verify_steps": 48, "step_ms": [150.0, 160.0, 170.0],
           "kv_B_per_token": 61 * 576 * 2, "gpu_bw_Bps": 4.8e12, "verify_ms_mean": 140.0}
    rows = _rows()
    rows[0]["phase"] = "idle"  # the counter difference starts at the last sample before decode
    s = gv.analyze(rows, req)
    nbytes = 61 * 1152 * (32768 + 24.5)
    assert s["decode_step_ms"] == 160.0
    assert s["eff_bw_GBps"] == pytest.approx(nbytes / 0.16 / 1e9)
    # no whole-step floor in the request (a server's): the attention alone, under its own name
    assert s["floor_ms"] is None and s["gap"] is None
    assert s["kv_floor_ms"] == pytest.approx(nbytes / 4.8e12 * 1e3) and s["attn_gap"] == pytest.approx(160 / s["kv_floor_ms"])
    # the engine's probe gives the step model's floor: the gap is the step over it
    assert gv.analyze(rows, {**req, "floor_ms": 8.0})["gap"] == pytest.approx(160 / 8.0)
    assert s["energy_J_per_token"] == pytest.approx(28 * 7 / 48)  # counter over the decode rows / decoded tokens
    assert s["verdict"] == "latency-bound"
    rows[0]["energy_J"] = None  # no counter: power x window over the decode rows
    assert gv.analyze(rows, req)["energy_J_per_token"] == pytest.approx(140 * 0.2 * 7 / 48)


def test_energy_per_token_is_decode_only():
    """A server without a first-token time: prefill and decode share one "request" phase, whose energy is not
    divided by the decoded tokens as if it were the decode's; it is said under its own name."""
    req = {"prompt_tokens": 32768, "completion_tokens": 49, "verify_steps": 48}
    rows = _rows()
    rows[0]["phase"] = "idle"
    for r in rows[1:]:
        r["phase"] = "request"
    s = gv.analyze(rows, req)
    assert s["energy_J_per_token"] is None and s["decode_energy_J"] is None
    assert s["request_energy_J_per_token"] == pytest.approx(28 * 7 / 48)
    rows[4]["phase"] = "prefill"  # with a first-token time: the decode's rows alone
    for r in rows[5:]:
        r["phase"] = "decode"
    s = gv.analyze(rows, req)
    assert s["energy_J_per_token"] == pytest.approx(28 * 3 / 48) and s["request_energy_J_per_token"] is None


def test_gpu_spec_for_nvml_names():
    assert gpu_spec_for("NVIDIA H200").name == "h200" and gpu_spec_for("NVIDIA H20").name == "h20"
    assert gpu_spec_for("NVIDIA RTX PRO 6000 Blackwell Server Edition").name == "rtx-pro-6000"
    assert gpu_spec_for("Tesla T4") is None and gpu_spec_for(None) is None


@pytest.mark.parametrize("device, preset, tbps", [
    ("NVIDIA H100 80GB HBM3", "h100", 3.35), ("NVIDIA H100 PCIe", "h100-pcie", 2.0), ("NVIDIA H100 NVL", "h100-nvl", 3.9),
    ("NVIDIA GH200 480GB", "gh200", 4.0), ("NVIDIA GH200 144G HBM3e", "gh200-hbm3e", 4.9),
    ("NVIDIA H200", "h200", 4.8), ("NVIDIA H200 NVL", "h200-nvl", 4.8),
    ("NVIDIA A100-SXM4-80GB", "a100", 2.039), ("NVIDIA A100 80GB PCIe", "a100-80gb-pcie", 1.935),
    ("NVIDIA A100-SXM4-40GB", "a100-40gb", 1.555), ("NVIDIA A100-PCIE-40GB", "a100-40gb", 1.555),
    ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "rtx-pro-6000", 1.792),
    ("nvidia  h100 pcie", "h100-pcie", 2.0),  # case and spacing aside
])
def test_gpu_names_map_to_their_own_datasheet(device, preset, tbps):
    spec = gpu_spec_for(device)
    assert spec is not None and spec.name == preset and spec.bw_Bps == pytest.approx(tbps * 1e12)


def test_gpu_names_never_match_by_substring():
    # a sibling's name inside another board's must not lend it the sibling's datasheet
    for unknown in ("NVIDIA H100 PCIe 94GB Custom", "NVIDIA H200 SXM 141GB Prototype", "NVIDIA H20 Custom", "NVIDIA A100",
                    "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition"):
        assert gpu_spec_for(unknown) is None, unknown


# ---- the probe end to end (tiny engine on the CPU, fake reader) ----------------------------------
def test_run_gpu_util_on_the_tiny_engine_with_a_fake_reader(tmp_path):
    from ddprobe.probes.backends.engine import EngineBackend

    be = EngineBackend(preset="tiny", max_ctx=1024)
    w = ResultWriter(Result(kind="gpu-util", meta=RunMeta.collect(probe_gpu=False), config=be.describe()),
                     tmp_path / "g.json")
    # decode of 128 tokens takes 50-60 ms on a 2-core CPU (6 tokens took 6 ms: no 10 ms sample landed in it)
    res = run_gpu_util(be, 256, 128, 0.005, w, reader_factory=FakeReader)
    phases = {r["phase"] for r in res.rows}
    assert {"idle", "prefill", "decode"} <= phases
    s = res.summary
    assert s["request"]["kv_B_per_token"] == be.describe()["layers"] * be.describe()["kv_row"] * 4
    assert s["decode_step_ms"] > 0 and s["eff_bw_GBps"] > 0 and s["energy_J_per_token"] > 0
    saved = Result.load(tmp_path / "g.json")
    assert saved.kind == "gpu-util" and len(saved.rows) == len(res.rows) and saved.summary["per_phase"]
    # the verdicts are the analysis of the timeline saved (their values follow from the fake reader's constants,
    # so they are not asserted here: the recorded H200 timelines test those), the headline the decode phase's
    assert saved.summary["per_phase"] == gv.analyze(saved.rows, s["request"])["per_phase"]
    decode = [d for d in s["per_phase"] if d["phase"] == "decode"]
    assert len(decode) == 2 and s["verdict"] == decode[0]["verdict"] and s["evidence"] == decode[0]["evidence"]
    assert [m[1] for m in s["markers"]] == ["warmup", "idle", "prefill", "decode", "idle"]


def test_the_gpu_util_pipeline_estimates_times_and_reads_ncu(tmp_path):
    """gpu_util_run (the command's and diagnose's pipeline) on the tiny engine: with ``on_estimate`` the request is
    estimated after the warm-up and the summary's timing sets it beside the request's time; with ``deep`` ncu's
    child run is recorded (without ncu here: skipped, saying why); without either, neither key is written."""
    import shutil

    from ddprobe.probes.backends.engine import EngineBackend
    from ddprobe.probes.gpu_util import DeepRun, gpu_util_run

    be = EngineBackend(preset="tiny", max_ctx=1024)
    heard = []
    w = ResultWriter(Result(kind="gpu-util", meta=RunMeta.collect(probe_gpu=False), config=be.describe()),
                     tmp_path / "g.json")
    deep = DeepRun("5ms", "engine", 600.0, None, ("--preset", "tiny"), "reference")
    res = gpu_util_run(be, 256, 16, 0.005, w, telemetry={"reader_factory": FakeReader, "window": None},
                       on_estimate=heard.append, deep=deep)
    saved = Result.load(tmp_path / "g.json")
    assert len(heard) == 1 and saved.config["estimate"] == heard[0].to_dict() and heard[0].total_s > 0
    timing = saved.summary["timing"]
    assert timing["actual_s"] == res.summary["request"]["e2e_s"] > 0 and timing["estimate_s"] == heard[0].total_s
    ncu_here = shutil.which("ncu") or Path("/usr/local/cuda/bin/ncu").exists()
    assert saved.summary["deep"] == res.summary["deep"]
    if not ncu_here:
        assert saved.summary["deep"] == {"skipped": "ncu not found on PATH or in /usr/local/cuda/bin"}
    w2 = ResultWriter(Result(kind="gpu-util", meta=RunMeta.collect(probe_gpu=False), config=be.describe()),
                      tmp_path / "g2.json")
    plain = gpu_util_run(be, 256, 16, 0.005, w2, telemetry={"reader_factory": FakeReader, "window": None})
    assert "timing" not in plain.summary and "deep" not in plain.summary and "estimate" not in plain.config
    assert plain.summary["decode_step_ms"] > 0


def test_the_ncu_child_command_is_the_same_request_shorter(tmp_path):
    """DeepRun's child: gpu-util at the same prompt and text, DEEP_DECODE_TOKENS, no warm-up, the backend rebuilt from
    the options as typed; ddprobe's own parser takes it (here, without a GPU, it stops at NVML: exit 1, not 2)."""
    import sys

    from ddprobe.probes.gpu_util import DEEP_DECODE_TOKENS, DeepRun

    deep = DeepRun("200ms", "sglang", 30.0, "http://127.0.0.1:30000", (), "paged")
    cmd = deep.command(8192, "novel", str(tmp_path / "child.json"))
    assert cmd[:4] == [sys.executable, "-m", "ddprobe", "gpu-util"]
    assert cmd[4:] == ["--prompt-len", "8192", "--decode-tokens", str(DEEP_DECODE_TOKENS), "--no-warmup", "--period",
                       "200ms", "--text", "novel", "--backend", "sglang", "--timeout", "30.0", "--url",
                       "http://127.0.0.1:30000", "--json", str(tmp_path / "child.json")]
    engine = DeepRun("5ms", "engine", 600.0, None, ("--preset", "tiny", "--no-graphs"), "reference")
    child = engine.command(256, "predictable", str(tmp_path / "c.json"))[3:]  # from the command's name on
    assert child[child.index("--timeout"):] == ["--timeout", "600.0", "--preset", "tiny", "--no-graphs", "--json",
                                                str(tmp_path / "c.json")]
    if Sampler(0.05).start().available:
        pytest.skip("an NVIDIA GPU is visible here: the child would measure")
    r = CliRunner().invoke(app, child)
    assert r.exit_code == 1 and "no NVIDIA GPU visible to NVML" in r.output, r.output


def test_run_gpu_util_without_nvml_raises_one_line(tmp_path):
    def none():
        raise NvmlUnavailable("no NVIDIA GPU visible to NVML: test")

    w = ResultWriter(Result(kind="gpu-util", meta=RunMeta.collect(probe_gpu=False)))
    be = SimpleNamespace(tokenize=lambda t: list(range(len(t.split()))), name="fake")
    with pytest.raises(NvmlUnavailable, match="^no NVIDIA GPU visible to NVML: test$"):
        run_gpu_util(be, 64, 4, 0.01, w, reader_factory=none)


# ---- CLI ----------------------------------------------------------------------------------------
def test_cli_live_without_gpu_exits_1_with_one_line(tmp_path):
    if Sampler(0.05).start().available:
        pytest.skip("an NVIDIA GPU is visible here")
    r = CliRunner().invoke(app, ["gpu-util", "--prompt-len", "1k", "--json", str(tmp_path / "x.json")])
    assert r.exit_code == 1
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: no NVIDIA GPU visible to NVML:")
    assert "without a GPU here: --replay FILE re-analyses a saved run, --source prometheus|dcgm-exporter" in lines[0]
    assert not (tmp_path / "x.json").exists()


def test_cli_replay_writes_no_copy_unless_asked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        r = CliRunner().invoke(app, ["gpu-util", "--replay", str(SYNTH)])
        assert r.exit_code == 0, r.output
    assert list(tmp_path.iterdir()) == [] and "written to" not in r.output  # no ddprobe-results/ copy per call


def test_cli_replay_writes_json_and_csv(tmp_path):
    r = CliRunner().invoke(app, ["gpu-util", "--replay", str(SYNTH), "--json", str(tmp_path / "r.json"), "--csv",
                                 str(tmp_path / "r.csv")])
    assert r.exit_code == 0, r.output
    assert "latency-bound" in r.output and "compute-bound" in r.output
    d = json.loads((tmp_path / "r.json").read_text())
    assert d["kind"] == "gpu-util" and len(d["rows"]) == 162
    assert {p["verdict"] for p in d["summary"]["per_phase"] if p["phase"] == "decode"} == {"latency-bound"}
    assert (tmp_path / "r.csv").read_text().splitlines()[0].startswith("t_s,gpu,phase,power_W")


def test_cli_replay_rejects_other_kinds(tmp_path):
    r = CliRunner().invoke(app, ["gpu-util", "--replay", str(DATA / "commit-tiny-cpu.json"), "--json",
                                 str(tmp_path / "r.json")])
    assert r.exit_code == 1 and "needs a gpu-util results file" in r.output


def test_replay_equals_fresh_analysis_and_report_renders(tmp_path):
    from ddprobe.reports import render

    res = replay(Result.load(SYNTH))
    assert res.summary["per_phase"] == gv.analyze(res.rows)["per_phase"]
    res.save(tmp_path / "gpu-util-replayed.json")
    for f in [tmp_path / "gpu-util-replayed.json", *sorted(DATA.glob("gpu-util-h200-*.json"))]:
        written = render.write_report([f], tmp_path / f"{f.stem}.md")
        text = written[0].read_text()
        verdicts = {d["verdict"] for d in replay(Result.load(f)).summary["per_phase"]}
        assert verdicts and all(v in text for v in verdicts), (f.name, verdicts)


def test_deep_helpers():
    text = ('==PROF== Connected\n"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n'
            '"0","_paged_verify_kernel","dram__throughput.avg.pct_of_peak_sustained_elapsed","%","0.61"\n'
            '"0","_paged_verify_kernel","gpu__time_duration.sum","msecond","2.50"\n'
            '"0","_paged_verify_kernel","sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed","%","0.9"\n')
    k = parse_ncu_csv(text)
    assert k == [{"id": "0", "kernel": "_paged_verify_kernel", "dram_pct": 0.61, "time_us": 2500.0,
                  "tensor_pct": 0.9}]
    # the H200's ncu wrote the short unit: 33,440 ns is 33.44 us (read as 33,440 us before)
    for unit, value, want in [("ns", "33,440", 33.44), ("nsecond", "33,440", 33.44), ("us", "632.26", 632.26),
                              ("ms", "2.5", 2500.0)]:
        got = parse_ncu_csv(text.replace('"msecond","2.50"', f'"{unit}","{value}"'))[0]["time_us"]
        assert got == pytest.approx(want)
    odd = parse_ncu_csv(text.replace('"msecond"', '"cycle"'))[0]
    assert odd["time_us"] is None and odd["time_unit"] == "cycle"


def test_busy_less_than_half_the_time_with_low_units_is_idle_waiting_on_the_host():
    d = gv.analyze(_rows(util_gpu_pct=25.0, dram_active_pct=1.8, sm_active_pct=6.6))["per_phase"][0]
    assert d["verdict"] == "host-bound" and "waiting on the host" in d["evidence"]
    d = gv.analyze(_rows(**{**NO_GPM, "util_gpu_pct": 25.0}))["per_phase"][0]
    assert d["verdict"] == "host-bound" and d["basis"] == "power+nvml"
    # several GPUs: a host-bound one is working (the headline is its verdict), an idle one is not
    idle = [dict(r, gpu=0) for r in _rows(util_gpu_pct=0, sm_active_pct=0, tensor_active_pct=0, dram_active_pct=0,
                                          power_W=124)]
    host = [dict(r, gpu=1) for r in _rows(util_gpu_pct=25.0, dram_active_pct=1.8, sm_active_pct=6.6)]
    a = gv.analyze(idle + host)
    assert sorted(d["verdict"] for d in a["per_phase"]) == ["host-bound", "idle"]
    assert a["verdict"] == "host-bound"


@pytest.mark.parametrize("path, want", [("paged", "latency-bound"), ("split", "host-bound")])
def test_h200_timelines_replay(path, want):
    f = DATA / f"gpu-util-h200-{path}.json"
    res = replay(Result.load(f))
    by_phase = {d["phase"]: d for d in res.summary["per_phase"]}
    assert by_phase["prefill"]["verdict"] == "compute-bound" and by_phase["decode"]["verdict"] == want
    assert res.summary["eff_bw_GBps"] < 100 and res.summary["attn_gap"] > 100  # far off the KV floor either way
    assert all(r["tensor_active_pct"] is not None for r in res.rows if r["phase"] == "decode")


H200 = DATA / "h200"  # lab-2026-12-03:benchmarks/gpu_util_multi.py on the lent H200 (one GPU: the two-GPU kind was not lent)


def test_recorded_matmul_load_replays_compute_bound_then_idle(tmp_path):
    res = replay(Result.load(H200 / "gpu-util-1gpu-one-busy.json"))
    got = {(d["gpu"], d["phase"]): d for d in res.summary["per_phase"]}
    assert got[(0, "request")]["verdict"] == "compute-bound" and "tensor pipes" in got[(0, "request")]["evidence"]
    assert got[(0, "idle")]["verdict"] == "idle" and res.summary["verdict"] == "compute-bound"
    r = CliRunner().invoke(app, ["gpu-util", "--replay", str(H200 / "gpu-util-1gpu-one-busy.json"), "--json",
                                 str(tmp_path / "r.json")])
    assert r.exit_code == 0 and "compute-bound" in r.output


def test_two_gpus_each_get_their_rows_and_the_headline_is_the_working_one():
    """GPU 1 carries the recorded matmul timeline, GPU 0 sits idle beside it (its samples the recorded
    idle ones, stretched over the same times): one row and verdict per GPU and phase, and the headline
    verdict is the busy GPU's, not GPU 0's."""
    rec = Result.load(H200 / "gpu-util-1gpu-one-busy.json")
    idle = [r for r in rec.rows if r["phase"] == "idle" and r.get("sm_active_pct") is not None]
    rows = []
    for i, r in enumerate(rec.rows):
        rows.append(dict(r, gpu=1))
        rows.append(dict(idle[i % len(idle)], gpu=0, t_s=r["t_s"], window_s=r["window_s"], phase=r["phase"]))
    s = gv.analyze(rows, {}, rec.config["sources"])
    got = {(d["gpu"], d["phase"]): d["verdict"] for d in s["per_phase"]}
    assert got[(0, "request")] == "idle" and got[(1, "request")] == "compute-bound"
    assert s["verdict"] == "compute-bound"


@pytest.mark.parametrize("source", [[], ["--source", "prometheus", "--prom-url", "http://127.0.0.1:1"]])
def test_bad_decode_tokens_is_named_before_any_gpu_or_source_probe(tmp_path, source):
    r = CliRunner().invoke(app, ["gpu-util", "--decode-tokens", "0", *source, "--json", str(tmp_path / "x.json")])
    assert r.exit_code == 1
    assert r.output.strip() == "error: --decode-tokens must be at least 2, got 0", r.output


def test_unbelievable_readings_are_kept_unknown_and_the_file_stays_readable(tmp_path):
    """A negative power from an exporter, text where a clock belongs, a row without its time: the readings are
    kept as unknown (null) or the row dropped, each said once, and the file written with them loads again."""
    from ddprobe.probes.gpu_util import believed
    from ddprobe.results import Result, ResultWriter, RunMeta

    notes: list[str] = []
    rows = believed([{"t_s": 0.1, "gpu": 0, "power_W": -1.0, "sm_clock_MHz": 1980.0},
                     {"t_s": 0.2, "gpu": 0, "power_W": -3.0, "sm_clock_MHz": "fast"},
                     {"t_s": None, "gpu": 0, "power_W": 300.0}], notes)
    assert rows == [{"t_s": 0.1, "gpu": 0, "power_W": None, "sm_clock_MHz": 1980.0},
                    {"t_s": 0.2, "gpu": 0, "power_W": None, "sm_clock_MHz": None}]
    assert notes == ["telemetry: power_W is -1.0 W (must be >= 0): not believed, kept as unknown",
                     "telemetry: sm_clock_MHz is str 'fast' (must be a number in MHz): not believed, kept as unknown",
                     "telemetry: t_s is null (must be a value): that row dropped"]
    w = ResultWriter(Result(kind="gpu-util", meta=RunMeta.collect(probe_gpu=False), config={}), tmp_path / "g.json")
    for r in rows:
        w.add(r)
    assert [r.power_W for r in Result.load(tmp_path / "g.json").records] == [None, None]


def test_step_parts_split_the_decode_step_into_launches_and_bytes():
    """k2 at 64k (docs/perf.md): 1,424 kernels; at 2.5 us each 3.56 ms of launches against 10.4 ms of bytes in an
    18.37 ms step: bandwidth-bound, the launches 19% of it."""
    from ddprobe.probes.gpu_util import step_parts

    req = {"latency_floor_ms": 1424 * 2.5e-3, "bytes_floor_ms": 10.4, "kernels": 1424, "kernel_us": 2.5, "syncs": 0,
           "launches_source": "counted on the GPU"}
    p = step_parts({"request": req, "decode_step_ms": 18.37})["step_parts"]
    assert p["bound"] == "bandwidth-bound" and p["launch_share"] == pytest.approx(3.56 / 18.37)
    assert p["bytes_share"] == pytest.approx(10.4 / 18.37)
    tiny = step_parts({"request": {**req, "latency_floor_ms": 0.6, "bytes_floor_ms": 0.0014}, "decode_step_ms": 0.7})
    assert tiny["step_parts"]["bound"] == "launch-bound"
    assert step_parts({"request": {}, "decode_step_ms": 1.0}) == {}  # a server: no floor, no parts


@pytest.mark.parametrize("key,value,says", [
    ("power_W", 1e12, "'power_W' is 1000000000000.0 W (must be <= 100000)"),
    ("gpm_sm_util_pct", 500.0, "'sm_active_pct' is 500.0 % (must be <= 105)"),  # an older file's key, upgraded
    ("power_limit_W", 0, "'power_limit_W' is 0 W (must be > 0)"),
    ("sm_clock_MHz", 1e9, "'sm_clock_MHz' is 1000000000.0 MHz (must be <= 100000)"),
])
def test_a_reading_no_gpu_can_give_is_refused_on_replay_and_unknown_when_live(key, value, says, tmp_path):
    """A replayed file with a 1e12 W power, a 500% SM activity or a zero power limit was re-analysed as if true
    (issue 65): now refused in one line naming the field; the same reading from a live source is kept as unknown
    and said (``believed``), so a live run never fails on it."""
    import subprocess
    import sys

    from ddprobe.probes.gpu_util import believed

    doc = json.loads((DATA / "gpu-util-synthetic.json").read_text())
    for r in doc["rows"]:
        r[key] = value
    bad = tmp_path / "g.json"
    bad.write_text(json.dumps(doc))
    r = subprocess.run([sys.executable, "-m", "ddprobe", "gpu-util", "--replay", str(bad)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 1 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    live = key.replace("gpm_sm_util_pct", "sm_active_pct")
    notes: list[str] = []
    assert believed([{"t_s": 0.1, "gpu": 0, live: value, "util_gpu_pct": 100.0}], notes) == \
        [{"t_s": 0.1, "gpu": 0, live: None, "util_gpu_pct": 100.0}]
    assert notes and notes[0].startswith(f"telemetry: {live} is ") and "not believed, kept as unknown" in notes[0]
