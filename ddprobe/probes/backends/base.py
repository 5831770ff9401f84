"""What every backend the probes talk to shares: the interface, ``GenStats``, the errors. The backends themselves
live in their own modules and are chosen by name in ``ddprobe.probes.backends.make_backend``:

- ``EngineBackend``: the reference DDTree engine in-process (``ddprobe.probes.backends.engine``).
- ``SGLangBackend``: SGLang's native ``/generate`` (``input_ids`` in, ``meta_info`` out).
- ``VLLMBackend``: OpenAI-style ``/v1/completions`` and ``/tokenize``, counters from ``/metrics``.

Commit length, one definition (``GenStats.commit_len``): the per-step mean of the tokens each verify
step committed to the output (accepted depth + 1), a step cut by the token limit counted as what it
actually committed; the first token, from the prefill, belongs to no step. So it equals
(completion_tokens - 1) / verify_steps. SGLang's own ``completion_tokens / spec_verify_ct`` (its
``spec_accept_length``, which counts the prefill token) is kept beside it as ``sglang_accept_length``.
- SGLang: commit_len = (completion_tokens - 1) / spec_verify_ct; the spread from
  ``spec_accept_histogram`` (index = draft tokens accepted in a step).
- vLLM: 1 + accepted / drafts from the change in ``vllm:spec_decode_num_accepted_tokens_total`` and
  ``vllm:spec_decode_num_drafts_total`` across the request (a cut last step as vLLM counts it). Those
  counters are server-wide: the backend also reads ``vllm:request_success_total`` and the prompt and
  generation token counters, and when they moved by more than its own request (another client's
  traffic) it retries, then fails the cell with one line rather than report a mixed number.

Every network failure becomes a ``BackendError`` naming the URL and what failed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from ...units import DDProbeError


class BackendError(DDProbeError):
    pass


class StopGeneration(Exception):
    """Raised from an ``on_tokens`` callback to end a decode early: ``reason`` "stop" (a stop string or
    token) or "abort" (the client went away); ``keep``: how many generated tokens to keep (None: all)."""

    def __init__(self, reason: str = "abort", keep: int | None = None):
        super().__init__(reason)
        self.reason, self.keep = reason, keep


@dataclass
class GenStats:
    """What one request's decode measured. Per-step lists are filled where the backend knows them."""

    prompt_tokens: int
    completion_tokens: int
    verify_steps: int
    commit_lens: list[int] = field(default_factory=list)  # per verify step, bonus included, cut at the limit
    commit_mean: float | None = None  # the mean where a backend knows it exactly without per-step values
    accepted_tokens: float | None = None  # accepted draft tokens over all steps, where only a total is known
    drafts_per_step: float | None = None  # draft nodes proposed per step (tree size)
    prefill_s: float | None = None  # with a reused prefix: the tokens prefilled only
    reused_tokens: int | None = None  # prompt tokens from a cache: the previous request's (engine), SGLang's cached_tokens
    decode_s: float | None = None
    e2e_s: float | None = None
    tokens: list[int] = field(default_factory=list)
    step_times_s: list[float] = field(default_factory=list)
    # every verify step that ran, as (draft tokens accepted, draft nodes) before a token limit or a stop cut the
    # output: what vLLM's spec-decode counters count (the engine's; ``ddprobe serve``'s vLLM imitation reads it)
    ran_steps: list[tuple[int, int]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def commit_len(self) -> float:
        """Mean tokens committed per verify step, bonus included, a cut step counted as committed
        (= (completion_tokens - 1) / verify_steps)."""
        if self.commit_mean is not None:
            return self.commit_mean
        if self.commit_lens:
            return sum(self.commit_lens) / len(self.commit_lens)
        if self.accepted_tokens is not None and self.verify_steps:
            return 1.0 + self.accepted_tokens / self.verify_steps
        return (self.completion_tokens - 1) / self.verify_steps if self.verify_steps else float("nan")

    @property
    def sglang_accept_length(self) -> float:
        """SGLang's completion_tokens / spec_verify_ct: counts the prefill's token, so it exceeds commit_len."""
        return self.completion_tokens / self.verify_steps if self.verify_steps else float("nan")


def checked_stats(st: GenStats, max_new_tokens: int, where: str, budget: int | None = None) -> GenStats:
    """``st`` when its numbers can be true of one greedy request of ``max_new_tokens`` (a ``budget``-node tree
    when known), else one ``BackendError`` saying which number is impossible: completion tokens at most
    max_new_tokens + budget (a cut last step may overshoot by its drafts), at least one verify step and no more
    than the tokens after the prefill's, commit length within [1, budget + 1] (without a budget: at most
    max_new_tokens), every number finite."""
    import math

    slack = budget or 0
    if not 1 <= st.completion_tokens <= max_new_tokens + slack:
        raise BackendError(f"{where}: completion_tokens {st.completion_tokens} for max_new_tokens {max_new_tokens}"
                           + (f" and a {budget}-node tree" if budget else "") + ": impossible, not believed")
    if not 1 <= st.verify_steps <= max(st.completion_tokens - 1, 1):
        raise BackendError(f"{where}: {st.verify_steps} verify steps for {st.completion_tokens} tokens: impossible "
                           "(each step commits at least one token), not believed")
    top = budget + 1 if budget else max_new_tokens
    c = st.commit_len
    if not (math.isfinite(c) and 1.0 - 1e-9 <= c <= top + 1e-9):
        raise BackendError(f"{where}: commit length {c:g} outside [1, {top}]"
                           + (f" (budget {budget} + 1)" if budget else f" (max_new_tokens {max_new_tokens})")
                           + ": the server's counters are not believed")
    for name in ("e2e_s", "drafts_per_step", "accepted_tokens"):
        v = getattr(st, name)
        if v is not None and not (math.isfinite(v) and v >= 0):
            raise BackendError(f"{where}: {name} {v}: not a finite non-negative number, not believed")
    return st


def add_note(stats: GenStats, note: str) -> None:
    """Add ``note`` to the row's ``server_note``: every check's note is kept, "; "-joined in the order they were
    found (a later check never hides an earlier one)."""
    if not note:
        return
    before = stats.extra.get("server_note")
    stats.extra["server_note"] = f"{before}; {note}" if before else note


def histogram_note(hist: list[int], st: GenStats) -> str | None:
    """Why a per-request histogram (index = draft tokens accepted in a step) cannot be the spread of ``st``
    (None: it can): its steps must number the verify steps, and the tokens it says were committed must cover
    those counted (completion_tokens - 1), a cut last step over by at most its drafts."""
    steps, committed = sum(hist), sum((i + 1) * n for i, n in enumerate(hist))
    if steps != st.verify_steps:
        return f"histogram counts {steps} steps, the server {st.verify_steps} verify steps: spread ignored"
    need = st.completion_tokens - 1
    if not need <= committed <= need + len(hist) - 1:
        return (f"histogram says {committed} tokens committed (mean {committed / steps:.2f}), the counts "
                f"{need} (commit length {st.commit_len:.2f}): spread ignored")
    return None


class Backend(Protocol):
    name: str

    def tokenize(self, text: str) -> list[int]: ...

    def max_context(self) -> int | None: ...

    def generate(self, input_ids: list[int], max_new_tokens: int) -> GenStats: ...  # temperature 0

    def describe(self) -> dict[str, Any]: ...
