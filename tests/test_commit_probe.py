"""Commit-length probe against the in-process engine and against `ddprobe serve` through both HTTP backends."""
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
import requests
from typer.testing import CliRunner

from ddprobe.cli import app
from ddprobe import texts
from ddprobe.probes.backends.base import BackendError
from ddprobe.probes.backends.sglang import SGLangBackend
from ddprobe.probes.backends.vllm import VLLMBackend
from ddprobe.probes.commit import prompt_ids, run_commit_probe
from ddprobe.probes.backends.engine import EngineBackend
from ddprobe.results import Result, ResultWriter, RunMeta

CTX, NEW = 256, 24


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(url: str, proc=None, timeout: float = 90.0):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stdout.read()}")
        try:
            if requests.get(url + "/health", timeout=1).status_code == 200:
                return
        except requests.RequestException:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up")


@pytest.fixture(scope="module")
def served():
    """`ddprobe serve` in its own process on a free loopback port (tiny preset, seed 0)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ddprobe.cli", "serve", "--port", str(port), "--seed", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_up(url, proc)
        yield url, proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def engine():
    return EngineBackend(preset="tiny", seed=0)


def writer():
    return ResultWriter(Result(kind="commit", meta=RunMeta.collect(command="test")))


def test_prompts_have_exact_token_counts(engine):
    for kind in texts.KINDS:
        ids = prompt_ids(engine, kind, 300, seed=3)
        assert len(ids) == 300
    pred = engine.tokenizer.decode(prompt_ids(engine, "predictable", 60))
    assert pred.startswith("The cat sat on the mat. The cat sat")
    rec = prompt_ids(engine, "recall", 500, seed=1)
    passage = engine.tokenize(texts.recall(8, 1)[1])
    assert rec[: len(passage)] == passage  # the passage opens the prompt...
    assert rec[-4:] == passage[:4]  # ...and its first words close it
    novel = texts.novel(5000, seed=0).split()
    grams = [tuple(novel[i:i + 8]) for i in range(len(novel) - 8)]
    assert len(set(grams)) == len(grams)  # no 8-word span repeats in novel text


def test_recall_passage_covers_the_decode(engine):
    """A target that copies the recall passage perfectly copies for every new token (else commit length would mix
    the copy with novel text after it: ~2.6 at best for a 64-word passage and 128 new tokens)."""
    for new in (2, 32, 128, 250):
        _, passage = texts.recall(8, 0, texts.recall_words(new))
        assert len(engine.tokenize(passage)) >= new + texts.RECALL_CUE_WORDS
    assert texts.recall_words(128) == texts.RECALL_WORDS == 160
    assert texts.recall_words(10_000) == len(texts.NAMES)  # every name once at most: the passage is capped
    long = prompt_ids(engine, "recall", 3000, seed=1, new_tokens=250)
    _, passage = texts.recall(8, 1, texts.recall_words(250))
    assert long[: len(engine.tokenize(passage))] == engine.tokenize(passage)
    assert prompt_ids(engine, "recall", 3000, seed=1)[:60] == long[:60]  # the same text, a shorter passage


def test_recall_context_too_short_is_refused_before_anything_runs(tmp_path):
    out = tmp_path / "r.json"
    r = CliRunner().invoke(app, ["commit", "--ctx", "128,1k", "--text", "novel,recall", "--json", str(out)])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert "context 128 (128 tokens) is too short for the recall text" in r.output
    assert "sized for 128 new tokens" in r.output and not out.exists()  # refused before any cell or file
    r = CliRunner().invoke(app, ["commit", "--ctx", "1k", "--text", "recall", "--max-new-tokens", "2000",
                                 "--json", str(out)])
    assert r.exit_code == 1 and "covers at most 256 new tokens" in r.output and "asked for 2000" in r.output
    assert not out.exists() and "Traceback" not in r.output


def test_http_backends_match_in_process_engine(served, engine):
    url, _ = served
    local = run_commit_probe(engine, [CTX], ["predictable", "novel"], NEW, writer())
    via_sglang = run_commit_probe(SGLangBackend(url), [CTX], ["predictable", "novel"], NEW, writer())
    via_vllm = run_commit_probe(VLLMBackend(url), [CTX], ["predictable", "novel"], NEW, writer())
    for a, b, c, kind in zip(local, via_sglang, via_vllm, ["predictable", "novel"]):
        assert a["prompt_tokens"] == b["prompt_tokens"] == c["prompt_tokens"] == CTX
        assert a["verify_steps"] == b["verify_steps"] == c["verify_steps"]
        assert a["commit_len"] == pytest.approx(b["commit_len"])
        assert a["commit_len_p90"] == b["commit_len_p90"]
        for row in (a, b):  # one definition: per-step mean, the prefill's token in no step, cut steps as cut
            assert row["commit_len"] == pytest.approx((row["completion_tokens"] - 1) / row["verify_steps"])
        for row in (a, b, c):
            assert row["sglang_accept_length"] == pytest.approx(row["completion_tokens"] / row["verify_steps"])
        # vLLM's own figure, 1 + accepted / drafts, counts a last step cut by the token limit whole (as vLLM does):
        # the same engine's uncut count, at or above the kept one
        g = engine.generate(prompt_ids(engine, kind, CTX), NEW)
        assert c["commit_len"] == pytest.approx(1 + sum(a for a, _ in g.ran_steps) / len(g.ran_steps))
        assert c["commit_len"] >= b["commit_len"] - 1e-9
    # the servers say no first-token time: the note says why the timing columns are '-' and what they report
    from ddprobe.probes.commit import timing_note

    assert timing_note(local) is None
    note = timing_note(via_sglang)
    assert note.startswith("the sglang backend reports no first-token time") and "ms/step, tok/s and prefill" in note
    assert f"predictable @ {CTX} {via_sglang[0]['e2e_s']:.3g} s" in note
    # the server decodes the very same tokens as the in-process engine
    ids = prompt_ids(engine, "novel", CTX)
    remote = requests.post(url + "/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": NEW}},
                           timeout=60).json()
    assert remote["output_ids"] == engine.generate(ids, NEW).tokens
    assert sum(remote["meta_info"]["spec_accept_histogram"]) == remote["meta_info"]["spec_verify_ct"]


def test_interrupted_run_keeps_measured_cells(tmp_path, engine):
    """The server dies after the first cell: the error names the URL and the first cell is on disk."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ddprobe.cli", "serve", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_up(url, proc)
        path = tmp_path / "cells.json"
        w = ResultWriter(Result(kind="commit", meta=RunMeta.collect(command="t")), path)

        def kill_after_first(row):
            proc.kill()
            proc.wait()

        with pytest.raises(BackendError, match=f"{url}/(tokenize|generate): connection refused"):
            run_commit_probe(SGLangBackend(url), [CTX], ["predictable", "novel"], NEW, w, on_cell=kill_after_first)
        rows = Result.load(path).rows
        assert [r["text"] for r in rows] == ["predictable"]
    finally:
        proc.kill()


class _Handler(http.server.BaseHTTPRequestHandler):
    mode = "garbage"

    def log_message(self, *a):
        pass

    def _send(self, code, body, ctype="application/json"):
        data = body.encode()
        self.send_response(code)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except BrokenPipeError:  # the client gave up first (the timeout test)
            pass

    def do_GET(self):
        if self.mode == "slow":
            time.sleep(2.0)
        if self.path == "/v1/models":
            return self._send(200, json.dumps({"data": [{"id": "plain", "max_model_len": 100000}]}))
        if self.path == "/metrics":  # a vLLM server without speculative decoding
            return self._send(200, "# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total 5.0\n",
                              "text/plain")
        return self._send(404, "{}")

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        if self.mode == "slow":
            time.sleep(2.0)
        if self.mode == "garbage":
            return self._send(200, "<html>not json</html>", "text/html")
        if self.path == "/tokenize":
            return self._send(200, json.dumps({"tokens": list(range(10))}))
        if self.path == "/generate":  # SGLang without speculative decoding: no spec_verify_ct
            return self._send(200, json.dumps({"text": "x", "meta_info": {"prompt_tokens": 10,
                                                                          "completion_tokens": 4}}))
        return self._send(500, "boom")


@pytest.fixture
def stub():
    def start(mode):
        handler = type("H", (_Handler,), {"mode": mode})
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}"

    servers = []
    yield start
    for s in servers:
        s.shutdown()


def test_error_paths(stub):
    closed = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(BackendError, match=f"POST {closed}/tokenize: connection refused"):
        SGLangBackend(closed).tokenize("the cat")
    url = stub("garbage")
    with pytest.raises(BackendError, match=f"{url}/tokenize: answer is not valid JSON"):
        SGLangBackend(url).tokenize("the cat")
    url = stub("plain")
    with pytest.raises(BackendError, match="no speculative-decoding counters.*spec_verify_ct"):
        SGLangBackend(url).generate(list(range(10)), 4)
    with pytest.raises(BackendError, match="no speculative-decoding counters.*spec_decode_num_accepted_tokens_total"):
        VLLMBackend(url).generate(list(range(10)), 4)
    url = stub("slow")
    with pytest.raises(BackendError, match=f"{url}/tokenize: no complete answer within 0.5 s"):
        SGLangBackend(url, timeout_s=0.5).tokenize("the cat")
    with pytest.raises(BackendError, match="bad URL"):
        SGLangBackend("localhost:30000")


def test_cli_commit_engine_and_errors(tmp_path):
    runner = CliRunner()
    path, csv = tmp_path / "c.json", tmp_path / "c.csv"
    r = runner.invoke(app, ["commit", "--ctx", "200", "--max-new-tokens", "12", "--json", str(path),
                            "--csv", str(csv)])
    assert r.exit_code == 0, r.output
    res = Result.load(path)
    assert [(row["text"], row["ctx"]) for row in res.rows] == [("predictable", 200), ("novel", 200)]
    assert res.config["backend"] == "engine" and res.config["preset"] == "tiny"
    assert "(completion_tokens - 1) / verify_steps" in res.summary["definitions"]["commit_len"]
    assert all(1 <= row["commit_len"] <= 8 for row in res.rows) and csv.read_text().startswith("backend,")
    for args, msg in [(["--ctx", "12q"], "bad token count '12q'"),
                      (["--ctx", "512k"], "context 512k (524,288 tokens) + 128 new tokens is beyond the 270,336 "
                                          "tokens"),
                      (["--text", "poetry"], "unknown text kind 'poetry'"),
                      (["--budget", "0", "--ctx", "200"], "--budget: must be in 1..1024, got 0"),
                      (["--backend", "vllm"], "needs --url"),
                      (["--backend", "sglang", "--url", f"http://127.0.0.1:{free_port()}"], "connection refused")]:
        r = runner.invoke(app, ["commit", *args, "--json", str(tmp_path / "x.json")])
        assert r.exit_code == 1 and msg in r.output, (args, r.output)
        assert "Traceback" not in r.output
    assert not (tmp_path / "x.json").exists()  # nothing written when a run cannot start


def test_recall_copied_counts_the_passage_words_after_the_cue():
    """The recall cell says whether the target itself wrote the passage back (real tokenizer round trip)."""
    from ddprobe import texts
    from ddprobe.probes.backends.base import GenStats
    from ddprobe.probes.commit import recall_copied
    from ddprobe.probes.backends.engine import EngineBackend

    be = EngineBackend(preset="tiny", max_ctx=2048)
    _, passage = texts.recall(8, 0)
    want = passage.split()[texts.RECALL_CUE_WORDS:]
    ids = be.tokenize(" ".join(want[:10]) + " The cat sat on the mat.")
    st = GenStats(prompt_tokens=1, completion_tokens=len(ids), verify_steps=1, tokens=ids)
    assert recall_copied(be, st) == (10, len(want))
    st.tokens = be.tokenize("The cat sat on the mat.")
    assert recall_copied(be, st) == (0, len(want))
    st.tokens = []
    assert recall_copied(be, st) is None


def test_output_repeats_tells_a_loop_from_prose():
    """A looping output (real tokenizer, the tiny target's kind of loop) against novel prose and the refrain."""
    from ddprobe import texts
    from ddprobe.probes.commit import REPEAT_SPAN, loop_notes, output_repeats
    from ddprobe.probes.backends.engine import EngineBackend

    be = EngineBackend(preset="tiny", max_ctx=2048)
    prose = be.tokenize(texts.novel(120, seed=5))[:128]
    assert output_repeats(prose) < 0.05  # the generator's prose does not repeat 5-token spans by chance
    loop = be.tokenize("This humble hunter rarely carried this humble hunter around no proud fox. " * 12)[:128]
    assert output_repeats(loop) > 0.8
    cat = be.tokenize(texts.predictable(200))[:128]
    assert output_repeats(cat) > 0.9  # the predictable refrain is a repeat by design (no note for it)
    first = be.tokenize("The cat sat on the mat.")  # 7 tokens: the first repeat of one span is one hit
    assert output_repeats(first + first[:REPEAT_SPAN]) == 1 / (len(first) + 1)
    assert output_repeats(first[:REPEAT_SPAN]) is None and output_repeats([]) is None
    rows = [{"text": "novel", "ctx": 1024, "commit_len": 3.74, "output_repeats": output_repeats(loop)},
            {"text": "novel", "ctx": 16384, "commit_len": 1.6, "output_repeats": output_repeats(prose)},
            {"text": "predictable", "ctx": 1024, "commit_len": 7.94, "output_repeats": output_repeats(cat)},
            {"text": "novel", "ctx": 2048, "commit_len": 1.6, "output_repeats": None},
            # the tiny target's own novel prose repeats phrases (0.77-0.85 on the CPU) that its drafter does not
            # predict (commit 1.5): no note
            {"text": "novel", "ctx": 4096, "commit_len": 1.51, "output_repeats": 0.85}]
    notes = loop_notes(rows)
    assert len(notes) == 1 and notes[0].startswith("novel @ 1k: ") and "3.74" in notes[0] and "looping" in notes[0]


@pytest.mark.parametrize("stall_after_headers", [False, True])
def test_the_socket_clock_says_what_the_deadline_says(monkeypatch, stall_after_headers):
    """Two clocks bound an answer (requests' socket timeout, ddprobe.deadline's whole-answer deadline) and either
    may run out first on a loaded machine: the socket's alone (the deadline taken away here) gives the same line,
    headers late or body late (requests calls a late body a ConnectionError)."""
    import socket as sk

    import ddprobe.deadline
    from ddprobe.probes.backends.http import HttpClient

    srv = sk.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def serve():
        c, _ = srv.accept()
        c.recv(65536)
        if stall_after_headers:
            c.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\ncontent-type: application/json\r\n\r\n{")
        time.sleep(3)
        c.close()
    threading.Thread(target=serve, daemon=True).start()
    monkeypatch.setattr(ddprobe.deadline, "within", lambda fn, _s, progress: fn(progress))
    url = f"http://127.0.0.1:{srv.getsockname()[1]}"
    stage = "the body was still arriving" if stall_after_headers else "waiting for the answer's headers"
    with pytest.raises(BackendError, match=f"GET {url}/x: no complete answer within 0.5 s \\(--timeout; .*{stage}"):
        HttpClient(url, 0.5).call("GET", "/x")
    srv.close()
