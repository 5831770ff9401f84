"""Backends the probes talk to, behind one small interface.

- ``EngineBackend``: the reference DDTree engine in-process (``ddprobe.probes.engine_backend``).
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
from typing import Any, Callable, Protocol

from ..units import DDProbeError


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


class Backend(Protocol):
    name: str

    def tokenize(self, text: str) -> list[int]: ...

    def max_context(self) -> int | None: ...

    def generate(self, input_ids: list[int], max_new_tokens: int) -> GenStats: ...  # temperature 0

    def describe(self) -> dict[str, Any]: ...


def make_backend(kind: str, url: str | None = None, timeout_s: float = 600.0,
                 engine_factory: Callable[[], Backend] | None = None) -> Backend:
    """Backend by name: ``engine`` (needs ``engine_factory``), ``sglang`` or ``vllm`` (need ``url``)."""
    if kind == "engine":
        if url:
            raise BackendError("--url is for --backend sglang or vllm: the engine backend runs in this process")
        if engine_factory is None:
            raise BackendError("the engine backend needs an engine")
        return engine_factory()
    if kind in ("sglang", "vllm"):
        if not url:
            raise BackendError(f"--backend {kind} needs --url http://host:port")
        from .sglang import SGLangBackend
        from .vllm import VLLMBackend

        return SGLangBackend(url, timeout_s) if kind == "sglang" else VLLMBackend(url, timeout_s)
    raise BackendError(f"unknown backend {kind!r}; known: engine, sglang, vllm")


def __getattr__(name: str):  # the server backends live in their own modules; old imports keep working
    if name == "SGLangBackend":
        from .sglang import SGLangBackend
        return SGLangBackend
    if name == "VLLMBackend":
        from .vllm import VLLMBackend
        return VLLMBackend
    raise AttributeError(name)
