"""The HTTP backends parsed against recorded response shapes of real SGLang (/generate meta_info with its
spec fields) and real vLLM (/metrics with vllm:spec_decode_* counters), served from tests/data/recorded/ by a plain
loopback HTTP server. Where the files come from is written in each of them. Expected numbers are worked
out here by hand from the recorded fields."""
import http.server
import json
import threading
from pathlib import Path

import pytest

from ddprobe.probes.backends import BackendError
from ddprobe.probes.sglang import SGLangBackend
from ddprobe.probes.vllm import VLLMBackend, parse_metrics

DATA = Path(__file__).parent / "data" / "recorded"
SGLANG = json.loads((DATA / "sglang-generate-spec.json").read_text())
METRICS = {k: (DATA / f"vllm-metrics-{k}.txt").read_text() for k in ("before", "after", "after-busy")}


def replay(routes: dict):
    """A loopback server answering each path with the next recorded body of its list (the last one repeats)."""
    calls: dict[str, int] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _answer(self):
            bodies = routes.get(self.path)
            if bodies is None:
                self.send_response(404)
                self.end_headers()
                return
            i = calls.get(self.path, 0)
            calls[self.path] = i + 1
            body = bodies[min(i, len(bodies) - 1)]
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(200)
            self.send_header("content-type", "text/plain" if isinstance(body, str) else "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._answer()

        def do_POST(self):
            self.rfile.read(int(self.headers.get("content-length", 0)))
            self._answer()

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


@pytest.fixture
def serve():
    servers = []

    def start(routes):
        srv, url = replay(routes)
        servers.append(srv)
        return url

    yield start
    for s in servers:
        s.shutdown()


def test_sglang_meta_info_as_sglang_writes_it(serve):
    url = serve({"/generate": [SGLANG["response"]]})
    st = SGLangBackend(url).generate(list(range(1024)), 128)
    meta = SGLANG["response"]["meta_info"]
    # 128 tokens: 1 from the prefill, 127 over 37 verify steps (the last one cut at the limit)
    assert st.verify_steps == 37 and st.completion_tokens == 128
    assert st.commit_len == pytest.approx(127 / 37)
    assert st.sglang_accept_length == pytest.approx(128 / 37) == meta["spec_accept_length"]
    # histogram [5, 6, 7, 8, 7, 4] by accepted drafts: 37 steps; 7 drafts proposed per step (259 / 37)
    assert len(st.commit_lens) == 37 and st.commit_lens.count(1) == 5 and st.commit_lens.count(6) == 4
    assert st.drafts_per_step == pytest.approx(7.0)
    assert st.extra["reported_spec_accept_length"] == meta["spec_accept_length"]


def test_sglang_older_alias_only_and_missing_spec_fields(serve):
    meta = dict(SGLANG["response"]["meta_info"])
    for k in ("spec_correct_drafts_histogram", "spec_num_proposed_drafts"):
        meta.pop(k)
    url = serve({"/generate": [{"text": "x", "meta_info": meta}]})
    st = SGLangBackend(url).generate([1, 2], 128)
    assert len(st.commit_lens) == 37 and st.drafts_per_step == pytest.approx(7.0)  # from the aliases
    plain = {k: v for k, v in meta.items() if not k.startswith("spec_")}
    url = serve({"/generate": [{"text": "x", "meta_info": plain}]})
    with pytest.raises(BackendError, match="no speculative-decoding counters.*spec_verify_ct"):
        SGLangBackend(url).generate([1, 2], 128)


def models():
    return {"object": "list", "data": [{"id": "meta-llama/Llama-3.1-8B-Instruct", "max_model_len": 131072}]}


def completion(n=128):
    return {"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": "x", "finish_reason":
                                                                          "length"}],
            "usage": {"prompt_tokens": 1024, "completion_tokens": n, "total_tokens": 1024 + n}}


def test_vllm_counters_as_vllm_exposes_them(serve):
    url = serve({"/v1/models": [models()], "/metrics": [METRICS["before"], METRICS["after"]],
                 "/v1/completions": [completion()]})
    st = VLLMBackend(url).generate(list(range(1024)), 128)
    # drafts 1000 -> 1050, accepted 1650 -> 1727, draft tokens 3000 -> 3150
    assert st.verify_steps == 50 and st.accepted_tokens == 77
    assert st.commit_len == pytest.approx(1 + 77 / 50) == pytest.approx((128 - 1) / 50)
    assert st.drafts_per_step == pytest.approx(3.0) and "traffic_check" not in st.extra
    totals = parse_metrics(METRICS["after"], "after", counters=("vllm:request_success",),
                           gauges=("vllm:num_requests_running",))
    assert totals == {"vllm:request_success": 13.0, "vllm:num_requests_running": 0.0}  # summed over reasons


def test_vllm_other_clients_traffic_fails_the_cell_in_one_line(serve):
    url = serve({"/v1/models": [models()], "/v1/completions": [completion()],
                 "/metrics": [METRICS["before"], METRICS["after-busy"]] * 3})
    be = VLLMBackend(url)
    with pytest.raises(BackendError) as e:
        be.generate(list(range(1024)), 128)
    msg = str(e.value)
    assert "other clients' traffic" in msg and "request_success_total +2" in msg and "\n" not in msg
    assert "generation_tokens_total +256 (this request: 128)" in msg


def test_vllm_busy_gauge_before_the_request_is_traffic(serve):
    busy_before = METRICS["before"].replace('engine="0"} 0.0\n# HELP vllm:num_requests_waiting',
                                            'engine="0"} 1.0\n# HELP vllm:num_requests_waiting')
    assert busy_before != METRICS["before"]
    url = serve({"/v1/models": [models()], "/v1/completions": [completion()],
                 "/metrics": [busy_before, METRICS["after"]] * 3})
    with pytest.raises(BackendError, match="num_requests_running > 0 before the request"):
        VLLMBackend(url).generate(list(range(1024)), 128)
