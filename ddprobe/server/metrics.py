"""``/metrics`` of ``ddprobe serve``: Prometheus text with vLLM's metric names.

Counters (vLLM's names, labels ``model_name`` and ``engine``): ``vllm:prompt_tokens``,
``vllm:generation_tokens``, ``vllm:request_success`` (label ``finished_reason``: length, stop,
abort), and with speculative decoding ``vllm:spec_decode_num_drafts`` (verify steps),
``vllm:spec_decode_num_draft_tokens`` (tree nodes proposed) and
``vllm:spec_decode_num_accepted_tokens`` (draft tokens accepted per step, every step that ran counted whole
though a token limit or a stop cut the output, as vLLM counts: ``vllm_steps``; so 1 + accepted / drafts is vLLM's
mean acceptance length, at or above ddprobe's commit length) and
``vllm:spec_decode_num_accepted_tokens_per_pos`` (label ``position``, 0 to the most a step can accept - 1: steps
that accepted a token there; a tree's position is its depth). Gauges
``vllm:num_requests_running`` and ``vllm:num_requests_waiting``. prometheus-client is the
``server`` extra. ``spec_meta``: the SGLang-style speculative fields of one request's ``meta_info``, each
what SGLang reports under that name (``spec_accept_length`` = completion_tokens / spec_verify_ct), ddprobe's own
commit length under its own name (``commit_len``). ``vllm_spec_metrics``: one request's
``metrics.speculative_decoding`` as vLLM 0.32 returns it with ``--per-request-spec-decode-metrics detailed``
(names, label keys and fields checked against a real vLLM by tests/test_live_vllm.py).
"""
from __future__ import annotations

import threading
from typing import Any, Callable

FINISH_REASONS = ("length", "stop", "abort")


class Metrics:
    def __init__(self, model_name: str, spec: bool, positions: int = 0):
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
            per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.",
                              names + ["position"], registry=self.registry)
            self.per_pos = [per_pos.labels(**labels, position=str(p)) for p in range(positions)]
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
                ran = vllm_steps(st)
                self.drafts.inc(len(ran))
                self.draft_tokens.inc(sum(d for _, d in ran))
                self.accepted.inc(sum(a for a, _ in ran))
                for a, _ in ran:
                    for c in self.per_pos[:a]:
                        c.inc()
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


def vllm_steps(st) -> list[tuple[int, int]]:
    """(draft tokens accepted, draft nodes) of every verify step that ran, as vLLM counts them: before a token limit
    or a stop cut the output (vLLM's scheduler counts a step's acceptance, then checks the limit and the stops), so
    a cut step counts whole and a step a stop cut away entirely counts too (``GenStats.ran_steps``, which the
    engine served fills)."""
    return list(st.ran_steps)


def vllm_spec_metrics(st, positions: int) -> dict[str, Any]:
    """One request's ``metrics.speculative_decoding`` in vLLM's fields: the mean acceptance length (1 + accepted /
    steps) and rate, the histogram (index = tokens accepted in a step), the counts, per step what was accepted and
    what was drafted (the tree's nodes)."""
    ran = vllm_steps(st)
    acc, steps, drafted = [a for a, _ in ran], len(ran), sum(d for _, d in ran)
    hist = [0] * (positions + 1)
    for a in acc:
        hist[min(a, positions)] += 1
    return {"mean_acceptance_length": 1 + sum(acc) / steps if steps else 1.0,
            "draft_acceptance_rate": sum(acc) / drafted if drafted else 0.0, "acceptance_histogram": hist,
            "num_spec_steps": steps, "num_accepted_draft_tokens": sum(acc), "num_draft_tokens": drafted,
            "num_spec_tokens": positions, "per_step_accepted": acc if ran else None,  # null without a step, as
            "per_step_drafted": [d for _, d in ran] if ran else None}  # vLLM 0.32 answers it
