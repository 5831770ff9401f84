"""Issue 62 on the shipped real traces: steps found wherever the profile starts (rotated mid-step), a trace grown by
repetition read back into its steps with --model, the server's step labels first (SGLang's and vLLM's names, other
modes set apart, the context from the labels), the floor of the traced step equal to `ddprobe floor`'s, and
`trace diff` naming what changed. Issue 65's reader cases: every malformed structure or impossible number one
line naming the event or field, nothing written."""
import gzip
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ddprobe.probes.trace import run_trace
from ddprobe.probes.trace_parts.steps import parse_label
from ddprobe.units import DDProbeError

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "tests/data/traces"
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
H100 = sorted(TRACES.glob("h100-*-32k.trace.json.gz"))
SPLIT = TRACES / "h100-split_ws-graphs-32k.trace.json.gz"
SGL = TRACES / "h100-sglang-graphs-32k.trace.json.gz"


def cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "ddprobe", *map(str, args)], env=ENV, capture_output=True,
                          text=True, timeout=timeout)


def load(path: Path) -> dict:
    return json.loads(gzip.open(path, "rt").read())


def save(doc: dict, path: Path) -> Path:
    with gzip.open(path, "wt") as f:
        json.dump(doc, f)
    return path


DEVICE = ("kernel", "gpu_memcpy", "gpu_memset")


def rotated(src: Path, dst: Path, at: float) -> Path:
    """``src`` cut on the GPU's clock at ``at`` of its first third (inside its first step) and the head moved past
    its end: the same events, a profile that starts mid-step. A launch moves with its kernels; a graph cut in two
    leaves its head without a launch record, as a profile started inside it would."""
    doc = load(src)
    timed = [e for e in doc["traceEvents"] if "ts" in e]
    dev = [e for e in timed if e.get("cat") in DEVICE]
    t0 = min(float(e["ts"]) for e in dev)
    t1 = max(float(e["ts"]) + float(e.get("dur", 0)) for e in timed)
    cut, shift = t0 + at * (t1 - t0) / 3, (t1 - t0) + 5000.0
    corr = lambda e: (e.get("args") or {}).get("correlation")  # noqa: E731
    moved = {corr(e) for e in dev if float(e["ts"]) < cut}
    kept = {corr(e) for e in dev if float(e["ts"]) >= cut}
    for e in timed:
        c = corr(e)
        if e.get("cat") in DEVICE:
            move = float(e["ts"]) < cut
        elif c is not None and (c in moved or c in kept):
            move = c in moved and c not in kept
        else:
            move = float(e["ts"]) < cut
        if move:
            e["ts"] = float(e["ts"]) + shift
            if c is not None:
                e["args"]["correlation"] = int(c) + 10 ** 7
    return save(doc, dst)


@pytest.mark.parametrize("src", H100, ids=lambda p: p.name.split("-32k")[0])
@pytest.mark.parametrize("at", [0.3, 0.55, 0.8])
def test_rotated_mid_step_same_median_step(src, at, tmp_path):
    base = run_trace([src])[0].rows[0]
    rot = run_trace([rotated(src, tmp_path / "r.trace.json.gz", at)])[0].rows[0]
    assert rot["step_ms"] == pytest.approx(base["step_ms"], rel=0.02), (base["step_ms"], rot["step_ms"])
    assert rot["attention_per_step"] == base["attention_per_step"] == 61


def grown(src: Path, dst: Path, copies: int) -> Path:
    """``src`` repeated ``copies`` times, each copy after the last with other kernels between copies, correlation ids
    offset: a real step sequence whose repeating unit is the whole copy (three steps)."""
    doc = load(src)
    events = doc.pop("traceEvents")
    timed = [e for e in events if "ts" in e]
    t0 = min(float(e["ts"]) for e in timed)
    span = max(float(e["ts"]) + float(e.get("dur", 0)) for e in timed) - t0 + 2000.0
    corr = max(int((e.get("args") or {}).get("correlation", 0) or 0) for e in events) + 1
    out = [e for e in events if "ts" not in e]
    for c in range(copies):
        for e in timed:
            e2 = dict(e, ts=float(e["ts"]) + c * span, args=dict(e.get("args") or {}))
            if "correlation" in e2["args"]:
                e2["args"]["correlation"] = int(e2["args"]["correlation"]) + c * corr
            out.append(e2)
        for j in range(3):  # other work between the copies
            out.append({"ph": "X", "cat": "kernel", "name": f"between_copies_{j}", "ts": t0 + (c + 1) * span - 900
                        + j * 10, "dur": 5.0, "args": {"stream": 7, "correlation": 10 ** 9 + c * 100 + j}})
    doc["traceEvents"] = out
    return save(doc, dst)


def test_a_unit_of_three_steps_is_split_with_the_model(tmp_path):
    real = run_trace([SPLIT], model="k2", ctx=32768)[0].rows[0]
    big = grown(SPLIT, tmp_path / "g.trace.json.gz", 4)
    plain = run_trace([big])[0].rows[0]
    assert plain["attention_per_step"] == 183  # three steps read as one unit without the model
    res, _ = run_trace([big], model="k2", ctx=32768)
    row = res.rows[0]
    assert row["attention_per_step"] == 61 and "split into 3 steps" in res.summary["detail"]["0"]
    for key in ("attention_ms", "moe_ms", "gemm_ms"):
        assert row[key] == pytest.approx(real[key], rel=0.02), key
    assert row["step_ms"] == pytest.approx(real["step_ms"], rel=0.02)


def labelled(src: Path, dst: Path, name_of) -> Path:
    """``src`` with a server's step label around each step's launches (CPU side), as SGLang's detailed
    annotations or vLLM's detailed trace annotation write them; ``name_of(i)`` names step i."""
    _, ranks = run_trace([src])
    doc = load(src)
    launch = {int(e["args"]["correlation"]): float(e["ts"]) for e in doc["traceEvents"]
              if e.get("cat") == "cuda_runtime" and "correlation" in (e.get("args") or {})}
    for i, step in enumerate(ranks[0].found.steps):
        ts = [launch[k.corr] for k in step if k.corr in launch]
        doc["traceEvents"].append({"ph": "X", "cat": "user_annotation", "name": name_of(i), "ts": min(ts) - 1.0,
                                   "dur": max(ts) - min(ts) + 2.0, "pid": 1, "tid": 1})
    return save(doc, dst)


def test_sglang_labels_come_first_context_from_them_other_modes_apart(tmp_path):
    def name(i):
        if i == 0:
            return "step[EXTEND bs=1 toks=32768 c_sq=32768 c_sqsq=1 c_sqsk=1 c_sk=32768]"
        return f"step[TARGET_VERIFY bs=1 g_sq=9 g_sqsq=81 g_sqsk=1 g_sk={32768 + i}]"
    f = labelled(SPLIT, tmp_path / "l.trace.json.gz", name)
    res, _ = run_trace([f], model="k2")  # no --ctx: the labels say it
    row = res.rows[0]
    assert row["method"] == "labels" and row["mode"] == "verify" and row["steps"] == 1
    assert "set apart: 1 extend steps" in res.summary["detail"]["0"]
    assert row["ctx"] == 32769 and row["ctx_from"] == "the step labels"
    assert row["step_ms"] == pytest.approx(run_trace([SPLIT])[0].rows[0]["step_ms"], rel=0.05)  # the same step
    with pytest.raises(DDProbeError, match="contradicts the trace's step labels"):
        run_trace([f], model="k2", ctx=65536)


def test_vllm_labels_on_a_real_trace(tmp_path):
    def name(i):
        return ("execute_context_1(sq32768sk32768)_generation_0(sq0sk0)" if i == 0 else
                f"execute_context_0(sq0sk0)_generation_1(sq9sk{32768 + 9 * i})")
    f = labelled(SPLIT, tmp_path / "v.trace.json.gz", name)
    res, _ = run_trace([f], model="k2")
    row = res.rows[0]
    assert row["method"] == "labels" and row["mode"] == "decode" and row["ctx"] == 32777
    assert "set apart: 1 extend steps" in res.summary["detail"]["0"]


def test_vllm_labels_and_the_label_formats():
    assert parse_label("step[TARGET_VERIFY bs=2 g_sq=18 g_sqsq=162 g_sqsk=1 g_sk=65540]") == ("verify", 2, 32770)
    assert parse_label("step[DECODE bs=1 g_sq=1 g_sqsq=1 g_sqsk=1 g_sk=4096]") == ("decode", 1, 4096)
    assert parse_label("step[EXTEND bs=1 toks=512]") == ("extend", 1, None)
    assert parse_label("execute_context_0(0)_generation_1(1)") == ("decode", 1, None)
    assert parse_label("execute_context_0(sq0sk0)_generation_2(sq18sk65536)") == ("decode", 2, 32768)
    assert parse_label("execute_context_1(sq512sk512)_generation_0(sq0sk0)") == ("extend", 1, 512)
    assert parse_label("execute_new_0_cached_1") == ("decode", 1, None)
    for bad in ("step[VERIFY]", "step[TARGET_VERIFY bs=1 g_sk=lots]", "execute_context_x"):
        with pytest.raises(DDProbeError, match="does not parse|not a token count"):
            parse_label(bad)


def test_the_floor_is_the_engines_own_k2_floor(tmp_path):
    res, _ = run_trace([SPLIT], model="k2", ctx=32768)
    row = res.rows[0]
    r = cli("floor", "--model", "k2", "--ctx", "32k", "--gpu", "h100", "--json")
    assert r.returncode == 0, r.stderr
    floor = json.loads(r.stdout)
    floor_ms = (floor.get("rows") or floor)[0]["floor_ms"]
    assert row["floor_ms"] == pytest.approx(floor_ms, rel=1e-9)
    assert row["gap"] == pytest.approx(row["step_ms"] / floor_ms)
    assert "1,479 kernels per step" in row["floor_from"] and "graph-replayed" in row["floor_from"]
    eager = run_trace([TRACES / "h100-sglang-eager-32k.trace.json.gz"], model="k2", ctx=32768)[0].rows[0]
    assert "eager" in eager["floor_from"] and eager["floor_ms"] > row["floor_ms"]  # 3,522 kernels at the eager time


def test_diff_names_sglangs_fwd_kernel(tmp_path):
    out = tmp_path / "d.json"
    r = cli("trace", "diff", SGL, SPLIT, "--model", "k2", "--ctx", "32k", "-o", out)
    assert r.returncode == 0, r.stderr
    assert "what changed most: _fwd_kernel, 310.1 -> 0.000 ms per step" in r.stdout
    d = json.loads(out.read_text())["summary"]["diff"]
    assert d["changed"] == "_fwd_kernel" and d["changed_before_ms"] == pytest.approx(310.1, abs=0.1)
    assert "ddp_seesaw_bf16" in d["added"] and "_fwd_kernel" in d["gone"]
    assert d["gap_before"] > 30 and 1 < d["gap_after"] < 2
    again = cli("trace", "diff", SGL, SGL, "-o", tmp_path / "e.json")
    assert again.returncode == 1 and "given twice" in again.stderr and not (tmp_path / "e.json").exists()
    other = cli("trace", "diff", SGL, TRACES / "serve-tiny-cpu-TP-0.trace.json.gz", "-o", tmp_path / "f.json")
    assert other.returncode == 1 and len(other.stderr.strip().splitlines()) == 1


def damaged(tmp_path, change) -> Path:
    doc = load(SPLIT)
    if change != "deep":
        change(doc)
        return save(doc, tmp_path / "bad.trace.json.gz")
    text = json.dumps(doc).replace('"traceEvents": [', '"traceEvents": [{"ph": "X", "cat": "kernel", "name": "deep", '
                                   '"args": {"x": ' + "[" * 100000 + "]" * 100000 + "}}, ", 1)
    with gzip.open(tmp_path / "bad.trace.json.gz", "wt") as f:
        f.write(text)
    return tmp_path / "bad.trace.json.gz"


def _first_kernel(doc):
    return next(e for e in doc["traceEvents"] if e.get("cat") == "kernel")


@pytest.mark.parametrize("change,words", [
    (lambda d: _first_kernel(d).update(args=[1, 2]), "args is a list"),
    (lambda d: _first_kernel(d).update(args="grid"), "args is a str"),
    (lambda d: _first_kernel(d).update(dur=1e12), "longer than an hour"),
    (lambda d: _first_kernel(d).update(ts=-5), "ts -5 us is negative"),
    (lambda d: d.update(deviceProperties={"name": "H100"}), "deviceProperties is not a list"),
    (lambda d: d["deviceProperties"][0].update(name=7), "deviceProperties[0].name is 7"),
    (lambda d: d["deviceProperties"][0].update(numSms="many"), "deviceProperties[0].numSms is 'many'"),
    ("deep", "nested deeper"),
    (lambda d: _first_kernel(d).update(name=12), "name is int '12', not text"),
    (lambda d: _first_kernel(d).update(cat=["kernel"]), "cat is list"),
    (lambda d: _first_kernel(d)["args"].update(correlation={}), "correlation is dict"),
    (lambda d: _first_kernel(d)["args"].update(stream=[7]), "stream is list"),
    (lambda d: d["traceEvents"].insert(3, 7), "an event of traceEvents is int '7', not an object"),
])
def test_malformed_structure_and_impossible_numbers_one_line(change, words, tmp_path):
    out = tmp_path / "o.json"
    r = cli("trace", damaged(tmp_path, change), "-o", out)
    assert r.returncode == 1 and words in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr and not out.exists()


def test_a_file_twice_or_its_copy_is_not_two_ranks(tmp_path):
    copy = tmp_path / "x-TP-1.trace.json.gz"
    copy.write_bytes(SPLIT.read_bytes())
    for args, words in (([SPLIT, SPLIT], "given twice"), ([SPLIT, copy], "hold the same bytes")):
        r = cli("trace", *args, "-o", tmp_path / "o.json")
        assert r.returncode == 1 and words in r.stderr, r.stderr
    assert not (tmp_path / "o.json").exists()


def test_unrelated_traces_are_not_read_as_ranks(tmp_path):
    """Two single-GPU traces of different runs (SGLang's kernel and split_ws, neither naming a rank) were read as
    ranks 0 and 1 with a "skew" between them: several traces must each say their rank, in one world size; one line
    naming the file, nothing written. Each alone, and two that name their ranks, still read."""
    out = tmp_path / "o.json"
    r = cli("trace", SGL, SPLIT, "-o", out)
    assert r.returncode == 1 and "names no rank" in r.stderr and SGL.name in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1 and not out.exists()
    a = as_rank(SPLIT, tmp_path / "a.trace.json.gz", 0)
    b = save(dict(load(SPLIT), distributedInfo={"rank": 1, "world_size": 4}), tmp_path / "b.trace.json.gz")
    with pytest.raises(DDProbeError, match="different world sizes \\(2, 4\\)"):
        run_trace([a, b])
    b = as_rank(SPLIT, tmp_path / "b.trace.json.gz", 1)
    assert [row["rank"] for row in run_trace([a, b])[0].rows] == [0, 1]
    assert run_trace([SGL])[0].rows[0]["rank"] == 0


def test_a_catastrophic_marker_is_refused_at_once(tmp_path):
    t0 = time.perf_counter()
    r = cli("trace", SPLIT, "--marker", "^(a+)+$", "-o", tmp_path / "o.json")
    assert r.returncode == 1 and "repetition inside a repetition" in r.stderr
    assert time.perf_counter() - t0 < 30


def test_an_alternation_inside_a_repetition_is_refused_at_once(tmp_path):
    r = cli("trace", SPLIT, "--marker", "(a|aa)*$", "-o", tmp_path / "o.json")
    assert r.returncode == 1 and "alternation inside a repetition" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "o.json").exists()


def test_a_marker_that_backtracks_is_bounded_in_time(tmp_path):
    """a*a*a*a*a*c passes the structural check but backtracks as n^5 on a name of a's: the search is cut at
    MARKER_S and said in one line, not left to run for hours."""
    from ddprobe.probes.trace_parts import read

    doc = load(SPLIT)
    doc["traceEvents"].append({"ph": "X", "cat": "user_annotation", "name": "a" * 900 + "b", "ts": 1e6, "dur": 1.0,
                               "pid": 1, "tid": 1})
    bad = save(doc, tmp_path / "long-name.trace.json.gz")
    t0 = time.perf_counter()
    r = cli("trace", bad, "--marker", "a*a*a*a*a*c", "-o", tmp_path / "o.json")
    assert r.returncode == 1 and f"took over {read.MARKER_S:g} s on one annotation name" in r.stderr, r.stderr
    assert time.perf_counter() - t0 < read.MARKER_S + 60 and not (tmp_path / "o.json").exists()
    search = read.bounded_search(read.check_marker(r"^ProfilerStep#\d+$"))
    assert search("ProfilerStep#3") and not search("a" * 900)  # a plain pattern is unchanged


class Trickle(BaseHTTPRequestHandler):
    def do_POST(self):  # headers at once, then a byte a second: never a whole answer
        self.send_response(200)
        self.send_header("Content-Length", "1000")
        self.end_headers()
        try:
            for _ in range(60):
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(1)
        except OSError:
            pass

    def log_message(self, *a):
        pass


def test_url_against_a_trickling_server_is_bounded_and_names_wait(tmp_path):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        t0 = time.perf_counter()
        r = cli("trace", "--url", f"http://127.0.0.1:{srv.server_address[1]}", "--wait", "3", "--dir",
                tmp_path / "d", "-o", tmp_path / "o.json", timeout=60)
        took = time.perf_counter() - t0
    finally:
        srv.shutdown()
    assert r.returncode == 1 and "--wait" in r.stderr and "--timeout" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and took < 30
    assert not (tmp_path / "o.json").exists()


def test_the_report_draws_both_sides_of_a_diff(tmp_path):
    from ddprobe.probes.trace_parts.diff import run_diff
    from ddprobe.reports import render

    res = run_diff(SGL, SPLIT, model="k2", ctx=32768)
    res.save(tmp_path / "d.json")
    report = render.build([tmp_path / "d.json"])
    (s,) = report.sections
    assert [f.name.split("-", 1)[-1] for f in s.figures] == ["anatomy", "strip", "strip-after"] or \
        [f.name.rsplit("-", 1)[-1] for f in s.figures] == ["anatomy", "strip", "after"]
    assert [x["side"] for x in res.rows] == ["before", "after"]
    assert any(f.startswith("trace diff:") and "_fwd_kernel" in f for f in s.findings)
    html = render.write(report, tmp_path / "r.html")[0].read_text()
    assert "Step anatomy, before and after" in html and "What moved, per kernel" in html


def test_a_trace_shorter_than_two_steps_is_one_line(tmp_path):
    doc = load(SPLIT)
    dev = [e for e in doc["traceEvents"] if e.get("cat") in DEVICE]
    t0 = min(float(e["ts"]) for e in dev)
    t1 = max(float(e["ts"]) + float(e.get("dur", 0)) for e in dev)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if "ts" not in e or float(e["ts"]) < t0 + 0.45 * (t1 - t0)]
    r = cli("trace", save(doc, tmp_path / "short.trace.json.gz"), "-o", tmp_path / "o.json")
    assert r.returncode == 1 and "profile at least two whole decode steps" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "o.json").exists()


def test_tp_from_the_ranks_but_never_for_an_engine_preset(tmp_path):
    """Two ranks' files: a served model's floor is at tp 2 (said: no collective kernel in them); the engine's k2
    is one GPU's share whatever the file count."""
    a, b = (as_rank(SPLIT, tmp_path / f"x-TP-{r}.trace.json.gz", r) for r in (0, 1))
    served = run_trace([a, b], model="kimi-k2", ctx=32768)[0]
    assert served.config["tp"] == 2 and "tp 2 but no collective kernel" in served.rows[0]["floor_from"]
    engine = run_trace([a, b], model="k2", ctx=32768)[0]
    assert engine.config["tp"] == 1


def as_rank(src: Path, dst: Path, rank: int) -> Path:
    doc = load(src)
    doc["distributedInfo"] = {"rank": rank, "world_size": 2}
    return save(doc, dst)


@pytest.mark.parametrize("extra,name", [(["--tp", "2"], "--tp"), (["--cpu-ops"], "--cpu-ops"),
                                        (["--marker", "x"], "--marker"), (["--kv-dtype", "fp8"], "--kv-dtype")])
def test_diff_refuses_the_options_it_does_not_take(extra, name, tmp_path):
    r = cli("trace", "diff", SGL, SPLIT, *extra, "-o", tmp_path / "o.json")
    assert r.returncode == 1 and f"not {name}" in r.stderr and not (tmp_path / "o.json").exists()


def test_a_plain_decode_step_is_floored_as_one_row_from_its_labels(tmp_path):
    """The labels say each step's query rows (SGLang's g_sq over bs): a plain decode step is floored as one row per
    request, a verify step as its B + 1, whatever --budget says (the one-row step reads fewer experts)."""
    def decode(i):
        return f"step[DECODE bs=1 g_sq=1 g_sqsq=1 g_sqsk=1 g_sk={32768 + i}]"

    def verify(i):
        return f"step[TARGET_VERIFY bs=1 g_sq=9 g_sqsq=81 g_sqsk=1 g_sk={32768 + i}]"
    one = run_trace([labelled(SPLIT, tmp_path / "d.trace.json.gz", decode)], model="k2")[0].rows[0]
    nine = run_trace([labelled(SPLIT, tmp_path / "v.trace.json.gz", verify)], model="k2")[0].rows[0]
    assert one["mode"] == "decode" and "1 query rows per request, from the step labels" in one["floor_from"]
    assert "9 query rows per request" in nine["floor_from"]
    assert one["floor_ms"] < nine["floor_ms"]  # k2's top-8 of 48 experts: one row touches 8, nine rows about 39


@pytest.mark.parametrize("key, times, says", [("idle_ms", 30.0, "beyond the step's span"),
                                              ("attention_ms", 100.0, "over twice the span"),
                                              ("gap", 0.1, "not step / floor")])
def test_a_trace_results_file_with_impossible_times_is_refused(tmp_path, key, times, says):
    """A trace results file is believed only where its numbers can be (issue 65: idle or class time beyond the step,
    a gap that is not step / floor made a report): one line naming the field, on load (report, gate)."""
    from ddprobe.results import Result

    res, _ = run_trace([SPLIT], model="k2", ctx=32768)
    res.save(tmp_path / "ok.json")
    assert Result.load(tmp_path / "ok.json").rows  # the real file loads
    doc = json.loads((tmp_path / "ok.json").read_text())
    doc["rows"][0][key] *= times
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(DDProbeError, match=f"row 1 of this trace file: '{key}' .*{says}"):
        Result.load(tmp_path / "bad.json")


def test_a_prompt_file_that_is_a_fifo_is_refused_not_waited_on(tmp_path):
    """--prompt-file naming a FIFO: refused at once in one line (it was opened for a read that waits for a writer
    forever, before any server was asked)."""
    fifo = tmp_path / "prompt"
    os.mkfifo(fifo)
    t0 = time.perf_counter()
    r = cli("trace", "--url", "http://127.0.0.1:1", "--prompt-file", fifo, "--wait", "3", "-o", tmp_path / "o.json",
            timeout=60)
    assert r.returncode == 1 and "--prompt-file" in r.stderr and "is a FIFO: give a regular file" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and time.perf_counter() - t0 < 30
