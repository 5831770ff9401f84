"""The vLLM backend's reading of an answer, without vLLM (the live group, tests/test_live_vllm.py, runs the real
server): a dropped connection named as such against real sockets on 127.0.0.1; conditional acceptance per position
from vLLM's per-step drafted counts; the output's token ids and the prefix cache's reuse read from the answer; a cut
last step counted as vLLM counts it, kept by the results file's schema (issue 65)."""
from __future__ import annotations

import socket
import threading

import pytest

from ddprobe.probes.backends.base import BackendError
from ddprobe.probes.backends.http import HttpClient
from ddprobe.probes.backends.vllm import answer_extras, per_request_stats, reached_per_pos
from ddprobe.probes.commit import cell_row
from ddprobe.results import Result, RunMeta


class OneShot:
    """A real TCP server on 127.0.0.1 that reads one request and answers it with ``reply`` bytes, then closes
    (``reply`` b"": closes at once, as a server that dies on the request does)."""

    def __init__(self, reply: bytes):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.reply = reply
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        conn, _ = self.sock.accept()
        with conn:
            conn.settimeout(5)
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            if self.reply:
                conn.sendall(self.reply)
        self.sock.close()


@pytest.mark.parametrize("reply", [
    b"",  # closed before any answer: requests says RemoteDisconnected (a ProtocolError)
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n{\"usage\": ",
], ids=["before the headers", "mid-body"])
def test_a_dropped_connection_is_named_so_not_cannot_connect(reply):
    srv = OneShot(reply)
    with pytest.raises(BackendError) as e:
        HttpClient(srv.url, timeout_s=10).call("POST", "/v1/completions", {"prompt": [1, 2]})
    line = str(e.value)
    assert "the connection dropped: the server closed it before a complete answer" in line, line
    assert "cannot connect" not in line and "\n" not in line
    srv.thread.join(5)


def test_nothing_listening_is_still_connection_refused():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(BackendError, match="connection refused"):
        HttpClient(f"http://127.0.0.1:{port}", timeout_s=5).call("GET", "/v1/models")


def test_conditional_acceptance_divides_by_the_drafts_that_reached_each_position():
    """Four steps of k = 4, one of which drafted a single token (ngram near a match's end) and accepted it. Read
    over the steps accepted at the position before, position 1 is 2 of 4 (0.50): that step counts as a rejection at
    a position it never drafted. Over the drafts that reached position 1 it is 2 of 3 (0.67)."""
    accepted, drafted = [4, 1, 1, 4], [4, 1, 4, 4]  # step 2 drafted 1 token (ngram near a match's end)
    assert reached_per_pos(accepted, drafted, 4) == [4, 3, 2, 2]
    sd = {"num_spec_steps": 4, "num_accepted_draft_tokens": 10, "num_draft_tokens": 13, "num_spec_tokens": 4,
          "acceptance_histogram": [0, 2, 0, 0, 2], "per_step_accepted": accepted, "per_step_drafted": drafted,
          "mean_acceptance_length": 3.5}
    st = per_request_stats(sd, 100, 15, 1.0, 16, "here")
    assert st.extra["accepted_per_pos"] == [4, 2, 2, 2]
    assert st.extra["reached_per_pos"] == [4, 3, 2, 2]
    assert st.extra["cond_accept_per_pos"] == [1.0, pytest.approx(2 / 3), 1.0, 1.0]
    assert st.extra["cond_accept_basis"].startswith("drafts that reached")
    sd.pop("per_step_drafted")  # an older server: at p over at p - 1, said so
    st = per_request_stats(sd, 100, 15, 1.0, 16, "here")
    assert st.extra["cond_accept_per_pos"] == [1.0, 0.5, 1.0, 1.0] and "undrafted" in st.extra["cond_accept_basis"]
    sd["per_step_drafted"] = [3, 1, 4, 4]  # a step accepting more than it drafted: not believed, the old basis
    st = per_request_stats(sd, 100, 15, 1.0, 16, "here")
    assert "reached_per_pos" not in st.extra and st.extra["cond_accept_per_pos"][1] == 0.5


def test_token_ids_and_the_prefix_caches_reuse_are_read_from_the_answer():
    sd = {"num_spec_steps": 2, "num_accepted_draft_tokens": 2, "num_spec_tokens": 4}
    st = per_request_stats(sd, 600, 5, 1.0, 5, "here")
    answer = {"choices": [{"text": "a b c d e", "token_ids": [7, 8, 7, 8, 7]}],
              "usage": {"prompt_tokens": 600, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 512}}}
    answer_extras(st, answer, "here")
    assert st.tokens == [7, 8, 7, 8, 7] and st.reused_tokens == 512
    st2 = per_request_stats(sd, 600, 5, 1.0, 5, "here")
    answer_extras(st2, {"choices": [{"token_ids": [1, 2]}], "usage": {"prompt_tokens_details": {"cached_tokens": 601}}},
                  "here")
    assert st2.tokens == [] and "2 token ids for 5 completion tokens" in st2.extra["server_note"]
    assert st2.reused_tokens is None  # more cached than the prompt: not believed


@pytest.mark.parametrize("new", [2, 3])
def test_a_cut_last_step_counted_whole_is_a_row_the_results_file_keeps(tmp_path, new):
    """--max-new-tokens 2 (or 3) with four drafts: the prefill's token, then one step that accepted all four, cut to
    the limit. vLLM counts it whole (commit length 5); so does ddprobe, and the file takes it (budget + 1 bounds it)."""
    sd = {"num_spec_steps": 1, "num_accepted_draft_tokens": 4, "num_draft_tokens": 4, "num_spec_tokens": 4,
          "acceptance_histogram": [0, 0, 0, 0, 1], "per_step_accepted": [4], "per_step_drafted": [4],
          "mean_acceptance_length": 5.0}
    st = per_request_stats(sd, 512, new, 0.5, new, "here")
    assert st.commit_len == 5.0 and st.extra["budget"] == 4
    row = cell_row("predictable", 512, new, st, "vllm")
    r = Result(kind="commit", meta=RunMeta.collect(probe_gpu=False), config={"backend": "vllm", "budget": 4},
               rows=[row])
    r.save(tmp_path / "c.json")
    assert Result.load(tmp_path / "c.json").rows[0]["commit_len"] == 5.0


@pytest.mark.parametrize("metrics, believed", [
    ({"time_to_first_token_ms": 12.0, "generation_time_ms": 40.0}, True),
    ({"time_to_first_token_ms": 12.0, "generation_time_ms": 1e-6}, False),  # 0.25 ns a step
    ({"time_to_first_token_ms": 5e9, "generation_time_ms": 40.0}, False),  # a 58-day prefill
    ({"time_to_first_token_ms": 12.0, "generation_time_ms": 4e10}, False),  # 10^7 s a step
    ({"time_to_first_token_ms": -5.0, "generation_time_ms": 40.0}, False),  # was dropped without a word
    ({"time_to_first_token_ms": 12.0, "generation_time_ms": "fast"}, False),
])
def test_the_servers_timing_is_held_to_the_range_of_a_typed_step_time(metrics, believed):
    from ddprobe.probes.backends.vllm import timing

    st = per_request_stats({"num_spec_steps": 4, "num_accepted_draft_tokens": 4, "num_spec_tokens": 4}, 100, 9, 1.0,
                           9, "here")
    timing(st, metrics)
    assert (st.decode_s is not None) == believed
    assert believed or "not believed" in st.extra["server_note"]
    if not believed and (metrics["time_to_first_token_ms"] < 0 or metrics["generation_time_ms"] == "fast"):
        assert ": not a time, not believed: no timing" in st.extra["server_note"]


@pytest.mark.parametrize("key,value", [("per_step_accepted", [-1, 4, 0, 0]), ("acceptance_histogram", "x"),
                                       ("per_step_drafted", [4, 4, None, 4])])
def test_per_step_lists_that_are_not_counts_are_said_not_dropped(key, value):
    """A per-step list holding a negative count or a non-number was ignored without a word: now said."""
    sd = {"num_spec_steps": 4, "num_accepted_draft_tokens": 5, "num_draft_tokens": 16, "num_spec_tokens": 4, key: value}
    st = per_request_stats(sd, 100, 10, 1.0, 16, "here")
    assert f"{key} {str(value)[:40]}: not a list of counts, ignored" in st.extra["server_note"]
    assert st.verify_steps == 4 and st.accepted_tokens == 5  # the totals stand


def test_a_server_that_refuses_return_token_ids_is_asked_again_without_it():
    """ddprobe serve's imitation of vLLM (a real uvicorn server on 127.0.0.1, the tiny engine) refuses fields it does
    not know, as a vLLM before return_token_ids might: the backend asks once more without the field, never again,
    and the row says it has no ids."""
    pytest.importorskip("uvicorn")
    from test_server import Served

    from ddprobe.probes.backends.engine import EngineBackend
    from ddprobe.probes.backends.vllm import VLLMBackend
    from ddprobe.probes.commit import prompt_ids

    srv = Served(EngineBackend(preset="tiny", seed=0))
    try:
        be = VLLMBackend(srv.url)
        ids = prompt_ids(srv.backend, "novel", 64)
        st = be.generate(ids, 8)
        assert st.completion_tokens == 8 and st.tokens == [] and "no loop check" in st.extra["token_ids"]
        assert be._ids_asked is False and be.generate(ids, 8).commit_len == st.commit_len
    finally:
        srv.close()


def test_a_late_answer_names_the_option_that_set_the_time():
    """A server that takes the request and says nothing: the line names the caller's option (trace --url's is --wait,
    which it passes), not one the command lacks."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    url = f"http://127.0.0.1:{srv.getsockname()[1]}"
    try:
        for flag in ("--timeout", "--wait"):
            with pytest.raises(BackendError) as e:
                HttpClient(url, timeout_s=0.5, timeout_flag=flag).call("GET", "/v1/models")
            assert f"no complete answer within 0.5 s ({flag}; " in str(e.value)
    finally:
        srv.close()


def test_a_prompt_count_other_than_the_prompt_sent_is_not_believed():
    """A real HTTP server on 127.0.0.1 answering as vLLM does, but counting 10 prompt tokens for the 64 sent."""
    import json as _json

    from ddprobe.probes.backends.vllm import VLLMBackend

    answers = {"/v1/models": {"data": [{"id": "m", "max_model_len": 4096}]},
               "/v1/completions": {"choices": [{"text": "x", "token_ids": [1, 2, 3]}],
                                   "usage": {"prompt_tokens": 10, "completion_tokens": 3},
                                   "metrics": {"speculative_decoding": {"num_spec_steps": 1,
                                                                        "num_accepted_draft_tokens": 1}}}}

    import http.server

    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _answer(self):
            n = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(n)
            body = _json.dumps(answers[self.path.split("?")[0]]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        with pytest.raises(BackendError, match="usage.prompt_tokens 10 for a prompt of 64 token ids: not believed"):
            VLLMBackend(f"http://127.0.0.1:{srv.server_address[1]}").generate(list(range(64)), 3)
    finally:
        srv.shutdown()


def test_every_checks_note_is_kept_not_the_last_alone():
    """An answer whose histogram does not fit, whose mean acceptance length is not its counts', whose timing is not
    believed and whose token ids are too few: the row's server_note keeps all four, "; "-joined in the order found
    (each check used to overwrite the one before: the timing note was lost to the token-id note)."""
    from ddprobe.probes.backends.vllm import timing

    sd = {"num_spec_steps": 2, "num_accepted_draft_tokens": 2, "num_spec_tokens": 4,
          "acceptance_histogram": [0, 0, 5], "mean_acceptance_length": 3.0}
    st = per_request_stats(sd, 600, 5, 1.0, 5, "here")
    timing(st, {"time_to_first_token_ms": 12.0, "generation_time_ms": 1e-6})
    answer_extras(st, {"choices": [{"token_ids": [1, 2]}]}, "here")
    notes = st.extra["server_note"].split("; ")
    assert len(notes) == 4, notes
    assert notes[0].startswith("acceptance_histogram [0, 0, 5] does not fit 2 steps")
    assert notes[1].startswith("vLLM's mean_acceptance_length 3 differs from 1 + accepted / steps = 2")
    assert "not believed (a step is between 1 us and 1 h): no timing" in notes[2]
    assert notes[3] == "here: 2 token ids for 5 completion tokens: the output's ids not believed (no loop check)"
    assert st.decode_s is None and st.tokens == []
