"""SGLang's native ``/generate``: per-request ``meta_info`` (``spec_verify_ct``, ``completion_tokens``, and
under today's names, sglang PR 24081, each with the older ones it still sends as aliases: ``spec_num_correct_drafts``
(``spec_accepted_drafts``; ``spec_accept_token_num`` before PR 23530), ``spec_num_proposed_drafts``
(``spec_proposed_drafts``), ``spec_correct_drafts_histogram`` (``spec_accept_histogram``), index = draft tokens
accepted in a step). commit_len = (completion_tokens - 1) / spec_verify_ct; SGLang's own
``spec_accept_length`` (= completion_tokens / spec_verify_ct) is kept as ``sglang_accept_length``, its correct-draft
count as ``reported_spec_num_correct_drafts`` (checked against the histogram). The older ``spec_draft_token_num``
counted each step's root slot too (PR 23530): it is not read as drafts. ``/generate`` returns these fields with no
flag; SGLang's OpenAI routes return the same ones under ``sglext.spec_tokens_details`` when the request sets
``return_spec_tokens_details`` (PR 33518). ``cached_tokens`` (prompt tokens from its prefix cache) is
``reused_tokens``; ``output_ids``, when the answer has them, are the generated tokens.
"""
from __future__ import annotations

import time
from typing import Any

from .base import BackendError, GenStats, add_note, checked_stats, histogram_note
from .http import HttpClient, context_of, field_of, number_of


# today's name first, then the older ones SGLang sent (and still sends as aliases)
CORRECT = ("spec_num_correct_drafts", "spec_accepted_drafts", "spec_accept_token_num")
PROPOSED = ("spec_num_proposed_drafts", "spec_proposed_drafts")
DRAFTS_MAX = 1024  # draft nodes of one verify step: the largest tree budget (--budget's 1..1024)
HISTOGRAM = ("spec_correct_drafts_histogram", "spec_accept_histogram")


def first_of(meta: dict, names: tuple[str, ...]):
    """The value under the first of ``names`` that ``meta`` has (None: none)."""
    return next((meta[n] for n in names if n in meta), None)


def _count(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _said_prompt_and_time(stats: GenStats, meta: dict, limit_s: float, where: str) -> None:
    """The server's ``prompt_tokens`` and ``e2e_latency`` where they can be true: the prompt as many tokens as sent
    (a chat template may add a few: up to twice and 64 more), the latency within the time this client waits for an
    answer (``limit_s``, its --timeout); else the tokens sent and the time measured here stand, and a
    ``server_note`` says what was not believed."""
    sent, said = stats.prompt_tokens, meta.get("prompt_tokens")
    if isinstance(said, int) and not isinstance(said, bool) and 0 < said <= 2 * sent + 64:
        stats.prompt_tokens = said
    elif said is not None:
        add_note(stats, f"{where}: prompt_tokens {str(said)[:24]} for {sent:,} tokens sent: not believed (the tokens "
                        "sent are counted)")
    lat = number_of(meta, "e2e_latency")
    if lat is not None and 0 <= lat <= limit_s:
        stats.e2e_s = lat
    elif "e2e_latency" in meta:
        add_note(stats, f"{where}: e2e_latency {str(meta['e2e_latency'])[:24]} s, beyond the {limit_s:g} s this "
                        "client waits for an answer: not believed (the time measured here is kept)")


class SGLangBackend(HttpClient):
    name = "sglang"

    def tokenize(self, text: str) -> list[int]:
        d = self.call("POST", "/tokenize", {"prompt": text, "add_special_tokens": False})
        return list(field_of(d, "tokens", f"{self.url}/tokenize", list))

    def max_context(self) -> int | None:
        for path, key in (("/get_model_info", "max_context_length"), ("/get_model_info", "context_length"),
                          ("/v1/models", None)):
            d = self.get_optional(path)
            if key and isinstance(d, dict) and d.get(key) is not None:
                return context_of(d[key], f"{self.url}{path}: {key}")
            data = d.get("data") if key is None and isinstance(d, dict) else None
            if data and not (isinstance(data, list) and isinstance(data[0], dict)):
                raise BackendError(f"{self.url}/v1/models: 'data' is {str(data)[:40]!r}, not a list of models")
            if data and data[0].get("max_model_len"):
                return context_of(data[0]["max_model_len"], f"{self.url}/v1/models: max_model_len")
        return None

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "url": self.url, "model_info": self.get_optional("/get_model_info")}

    def generate(self, input_ids: list[int], max_new_tokens: int) -> GenStats:
        where = f"{self.url}/generate"
        body = {"input_ids": input_ids, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0,
                                                              "ignore_eos": True}}
        t0 = time.perf_counter()
        d = self.call("POST", "/generate", body)
        e2e = time.perf_counter() - t0
        meta = d.get("meta_info") if isinstance(d, dict) else None
        if not isinstance(meta, dict):
            raise BackendError(f"{where}: answer has no meta_info")
        if "spec_verify_ct" not in meta:
            raise BackendError(f"{where}: the server reports no speculative-decoding counters (meta_info has no "
                               "spec_verify_ct): is speculative decoding enabled?")
        completion = field_of(meta, "completion_tokens", where, int)
        verify = field_of(meta, "spec_verify_ct", where, int)
        if verify <= 0:
            raise BackendError(f"{where}: spec_verify_ct is {verify}: no verify step ran")
        stats = GenStats(prompt_tokens=len(input_ids), completion_tokens=completion, verify_steps=verify, e2e_s=e2e,
                         commit_mean=(completion - 1) / verify if completion >= 1 else None)
        _said_prompt_and_time(stats, meta, self.timeout_s, where)
        checked_stats(stats, max_new_tokens, where)  # impossible counts: the cell fails in one line
        cached = meta.get("cached_tokens")  # prompt tokens served from SGLang's prefix (radix) cache
        if isinstance(cached, int) and not isinstance(cached, bool) and 0 <= cached <= stats.prompt_tokens:
            stats.reused_tokens = cached
        out_ids = d.get("output_ids")  # the generated ids (output_repeats); absent on some versions
        if isinstance(out_ids, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in out_ids):
            stats.tokens = list(out_ids)
        hist = first_of(meta, HISTOGRAM)
        if isinstance(hist, list) and hist and all(_count(h) is not None for h in hist):
            note = histogram_note(hist, stats)
            if note:  # the mean stands (from the counts); the spread is not shown
                add_note(stats, note)
            else:  # SGLang: histogram[i] = verify steps that accepted i draft tokens (committed i + 1)
                stats.commit_lens = [i + 1 for i, n in enumerate(hist) for _ in range(n)]
        elif hist is not None:  # a histogram that is not counts: the mean stands, the spread is not shown
            add_note(stats, f"accepted-drafts histogram {str(hist)[:40]}: not a list of counts, ignored")
        proposed = _count(first_of(meta, PROPOSED))
        if proposed is not None and proposed > DRAFTS_MAX * verify:  # more nodes a step than any tree has
            add_note(stats, f"{proposed} drafts proposed over {verify} verify steps: not believed")
            proposed = None
        if proposed is not None:
            stats.drafts_per_step = proposed / verify
        correct = _count(first_of(meta, CORRECT))
        if correct is not None:
            stats.extra["reported_spec_num_correct_drafts"] = correct
            said = sum(i * n for i, n in enumerate(hist)) if stats.commit_lens else None
            if (said is not None and said != correct) or (proposed is not None and correct > proposed):
                add_note(stats, f"{correct} correct drafts do not fit "
                         + (f"the histogram's {said}" if said is not None and said != correct
                            else f"{proposed} proposed") + ": not believed")
                stats.extra.pop("reported_spec_num_correct_drafts")
        for key in ("spec_accept_length", "spec_accept_rate"):
            if number_of(meta, key) is not None:
                stats.extra["reported_" + key] = meta[key]
        return stats
