"""The two routes of ``ddprobe serve`` that decode: SGLang's ``/generate`` and OpenAI's ``/v1/completions``,
each plain or streamed (one server-sent event per verify step)."""
import asyncio
import time
import uuid

from fastapi import Request

from . import models as m
from .metrics import vllm_spec_metrics
from .served import ApiError, Served, finish_reason, result, served, started, stream
from .worker import Job, held_tail


async def generate(req: m.GenerateRequest, request: Request):
    s, sp, t0, rid = served(request), req.sampling_params, time.perf_counter(), req.rid or uuid.uuid4().hex
    ids = req.input_ids if req.input_ids is not None else await asyncio.to_thread(s.backend.tokenize, req.text)
    job = s.submit(ids, sp.max_new_tokens, sp.temperature, sp.stop, sp.stop_token_ids)
    if req.stream:
        return stream(job, await started(request, job), *generate_chunks(s, job, rid, t0))
    st = await result(request, job)
    if st is None:
        raise ApiError(499, "client closed the request")
    text = await asyncio.to_thread(s.text, job, st.tokens)  # decoding, like tokenizing, off the event loop
    return {"text": text, "output_ids": st.tokens, "meta_info": s.meta(job, st, rid, t0)}


def generate_chunks(s: Served, job: Job, rid: str, t0: float):
    """``/generate``'s stream: each event the text so far (less a tail that may become a stop) and the ids."""
    toks: list[int] = []

    def on_tokens(new):
        toks.extend(new)
        text = s.text(job, toks)
        return [{"text": text[:len(text) - held_tail(text, job.stop)], "output_ids": list(toks),
                 "meta_info": {"id": rid, "finish_reason": None, "prompt_tokens": len(job.ids),
                               "completion_tokens": len(toks)}}]

    def on_done(st):
        return [{"text": s.text(job, st.tokens), "output_ids": st.tokens, "meta_info": s.meta(job, st, rid, t0)}]

    return on_tokens, on_done


class Completion:
    """The bodies of one ``/v1/completions`` answer (OpenAI's shapes)."""

    def __init__(self, s: Served, job: Job, include_usage: bool, spec_metrics: bool = False):
        self.s, self.job, self.include_usage, self.spec_metrics = s, job, include_usage, spec_metrics
        self.id, self.created = "cmpl-" + uuid.uuid4().hex, int(time.time())
        self.sent = ""  # the text a stream has sent

    def body(self, choice: dict, usage=None) -> dict:
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.s.name,
                "choices": [choice] if choice else [], "usage": usage}

    def usage(self, st) -> dict:
        n = len(self.job.ids)
        return {"prompt_tokens": n, "completion_tokens": st.completion_tokens, "total_tokens": n + st.completion_tokens}

    def whole(self, st) -> dict:
        out = self.body({"index": 0, "text": self.s.text(self.job, st.tokens), "finish_reason": finish_reason(st),
                         "logprobs": None}, self.usage(st))
        if self.spec_metrics:  # as vLLM with --per-request-spec-decode-metrics detailed
            out["metrics"] = {"speculative_decoding": vllm_spec_metrics(st, self.s.max_commit - 1)}
        return out

    def on_tokens(self, toks: list[int], new: list[int]) -> list[dict]:
        toks.extend(new)
        text = self.s.text(self.job, toks)
        text = text[:len(text) - held_tail(text, self.job.stop)]  # what a later step may turn into a stop
        if len(text) <= len(self.sent):
            return []
        delta, self.sent = text[len(self.sent):], text
        return [self.body({"index": 0, "text": delta, "finish_reason": None, "logprobs": None})]

    def on_done(self, st) -> list[dict]:  # the held-back rest (the text before any stop), with the finish reason
        rest = self.s.text(self.job, st.tokens)[len(self.sent):]
        out = [self.body({"index": 0, "text": rest, "finish_reason": finish_reason(st), "logprobs": None})]
        if self.include_usage:
            out.append(self.body({}, self.usage(st)))
        return out


async def completions(req: m.CompletionRequest, request: Request):
    s = served(request)
    if req.model is not None and req.model != s.name:
        raise ApiError(404, f"model {req.model!r} does not exist; this server has {s.name!r}", "model")
    ids = await asyncio.to_thread(s.backend.tokenize, req.prompt) if isinstance(req.prompt, str) else req.prompt
    job = s.submit(ids, req.max_tokens, req.temperature, req.stop, req.stop_token_ids, seed=req.seed)
    c = Completion(s, job, bool(req.stream_options and req.stream_options.include_usage),
                   getattr(request.app.state, "per_request_spec_metrics", False))
    if req.stream:
        toks: list[int] = []
        return stream(job, await started(request, job), lambda new: c.on_tokens(toks, new), c.on_done)
    st = await result(request, job)
    if st is None:
        raise ApiError(499, "client closed the request")
    return await asyncio.to_thread(c.whole, st)
