"""vLLM's OpenAI ``/v1/completions`` with the spec-decode counters of ``/metrics`` (server-wide: the
backend checks that only its own request moved them; see ``VLLMBackend.other_traffic``), or, when the server
returns them (vLLM PR #48915, ``--per-request-spec-decode-metrics``), the request's own counts under
``metrics.speculative_decoding`` (``num_spec_steps``, ``num_accepted_draft_tokens``, ``num_draft_tokens``,
``acceptance_histogram``: index = draft tokens accepted in a step), which no other client's traffic can mix.

Verify steps, as vLLM counts them, are the steps that proposed a draft: a step where the proposer drafted nothing
(ngram speculation finding no match) commits its one token outside them, and a request with no drafted step has
vLLM's mean acceptance length 1.0 (kept so, with a note). Commit length is vLLM's ``1 + accepted / drafts``.

Per draft position (``accepted_per_pos``): the steps whose draft token at position p was accepted, from the change
in ``vllm:spec_decode_num_accepted_tokens_per_pos{position=p}`` or from the request's ``per_step_accepted`` (a step
accepting a tokens counts at positions 0..a-1); ``cond_accept_per_pos``: conditional acceptance per draft position,
over the drafts that reached p (a token drafted there, every earlier one accepted) where the answer has vLLM's
``per_step_drafted``; from the counters alone (no drafted count per position), accepted at p over accepted at p - 1
(at 0: over the drafted steps), a step that drafted fewer tokens than positions counting as not accepted at the
missing ones, as vLLM's counters count it. ``cond_accept_basis`` says which.

A step cut by ``max_tokens`` counts whole, as vLLM counts it (``--max-new-tokens 2`` with four drafts: commit
length 5); the row carries the budget k that bounds it. Each request asks for the output's token ids
(``return_token_ids``: the loop check, the repeated-token check, recall's copied words through ``/detokenize``)
and reads the prompt tokens the server's prefix cache served (``usage.prompt_tokens_details.cached_tokens``, a
server started with ``--enable-prompt-tokens-details``) as the cell's ``reused_tokens``.

Every count is checked before it is believed (``backends.checked_stats``): counters that go backwards (a
restart during the request) or jump past what one request can move, and per-request figures that contradict each
other, fail the cell in one line. A restart between cells (counters lower than after the previous cell, or a new
``process_start_time_seconds``) is said in the next cell's ``server_note``; its counts start again and stand."""
from __future__ import annotations

import math
import time
from typing import Any

from ...units import RANGES
from .base import BackendError, GenStats, add_note, checked_stats
from .http import HttpClient, context_of, field_of


NO_SPEC = "no speculative-decoding counters"


class VLLMBackend(HttpClient):
    name = "vllm"
    ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
    DRAFTS = "vllm:spec_decode_num_drafts"
    DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
    SUCCESS = "vllm:request_success"  # label finished_reason; one more per finished request
    GEN_TOKENS = "vllm:generation_tokens"
    PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"  # label position: 0 .. k-1
    STARTED = "process_start_time_seconds"  # prometheus-client's process collector: changes when the server restarts
    GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", STARTED)
    COUNTERS = (ACCEPTED, DRAFTS, DRAFT_TOKENS, SUCCESS, GEN_TOKENS)
    RETRIES = 2  # attempts after the first when another client's traffic is seen

    def __init__(self, url: str, timeout_s: float = 600.0, model: str | None = None):
        super().__init__(url, timeout_s)
        self._model = model
        self._models: dict | None = None
        self._per_request = False  # the server returns metrics.speculative_decoding: /metrics is not read
        self._last: dict[str, float] | None = None  # the counters after the previous cell (a restart shows below)
        self._budget: int | None = None  # draft tokens per step, from describe() (0: unknown)
        self._scrape: dict[str, float] | None = None  # describe()'s read of /metrics, not yet used as a "before"
        self._ids_asked = True  # return_token_ids, until the server refuses the field

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
        return context_of(self._model_card().get("max_model_len"), f"{self.url}/v1/models: max_model_len")

    def describe(self) -> dict[str, Any]:
        """What the results file's config says of the server; ``budget``: the draft tokens per step (k), counted
        from the per-position series vLLM's /metrics keeps for each speculative position (absent: unknown)."""
        out = {"backend": self.name, "url": self.url, "model": self._model_card().get("id")}
        if self._budget is None:
            self._budget = 0
            try:  # read once; the first request's "before" (its traffic check covers the time in between)
                self._scrape = self.spec_counters()
            except BackendError:
                return out
            self._budget = sum(n.startswith(self.PER_POS + "[") for n in self._scrape)
        return {**out, "budget": self._budget} if self._budget else out

    def spec_counters(self) -> dict[str, float]:
        """Sum of each counter (``_total`` samples) and gauge we read, over all label sets."""
        text = self.call("GET", "/metrics", expect_json=False)
        totals = parse_metrics(text, f"{self.url}/metrics", counters=self.COUNTERS,
                               gauges=self.GAUGES, by_label=(self.PER_POS, "position"))
        missing = [n for n in (self.ACCEPTED, self.DRAFTS) if n not in totals]
        if missing:
            raise BackendError(f"{self.url}/metrics: the server reports {NO_SPEC} "
                               f"({', '.join(m + '_total' for m in missing)} missing): is speculative decoding on?")
        return totals

    def other_traffic(self, before: dict, after: dict, completion_tokens: int) -> str | None:
        """Why the counters moved by more than this one request (None when they did not or cannot tell)."""
        why = []
        busy = [g.split(":")[1] for g in self.GAUGES if before.get(g) and g != self.STARTED]
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
                before, self._scrape = self._scrape or self.spec_counters(), None
            except BackendError as e:  # per-request metrics may still come with the answer
                no_counters = e
        body = {"model": self._model, "prompt": input_ids, "max_tokens": max_new_tokens, "temperature": 0.0,
                "ignore_eos": True}
        if self._ids_asked:
            body["return_token_ids"] = True  # the output's ids: the loop check, recall's copied words
        t0 = time.perf_counter()
        try:
            d = self._complete(body)
        except BackendError:
            if no_counters is not None and NO_SPEC in str(no_counters):  # no spec decoding: the first thing to say
                raise no_counters from None
            raise  # /metrics unreachable too (a proxy without it, a dead server): the request's own failure
        e2e = time.perf_counter() - t0
        usage = field_of(d, "usage", where, dict)
        completion = field_of(usage, "completion_tokens", where, int)
        prompt = field_of(usage, "prompt_tokens", where, int)
        if prompt != len(input_ids):  # the cell's context is the prompt sent: another count is another request
            raise BackendError(f"{where}: usage.prompt_tokens {prompt} for a prompt of {len(input_ids)} token ids: "
                               "not believed")
        own = (d.get("metrics") or {}).get("speculative_decoding") if isinstance(d.get("metrics"), dict) else None
        if isinstance(own, dict):
            self._per_request = True
            stats = per_request_stats(own, prompt, completion, e2e, max_new_tokens, where)
            timing(stats, d["metrics"])
            return answer_extras(stats, d, where), ""
        if before is None:
            raise no_counters or BackendError(f"{where}: the answer has no metrics.speculative_decoding any more "
                                              "(the server restarted without --per-request-spec-decode-metrics?)")
        after = self.spec_counters()
        back = [n for n in self.COUNTERS if n in before and n in after and after[n] < before[n]]
        if back or before.get(self.STARTED) != after.get(self.STARTED):
            what = (f"{back[0]}_total went backwards ({before[back[0]]:g} -> {after[back[0]]:g}; the server "
                    "restarted?)" if back else f"{self.STARTED} changed during the request (the server restarted)")
            raise BackendError(f"{self.url}/metrics: {what}: the request's counts are lost")
        traffic = self.other_traffic(before, after, completion)
        if traffic:
            return None, traffic
        stats = self._counter_stats(before, after, prompt, completion, e2e, max_new_tokens)
        if self.SUCCESS not in after and self.GEN_TOKENS not in after:
            stats.extra["traffic_check"] = "unavailable: /metrics has no request_success or generation_tokens"
        return answer_extras(stats, d, where), ""

    def _complete(self, body: dict) -> dict:
        """POST /v1/completions; a server that refuses ``return_token_ids`` by name (HTTP 400/422: a vLLM before
        it, ``ddprobe serve``'s imitation) is asked again without it, and never again: its rows then say that the
        loop check had no ids."""
        try:
            return self.call("POST", "/v1/completions", body)
        except BackendError as e:
            if "return_token_ids" not in body or not any(f"HTTP {c}" in str(e) for c in (400, 422)) \
                    or "return_token_ids" not in str(e):
                raise
        self._ids_asked = False
        return self.call("POST", "/v1/completions", {k: v for k, v in body.items() if k != "return_token_ids"})

    def decode(self, ids: list[int]) -> str:
        """The text of ``ids`` in the server's tokenizer (``/detokenize``): recall's copied-words figure reads it."""
        self._model_card()
        d = self.call("POST", "/detokenize", {"model": self._model, "tokens": list(ids)})
        return str(field_of(d, "prompt", f"{self.url}/detokenize", str))

    def _restarted(self, before: dict) -> str | None:
        """Why the server restarted since the previous cell (None: it did not, or there was none)."""
        last, self._last = self._last, None
        if last is None:
            return None
        if last.get(self.STARTED) != before.get(self.STARTED):
            return f"the server restarted since the previous cell ({self.STARTED} changed): its counters started again"
        low = [n for n in self.COUNTERS if n in last and n in before and before[n] < last[n]]
        return (f"the server restarted since the previous cell ({low[0]}_total fell from {last[low[0]]:g} to "
                f"{before[low[0]]:g}): its counters started again") if low else None

    def _counter_stats(self, before: dict, after: dict, prompt: int, completion: int, e2e: float,
                       max_new_tokens: int) -> GenStats:
        """GenStats from the change in the spec-decode counters across one request (nobody else's traffic)."""
        where = f"{self.url}/metrics"
        restarted = self._restarted(before)
        self._last = after
        delta = {n: after[n] - before.get(n, 0.0) for n in after}
        accepted, drafts = delta[self.ACCEPTED], delta[self.DRAFTS]
        if drafts <= 0:
            if accepted:
                raise BackendError(f"{where}: {accepted:g} accepted tokens counted with no draft: not believed")
            stats = no_draft_stats(prompt, completion, e2e, max_new_tokens, where)
        else:
            stats = GenStats(prompt_tokens=prompt, completion_tokens=completion, verify_steps=int(round(drafts)),
                             accepted_tokens=accepted, e2e_s=e2e)
            at = [delta[n] for n in sorted((n for n in delta if n.startswith(self.PER_POS + "[")),
                                           key=lambda n: int(n[len(self.PER_POS) + 1:-1]))]
            k = len(at) or None  # vLLM keeps one per-position series per speculative token
            if self.DRAFT_TOKENS in delta:
                stats.drafts_per_step = delta[self.DRAFT_TOKENS] / drafts
                # a step may draft fewer (ngram near a match's end): the most is at least the mean
                k = k or max(1, math.ceil(stats.drafts_per_step - 1e-9))
            checked_stats(stats, max_new_tokens, where, budget=k)
            keep_positions(stats, at, drafts, accepted, f"{where} {self.PER_POS}_total")
            if k:
                stats.extra["budget"] = k  # what bounds vLLM's commit length: a cut last step counts whole
        stats.extra["spec_counts"] = "server-wide counters of /metrics, this request alone"
        if restarted:
            add_note(stats, restarted)
        return stats


def timing(stats: GenStats, metrics: dict) -> None:
    """Prefill and decode time from vLLM's per-request timing (``--enable-per-request-metrics``):
    ``time_to_first_token_ms`` (scheduled to first token) and ``generation_time_ms`` (first token to last). The
    decode steps, for the time per step, are the verify steps and the steps that drafted nothing (each committed
    one token: ``completion - 1 - verify_steps - accepted`` of them, none when a cut last step hides them)."""
    ttft, gen = metrics.get("time_to_first_token_ms"), metrics.get("generation_time_ms")
    num = (int, float)
    if not (isinstance(ttft, num) and isinstance(gen, num) and math.isfinite(ttft) and math.isfinite(gen)
            and ttft >= 0 and gen > 0):
        bad = [f"{k} {str(v)[:24]}" for k, v in (("time_to_first_token_ms", ttft), ("generation_time_ms", gen))
               if v is not None and not (isinstance(v, num) and not isinstance(v, bool) and math.isfinite(v)
                                         and v >= 0)]
        if bad:  # absent, or a zero generation time (one token): no timing, nothing to say
            add_note(stats, f"vLLM's {' and '.join(bad)}: not a time, not believed: no timing")
        return
    plain = max(0, stats.completion_tokens - 1 - stats.verify_steps - round(stats.accepted_tokens or 0))
    steps = stats.verify_steps + plain
    lo, hi, said = RANGES["step time"]  # what a typed --step-ms may be, for the time per step the server implies
    if ttft > hi * 1e3 or (steps and not lo <= gen / 1e3 / steps <= hi):
        add_note(stats, (f"vLLM's time_to_first_token_ms {ttft:g} and generation_time_ms {gen:g} over "
                         f"{steps} decode steps are not believed (a step is between {said}): no timing"))
        return
    stats.prefill_s, stats.decode_s = ttft / 1e3, gen / 1e3
    stats.extra["decode_steps"] = steps


def answer_extras(stats: GenStats, d: dict, where: str) -> GenStats:
    """What the answer says beyond the counts: the output's token ids (``return_token_ids``: ``choices[0].token_ids``;
    the loop check and recall's copied words read them) and the prompt tokens the server's prefix cache served
    (``usage.prompt_tokens_details.cached_tokens``, where the server reports it: ``--enable-prompt-tokens-details``)."""
    choices = d.get("choices")
    ids = _ints(choices[0].get("token_ids")) if isinstance(choices, list) and choices and \
        isinstance(choices[0], dict) else None
    if ids is None:
        stats.extra["token_ids"] = "not returned by the server (return_token_ids): no loop check on this row"
    elif len(ids) == stats.completion_tokens:
        stats.tokens = list(ids)
    elif ids is not None:
        add_note(stats, (f"{where}: {len(ids)} token ids for {stats.completion_tokens} completion tokens: "
                         "the output's ids not believed (no loop check)"))
    details = (d.get("usage") or {}).get("prompt_tokens_details") if isinstance(d.get("usage"), dict) else None
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if isinstance(cached, int) and not isinstance(cached, bool) and 0 <= cached <= stats.prompt_tokens:
        stats.reused_tokens = cached  # vLLM's prefix cache: the previous cell's prompt is this one's start
    return stats


def no_draft_stats(prompt: int, completion: int, e2e: float, max_new_tokens: int, where: str) -> GenStats:
    """A request during which the proposer drafted nothing (ngram speculation without a match): every token from a
    plain decode step, no verify step; vLLM's mean acceptance length is 1.0, so is the commit length."""
    if not 1 <= completion <= max_new_tokens:
        raise BackendError(f"{where}: completion_tokens {completion} for max_new_tokens {max_new_tokens}: "
                           "impossible, not believed")
    stats = GenStats(prompt_tokens=prompt, completion_tokens=completion, verify_steps=0, commit_mean=1.0,
                     accepted_tokens=0.0, e2e_s=e2e)
    add_note(stats, ("no step proposed a draft (the proposer found nothing to draft): commit length "
                     "1.0, as vLLM counts it"))
    return stats


def reached_per_pos(accepted: list[int], drafted: list[int] | None, k: int) -> list[int] | None:
    """Per draft position p, the steps whose draft reached p: a token drafted there (``drafted`` > p) with every
    earlier one accepted (``accepted`` >= p), from vLLM's ``per_step_accepted`` and ``per_step_drafted``; None
    when the drafted counts are missing or do not fit (a step accepting more than it drafted)."""
    if drafted is None or len(drafted) != len(accepted) or any(a > d for a, d in zip(accepted, drafted)):
        return None
    return [sum(d > p and a >= p for a, d in zip(accepted, drafted)) for p in range(k)]


def keep_positions(stats: GenStats, at: list[float], steps: float, accepted: float, where: str,
                   reached: list[int] | None = None) -> None:
    """``accepted_per_pos`` (steps accepted at each draft position) and ``cond_accept_per_pos`` (conditional
    acceptance per position) into ``stats.extra`` when ``at`` can be true of the counts: non-increasing, at most
    ``steps``, summing to ``accepted``; else a ``server_note`` says why they are ignored. The conditional acceptance
    at p is at p over the steps whose draft ``reached`` p where the server says how many tokens each step drafted
    (``reached_per_pos``: a step that drafted 2 of 4 is not a failure at 3 and 4); without them, at p over at p - 1
    (at 0 over the steps), counting undrafted positions as rejected, as vLLM's counters do
    (``cond_accept_basis`` says which)."""
    if not at:
        return
    ok = all(0 <= a <= b for a, b in zip(at, [steps] + at[:-1])) and abs(sum(at) - accepted) < 0.5
    if not ok:
        add_note(stats, (f"{where}: per-position counts {[round(a) for a in at]} do not fit "
                         f"{steps:g} drafted steps and {accepted:g} accepted tokens: ignored"))
        return
    stats.extra["accepted_per_pos"] = [int(round(a)) for a in at]
    if reached is not None and len(reached) == len(at) and all(a <= r for a, r in zip(at, reached)):
        stats.extra["reached_per_pos"] = reached
        stats.extra["cond_accept_per_pos"] = [a / r if r else None for a, r in zip(at, reached)]
        stats.extra["cond_accept_basis"] = "drafts that reached the position (per_step_drafted)"
        return
    stats.extra["cond_accept_per_pos"] = [a / b if b else None for a, b in zip(at, [steps] + at[:-1])]
    stats.extra["cond_accept_basis"] = "accepted at the position before (undrafted positions count as rejected)"


def _ints(v) -> list[int] | None:
    ok = isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)
    return v if ok else None


def per_request_stats(sd: dict, prompt: int, completion: int, e2e: float, max_new_tokens: int,
                      where: str) -> GenStats:
    """GenStats from vLLM's per-request ``metrics.speculative_decoding`` (PR #48915): ``num_spec_steps`` verify
    steps (steps that drafted), ``num_accepted_draft_tokens`` (a step cut by the limit or a stop counted whole, as
    vLLM counts), ``num_draft_tokens`` and ``num_spec_tokens`` (k); ``acceptance_histogram`` (index = draft tokens accepted in a
    step) gives the spread and ``per_step_accepted`` the per-position counts when they agree with the totals;
    ``mean_acceptance_length``, vLLM's own figure, is kept beside ddprobe's as ``reported_mean_acceptance_length``."""
    where = f"{where} metrics.speculative_decoding"
    steps = field_of(sd, "num_spec_steps", where, int)
    accepted = field_of(sd, "num_accepted_draft_tokens", where, int)
    if steps < 0 or accepted < 0 or (steps == 0 and accepted):
        raise BackendError(f"{where}: num_spec_steps {steps}, num_accepted_draft_tokens {accepted}: not believed")
    k = sd.get("num_spec_tokens")
    k = k if isinstance(k, int) and not isinstance(k, bool) and k > 0 else None
    if steps == 0:
        stats = no_draft_stats(prompt, completion, e2e, max_new_tokens, where)
    else:
        stats = GenStats(prompt_tokens=prompt, completion_tokens=completion, verify_steps=steps,
                         accepted_tokens=float(accepted), e2e_s=e2e)
        drafted = sd.get("num_draft_tokens")
        if isinstance(drafted, int) and not isinstance(drafted, bool) and drafted >= 0:
            stats.drafts_per_step = drafted / steps
        checked_stats(stats, max_new_tokens, where, budget=k)
        for key in ("acceptance_histogram", "per_step_accepted", "per_step_drafted"):
            if sd.get(key) is not None and _ints(sd[key]) is None:
                add_note(stats, f"{key} {str(sd[key])[:40]}: not a list of counts, ignored")
        hist = _ints(sd.get("acceptance_histogram"))
        if hist and sum(hist) == steps and sum(i * n for i, n in enumerate(hist)) == accepted:
            stats.commit_lens = [i + 1 for i, n in enumerate(hist) for _ in range(n)]
        elif hist:
            add_note(stats, (f"acceptance_histogram {hist} does not fit {steps} steps and {accepted} "
                             "accepted tokens: spread ignored"))
        per_step = _ints(sd.get("per_step_accepted"))
        if per_step is not None and len(per_step) == steps:
            at = [sum(a > p for a in per_step) for p in range(k or max(per_step, default=0))]
            keep_positions(stats, at, steps, accepted, f"{where} per_step_accepted",
                           reached=reached_per_pos(per_step, _ints(sd.get("per_step_drafted")), len(at)))
        if k:
            stats.extra["budget"] = k  # what bounds vLLM's commit length: a cut last step counts whole
    reported = sd.get("mean_acceptance_length")
    if isinstance(reported, (int, float)) and not isinstance(reported, bool) and math.isfinite(reported):
        stats.extra["reported_mean_acceptance_length"] = float(reported)
        if abs(reported - stats.commit_len) > 1e-6:
            add_note(stats, (f"vLLM's mean_acceptance_length {reported:g} differs from 1 + accepted / "
                             f"steps = {stats.commit_len:g} of its own counts"))
    stats.extra["spec_counts"] = "per request (metrics.speculative_decoding)"
    return stats


def parse_metrics(text: str, where: str, counters=(), gauges=(), by_label: tuple[str, str] | None = None
                  ) -> dict[str, float]:
    """Prometheus text -> {name: value summed over label sets} for the named counters (their ``_total``
    samples; ``_created`` and other series ignored) and gauges, read with prometheus-client's parser. Goes by
    sample name, so text without ``# TYPE`` lines (grep output: each sample its own untyped family) reads the
    same as vLLM's full exposition. ``by_label`` (counter, label): that counter per value of that label, as
    ``counter[value]`` keys (summed over its other labels)."""
    from prometheus_client.parser import text_string_to_metric_families

    totals = {c + "_total": c for c in counters}
    split = (by_label[0] + "_total", by_label[1]) if by_label else None
    out: dict[str, float] = {}
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                name = totals.get(s.name) or (s.name if s.name in gauges else None)
                if split and s.name == split[0] and s.labels.get(split[1], "").isdigit():
                    name = f"{by_label[0]}[{s.labels[split[1]]}]"
                if name is not None:
                    if not math.isfinite(s.value):
                        raise BackendError(f"{where}: {s.name} is {s.value}, not a finite number")
                    out[name] = out.get(name, 0.0) + s.value
    except ValueError as e:
        raise BackendError(f"{where}: not Prometheus text ({e})") from None
    return out
