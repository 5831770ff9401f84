"""``/metrics`` of ``ddprobe serve``: Prometheus text with vLLM's metric names.

Counters (vLLM's names, labels ``model_name`` and ``engine``): ``vllm:prompt_tokens``,
``vllm:generation_tokens``, ``vllm:request_success`` (label ``finished_reason``: length, stop,
abort), and with speculative decoding ``vllm:spec_decode_num_drafts`` (verify steps),
``vllm:spec_decode_num_draft_tokens`` (tree nodes proposed) and
``vllm:spec_decode_num_accepted_tokens`` (draft tokens accepted per step, a last step cut by the token limit
counted uncut, as vLLM counts it: so 1 + accepted / drafts is vLLM's mean acceptance length, at or above
ddprobe's commit length). Gauges
``vllm:num_requests_running`` and ``vllm:num_requests_waiting``. prometheus-client is the
``server`` extra. ``spec_meta``: the SGLang-style speculative fields of one request's ``meta_info``, each
what SGLang reports under that name (``spec_accept_length`` = completion_tokens / spec_verify_ct), ddprobe's own
commit length under its own name (``commit_len``).
"""
from __future__ import annotations

import threading
from typing import Any, Callable

FINISH_REASONS = ("length", "stop", "abort")


class Metrics:
    def __init__(self, model_name: str, spec: bool):
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.registry = CollectorRegistry()
        self._lock = threading.Lock()
        labels = {"model_name": model_name, "engine": "0"}
        names = list(labels)

        def counter(metric: str, doc: str):
            return Counter(metric, doc, names, registry=self.registry).labels(**labels)

        self.prompt_tokens = counter("vllm:prompt_tokens", "Prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Generation tokens processed.")
        success = Counter("vllm:request_success", "Finished requests.", names + ["finished_reason"],
                          registry=self.registry)
        self.success = {r: success.labels(**labels, finished_reason=r) for r in FINISH_REASONS}
        self.spec = spec
        if spec:
            self.drafts = counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts (verify steps).")
            self.draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.")
            self.accepted = counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.")
        self._running = Gauge("vllm:num_requests_running", "Requests being decoded.", names, registry=self.registry)
        self._waiting = Gauge("vllm:num_requests_waiting", "Requests queued.", names, registry=self.registry)
        self._labels = labels

    def gauges(self, running: Callable[[], int], waiting: Callable[[], int]) -> None:
        self._running.labels(**self._labels).set_function(running)
        self._waiting.labels(**self._labels).set_function(waiting)

    def finished(self, st) -> None:
        """One request's counts, all at once (a reader never sees half a request)."""
        with self._lock:
            self.prompt_tokens.inc(st.prompt_tokens)
            self.generation_tokens.inc(st.completion_tokens)
            if self.spec:
                self.drafts.inc(st.verify_steps)
                self.draft_tokens.inc(st.extra.get("tree_nodes", 0))
                self.accepted.inc(st.extra.get("accepted_uncut", sum(c - 1 for c in st.commit_lens)))
            self.success[st.extra.get("finish_reason", "length")].inc()

    def text(self) -> str:
        from prometheus_client import generate_latest

        with self._lock:
            return generate_latest(self.registry).decode()


def spec_meta(st, max_commit: int) -> dict[str, Any]:
    """SGLang's speculative fields of one request as SGLang fills them, and ddprobe's commit length beside them
    (``commit_len``, defined once: ``GenStats.commit_len``)."""
    hist = [0] * max_commit
    for c in st.commit_lens:
        hist[c - 1] += 1
    steps = st.verify_steps
    drafts = st.extra.get("tree_nodes", 0)
    return {"spec_verify_ct": steps, "spec_accept_histogram": hist, "spec_correct_drafts_histogram": hist,
            "commit_len": st.commit_len if steps else 0.0, "spec_accept_length": st.sglang_accept_length if steps else 0.0,
            "spec_num_correct_drafts": sum(c - 1 for c in st.commit_lens), "spec_num_proposed_drafts": drafts,
            "spec_accept_rate": sum(c - 1 for c in st.commit_lens) / drafts if drafts else 0.0}
