"""vLLM's OpenAI ``/v1/completions`` with the spec-decode counters of ``/metrics`` (server-wide: the
backend checks that only its own request moved them; see ``VLLMBackend.other_traffic``), or, when the server
returns them (vLLM PR #48915, ``--per-request-spec-decode-metrics``), the request's own counts under
``metrics.speculative_decoding`` (``num_spec_steps``, ``num_accepted_draft_tokens``, ``num_draft_tokens``,
``acceptance_histogram``: index = draft tokens accepted in a step), which no other client's traffic can mix.

Every count is checked before it is believed (``backends.checked_stats``): counters that go backwards (a
restart) or jump past what one request can move, and per-request figures that contradict each other, fail the
cell in one line."""
from __future__ import annotations

import math
import time
from typing import Any

from .base import BackendError, GenStats, checked_stats, histogram_note
from .http import HttpClient, field_of


class VLLMBackend(HttpClient):
    name = "vllm"
    ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
    DRAFTS = "vllm:spec_decode_num_drafts"
    DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
    SUCCESS = "vllm:request_success"  # label finished_reason; one more per finished request
    GEN_TOKENS = "vllm:generation_tokens"
    GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")
    COUNTERS = (ACCEPTED, DRAFTS, DRAFT_TOKENS, SUCCESS, GEN_TOKENS)
    RETRIES = 2  # attempts after the first when another client's traffic is seen

    def __init__(self, url: str, timeout_s: float = 600.0, model: str | None = None):
        super().__init__(url, timeout_s)
        self._model = model
        self._models: dict | None = None
        self._per_request = False  # the server returns metrics.speculative_decoding: /metrics is not read

    def _model_card(self) -> dict:
        if self._models is None:
            d = self.call("GET", "/v1/models")
            data = d.get("data") if isinstance(d, dict) else None
            if not data or not isinstance(data, list) or not isinstance(data[0], dict):
                raise BackendError(f"{self.url}/v1/models: lists no model")
            self._models = data[0]
            if self._model is None:
                self._model = str(data[0].get("id"))
        return self._models

    def tokenize(self, text: str) -> list[int]:
        self._model_card()
        d = self.call("POST", "/tokenize", {"model": self._model, "prompt": text, "add_special_tokens": False})
        return list(field_of(d, "tokens", f"{self.url}/tokenize", list))

    def max_context(self) -> int | None:
        v = self._model_card().get("max_model_len")
        return v if isinstance(v, int) else None

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "url": self.url, "model": self._model_card().get("id")}

    def spec_counters(self) -> dict[str, float]:
        """Sum of each counter (``_total`` samples) and gauge we read, over all label sets."""
        text = self.call("GET", "/metrics", expect_json=False)
        totals = parse_metrics(text, f"{self.url}/metrics", counters=self.COUNTERS,
                               gauges=self.GAUGES)
        missing = [n for n in (self.ACCEPTED, self.DRAFTS) if n not in totals]
        if missing:
            raise BackendError(f"{self.url}/metrics: the server reports no speculative-decoding counters "
                               f"({', '.join(m + '_total' for m in missing)} missing): is speculative decoding on?")
        return totals

    def other_traffic(self, before: dict, after: dict, completion_tokens: int) -> str | None:
        """Why the counters moved by more than this one request (None when they did not or cannot tell)."""
        why = []
        busy = [g.split(":")[1] for g in self.GAUGES if before.get(g)]
        if busy:
            why.append(f"{', '.join(busy)} > 0 before the request")
        if self.SUCCESS in after:
            n = after[self.SUCCESS] - before.get(self.SUCCESS, 0.0)
            if round(n) != 1:
                why.append(f"request_success_total +{n:g} (expected +1)")
        if self.GEN_TOKENS in after:
            n = after[self.GEN_TOKENS] - before.get(self.GEN_TOKENS, 0.0)
            if round(n) != completion_tokens:
                why.append(f"generation_tokens_total +{n:g} (this request: {completion_tokens})")
        return "; ".join(why) or None

    def generate(self, input_ids: list[int], max_new_tokens: int) -> GenStats:
        seen = ""
        for _ in range(1 + self.RETRIES):
            stats, seen = self._generate_once(input_ids, max_new_tokens)
            if stats is not None:
                return stats
            time.sleep(0.5)
        raise BackendError(f"{self.url}/metrics: other clients' traffic during each of {1 + self.RETRIES} attempts "
                           f"({seen}); vLLM's spec-decode counters are server-wide, so this cell's commit length "
                           "cannot be told apart: run on a server nobody else is using")

    def _generate_once(self, input_ids: list[int], max_new_tokens: int) -> tuple[GenStats | None, str]:
        where = f"{self.url}/v1/completions"
        self._model_card()
        before, no_counters = None, None
        if not self._per_request:
            try:
                before = self.spec_counters()
            except BackendError as e:  # per-request metrics may still come with the answer
                no_counters = e
        body = {"model": self._model, "prompt": input_ids, "max_tokens": max_new_tokens, "temperature": 0.0,
                "ignore_eos": True}
        t0 = time.perf_counter()
        try:
            d = self.call("POST", "/v1/completions", body)
        except BackendError:
            if no_counters is not None:  # a server without the counters is the first thing to say
                raise no_counters from None
            raise
        e2e = time.perf_counter() - t0
        usage = field_of(d, "usage", where, dict)
        completion = field_of(usage, "completion_tokens", where, int)
        prompt = field_of(usage, "prompt_tokens", where, int)
        own = (d.get("metrics") or {}).get("speculative_decoding") if isinstance(d.get("metrics"), dict) else None
        if isinstance(own, dict):
            self._per_request = True
            return per_request_stats(own, prompt, completion, e2e, max_new_tokens, where), ""
        if before is None:
            raise no_counters or BackendError(f"{where}: the answer has no metrics.speculative_decoding any more")
        after = self.spec_counters()
        back = [n for n in self.COUNTERS if n in before and n in after and after[n] < before[n]]
        if back:
            raise BackendError(f"{self.url}/metrics: {back[0]}_total went backwards ({before[back[0]]:g} -> "
                               f"{after[back[0]]:g}; the server restarted?): the request's counts are lost")
        traffic = self.other_traffic(before, after, completion)
        if traffic:
            return None, traffic
        accepted = after[self.ACCEPTED] - before[self.ACCEPTED]
        drafts = after[self.DRAFTS] - before[self.DRAFTS]
        if drafts <= 0:
            raise BackendError(f"{self.url}/metrics: no draft was counted during the request (speculative "
                               "decoding off?)")
        stats = GenStats(prompt_tokens=prompt, completion_tokens=completion, verify_steps=int(round(drafts)),
                         accepted_tokens=accepted, e2e_s=e2e)
        k = None
        if self.DRAFT_TOKENS in after:
            stats.drafts_per_step = (after[self.DRAFT_TOKENS] - before[self.DRAFT_TOKENS]) / drafts
            k = max(1, round(stats.drafts_per_step))
        checked_stats(stats, max_new_tokens, f"{self.url}/metrics", budget=k)
        if self.SUCCESS not in after and self.GEN_TOKENS not in after:
            stats.extra["traffic_check"] = "unavailable: /metrics has no request_success or generation_tokens"
        return stats, ""


def per_request_stats(sd: dict, prompt: int, completion: int, e2e: float, max_new_tokens: int,
                      where: str) -> GenStats:
    """GenStats from vLLM's per-request ``metrics.speculative_decoding`` (PR #48915): ``num_spec_steps`` verify
    steps, ``num_accepted_draft_tokens`` (a cut last step counted uncut, as vLLM counts), ``num_draft_tokens`` and
    ``num_spec_tokens`` (k); ``acceptance_histogram`` gives the spread when it agrees with the counts."""
    where = f"{where} metrics.speculative_decoding"
    steps = field_of(sd, "num_spec_steps", where, int)
    accepted = field_of(sd, "num_accepted_draft_tokens", where, int)
    if steps <= 0 or accepted < 0:
        raise BackendError(f"{where}: num_spec_steps {steps}, num_accepted_draft_tokens {accepted}: not believed")
    k = sd.get("num_spec_tokens")
    k = k if isinstance(k, int) and not isinstance(k, bool) and k > 0 else None
    stats = GenStats(prompt_tokens=prompt, completion_tokens=completion, verify_steps=steps,
                     accepted_tokens=float(accepted), e2e_s=e2e)
    drafted = sd.get("num_draft_tokens")
    if isinstance(drafted, int) and not isinstance(drafted, bool) and drafted >= 0:
        stats.drafts_per_step = drafted / steps
    checked_stats(stats, max_new_tokens, where, budget=k)
    hist = sd.get("acceptance_histogram")
    if isinstance(hist, list) and hist and all(isinstance(h, int) and not isinstance(h, bool) and h >= 0
                                               for h in hist):
        note = histogram_note(hist, stats)
        if note:
            stats.extra["server_note"] = note
        else:
            stats.commit_lens = [i + 1 for i, n in enumerate(hist) for _ in range(n)]
    stats.extra["spec_counts"] = "per request (metrics.speculative_decoding)"
    return stats


def parse_metrics(text: str, where: str, counters=(), gauges=()) -> dict[str, float]:
    """Prometheus text -> {name: value summed over label sets} for the named counters (their ``_total``
    samples; ``_created`` and other series ignored) and gauges, read with prometheus-client's parser. Goes by
    sample name, so text without ``# TYPE`` lines (grep output: each sample its own untyped family) reads the
    same as vLLM's full exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    totals = {c + "_total": c for c in counters}
    out: dict[str, float] = {}
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                name = totals.get(s.name) or (s.name if s.name in gauges else None)
                if name is not None:
                    if not math.isfinite(s.value):
                        raise BackendError(f"{where}: {s.name} is {s.value}, not a finite number")
                    out[name] = out.get(name, 0.0) + s.value
    except ValueError as e:
        raise BackendError(f"{where}: not Prometheus text ({e})") from None
    return out
