"""The HTTP backends parsed against responses of real SGLang and vLLM servers from the public record, served by a
plain loopback HTTP server. tests/data/recorded/SOURCES.md says where each file comes from and what was trimmed:

- real, pasted from live servers: an SGLang ``/generate`` response with the older spec keys (sglang PR 13754), the
  spec fields of a newer SGLang ``meta_info`` with the accepted-drafts histogram (sglang PR 33518, whose
  ``completion_tokens`` of 106 is stated in the comment's prose and added here), and rows of a Prometheus query of
  an 8-engine vLLM server's ``vllm:spec*`` series (vllm PR 24049, turned into exposition lines here);
- a documentation example: the ``/metrics`` example output of vLLM's docs/design/metrics.md (request_success,
  generation_tokens, num_requests_running; no spec-decode counters);
- constructed (values invented, names from vLLM's source): the before/after scrapes ``constructed-vllm-metrics-*``
  that drive ``VLLMBackend.generate`` end to end, because no public before/after pair of one server exists.
- live, captured here (issue 53) from vLLM 0.32.0's CPU build serving the live tests' tiny Llama: /metrics before
  and after one request, its answer with ``metrics.speculative_decoding``, one request that drafted nothing.

Expected numbers are worked out here by hand from the values visible in those files."""
import http.server
import re
import json
import threading
from pathlib import Path

import pytest

from ddprobe.probes.backends.base import BackendError
from ddprobe.probes.backends.sglang import SGLangBackend
from ddprobe.probes.backends.vllm import VLLMBackend, parse_metrics

DATA = Path(__file__).parent / "data" / "recorded"
SGLANG_13754 = json.loads((DATA / "sglang-pr13754-generate.json").read_text())
SGLANG_33518 = json.loads((DATA / "sglang-pr33518-spec-fields.json").read_text())
VLLM_DOC = (DATA / "vllm-design-doc-metrics-example.txt").read_text()
VLLM_24049 = (DATA / "vllm-pr24049-prometheus-query.txt").read_text()
METRICS = {k: (DATA / f"constructed-vllm-metrics-{k}.txt").read_text() for k in ("before", "after", "after-busy")}
# vLLM 0.32.0's CPU build, captured here from the live test's server (SOURCES.md): one request's /metrics before and
# after, its answer, a request that drafted nothing, /v1/models
LIVE = {k: (DATA / f"vllm-0.32-cpu-metrics-{k}.txt").read_text() for k in ("before", "after")}
LIVE_NOVEL = json.loads((DATA / "vllm-0.32-cpu-completion-novel-1k.json").read_text())
LIVE_NO_DRAFT = json.loads((DATA / "vllm-0.32-cpu-completion-no-draft.json").read_text())
LIVE_MODELS = json.loads((DATA / "vllm-0.32-cpu-models.json").read_text())


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


def test_sglang_live_response_older_keys(serve):
    """sglang PR 13754: 200 tokens (finish_reason length 200) over 188 verify steps, 11 drafts accepted in all."""
    meta = SGLANG_13754["meta_info"]
    url = serve({"/generate": [SGLANG_13754]})
    st = SGLangBackend(url).generate(list(range(171)), 200)
    assert st.completion_tokens == 200 and st.verify_steps == 188 and st.prompt_tokens == 171
    # 1 token from the prefill + 188 steps committing 1 each + 11 accepted drafts = 200
    assert 1 + 188 + 11 == 200
    assert st.commit_len == pytest.approx(199 / 188)
    assert st.sglang_accept_length == pytest.approx(200 / 188) == meta["spec_accept_length"]
    assert st.e2e_s == pytest.approx(1.7586748600006104)
    # no histogram in this key set; spec_draft_token_num (940 = 188 x 5) is not read as drafts per step
    assert st.commit_lens == [] and st.drafts_per_step is None
    assert st.extra["reported_spec_accept_rate"] == pytest.approx(11 / 940)
    assert st.reused_tokens == meta["cached_tokens"] == 0  # prompt tokens from SGLang's prefix cache
    assert st.tokens == []  # the recorded answer's output_ids were trimmed from the copy (SOURCES.md)


def meta_33518(**renames) -> dict:
    """The pasted spec fields plus completion_tokens 106 from the same comment's prose; keys renamed on request."""
    meta = {renames.get(k, k): v for k, v in SGLANG_33518.items()}
    meta["completion_tokens"] = 106
    return meta


def test_sglang_live_spec_fields_with_histogram(serve):
    """sglang PR 33518: histogram [11, 14, 11, 4, 0, 3] by drafts accepted in a step, 43 steps, 215 proposed."""
    url = serve({"/generate": [{"text": "", "meta_info": meta_33518()}]})
    st = SGLangBackend(url).generate([1, 2, 3], 106)
    assert st.verify_steps == 43 and st.completion_tokens == 106
    assert st.commit_len == pytest.approx(105 / 43)  # (completion_tokens - 1) / spec_verify_ct
    assert st.sglang_accept_length == pytest.approx(106 / 43) == SGLANG_33518["spec_accept_length"]
    assert st.drafts_per_step == pytest.approx(215 / 43) == 5.0
    lens = st.commit_lens
    assert len(lens) == 11 + 14 + 11 + 4 + 0 + 3 == 43
    assert [lens.count(n) for n in (1, 2, 3, 4, 5, 6)] == [11, 14, 11, 4, 0, 3]
    # the histogram's steps commit 43 + 63 = 106 tokens: one more than the 105 after the prefill's token
    assert sum(lens) == 43 + 63 == 106


def test_sglang_prefix_cache_and_output_ids(serve):
    """Constructed around the live spec fields: a second request whose prompt SGLang found in its radix cache
    (``cached_tokens``) and an answer that carries ``output_ids`` (as the live 13754 answer did, trimmed there)."""
    meta = meta_33518()
    meta.update(prompt_tokens=2048, cached_tokens=1024)
    ids = [7, 8, 9, 10, 11] * 21 + [7]  # 106 ids: a loop
    url = serve({"/generate": [{"text": "", "output_ids": ids, "meta_info": meta}]})
    st = SGLangBackend(url).generate(list(range(2048)), 106)
    assert st.reused_tokens == 1024 and st.tokens == ids
    from ddprobe.probes.commit import cell_row

    row = cell_row("novel", 2048, 106, st, "sglang")
    assert row["reused_tokens"] == 1024 and row["output_repeats"] > 0.9
    for bad in (-1, 4096, True, "1024"):  # not a count of this prompt's tokens: left unknown
        meta["cached_tokens"] = bad
        url = serve({"/generate": [{"text": "", "output_ids": ["x"], "meta_info": meta}]})
        st = SGLangBackend(url).generate(list(range(2048)), 106)
        assert st.reused_tokens is None and st.tokens == []


def test_sglang_older_aliases_and_missing_spec_fields(serve):
    meta = meta_33518(spec_correct_drafts_histogram="spec_accept_histogram",
                      spec_num_proposed_drafts="spec_proposed_drafts")
    url = serve({"/generate": [{"text": "", "meta_info": meta}]})
    st = SGLangBackend(url).generate([1, 2], 106)
    assert len(st.commit_lens) == 43 and st.drafts_per_step == pytest.approx(5.0)  # read from the aliases
    plain = {k: v for k, v in SGLANG_13754["meta_info"].items() if not k.startswith("spec_")}
    url = serve({"/generate": [{"text": "x", "meta_info": plain}]})
    with pytest.raises(BackendError, match="no speculative-decoding counters.*spec_verify_ct"):
        SGLangBackend(url).generate([1, 2], 128)


def test_sglang_correct_drafts_under_todays_name_and_its_aliases(serve):
    """sglang PR 24081 renamed the meta_info keys (``spec_num_correct_drafts``, ``spec_num_proposed_drafts``,
    ``spec_correct_drafts_histogram``) and kept the older ones as aliases; PR 13754's answer has the oldest
    (``spec_accept_token_num``). Each is read, and a count that contradicts the histogram is not believed."""
    for renames in ({}, {"spec_num_correct_drafts": "spec_accepted_drafts"}):
        url = serve({"/generate": [{"text": "", "meta_info": meta_33518(**renames)}]})
        st = SGLangBackend(url).generate([1, 2, 3], 106)
        assert st.extra["reported_spec_num_correct_drafts"] == 63 and "server_note" not in st.extra
        # SGLang's accept length is 1 + correct / steps: 43 steps + 63 correct drafts = its 106 tokens
        assert 1 + 63 / 43 == pytest.approx(st.sglang_accept_length)
    url = serve({"/generate": [SGLANG_13754]})
    assert SGLangBackend(url).generate(list(range(171)), 200).extra["reported_spec_num_correct_drafts"] == 11
    meta = meta_33518()
    meta["spec_num_correct_drafts"] = 64  # the histogram says 63
    url = serve({"/generate": [{"text": "", "meta_info": meta}]})
    st = SGLangBackend(url).generate([1, 2, 3], 106)
    assert "64 correct drafts do not fit the histogram's 63" in st.extra["server_note"]
    assert "reported_spec_num_correct_drafts" not in st.extra and st.commit_len == pytest.approx(105 / 43)


def live_vllm(answer: dict) -> dict:
    return {"/v1/models": [LIVE_MODELS], "/metrics": [LIVE["before"], LIVE["after"]], "/v1/completions": [answer]}


def test_vllm_live_answer_per_request_and_from_its_counters(serve):
    """vLLM 0.32.0: 32 tokens of novel text at 1k, 7 drafted steps accepting [0, 4, 0, 0, 0, 2, 0] of 4 drafts:
    vLLM's mean acceptance length 13 / 7; the counters across the request say the same, and so does each path."""
    own = LIVE_NOVEL["metrics"]["speculative_decoding"]
    st = VLLMBackend(serve(live_vllm(LIVE_NOVEL))).generate(list(range(1024)), 32)
    assert st.commit_len == pytest.approx(1 + 6 / 7, abs=1e-12) == own["mean_acceptance_length"]
    assert st.verify_steps == 7 and st.extra["spec_counts"].startswith("per request")
    assert st.extra["accepted_per_pos"] == [2, 2, 1, 1]  # steps accepting 4 and 2 drafts
    assert st.extra["cond_accept_per_pos"] == pytest.approx([2 / 7, 1.0, 0.5, 1.0])
    assert sorted(st.commit_lens) == [1] * 5 + [3, 5]  # the histogram [5, 0, 1, 0, 1]
    # 31 tokens after the prefill's: 7 drafted steps commit 13, so 18 more steps drafted nothing
    assert st.extra["decode_steps"] == 25 and st.decode_s == pytest.approx(0.10691004799991788)
    without = {k: v for k, v in LIVE_NOVEL.items() if k != "metrics"}  # a server without the per-request flag
    st2 = VLLMBackend(serve(live_vllm(without))).generate(list(range(1024)), 32)
    assert st2.extra["spec_counts"].startswith("server-wide") and st2.commit_len == pytest.approx(st.commit_len)
    assert st2.extra["accepted_per_pos"] == st.extra["accepted_per_pos"] and st2.drafts_per_step == 4.0


def test_vllm_live_request_that_drafted_nothing(serve):
    """ngram speculation found nothing to draft: vLLM says 0 spec steps and mean acceptance length 1.0; so does
    ddprobe, with a note, and the row is a valid results row."""
    from ddprobe.probes.commit import cell_row
    from ddprobe.schema import parse_row

    st = VLLMBackend(serve(live_vllm(LIVE_NO_DRAFT))).generate(list(range(32)), 16)
    assert st.commit_len == 1.0 == LIVE_NO_DRAFT["metrics"]["speculative_decoding"]["mean_acceptance_length"]
    assert st.verify_steps == 0 and "no step proposed a draft" in st.extra["server_note"]
    row = cell_row("novel", 32, 16, st, "vllm")
    assert row["sglang_accept_length"] is None and parse_row("commit", row, "row").commit_len == 1.0


def test_vllm_per_position_counts_that_cannot_be_true_are_ignored(serve):
    answer = json.loads(json.dumps(LIVE_NOVEL))
    answer["metrics"]["speculative_decoding"]["per_step_accepted"] = [0, 4, 0, 0, 0, 3, 0]  # 7 accepted, not 6
    st = VLLMBackend(serve(live_vllm(answer))).generate(list(range(1024)), 32)
    assert "accepted_per_pos" not in st.extra and "do not fit" in st.extra["server_note"]
    assert st.commit_len == pytest.approx(1 + 6 / 7)  # the counts stand


def doc_example() -> str:
    """vLLM's docs example with its `$ curl` line and `...` elisions dropped (not Prometheus text)."""
    return "".join(ln for ln in VLLM_DOC.splitlines(keepends=True) if not ln.startswith(("$", "...")))


def test_vllm_docs_example_parses_and_reads_as_busy():
    assert len(doc_example().splitlines()) == len(VLLM_DOC.splitlines()) - 4  # the curl line + 3 elisions
    be = VLLMBackend.__new__(VLLMBackend)  # other_traffic needs no connection
    totals = parse_metrics(doc_example(), "doc", counters=(be.SUCCESS, be.GEN_TOKENS), gauges=be.GAUGES)
    # request_success: stop 1 + length 131 + abort 0; num_requests_waiting is elided in the example
    assert totals == {"vllm:num_requests_running": 8.0, "vllm:generation_tokens": 27453.0,
                      "vllm:request_success": 132.0}
    assert be.other_traffic(totals, totals, 128) == (
        "num_requests_running > 0 before the request; request_success_total +0 (expected +1); "
        "generation_tokens_total +0 (this request: 128)")
    with pytest.raises(BackendError, match="not Prometheus text"):
        parse_metrics(VLLM_DOC, "doc")  # the elisions as pasted


def test_vllm_docs_example_has_no_spec_counters(serve):
    url = serve({"/metrics": [doc_example()]})
    with pytest.raises(BackendError, match="no speculative-decoding counters .*num_accepted_tokens_total, "
                                           "vllm:spec_decode_num_drafts_total missing"):
        VLLMBackend(url).spec_counters()


def pr24049_exposition() -> str:
    """The query rows as exposition lines `name{labels} value` (no # TYPE lines, as a grep of /metrics gives)."""
    rows = [ln.split(" | ") for ln in VLLM_24049.splitlines() if ln != "-- | --"]
    return "".join(f"{name} {value}\n" for name, value in rows)


def test_vllm_live_rows_sum_over_engines_and_skip_created():
    text = pr24049_exposition()
    assert text.count("\n") == 17
    totals = parse_metrics(text, "pr24049", counters=("vllm:spec_decode_num_drafts",
                                                      "vllm:spec_decode_num_accepted_tokens"))
    # engines 0..7: 22 + 15 + 29 + 20 + 25 + 24 + 27 + 26; the _created rows (1.7567e9 s) and the per-position row
    # (7) are not counted; the accepted totals are not among the rows reproduced
    assert totals == {"vllm:spec_decode_num_drafts": 188.0}


def models():
    return {"object": "list", "data": [{"id": "meta-llama/Llama-3.1-8B-Instruct", "max_model_len": 131072}]}


def completion(n=128):
    return {"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": "x", "finish_reason":
                                                                          "length"}],
            "usage": {"prompt_tokens": 1024, "completion_tokens": n, "total_tokens": 1024 + n}}


def test_vllm_generate_end_to_end_on_constructed_scrapes(serve):
    """CONSTRUCTED before/after scrapes (see SOURCES.md): the delta arithmetic of one request, end to end."""
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
    """CONSTRUCTED scrapes: another client's request finished between them."""
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


# ---- issue 65: a server's numbers that cannot be true are not believed (one line, or said and left out)
@pytest.mark.parametrize("routes,says", [
    ({"/get_model_info": [{"context_length": -5}]}, "/get_model_info: context_length is '-5': not a context length"),
    ({"/get_model_info": [{"max_context_length": 10 ** 30}]},
     "max_context_length is '1000000000000000000000000000000'"),
    ({"/v1/models": [{"data": [1]}]}, "/v1/models: 'data' is '[1]', not a list of models"),  # was an AttributeError
])
def test_sglang_context_lengths_that_cannot_be(serve, routes, says):
    url = serve(routes)
    with pytest.raises(BackendError, match=re.escape(says)):
        SGLangBackend(url).max_context()


def test_vllm_context_length_that_cannot_be(serve):
    card = dict(LIVE_MODELS["data"][0], max_model_len=0)
    url = serve({"/v1/models": [{"data": [card]}]})
    with pytest.raises(BackendError, match="max_model_len is '0': not a context length"):
        VLLMBackend(url).max_context()
    assert SGLangBackend(serve({"/get_model_info": [{"context_length": 4096}]})).max_context() == 4096


def test_sglang_prompt_tokens_latency_and_drafts_that_cannot_be_are_said_not_believed(serve):
    """PR 13754's answer with its prompt_tokens at 1e12 for 171 tokens sent, an e2e_latency of 1e30 s and 1e30
    drafts proposed: the tokens sent, the time measured here and no drafts per step stand, each said in the row's
    server_note; the sane counters still read."""
    meta = dict(SGLANG_13754["meta_info"], prompt_tokens=10 ** 12, e2e_latency=1e30,
                spec_num_proposed_drafts=10 ** 30, spec_accept_histogram=[-1, 189])
    url = serve({"/generate": [{"meta_info": meta}]})
    st = SGLangBackend(url, timeout_s=30).generate(list(range(171)), 200)
    assert st.prompt_tokens == 171 and st.e2e_s < 30 and st.drafts_per_step is None
    note = st.extra["server_note"]
    assert "prompt_tokens 1000000000000 for 171 tokens sent: not believed" in note
    assert "e2e_latency 1e+30 s, beyond the 30 s this client waits for an answer: not believed" in note
    assert "drafts proposed over 188 verify steps: not believed" in note
    assert "accepted-drafts histogram [-1, 189]: not a list of counts, ignored" in note and st.commit_lens == []
    assert st.completion_tokens == 200 and st.verify_steps == 188  # the counts that can be true stand
