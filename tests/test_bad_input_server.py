"""Bad input to `ddprobe serve` and to the commands that talk to a server, as one table each (request or
command, expected status or exit code, message pattern), so the next audit starts from them; and the graceful
stop of a real `ddprobe serve` process with requests in flight. A real uvicorn server on 127.0.0.1 (tiny
engine) and real clients (requests, the CLI)."""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from ddprobe.probes.engine_backend import EngineBackend

uvicorn = pytest.importorskip("uvicorn")
from test_server import Served  # noqa: E402  (the app in a uvicorn thread on a free port)
ROOT = Path(__file__).resolve().parent.parent
VALID_INT, VALID_NUM, VALID_BOOL = "Input should be a valid integer", "Input should be a valid number", \
    "Input should be a valid boolean"


@pytest.fixture(scope="module")
def srv():
    s = Served(EngineBackend(preset="tiny", seed=0))
    yield s
    s.close()


G, C = "/generate", "/v1/completions"
IDS = {"input_ids": [5, 6]}
# (route, JSON body or raw text, HTTP status, pattern of the error message); a status of 200 is a request that
# must still pass (the strict models refuse coercion, not plain values).
REQUESTS = [
    # nothing coerced into an integer: not a boolean, a string or a float
    (C, {"prompt": [5, 6], "max_tokens": True}, 400, f"max_tokens: {VALID_INT}"),
    (C, {"prompt": [5, 6], "max_tokens": "8"}, 400, f"max_tokens: {VALID_INT}"),
    (C, {"prompt": [5, 6], "max_tokens": 8.0}, 400, f"max_tokens: {VALID_INT}"),
    (G, {**IDS, "sampling_params": {"max_new_tokens": True}}, 400, f"max_new_tokens: {VALID_INT}"),
    (G, {**IDS, "sampling_params": {"max_new_tokens": "8"}}, 400, f"max_new_tokens: {VALID_INT}"),
    (G, {**IDS, "sampling_params": {"max_new_tokens": 8.0}}, 400, f"max_new_tokens: {VALID_INT}"),
    (C, {"prompt": [5, 6], "seed": "7"}, 400, f"seed: {VALID_INT}"),
    (G, {"input_ids": ["5", 6]}, 400, f"input_ids.0: {VALID_INT}"),
    (G, {**IDS, "sampling_params": {"stop_token_ids": [3.0]}}, 400, f"stop_token_ids.0: {VALID_INT}"),
    # nor a string into a boolean or a number
    (C, {"prompt": [5, 6], "stream": "yes"}, 400, f"stream: {VALID_BOOL}"),
    (G, {**IDS, "stream": "yes"}, 400, f"stream: {VALID_BOOL}"),
    (C, {"prompt": [5, 6], "stream": 1}, 400, f"stream: {VALID_BOOL}"),
    (C, {"prompt": [5, 6], "temperature": "0.5"}, 400, f"temperature: {VALID_NUM}"),
    (G, {**IDS, "sampling_params": {"temperature": "0.5"}}, 400, f"temperature: {VALID_NUM}"),
    (G, {**IDS, "sampling_params": {"temperature": True}}, 400, f"temperature: {VALID_NUM}"),
    # stop tokens within the vocabulary (tiny: 512)
    (G, {**IDS, "sampling_params": {"stop_token_ids": [512]}}, 400, r"stop_token_ids: token ids must be integers "
                                                                       r"in \[0, 512\)"),
    (G, {**IDS, "sampling_params": {"stop_token_ids": [-1]}}, 400, r"stop_token_ids: .*\[0, 512\)"),
    # a body that is not JSON says so (it was "0: JSON decode error")
    (G, "garbage", 400, r"^the request body is not valid JSON: .* at character 0$"),
    (C, '{"prompt": [5, 6],', 400, r"^the request body is not valid JSON"),
    (C, "", 400, r"^the request has no body: send a JSON object$"),
    # plain values still pass: an integer is a number, a temperature of 0 decodes greedily
    (C, {"prompt": [5, 6], "max_tokens": 2, "temperature": 0, "stream": False}, 200, ""),
    (G, {**IDS, "sampling_params": {"max_new_tokens": 2, "temperature": 0, "stop_token_ids": [511]}}, 200, ""),
]


@pytest.mark.parametrize("path,body,status,pattern", REQUESTS)
def test_bad_requests_table(srv, path, body, status, pattern):
    if isinstance(body, str):
        r = requests.post(srv.url + path, data=body, headers={"content-type": "application/json"}, timeout=60)
    else:
        r = requests.post(srv.url + path, json=body, timeout=60)
    assert r.status_code == status, r.text
    if status != 200:
        e = r.json()["error"]
        assert set(e) == {"message", "type", "param", "code"} and e["code"] == status and "\n" not in e["message"]
        assert re.search(pattern, e["message"]), e["message"]


# (command, with {url} for the server's root, exit code, pattern in the output); {out} is a fresh folder
COMMANDS = [
    # an OpenAI base URL (what OpenAI clients take) is read as the server's root: it once requested /v1/v1/models
    ("commit --backend vllm --url {url}/v1 --ctx 128 --max-new-tokens 8 --text novel --json {out}/c.json", 0,
     r"1 cell\(s\) written"),
    ("commit --backend sglang --url {url}/v1/ --ctx 128 --max-new-tokens 8 --text novel --json {out}/c.json", 0,
     r"1 cell\(s\) written"),
    # diagnose over a server that reports no step time says so (it blamed an unfinished commit probe)
    ("diagnose --backend sglang --url {url} --ctx 128 --max-new-tokens 8 --decode-tokens 8 --bw 1TB/s "
     "--out-dir {out}/d", 0, r"floor: skipped: the sglang backend reports no decode step time"),
]


@pytest.mark.parametrize("command,code,pattern", COMMANDS)
def test_server_commands_table(srv, tmp_path, command, code, pattern):
    from typer.testing import CliRunner

    from ddprobe.cli import app

    r = CliRunner().invoke(app, command.format(url=srv.url, out=tmp_path).split())
    assert r.exit_code == code, r.output
    assert re.search(pattern, r.output) and "Traceback" not in r.output, r.output
    assert "the commit probe did not finish" not in r.output


def test_server_url_normalization():
    from ddprobe.probes.http import server_root

    for given in ("http://h:8000", "http://h:8000/", "http://h:8000/v1", "http://h:8000/v1/"):
        assert server_root(given) == "http://h:8000"
    assert server_root("http://h:8000/proxy/v1") == "http://h:8000/proxy"  # only OpenAI's suffix goes
    assert server_root("http://h:8000/v10") == "http://h:8000/v10"


# ---- graceful stop: a real `ddprobe serve` process ------------------------------------------------------------

LONG = {"text": "the cat sat on the mat and", "sampling_params": {"max_new_tokens": 8000}}


class ServeProcess:
    def __init__(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "ddprobe", "serve", "--preset", "tiny", "--port",
                                      str(self.port), "--device", "cpu"], cwd=ROOT, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True)
        self.reader.start()
        t0 = time.time()
        while True:
            assert self.proc.poll() is None, "".join(self.lines)
            assert time.time() - t0 < 180, "ddprobe serve did not come up"
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            time.sleep(0.2)

    def health(self) -> dict:
        return requests.get(self.url + "/health", timeout=10).json()

    def wait_for(self, running: int, waiting: int) -> None:
        t0 = time.time()
        while (h := self.health())["running"] != running or h["waiting"] != waiting:
            assert time.time() - t0 < 60, h
            time.sleep(0.05)

    def stop(self, sig, twice: bool = False, again_after_s: float = 0.05) -> tuple[int, float]:
        """Send ``sig`` (``twice``: again ``again_after_s`` later, as an impatient user does); (exit code, seconds to
        exit), killed after 30 s."""
        t0 = time.perf_counter()
        self.proc.send_signal(sig)
        if twice:
            time.sleep(again_after_s)
            if self.proc.poll() is None:
                self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            code = None
        took = time.perf_counter() - t0
        self.reader.join(timeout=10)
        return code, took

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def served_process():
    p = ServeProcess()
    yield p
    p.close()


def in_thread(fn, *args):
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(r=fn(*args)), daemon=True)
    t.start()
    return t, out


def test_sigint_with_a_stream_running_and_a_request_queued(served_process):
    """Ctrl-C with a long stream decoding and a plain request queued behind it: "shutting down" is printed, the
    stream gets its end event (finish reason abort) and [DONE], the queued request a 503 error body, and the
    process exits 0 within 5 s; a second Ctrl-C changes nothing (it once hung over 60 s, and a second Ctrl-C
    printed tracebacks)."""
    p = served_process
    stream = requests.post(p.url + G, json={**LONG, "stream": True}, stream=True, timeout=60)
    lines = stream.iter_lines()
    first = next(ln for ln in lines if ln.startswith(b"data: "))  # the engine is on it
    assert json.loads(first[6:])["meta_info"]["finish_reason"] is None
    queued_t, queued = in_thread(lambda: requests.post(p.url + G, json=LONG, timeout=60))
    p.wait_for(running=1, waiting=1)
    code, took = p.stop(signal.SIGINT, twice=True)
    events = [ln[6:] for ln in lines if ln.startswith(b"data: ")]
    queued_t.join(timeout=30)
    output = "".join(p.lines)
    assert code == 0 and took < 5.0, (code, took, output)
    assert "shutting down" in output and "Traceback" not in output, output
    assert events[-1] == b"[DONE]" and json.loads(events[-2])["meta_info"]["finish_reason"]["type"] == "abort"
    r = queued["r"]
    assert r.status_code == 503 and "shutting down" in r.json()["error"]["message"], r.text


def test_sigterm_with_a_plain_request_running(served_process):
    """SIGTERM with a plain (not streamed) request decoding: the client gets a 503 JSON error body at the
    engine's next step, the process exits 0 within 5 s."""
    p = served_process
    running_t, running = in_thread(lambda: requests.post(p.url + C, json={"prompt": LONG["text"],
                                                                         "max_tokens": 8000}, timeout=60))
    p.wait_for(running=1, waiting=0)
    code, took = p.stop(signal.SIGTERM)
    running_t.join(timeout=30)
    output = "".join(p.lines)
    assert code == 0 and took < 5.0, (code, took, output)
    assert "shutting down" in output and "Traceback" not in output, output
    r = running["r"]
    assert r.status_code == 503 and r.json()["error"]["type"] == "server_error", r.text
    assert "shutting down" in r.json()["error"]["message"]


@pytest.mark.parametrize("again_after_s", [0.2, 0.5, 1.0])
def test_second_sigint_during_shutdown_is_absorbed(served_process, again_after_s):
    """A second Ctrl-C 0.2-1.0 s after the first, while the engine finishes (the event loop may be closed by then),
    only says "already shutting down": the process still exits 0 without a traceback (it was killed 5 of 7 runs)."""
    p = served_process
    running_t, _ = in_thread(lambda: requests.post(p.url + G, json=LONG, timeout=60))
    p.wait_for(running=1, waiting=0)
    code, took = p.stop(signal.SIGINT, twice=True, again_after_s=again_after_s)
    running_t.join(timeout=30)
    output = "".join(p.lines)
    assert code == 0 and took < 6.0, (code, took, output)
    assert "shutting down" in output and "Traceback" not in output and "KeyboardInterrupt" not in output, output


# ---- request bodies: size, deadline, content type, encoding (ddprobe.server.limits) ---------------------------

@pytest.fixture(scope="module")
def limited():
    s = Served(EngineBackend(preset="tiny", seed=0), max_body=4096, body_read_s=1.0)
    yield s
    s.close()


def _raw(url: str, head: str, body: bytes = b"", wait_s: float = 10.0) -> tuple[int, dict, float]:
    """Send ``head`` + ``body`` on a raw socket; (status, JSON body, seconds until the answer)."""
    host, port = url.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=wait_s) as c:
        t0 = time.perf_counter()
        c.sendall(head.encode() + b"\r\n\r\n" + body)
        data = b""
        while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < int(
                re.search(rb"content-length: (\d+)", data.lower()).group(1)):
            chunk = c.recv(65536)
            if not chunk:
                break
            data += chunk
        took = time.perf_counter() - t0
    status = int(data.split(b" ", 2)[1])
    return status, json.loads(data.split(b"\r\n\r\n", 1)[1]), took


def test_body_limits(limited):
    url = limited.url
    big = json.dumps({"prompt": "word " * 2000}).encode()  # 10 kB > --max-body 4096
    r = requests.post(url + "/tokenize", data=big, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 413 and "larger than the 4,096 bytes" in r.json()["error"]["message"], r.text
    # declared but never sent in full: answered at the body deadline (1 s), not held open
    status, body, took = _raw(url, "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                   "Content-Length: 100", b'{"prompt": ')
    assert status == 408 and "did not arrive within 1 s" in body["error"]["message"] and took < 5, (body, took)
    # curl -d sends a form; no Content-Type at all; a gzip label on a plain body
    r = requests.post(url + "/tokenize", data={"prompt": "the cat"}, timeout=30)
    assert r.status_code == 415 and "curl -d sends a form" in r.json()["error"]["message"], r.text
    r = requests.post(url + "/tokenize", data=b'{"prompt": "the cat"}', timeout=30)
    assert r.status_code == 415 and r.json()["error"]["message"].startswith("the Content-Type header is missing")
    r = requests.post(url + "/tokenize", data=b'{"prompt": "the cat"}', timeout=30,
                      headers={"content-type": "application/json", "content-encoding": "gzip"})
    assert r.status_code == 415 and "Content-Encoding 'gzip' is not accepted" in r.json()["error"]["message"]
    e = requests.post(url + "/tokenize", json={"prompt": "the cat"}, timeout=30)
    assert e.status_code == 200 and e.json()["count"] == 2  # a plain request still passes
    r = requests.post(url + C, json={"prompt": [5, 6], "max_tokens": 2, "stream_options": {"include_usage": True}},
                      timeout=30)
    assert r.status_code == 400 and "stream_options is only allowed when stream is true" in r.text, r.text


def test_health_answers_while_a_20_mb_prompt_is_tokenized(srv):
    """Tokenizing runs off the event loop: /health answers in under 100 ms while 20 MB of text is tokenized (it
    once waited 16.8 s)."""
    text = ("the cat sat on the mat and " * 800_000)[:20_000_000]
    t, out = in_thread(lambda: requests.post(srv.url + "/tokenize", json={"prompt": text}, timeout=300))
    time.sleep(1.5)  # the body is sent and parsed; tokenizing has begun
    waits = []
    for _ in range(5):
        t0 = time.perf_counter()
        assert requests.get(srv.url + "/health", timeout=10).status_code == 200
        waits.append(time.perf_counter() - t0)
        time.sleep(0.1)
    busy = t.is_alive()
    t.join(timeout=300)
    assert busy, "the tokenize request ended before /health was asked: the check proves nothing"
    assert out["r"].status_code == 200 and out["r"].json()["count"] > 5_000_000
    assert max(waits) < 0.1, waits
