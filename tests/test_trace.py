"""`ddprobe trace` on the CPU: fresh torch.profiler traces of the engine's steps (tiny preset), the three ways of
finding steps, several ranks, the command in a fresh process, `serve` + `trace --url` end to end, and bad input."""
import gzip
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ddprobe.probes.trace import named_rank, run_trace
from ddprobe.units import DDProbeError

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
STEPS = 6


def cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "ddprobe", "trace", *map(str, args)], env=ENV, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def engine_trace(tmp_path_factory) -> Path:
    """A real torch.profiler trace of STEPS verify steps of the tiny engine, one ProfilerStep per step."""
    import torch  # noqa: F401
    from torch.profiler import ProfilerActivity, profile, schedule

    from ddprobe.engine.generate import Engine

    eng = Engine("tiny", attn="reference", device="cpu")
    ids = list(range(5, 45))
    eng.generate(ids, 8)
    path = tmp_path_factory.mktemp("traces") / "tiny-TP-0.trace.json.gz"
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=0, active=100)) as prof:
        eng.generate(ids, STEPS * 3, on_tokens=lambda toks, n: prof.step())
    prof.export_chrome_trace(str(path))
    return path


def rewrite(src: Path, dst: Path, keep) -> Path:
    doc = json.loads(gzip.open(src, "rt").read())
    doc["traceEvents"] = [e for e in doc["traceEvents"] if keep(e)]
    with gzip.open(dst, "wt") as f:
        json.dump(doc, f)
    return dst


def as_rank(src: Path, dst: Path, rank: int) -> Path:
    """``src`` as rank ``rank``'s trace: the same events, its own distributedInfo (two files of the same bytes are
    one trace, refused as two ranks)."""
    doc = json.loads(gzip.open(src, "rt").read())
    doc["distributedInfo"] = {"rank": rank, "world_size": 2}
    with gzip.open(dst, "wt") as f:
        json.dump(doc, f)
    return dst


def test_engine_trace_steps_by_markers(engine_trace):
    res, ranks = run_trace([engine_trace], cpu_ops=True)
    row = res.rows[0]
    assert row["method"] == "markers" and row["steps"] >= STEPS - 1
    assert 0 < row["busy_ms"] <= row["step_ms"] and row["idle_ms"] >= 0
    assert row["busy_ms"] + row["idle_ms"] == pytest.approx(row["step_ms"], rel=1e-12)  # all three of one step
    assert row["overlap_ms"] == pytest.approx(0.0, abs=1e-9)  # one thread: nothing counted twice
    summed = sum(row[f"{c}_ms"] for c in ("attention", "moe", "gemm", "communication", "norm_elementwise",
                                          "sampling_tree", "other"))
    busy = sum(ranks[0].steps.busy_ms) / row["steps"]  # the class times are means per step
    assert summed == pytest.approx(busy, rel=0.02)  # one thread: top-level operators never overlap
    assert row["gemm_ms"] > 0 and row["gemm_per_step"] >= 8  # the tiny target's projections, every step
    assert row["sampling_tree_per_step"] >= 1  # the tree's top-k / the walk's argmax
    strip = res.summary["strip"]
    assert strip["kernels"] and all(k[1] >= 0 and k[2] >= 0 for k in strip["kernels"])


def test_without_markers_the_repeating_sequence_is_found(engine_trace, tmp_path):
    bare = rewrite(engine_trace, tmp_path / "bare.json.gz", lambda e: e.get("cat") != "user_annotation")
    res, ranks = run_trace([bare], cpu_ops=True)
    marked, _ = run_trace([engine_trace], cpu_ops=True)
    row = res.rows[0]
    assert row["method"] == "repeating kernel sequence" and row["steps"] >= 2
    assert "repeats" in ranks[0].detail
    # the window that repeats is one verify step: its span within 30% of the marked steps' median
    assert row["step_ms"] == pytest.approx(marked.rows[0]["step_ms"], rel=0.3)


def test_ranks_side_by_side_with_skew(engine_trace, tmp_path):
    for r in (0, 1):
        as_rank(engine_trace, tmp_path / f"1700000000.5-TP-{r}.trace.json.gz", r)
    with pytest.raises(DDProbeError, match="no GPU kernels"):
        run_trace([tmp_path])
    res, _ = run_trace([tmp_path], cpu_ops=True)
    assert [r["rank"] for r in res.rows] == [0, 1]
    sk = res.summary["skew"]
    assert sk["ranks"] == 2 and sk["skew"] == pytest.approx(1.0) and set(sk["communication_ms"]) == {"0", "1"}


def test_sglang_stages_and_merged_files(engine_trace, tmp_path):
    for stage in ("EXTEND", "DECODE"):
        shutil.copy(engine_trace, tmp_path / f"1733.5-TP-0-{stage}.trace.json.gz")
    res, _ = run_trace([tmp_path], cpu_ops=True)
    assert [Path(r["file"]).name for r in res.rows] == ["1733.5-TP-0-DECODE.trace.json.gz"]
    assert "EXTEND" in res.config["left_out"][0]
    merged = tmp_path / "m"
    merged.mkdir()
    shutil.copy(engine_trace, merged / "merged-1733.5.trace.json.gz")
    with pytest.raises(DDProbeError, match="merge_profiles false"):
        run_trace([merged], cpu_ops=True)


def test_rank_from_sglang_and_vllm_names():
    assert named_rank(Path("1733.12-TP-3.trace.json.gz"), {}) == 3
    assert named_rank(Path("1733.12-TP-5-DP-0-EXTEND.trace.json.gz"), {}) == 5
    assert named_rank(Path("dp0_pp0_tp2_dcp0_ep0_rank2.1733000000123.pt.trace.json.gz"), {}) == 2
    assert named_rank(Path("whatever.json"), {"distributedInfo": {"rank": 7}}) == 7
    assert named_rank(Path("whatever.json"), {}) is None  # no rank said: a lone trace is rank 0, several refused
    for bad in (-1, "3", 2.0, True, None):  # not a rank: not believed, the name is used
        assert named_rank(Path("x-TP-6.trace.json.gz"), {"distributedInfo": {"rank": bad}}) == 6
        assert named_rank(Path("whatever.json"), {"distributedInfo": {"rank": bad}}) is None


def test_the_command_in_a_fresh_process(engine_trace, tmp_path):
    out = tmp_path / "t.json"
    r = cli(engine_trace, "--cpu-ops", "-o", out)
    assert r.returncode == 0, r.stderr
    assert "steps by markers" in r.stdout and "dense GEMM" in r.stdout
    from ddprobe.results import load

    got = load(out)
    assert got.kind == "trace" and got.records[0].steps >= STEPS - 1
    again = cli(engine_trace, "--cpu-ops", "-o", out)  # results already there: refused, kept
    assert again.returncode == 1 and "--force" in again.stderr and load(out).rows == got.rows


def one_line_error(r, *words):
    assert r.returncode == 1, (r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    for w in words:
        assert w in r.stderr, r.stderr


def test_bad_input_one_line_each_and_nothing_written(engine_trace, tmp_path):
    out = tmp_path / "never.json"
    text = tmp_path / "notes.txt"
    text.write_text("not a trace at all\n")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"schema": "x", "rows": []}))
    cut = tmp_path / "cut.trace.json.gz"
    cut.write_bytes(engine_trace.read_bytes()[: engine_trace.stat().st_size // 2])
    two = rewrite(engine_trace, tmp_path / "two.json.gz", lambda e: e.get("cat") == "cpu_op")
    doc = json.loads(gzip.open(two, "rt").read())
    doc["traceEvents"] = doc["traceEvents"][:2]
    two.write_bytes(gzip.compress(json.dumps(doc).encode()))
    one_line_error(cli(text, "-o", out), "not a torch-profiler trace")
    one_line_error(cli(other, "-o", out), "not a torch-profiler trace")
    one_line_error(cli(cut, "-o", out), "truncated")
    one_line_error(cli(engine_trace, "-o", out), "no GPU kernels", "--cpu-ops")
    one_line_error(cli(two, "--cpu-ops", "-o", out), "no step markers", "no repeating")
    one_line_error(cli(tmp_path / "missing.json.gz", "-o", out), "no such file")
    one_line_error(cli("-o", out), "--url")
    assert not out.exists()
    # a refused --url leaves nothing behind, not even the default folder it would have written the traces in
    r = subprocess.run([sys.executable, "-m", "ddprobe", "trace", "--url", f"http://127.0.0.1:{free_port()}",
                        "--num-steps", "2"], env=ENV, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    one_line_error(r, "refused")
    assert not (tmp_path / "ddprobe-results").exists()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_server_without_a_profiler_is_one_line(tmp_path):
    """A real HTTP server that, like vLLM started without --profiler-config, has no /start_profile (404)."""
    import uvicorn
    from fastapi import FastAPI

    app = FastAPI()
    app.add_api_route("/v1/models", lambda: {"data": [{"id": "m"}]}, methods=["GET"])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))  # the OS's port
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    t0 = time.time()
    while not server.started:
        assert th.is_alive() and time.time() - t0 < 60, "the test server did not start"
        time.sleep(0.02)
    try:
        url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
        r = cli("--url", url, "--dir", tmp_path / "d", "-o", tmp_path / "o.json", "--wait", "5")
        one_line_error(r, "404", "--profiler-config")
        assert not (tmp_path / "o.json").exists()
    finally:
        server.should_exit = True
        th.join(10)


def test_serve_and_trace_url_end_to_end(tmp_path):
    """`ddprobe serve` (tiny engine, CPU) writes a real torch.profiler trace of its verify steps at /start_profile;
    `ddprobe trace --url` asks for it, waits for the file and reads it."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ddprobe", "serve", "--preset", "tiny", "--port", str(port)],
                            env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        import requests

        t0 = time.time()
        while True:
            assert proc.poll() is None and time.time() - t0 < 120, "serve did not start"
            try:
                requests.get(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except requests.RequestException:
                time.sleep(0.3)
        r = cli("--url", f"http://127.0.0.1:{port}", "--num-steps", 4, "--ctx", "1k", "--cpu-ops", "--dir",
                tmp_path / "d", "-o", tmp_path / "o.json")
        assert r.returncode == 0, r.stderr
        files = list((tmp_path / "d").glob("*-TP-0*.trace.json.gz"))
        # only the decode stage: serve counts steps as SGLang does (the prefill is one), so a profile started at the
        # request would hold the prefill without profile_by_stage; each step's label says its context
        assert [f.name.split("-TP-0")[1] for f in files] == ["-DECODE.trace.json.gz"]
        res = json.loads((tmp_path / "o.json").read_text())
        row = res["rows"][0]
        assert row["method"] == "labels" and row["steps"] == 4 and row["mode"] == "verify", row
        assert 1024 < row["ctx_labels"] < 1024 + 4 * 9, row  # the asked context, and the tokens decoded since
        assert "set apart" not in res["summary"]["detail"]["0"]  # no prefill step in it
        stop = requests.post(f"http://127.0.0.1:{port}/stop_profile", json={}, timeout=30)  # already stopped itself
        assert stop.status_code == 400 and "not in progress" in stop.text
        # --no-request: the user's own request makes the steps
        own = subprocess.Popen([sys.executable, "-m", "ddprobe", "trace", "--url", f"http://127.0.0.1:{port}",
                                "--no-request", "--num-steps", "3", "--cpu-ops", "--wait", "60", "--dir",
                                str(tmp_path / "d2"), "-o", str(tmp_path / "o2.json")], env=ENV, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        t0 = time.time()
        while own.poll() is None:  # the user's traffic, until trace has its steps
            assert time.time() - t0 < 90, "trace --no-request did not finish"
            requests.post(f"http://127.0.0.1:{port}/generate", json={"text": "one two three", "sampling_params":
                                                                     {"max_new_tokens": 24}}, timeout=60)
        _, err_text = own.communicate(timeout=90)
        assert own.returncode == 0, err_text
        assert json.loads((tmp_path / "o2.json").read_text())["rows"][0]["steps"] == 3
    finally:
        proc.terminate()
        proc.wait(30)


def test_read_trace_refuses_what_it_cannot_read(tmp_path):
    from ddprobe.probes.trace_parts.read import read_trace

    p = tmp_path / "x.json"
    p.write_text('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 2, }')
    with pytest.raises(DDProbeError, match="not valid JSON|truncated"):
        read_trace(p)
    # numbers a file carries are checked before they are believed: each damaged field is one line naming the event
    good = {"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 2, "args": {"grid": [1, 8, 1], "stream": 7}}
    bad = [{"ts": "x"}, {"dur": None}, {"dur": -3}, {"dur": "nan"}, {"args": {"grid": "bad"}},
           {"args": {"grid": [1, 8, 1], "stream": "s7"}}]
    for change in bad:
        p.write_text(json.dumps({"traceEvents": [good, {**good, **change}]}))
        with pytest.raises(DDProbeError) as e:
            read_trace(p)
        assert str(e.value).startswith(f"{p}: event 2 ('k') has a field that is not what a trace holds: ")
        assert "\n" not in str(e.value)
    missing = [{k: v for k, v in good.items() if k != key} for key in ("ts", "dur")]
    op = {"ph": "X", "cat": "cpu_op", "name": "k", "ts": 1, "dur": 2}  # read with --cpu-ops, checked the same way
    for ev, cpu in [(m, False) for m in missing] + [({**op, **c}, True) for c in
                                                     ({"dur": float("nan")}, {"dur": -1}, {"ts": "x"})] + \
            [({k: v for k, v in op.items() if k != "ts"}, True)]:
        p.write_text(json.dumps({"traceEvents": [good, ev]}))
        with pytest.raises(DDProbeError) as e:
            read_trace(p, cpu_ops=cpu)
        assert str(e.value).startswith(f"{p}: event 2 ('k') has a field that is not what a trace holds: "), e.value
    p.write_text(json.dumps({"traceEvents": [good]}))
    assert [k.dur for k in read_trace(p).kernels] == [2.0]


def test_report_draws_the_step_anatomy(engine_trace, tmp_path):
    """`report` on a trace result: findings in words, the stacked bar per rank and one step's timeline strip."""
    from ddprobe.reports import render

    for r in (0, 1):
        as_rank(engine_trace, tmp_path / f"1700000000.5-TP-{r}.trace.json.gz", r)
    res, _ = run_trace([tmp_path], cpu_ops=True)
    res.save(tmp_path / "trace.json")
    report = render.build([tmp_path / "trace.json"])
    (s,) = report.sections
    assert s.kind == "trace" and [f.name.split("-")[-1] for f in s.figures] == ["anatomy", "strip"]
    assert all(f.png.startswith(b"\x89PNG") for f in s.figures)
    assert s.findings[0].startswith("rank 0:") and "skew" in s.findings[-1]
    html = render.write(report, tmp_path / "r.html")[0].read_text()
    assert "Where the step goes" in html and "The attention kernel against the GPU" in html


def graph_trace(path: Path, steps: int = 4, fwd_us: float = 5040.0) -> Path:
    """A Kineto file shaped as a CUDA-graph verify step is recorded (structure only, no GPU here): per step a draft
    graph of 3 kernels, a verify graph whose 61 layers each run SGLang's `_fwd_kernel` (grid 1 x 8 x 1) and a GEMM,
    then an eager device-to-host copy; graph kernels carry their cudaGraphLaunch's correlation id."""
    ev, t, corr = [], 1000.0, 1
    for _ in range(steps):
        for graph in ("draft", "verify"):
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": t - 20, "dur": 10,
                       "args": {"correlation": corr}})
            kernels = [("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", [1, 16, 1], 30.0)] * 3 if graph == "draft" else \
                [k for _ in range(61) for k in (("_fwd_kernel", [1, 8, 1], fwd_us),
                                                ("nvjet_tst_128x64_64x8_2x1_v_bz_coopA_TNN", [132, 1, 1], 40.0))]
            for name, grid, dur in kernels:
                ev.append({"ph": "X", "cat": "kernel", "name": name, "ts": t, "dur": dur,
                           "args": {"grid": grid, "block": [256, 1, 1], "registers per thread": 128,
                                    "shared memory": 65536, "blocks per SM": grid[0] * grid[1] / 132,
                                    "warps per SM": grid[0] * grid[1] * 8 / 132, "est. achieved occupancy %": 0,
                                    "stream": 7, "correlation": corr}})
                t += dur + 1.0
            corr += 1
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "ts": t - 5, "dur": 3,
                   "args": {"correlation": corr}})
        ev.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "ts": t, "dur": 2.0,
                   "args": {"stream": 7, "correlation": corr}})
        corr, t = corr + 1, t + 200.0  # the host's gap before the next step
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "numSms": 132}],
           "traceEvents": ev}
    with gzip.open(path, "wt") as f:
        json.dump(doc, f)
    return path


def test_graph_launches_are_the_units_and_the_grid_is_read(tmp_path):
    res, ranks = run_trace([graph_trace(tmp_path / "g-TP-0.trace.json.gz")], model="kimi-k2", ctx=32768, tp=8)
    row = res.rows[0]
    assert row["method"] == "graph launches" and row["steps"] == 4
    assert "3 graph launches" in ranks[0].detail
    assert row["attn_kernel"] == "_fwd_kernel" and row["attn_calls"] == 61 and row["sms"] == 132
    assert row["attn_grid"].startswith("grid 1 x 8 x 1 = 8 blocks on 132 SMs: at most 6% of the GPU can work on it")
    assert row["attention_ms"] == pytest.approx(61 * 5.040)
    assert [(a["name"], a["role"]) for a in row["attn_kernels"]] == [("_fwd_kernel", "verify")]
    # the KV one call reads: MLA's 576-value bf16 latent row (1152 B) per token per layer, all of it on each GPU
    assert row["attn_kv_B_per_call"] == 1152 * 32768
    assert row["attn_eff_bw_GBps"] == pytest.approx(1152 * 32768 / 5040e-6 / 1e9)
    assert row["attn_kernel_floor_us"] == pytest.approx(1152 * 32768 / 3.35e12 * 1e6)  # the H100's datasheet
    assert row["gap"] == pytest.approx(row["step_ms"] / row["floor_ms"])
    # every attention kernel together: the step's KV (61 layers) over the attention time per step
    assert row["attn_class_eff_bw_GBps"] == pytest.approx(61 * 1152 * 32768 / (61 * 5040e-6) / 1e9)
    # 1 us between consecutive kernels (125 per step, the copy last), nothing else idle inside the step
    assert row["idle_ms"] == pytest.approx(125 * 1.0 / 1e3)
    assert row["busy_ms"] == pytest.approx((3 * 30 + 61 * (5040 + 40) + 2) / 1e3)


@pytest.mark.parametrize("args,words", [
    (["--marker", "("], "--marker: not a regular expression"),
    (["--model", "nope"], "--model: unknown model 'nope'"),
    (["--gpu", "zz"], "--gpu: unknown GPU 'zz'"),
    (["--ctx", "12q"], "--ctx: bad token count"),
    (["--wait", "-3"], "--wait: must be in"),
    (["--ctx", "64k"], "--ctx needs --model"),
    (["--model", "kimi-k2"], "--model needs --ctx"),
    (["--tp", "8"], "--tp needs --model"),
    (["--gpu", "h100"], "--gpu needs --model"),
    (["--kv-dtype", "fp8"], "the dtype options need --model"),
    (["--marker", "^(a+)+$"], "a repetition inside a repetition"),
    (["--marker", "x" * 300], "characters, at most 200"),
    (["--prompt-file", "p.txt"], "--prompt-file is for --url"),
    (["--wait", "5"], "--wait is for --url"),
    (["--num-steps", "3"], "--num-steps is for --url"),
    (["--no-request"], "--no-request is for --url"),
    (["--dir", "d"], "--dir is for --url"),
    (["--budget", "4"], "--budget needs --model"),
])
def test_bad_options_one_line_before_anything_is_read(args, words, tmp_path):
    from typer.testing import CliRunner

    from ddprobe.cli import app

    out = tmp_path / "o.json"
    r = CliRunner().invoke(app, ["trace", str(ROOT / "tests/data/traces/serve-tiny-cpu-TP-0.trace.json.gz"),
                                 "--cpu-ops", "-o", str(out), *args])
    assert r.exit_code == 1 and words in r.output and "Traceback" not in r.output, r.output
    assert not out.exists()


def test_no_overlap_is_zero_not_a_rounding_below_it():
    """Kernels that never overlap, listed out of time order: their summed time and their union differ only by
    float rounding (Python 3.12's sum is compensated), which must not make a negative overlap or idle time (a
    results file refuses a negative ms)."""
    from ddprobe.probes.trace_parts.analyse import _busy, measure
    from ddprobe.probes.trace_parts.read import Kernel

    ks, t = [], 0.0
    for d in (0.2, 4.2, 2.8, 3.2, 1.0):
        ks.append(Kernel("k", t, d, 7, -1, "kernel", None))
        t += d + 0.5
    step = list(reversed(ks))
    assert sum(k.dur for k in step) - _busy(step) < 0  # the rounding is there: -1.8e-15 us
    r = measure([step] * 3)
    assert r.overlap_ms == 0.0 and r.median_idle_ms >= 0.0
