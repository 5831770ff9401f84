"""Backends the probes talk to, behind one small interface.

- ``EngineBackend``: the reference DDTree engine in-process (``ddprobe.probes.engine_backend``).
- ``SGLangBackend``: SGLang's native ``/generate`` (``input_ids`` in, ``meta_info`` out);
  commit length = completion_tokens / spec_verify_ct.
- ``VLLMBackend``: OpenAI-style ``/v1/completions`` and ``/tokenize``; commit length from the
  change in the ``/metrics`` counters ``vllm:spec_decode_num_accepted_tokens_total`` and
  ``vllm:spec_decode_num_drafts_total`` across the request: 1 + accepted / drafts.

Every network failure becomes a ``BackendError`` naming the URL and what failed.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from ..units import DDProbeError


class BackendError(DDProbeError):
    pass


@dataclass
class GenStats:
    """What one request's decode measured. Per-step lists are filled where the backend knows them."""

    prompt_tokens: int
    completion_tokens: int
    verify_steps: int
    commit_lens: list[int] = field(default_factory=list)  # per verify step, bonus included
    accepted_tokens: float | None = None  # accepted draft tokens over all steps, where only a total is known
    drafts_per_step: float | None = None  # draft nodes proposed per step (tree size)
    prefill_s: float | None = None
    decode_s: float | None = None
    e2e_s: float | None = None
    tokens: list[int] = field(default_factory=list)
    step_times_s: list[float] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def commit_len(self) -> float:
        """Mean tokens committed per verify step, bonus included."""
        if self.commit_lens:
            return sum(self.commit_lens) / len(self.commit_lens)
        if self.accepted_tokens is not None and self.verify_steps:
            return 1.0 + self.accepted_tokens / self.verify_steps
        return self.completion_tokens / self.verify_steps if self.verify_steps else float("nan")


class Backend(Protocol):
    name: str

    def tokenize(self, text: str) -> list[int]: ...

    def max_context(self) -> int | None: ...

    def generate(self, input_ids: list[int], max_new_tokens: int) -> GenStats: ...

    def describe(self) -> dict[str, Any]: ...


# ---- HTTP ---------------------------------------------------------------------

class _Http:
    def __init__(self, url: str, timeout_s: float = 600.0):
        if not url.startswith(("http://", "https://")):
            raise BackendError(f"bad URL {url!r}: expected http://host:port")
        if timeout_s <= 0:
            raise BackendError(f"timeout must be greater than zero, got {timeout_s}")
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        import requests  # lazy: only HTTP backends need it

        self._requests = requests
        self._session = requests.Session()

    def _call(self, method: str, path: str, json_body: Any = None, expect_json: bool = True) -> Any:
        url = self.url + path
        rq = self._requests
        try:
            r = self._session.request(method, url, json=json_body, timeout=self.timeout_s)
        except rq.exceptions.Timeout:
            raise BackendError(f"{method} {url}: no answer within {self.timeout_s:g} s (timeout)") from None
        except rq.exceptions.ConnectionError as e:
            reason = "connection refused" if "refused" in str(e).lower() else "cannot connect"
            raise BackendError(f"{method} {url}: {reason} (is the server running?)") from None
        except rq.exceptions.RequestException as e:
            raise BackendError(f"{method} {url}: {type(e).__name__}") from None
        if r.status_code >= 400:
            detail = r.text.strip().replace("\n", " ")[:200]
            raise BackendError(f"{method} {url}: HTTP {r.status_code} {detail}")
        if not expect_json:
            return r.text
        try:
            return r.json()
        except ValueError:
            raise BackendError(f"{method} {url}: answer is not valid JSON: {r.text[:80]!r}") from None

    def _get_optional(self, path: str) -> Any:
        """GET that returns None on 404 or a non-JSON answer (optional endpoints)."""
        try:
            return self._call("GET", path)
        except BackendError as e:
            if "HTTP 404" in str(e) or "not valid JSON" in str(e):
                return None
            raise


def _field(d: Any, key: str, where: str, kind: type | tuple = (int, float)) -> Any:
    if not isinstance(d, dict) or key not in d:
        raise BackendError(f"{where}: answer has no {key!r}")
    v = d[key]
    if not isinstance(v, kind) or isinstance(v, bool):
        raise BackendError(f"{where}: {key!r} has the wrong type ({type(v).__name__})")
    return v


class SGLangBackend(_Http):
    name = "sglang"

    def tokenize(self, text: str) -> list[int]:
        d = self._call("POST", "/tokenize", {"prompt": text, "add_special_tokens": False})
        return list(_field(d, "tokens", f"{self.url}/tokenize", list))

    def max_context(self) -> int | None:
        for path, key in (("/get_model_info", "max_context_length"), ("/get_model_info", "context_length"),
                          ("/v1/models", None)):
            d = self._get_optional(path)
            if key and isinstance(d, dict) and isinstance(d.get(key), int):
                return d[key]
            if key is None and isinstance(d, dict) and d.get("data"):
                v = d["data"][0].get("max_model_len")
                if isinstance(v, int):
                    return v
        return None

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "url": self.url, "model_info": self._get_optional("/get_model_info")}

    def generate(self, input_ids: list[int], max_new_tokens: int) -> GenStats:
        where = f"{self.url}/generate"
        body = {"input_ids": input_ids, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0,
                                                              "ignore_eos": True}}
        t0 = time.perf_counter()
        d = self._call("POST", "/generate", body)
        e2e = time.perf_counter() - t0
        meta = d.get("meta_info") if isinstance(d, dict) else None
        if not isinstance(meta, dict):
            raise BackendError(f"{where}: answer has no meta_info")
        if "spec_verify_ct" not in meta:
            raise BackendError(f"{where}: the server reports no speculative-decoding counters (meta_info has no "
                               "spec_verify_ct): is speculative decoding enabled?")
        completion = int(_field(meta, "completion_tokens", where))
        verify = int(_field(meta, "spec_verify_ct", where))
        if verify <= 0:
            raise BackendError(f"{where}: spec_verify_ct is {verify}: no verify step ran")
        stats = GenStats(prompt_tokens=int(meta.get("prompt_tokens", len(input_ids))), completion_tokens=completion,
                         verify_steps=verify, e2e_s=float(meta.get("e2e_latency", e2e)))
        hist = meta.get("spec_accept_histogram")
        if isinstance(hist, list) and hist and all(isinstance(h, int) for h in hist):
            # histogram[i] = verify steps that committed i + 1 tokens (accepted depth i, bonus included)
            stats.commit_lens = [i + 1 for i, n in enumerate(hist) for _ in range(n)]
        for key in ("spec_accept_length", "spec_accept_rate", "spec_draft_tokens"):
            if key in meta:
                stats.extra[key] = meta[key]
        return stats


class VLLMBackend(_Http):
    name = "vllm"
    ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
    DRAFTS = "vllm:spec_decode_num_drafts"
    DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"

    def __init__(self, url: str, timeout_s: float = 600.0, model: str | None = None):
        super().__init__(url, timeout_s)
        self._model = model
        self._models: dict | None = None

    def _model_card(self) -> dict:
        if self._models is None:
            d = self._call("GET", "/v1/models")
            data = d.get("data") if isinstance(d, dict) else None
            if not data or not isinstance(data, list):
                raise BackendError(f"{self.url}/v1/models: lists no model")
            self._models = data[0]
            if self._model is None:
                self._model = str(data[0].get("id"))
        return self._models

    def tokenize(self, text: str) -> list[int]:
        self._model_card()
        d = self._call("POST", "/tokenize", {"model": self._model, "prompt": text, "add_special_tokens": False})
        return list(_field(d, "tokens", f"{self.url}/tokenize", list))

    def max_context(self) -> int | None:
        v = self._model_card().get("max_model_len")
        return v if isinstance(v, int) else None

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "url": self.url, "model": self._model_card().get("id")}

    def spec_counters(self) -> dict[str, float]:
        """Sum of each spec-decode counter over all label sets, read with prometheus-client's parser."""
        from prometheus_client.parser import text_string_to_metric_families

        text = self._call("GET", "/metrics", expect_json=False)
        totals: dict[str, float] = {}
        try:
            for fam in text_string_to_metric_families(text):
                if fam.name in (self.ACCEPTED, self.DRAFTS, self.DRAFT_TOKENS):
                    totals[fam.name] = sum(s.value for s in fam.samples if s.name == fam.name + "_total")
        except ValueError as e:
            raise BackendError(f"{self.url}/metrics: not Prometheus text ({e})") from None
        missing = [n for n in (self.ACCEPTED, self.DRAFTS) if n not in totals]
        if missing:
            raise BackendError(f"{self.url}/metrics: the server reports no speculative-decoding counters "
                               f"({', '.join(m + '_total' for m in missing)} missing): is speculative decoding on?")
        return totals

    def generate(self, input_ids: list[int], max_new_tokens: int) -> GenStats:
        where = f"{self.url}/v1/completions"
        self._model_card()
        before = self.spec_counters()
        body = {"model": self._model, "prompt": input_ids, "max_tokens": max_new_tokens, "temperature": 0.0,
                "ignore_eos": True}
        t0 = time.perf_counter()
        d = self._call("POST", "/v1/completions", body)
        e2e = time.perf_counter() - t0
        after = self.spec_counters()
        usage = _field(d, "usage", where, dict)
        accepted = after[self.ACCEPTED] - before[self.ACCEPTED]
        drafts = after[self.DRAFTS] - before[self.DRAFTS]
        if drafts <= 0:
            raise BackendError(f"{self.url}/metrics: no draft was counted during the request (another client, "
                               "or speculative decoding off?)")
        stats = GenStats(prompt_tokens=int(_field(usage, "prompt_tokens", where)),
                         completion_tokens=int(_field(usage, "completion_tokens", where)),
                         verify_steps=int(round(drafts)), accepted_tokens=accepted, e2e_s=e2e)
        if self.DRAFT_TOKENS in after:
            stats.drafts_per_step = (after[self.DRAFT_TOKENS] - before[self.DRAFT_TOKENS]) / drafts
        return stats


def make_backend(kind: str, url: str | None = None, timeout_s: float = 600.0,
                 engine_factory: Callable[[], Backend] | None = None) -> Backend:
    """Backend by name: ``engine`` (needs ``engine_factory``), ``sglang`` or ``vllm`` (need ``url``)."""
    if kind == "engine":
        if engine_factory is None:
            raise BackendError("the engine backend needs an engine")
        return engine_factory()
    if kind in ("sglang", "vllm"):
        if not url:
            raise BackendError(f"--backend {kind} needs --url http://host:port")
        return SGLangBackend(url, timeout_s) if kind == "sglang" else VLLMBackend(url, timeout_s)
    raise BackendError(f"unknown backend {kind!r}; known: engine, sglang, vllm")
