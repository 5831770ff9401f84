"""Telemetry across many GPUs and nodes: dcgm-exporter endpoints served on 127.0.0.1 from recorded exposition
text (tests/data/recorded/SOURCES.md), read directly and through a real Prometheus server (Debian's
``prometheus``, started here with a 1 s scrape interval; skipped with the reason when it is not installed)."""
import functools
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddprobe import gpu_verdict as gv, signals
from ddprobe.cli import app
from ddprobe.probes.telemetry.dcgm_exporter import ExporterSource, parse
from ddprobe.probes.gpu_util import replay
from ddprobe.probes.telemetry.prometheus import PromWindow
from ddprobe.probes.telemetry.sampler import Sampler
from ddprobe.probes.telemetry.sources import SourceUnavailable
from ddprobe.results import Result, RunMeta

REC = Path(__file__).parent / "data" / "recorded"
NODES = [(REC / f"constructed-dcgm-h200-node-{n}-decode.txt").read_text() for n in (0, 1)]
VLLM = [(REC / f"constructed-vllm-metrics-{w}.txt").read_text() for w in ("before", "after")]


class Endpoint:
    """A /metrics endpoint on 127.0.0.1 serving ``texts`` in turn (the last one from then on)."""

    def __init__(self, *texts: str):
        self.texts, self.hits = list(texts), 0
        ep = self

        class H(BaseHTTPRequestHandler):
            def do_GET(self):
                body = ep.texts[min(ep.hits, len(ep.texts) - 1)].encode()
                ep.hits += 1
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- recorded dcgm-exporter output, parsed with its labels ---------------------------------------------------
def test_real_mig_output_is_one_row_per_slice_with_node_and_model():
    got = parse((REC / "dcgm-exporter-issue317-a30.txt").read_text(), "x")
    assert len(got) == 6  # GPU 0 has four MIG slices (GPU_I_ID 3-6), GPU 1 two: never summed over labels
    key = ("yg-data-k8s-gpu-a30-node-test-test0003.mt", "1", "4")
    assert got[key]["values"] == {"sm_occupancy_pct": 0.0, "power_W": 56.127}
    assert got[key]["labels"]["modelName"] == "NVIDIA A30"


def test_real_output_with_pod_labels_reads_tensor_as_percent():
    (g,) = parse((REC / "dcgm-exporter-issue68-a30.txt").read_text(), "x").values()
    assert g["values"] == {"tensor_active_pct": pytest.approx(2.2137)}
    assert "pod" not in g["labels"]  # empty pod/namespace labels are dropped


def test_readme_output_without_hostname_is_named_by_the_exporter_address():
    ep = Endpoint((REC / "dcgm-exporter-readme.txt").read_text())
    try:
        src = ExporterSource([ep.url])
        (gpu,) = src.open()
        (row,) = src.sample()
    finally:
        ep.close()
    assert gpu["node"] == ep.url.removeprefix("http://") and gpu["node_gpu"] == "0"
    assert row["sm_clock_MHz"] == 139 and row["tensor_active_pct"] is None  # not served: missing, not 0
    assert any("Hostname missing" in n for n in src.notes)
    assert src.sources["tensor_active_pct"].startswith("missing: no DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")


# ---- dcgm-exporter sampled directly: 8 GPUs on 2 nodes ------------------------------------------------------
@pytest.fixture
def nodes():
    eps = [Endpoint(t) for t in NODES]
    yield eps
    for e in eps:
        e.close()


def _sample_decode(urls, period=0.02):
    factory = functools.partial(ExporterSource, urls)
    factory.kind = "dcgm-exporter"
    s = Sampler(period, reader_factory=factory).start()
    assert s.available, s.sources
    s.mark("prefill")
    time.sleep(0.1)
    s.mark("decode")
    time.sleep(0.3)
    s.mark("idle")
    return s, s.stop()


def test_eight_gpu_latency_bound_decode_one_verdict_each_and_they_agree(nodes, tmp_path):
    s, rows = _sample_decode([e.url for e in nodes])
    assert {(r["node"], r["node_gpu"]) for r in rows} == {(f"node-{n}", str(g)) for n in (0, 1) for g in range(4)}
    a = gv.analyze(rows, None, s.sources)
    dec = [d for d in a["per_phase"] if d["phase"] == "decode"]
    assert len(dec) == 8 and {d["verdict"] for d in dec} == {"latency-bound"}
    assert {d["basis"] for d in dec} == {"dcgm"}  # the values came from DCGM's fields, not NVML GPM
    assert a["agree"] == "all 8 GPUs agree: latency-bound (2 nodes)"
    assert [n["node"] for n in a["nodes"]] == ["node-0", "node-1"] and a["nodes"][0]["verdicts"] == {
        "latency-bound": 4}
    assert a["nodes"][0]["tensor_active_pct"] == pytest.approx(3.05, abs=0.06)
    assert a["nodes"][0]["power_pct"] == pytest.approx(20.2, abs=0.3)  # 140 W of the H200's 700 W datasheet
    # the replay of the saved timeline says the same
    res = Result(kind="gpu-util", meta=RunMeta.collect(probe_gpu=False), config={"sources": s.sources}, rows=rows)
    res.save(tmp_path / "g.json")
    again = replay(Result.load(tmp_path / "g.json")).summary
    assert again["agree"] == a["agree"] and len([d for d in again["per_phase"] if d["phase"] == "decode"]) == 8


def test_gpus_that_agree_print_one_evidence_line_per_phase(nodes, tmp_path):
    from ddprobe.cli.gpu_source import evidence_lines

    s, rows = _sample_decode([e.url for e in nodes])
    a = gv.analyze(rows, None, s.sources)
    (dec,) = [line for line in evidence_lines(a) if line.startswith("decode")]
    # the medians over the 8 GPUs (tensor 3.0, 3.05 ... 3.35%: median 3.175%; power 140 W of 700 W), in the
    # sentence of their verdict
    assert dec.startswith("decode: all 8 GPUs agree: latency-bound (2 nodes); at the GPUs' medians: ")
    assert "tensor pipes 3.2%" in dec and "power 20% of the limit" in dec and dec.endswith("latency-bound")
    # two GPUs of node-1 fall idle: the disagreement, the majority at its medians, a line for each idle GPU
    for r in rows:
        if r["node"] == "node-1" and r["node_gpu"] in ("2", "3") and r["phase"] == "decode":
            r.update(util_gpu_pct=0.0, sm_active_pct=0.0, tensor_active_pct=0.0, dram_active_pct=0.0)
    lines = [line for line in evidence_lines(gv.analyze(rows, None, s.sources)) if "decode" in line]
    assert lines[0] == "decode: GPUs on 2 nodes disagree: 6 latency-bound, 2 idle (node-1/2, node-1/3)"
    assert lines[1].startswith("decode, the 6 latency-bound GPUs at their medians: ") and "tensor pipes 3" in lines[1]
    assert [line.split(":")[0] for line in lines[2:]] == ["GPU node-1/2 decode", "GPU node-1/3 decode"]
    # the CLI prints the same: one decode line for the 8 agreeing GPUs, none per GPU
    res = Result(kind="gpu-util", meta=RunMeta.collect(probe_gpu=False), config={"sources": s.sources},
                 rows=_sample_decode([e.url for e in nodes])[1])
    res.save(tmp_path / "g.json")
    r = CliRunner().invoke(app, ["gpu-util", "--replay", str(tmp_path / "g.json"), "--json", str(tmp_path / "r.json")])
    assert r.exit_code == 0, r.output
    printed = [line for line in r.output.splitlines() if "decode:" in line]
    assert len(printed) == 1 and "all 8 GPUs agree" in printed[0] and "GPU node-0/0 decode" not in r.output


def test_an_exporter_that_stops_answering_keeps_the_other_nodes(nodes):
    factory = functools.partial(ExporterSource, [e.url for e in nodes])
    factory.kind = "dcgm-exporter"
    s = Sampler(0.02, reader_factory=factory).start()
    time.sleep(0.06)
    nodes[1].close()
    closed_at = s.now()  # on the sampler's clock: a tick stamped later cannot reach node-1 (not a fixed 0.12 s: a
    time.sleep(0.1)      # loaded machine closes late)
    rows = s.stop()  # stop() takes one more tick: late rows exist
    late = [r for r in rows if r["t_s"] > closed_at]
    assert any(r["node"] == "node-1" for r in late)
    assert all(r["tensor_active_pct"] is not None for r in late if r["node"] == "node-0")
    assert all(r["tensor_active_pct"] is None for r in late if r["node"] == "node-1")
    assert sum("cannot connect" in n for n in s.notes) == 1  # one line, not one per tick


def test_nan_samples_and_an_energy_counter_reset(tmp_path):
    head = ('DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="0",UUID="GPU-1",modelName="NVIDIA H200",Hostname="n"} %s\n'
            'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu="0",UUID="GPU-1",modelName="NVIDIA H200",Hostname="n"} %s\n')
    ep = Endpoint(head % (5e6, "0.03"), head % (6e6, "NaN"), head % (1e3, "0.03"), head % (2e3, "0.03"))
    try:
        src = ExporterSource([ep.url])
        src.open()  # the first text
        rows = [{"t_s": float(t), "gpu": 0, **r} for t in range(3) for r in src.sample()]
        src.close()
    finally:
        ep.close()
    from ddprobe.probes.telemetry.sources import undo_resets

    notes = []
    undo_resets(rows, notes)
    assert [r["energy_J"] for r in rows] == [6000.0, 6001.0, 6002.0]  # mJ -> J, the restart continued
    assert rows[0]["tensor_active_pct"] is None and rows[1]["tensor_active_pct"] == 3.0
    assert len(notes) == 1 and "counter reset" in notes[0]
    assert any("NaN" in n for n in src.notes)


def test_unreachable_exporter_and_prometheus_are_one_line(tmp_path):
    port = _free_port()
    r = CliRunner().invoke(app, ["gpu-util", "--source", "dcgm-exporter", "--exporter-url",
                                 f"http://127.0.0.1:{port}", "--json", str(tmp_path / "x.json")])
    assert r.exit_code == 1 and "cannot connect" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(app, ["gpu-util", "--source", "prometheus", "--prom-url", f"http://127.0.0.1:{port}",
                                 "--json", str(tmp_path / "x.json")])
    assert r.exit_code == 1 and "Prometheus" in r.output and "cannot connect" in r.output
    assert not (tmp_path / "x.json").exists()  # nothing started, nothing measured


def test_old_gpm_files_load_with_the_signal_keys():
    r = Result.load(Path(__file__).parent / "data" / "gpu-util-h200-paged.json")
    assert all(not k.startswith("gpm_") for row in r.rows for k in row)
    assert any(row.get("tensor_active_pct") is not None for row in r.rows)
    assert all(k in signals.STATS for k in r.summary["per_phase"][0]["signals"])


# ---- a real Prometheus scraping the endpoints --------------------------------------------------------------
@pytest.fixture(scope="module")
def prom(tmp_path_factory):
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("the prometheus binary is not installed (apt-get install prometheus)")
    eps = [Endpoint(t) for t in NODES] + [Endpoint(*([VLLM[0]] * 2 + [VLLM[1]]))]
    d = tmp_path_factory.mktemp("prom")
    targets = lambda es: ", ".join(f"'{e.url.removeprefix('http://')}'" for e in es)  # noqa: E731
    (d / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\nscrape_configs:\n"
        f"  - job_name: dcgm\n    static_configs: [{{targets: [{targets(eps[:2])}]}}]\n"
        f"  - job_name: vllm\n    static_configs: [{{targets: [{targets(eps[2:])}]}}]\n")
    port = _free_port()
    t_start = time.time()
    p = subprocess.Popen([binary, f"--config.file={d / 'prometheus.yml'}", f"--storage.tsdb.path={d / 'data'}",
                          f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(url + "/-/ready", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        # Prometheus applies static targets a few seconds after it starts; then a few scrapes of each
        for _ in range(200):
            q = urllib.request.urlopen(url + "/api/v1/query?query=count(up%3D%3D1)", timeout=2).read()
            if b'"3"' in q:
                break
            time.sleep(0.1)
        time.sleep(3.2)
        yield url, t_start
    finally:
        p.terminate()
        p.wait(10)
        for e in eps:
            e.close()


def test_prometheus_window_reads_every_gpu_of_both_nodes(prom):
    url, t0 = prom
    w = PromWindow(url)
    assert w.check()
    rows, gpus = w.fetch(t0, time.time(), t0)
    assert w.step_s == 1.0 and "targets" in w.sources["step"]
    assert len(gpus) == 8 and {g["node"] for g in gpus} == {"node-0", "node-1"}
    assert {g["name"] for g in gpus} == {"NVIDIA H200"} and all(g["uuid"].startswith("GPU-") for g in gpus)
    per_gpu = [r for r in rows if r["gpu"] == 0]
    assert len(per_gpu) >= 3 and per_gpu[-1]["tensor_active_pct"] == pytest.approx(3.0)
    for r in rows:
        r["phase"] = "decode"
    a = gv.analyze(rows, None, w.sources)
    assert a["agree"] == "all 8 GPUs agree: latency-bound (2 nodes)"
    assert {d["basis"] for d in a["per_phase"]} == {"dcgm"}
    eng = w.engine(t0, time.time(), t0)
    assert eng["vllm:spec_decode_num_drafts_total"] > 0 and eng["commit_len"] > 1 and eng["timeline"]


def test_prometheus_match_narrows_and_no_series_is_one_line(prom):
    url, t0 = prom
    _, gpus = PromWindow(url, 'Hostname=~"node-1"').fetch(t0, time.time(), t0)
    assert {g["node"] for g in gpus} == {"node-1"} and len(gpus) == 4
    with pytest.raises(SourceUnavailable, match="no DCGM series matching"):
        PromWindow(url, 'Hostname="nowhere"').fetch(t0, time.time(), t0)


def test_a_window_shorter_than_one_scrape_is_said(prom):
    url, _ = prom
    w = PromWindow(url)
    now = time.time()
    rows, _ = w.fetch(now - 2.4, now - 2.0, now - 2.4)
    assert rows and any("shorter than one scrape" in n and "scrape_interval: 0.1s" in n for n in w.notes)


def _tiny_gpu_util(url: str, tmp_path, *more: str):
    """``gpu-util`` on the tiny CPU engine (256-token prompt) sampled from the Prometheus at ``url``; -> g.json."""
    return CliRunner().invoke(app, ["gpu-util", "--source", "prometheus", "--prom-url", url, "--preset", "tiny",
                                    "--attn", "reference", "--device", "cpu", "--dtype", "fp32", "--prompt-len", "256",
                                    *more, "--json", str(tmp_path / "g.json")])


def test_gpu_util_cli_on_the_tiny_engine_with_prometheus(prom, tmp_path):
    url, _ = prom
    r = _tiny_gpu_util(url, tmp_path, "--decode-tokens", "16", "--no-warmup")
    assert r.exit_code == 0, r.output
    res = Result.load(tmp_path / "g.json")
    assert res.config["source"] == "prometheus" and len({row["gpu"] for row in res.rows}) == 8
    # the tiny engine's request lasts about a second here: one or two 1 s scrapes, and the CLI says so
    assert "all 8 GPUs agree" in r.output or "too coarse" in r.output or "shorter than one scrape" in r.output
    assert "latency-bound" in r.output and "node-1/3" in r.output
    assert res.summary["engine"]["vllm:spec_decode_num_drafts_total"] >= 0


def test_gpu_util_cli_estimates_after_the_warm_up_and_says_what_deep_found(prom, tmp_path):
    """The command's pipeline end to end (``gpu_util_run``): the request estimated after the warm-up, its timing
    beside the estimate, and --deep's ncu run recorded and printed (here without ncu: skipped, saying why)."""
    url, _ = prom
    r = _tiny_gpu_util(url, tmp_path, "--decode-tokens", "8", "--deep")
    assert r.exit_code == 0, r.output
    res = Result.load(tmp_path / "g.json")
    timing = res.summary["timing"]
    assert timing["actual_s"] == res.summary["request"]["e2e_s"] > 0
    assert timing["estimate_s"] == res.config["estimate"]["total_s"] > 0  # the engine is calibrated after warm-up
    if not (shutil.which("ncu") or Path("/usr/local/cuda/bin/ncu").exists()):
        assert res.summary["deep"] == {"skipped": "ncu not found on PATH or in /usr/local/cuda/bin"}
        assert "ncu: ncu not found on PATH" in r.output
    else:
        assert "deep" in res.summary and "ncu: " in r.output


def test_report_has_a_per_node_table_the_agreement_and_a_heat_strip(nodes, tmp_path):
    from ddprobe.reports import findings, render

    s, rows = _sample_decode([e.url for e in nodes])
    res = Result(kind="gpu-util", meta=RunMeta.collect(probe_gpu=False), config={"sources": s.sources}, rows=rows,
                 summary=gv.analyze(rows, None, s.sources))
    res.save(tmp_path / "in" / "gpu-util.json")
    report = render.build([tmp_path / "in"], command="ddprobe report")
    (sec,) = report.sections
    node_table = next(t for t in sec.tables if t.title == "Per node")
    assert [r[0] for r in node_table.rows] == ["node-0", "node-1"] and "all 8 GPUs agree" in node_table.note
    assert any(f.name.endswith("-heat") and f.png.startswith(b"\x89PNG") for f in sec.figures)
    assert "decode: all 8 GPUs agree: latency-bound (2 nodes)." in findings.gpu_util(res)


@pytest.mark.parametrize("args, says", [
    (["--source", "prometheus", "--prom-url", "notaurl"], "bad Prometheus URL 'notaurl': expected http://host:port"),
    (["--source", "dcgm-exporter", "--exporter-url", "http://127.0.0.1:1,node2:9400"],
     "bad dcgm-exporter URL 'node2:9400'"),
])
def test_bad_url_is_named_as_given(tmp_path, args, says):
    r = CliRunner().invoke(app, ["gpu-util", *args, "--json", str(tmp_path / "x.json")])
    assert r.exit_code == 1 and says in r.output and "/api/v1" not in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1


def test_prom_window_names_the_url_as_given():
    with pytest.raises(SourceUnavailable, match=r"bad Prometheus URL 'notaurl': expected"):
        PromWindow("notaurl")
