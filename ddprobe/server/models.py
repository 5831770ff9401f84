"""Request models of ``ddprobe serve``: strict, so nothing a client asks for is silently ignored.

Policy (documented in docs/serve.md):
- Every field is strict (pydantic strict mode): nothing is coerced. An integer field takes a JSON integer
  only (``true``, ``"8"`` and ``8.0`` are a 400), a number field a JSON number (``"0.5"`` and ``true`` are a
  400; an integer is a number), a boolean ``true`` or ``false`` (``"yes"`` and ``1`` are a 400).
- Numbers must be finite (``NaN``/``Infinity`` literals are a 400) and each value in its range:
  ``seed`` in [0, 2**63 - 1]; a positive ``temperature`` at least ``MIN_TEMPERATURE`` (1e-5: below it the
  logits / temperature overflow; use 0 for greedy). Token ids (``input_ids``, a token-id ``prompt``,
  ``stop_token_ids``) within the vocabulary are checked by the app, which knows it.
- A body that is not JSON is a 400 saying so.
- Unknown fields are a 400 naming them.
- Fields the engine cannot honour are accepted only at their neutral value (``n: 1``,
  ``best_of: 1``, ``echo: false``, ``logprobs: null``, ``top_p: 1``, penalties 0, ...); any other
  value is a 400 saying it is not supported.
- One error body everywhere, OpenAI's: ``{"error": {"message", "type", "param", "code"}}`` (SGLang's
  native errors are ``{"error": {"message": ...}}``, a subset).
Needs pydantic (comes with the ``server`` extra's FastAPI).
"""
from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_STOPS = 4  # OpenAI's limit on stop sequences
MIN_TEMPERATURE = 1e-5  # smallest positive temperature: below it logits / temperature overflow (0 = greedy)
MAX_SEED = 2 ** 63 - 1  # the engine's generator takes a signed 64-bit seed


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


def _neutral(values: dict[str, Any], neutral: dict[str, tuple]) -> None:
    """Fields the engine cannot honour: only their neutral values pass."""
    for key, ok in neutral.items():
        v = values.get(key)
        if key in values and v not in ok:
            raise ValueError(f"{key}={v!r} is not supported by ddprobe serve (only {ok[0]!r})")


def _stops(v: Union[str, list[str], None]) -> list[str]:
    stops = [v] if isinstance(v, str) else list(v or [])
    if len(stops) > MAX_STOPS:
        raise ValueError(f"at most {MAX_STOPS} stop sequences")
    if any(s == "" for s in stops):
        raise ValueError("stop sequences must not be empty")
    return stops


def _temperature(v: float) -> float:
    if 0 < v < MIN_TEMPERATURE:
        raise ValueError(f"a positive temperature must be at least {MIN_TEMPERATURE:g} (0 decodes greedily)")
    return v


class _Sampled(Strict):
    """What every request that samples shares: its stop strings and temperature checked one way."""

    @field_validator("stop", check_fields=False)
    @classmethod
    def _stop(cls, v):
        return _stops(v)

    @field_validator("temperature", check_fields=False)
    @classmethod
    def _temperature(cls, v):
        return _temperature(v)


class SamplingParams(_Sampled):
    max_new_tokens: int = Field(128, ge=1)
    temperature: float = Field(0.0, ge=0.0, le=100.0)
    ignore_eos: bool = True  # the engine has no end-of-sequence token: true or false decode alike
    stop: Union[str, list[str], None] = None
    stop_token_ids: Optional[list[int]] = None
    n: int = 1
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    skip_special_tokens: bool = True

    @model_validator(mode="before")
    @classmethod
    def _unsupported(cls, values):
        if isinstance(values, dict):
            _neutral(values, {"n": (1,), "top_p": (1, 1.0), "top_k": (-1, 0), "min_p": (0, 0.0),
                              "frequency_penalty": (0, 0.0), "presence_penalty": (0, 0.0),
                              "repetition_penalty": (1, 1.0)})
        return values


class GenerateRequest(Strict):
    """SGLang's native ``/generate`` (one prompt per request)."""

    text: Optional[str] = None
    input_ids: Optional[list[int]] = None
    sampling_params: SamplingParams = SamplingParams()
    stream: bool = False
    rid: Optional[str] = None
    return_logprob: bool = False

    @model_validator(mode="after")
    def _one_prompt(self):
        if self.return_logprob:
            raise ValueError("return_logprob=True is not supported by ddprobe serve")
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("give exactly one of input_ids or text")
        return self


class StreamOptions(Strict):
    include_usage: bool = False


class CompletionRequest(_Sampled):
    """OpenAI's ``/v1/completions`` (vLLM's ``ignore_eos`` extension included)."""

    model: Optional[str] = None
    prompt: Union[str, list[int]]
    max_tokens: int = Field(16, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    stop: Union[str, list[str], None] = None
    stop_token_ids: Optional[list[int]] = None  # vLLM's extension, as /generate's sampling_params take it
    seed: Optional[int] = Field(None, ge=0, le=MAX_SEED)
    user: Optional[str] = None  # metadata: accepted, unused
    ignore_eos: bool = True
    n: int = 1
    best_of: Optional[int] = None
    echo: bool = False
    logprobs: Optional[int] = None
    suffix: Optional[str] = None
    top_p: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: Optional[dict[str, float]] = None

    @model_validator(mode="before")
    @classmethod
    def _unsupported(cls, values):
        if isinstance(values, dict):
            _neutral(values, {"n": (1,), "best_of": (None, 1), "echo": (False,), "logprobs": (None,),
                              "suffix": (None,), "top_p": (1, 1.0), "frequency_penalty": (0, 0.0),
                              "presence_penalty": (0, 0.0), "logit_bias": (None, {})})
            if values.get("stream_options") is not None and not values.get("stream"):
                raise ValueError("stream_options is only allowed when stream is true")  # as OpenAI answers
            if isinstance(values.get("prompt"), list) and any(isinstance(p, (str, list)) for p in values["prompt"]):
                raise ValueError("one prompt per request: a list of prompts is not supported by ddprobe serve")
        return values


class TokenizeRequest(Strict):
    prompt: str
    model: Optional[str] = None
    add_special_tokens: bool = False


def error_body(message: str, code: int, param: Optional[str] = None,
               kind: Literal["invalid_request_error", "not_found_error", "server_error"] = "invalid_request_error"):
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def validation_message(errors: list[dict]) -> tuple[str, Optional[str]]:
    """One line from pydantic's errors, never echoing the input (it may hold NaN, which JSON cannot carry)."""
    parts, param = [], None
    for e in errors[:3]:
        if e.get("type") == "json_invalid":  # FastAPI's loc is ("body", character offset)
            at = e.get("loc", ("body", None))[-1]
            why = str((e.get("ctx") or {}).get("error", "")) or "JSON decode error"
            return f"the request body is not valid JSON: {why}" + (f" at character {at}" if isinstance(at, int)
                                                                      else ""), None
        loc = [str(x) for x in e.get("loc", ()) if x not in ("body",)]
        where = ".".join(loc)
        param = param or (where or None)
        msg = str(e.get("msg", "invalid")).removeprefix("Value error, ")
        if e.get("type") == "missing" and not where:
            return "the request has no body: send a JSON object", None
        if e.get("type") == "extra_forbidden":
            msg = "unknown field (not part of this endpoint's request)"
        parts.append(f"{where}: {msg}" if where else msg)
    more = f" (+{len(errors) - 3} more)" if len(errors) > 3 else ""
    return "; ".join(parts) + more, param
