"""``ddprobe serve``: the reference engine over HTTP, speaking the protocols the probes read.

- SGLang native: ``POST /generate`` (``input_ids`` or ``text``; ``stream: true`` for server-sent events,
  one per verify step, each with the text so far and ``meta_info``) with ``meta_info`` fields
  ``prompt_tokens``, ``completion_tokens``, ``spec_verify_ct``, ``spec_accept_histogram`` (index =
  draft tokens accepted in a step), ``commit_len`` = ``spec_accept_length`` (per-step mean of tokens
  committed, a step cut by the limit counted as committed: never above min(budget, L) + 1) and
  ``sglang_accept_length`` (SGLang's completion_tokens / spec_verify_ct); ``GET /get_model_info``.
- OpenAI / vLLM: ``POST /v1/completions`` (``stream: true``: OpenAI's server-sent events, one chunk per
  verify step, then ``data: [DONE]``), ``GET /v1/models``, ``POST /tokenize``, and ``GET /metrics``
  in Prometheus text with vLLM's counter names (spec decode, request success, tokens, queue gauges).
- The engine works on its own thread (``server_worker``): ``/health`` and ``/metrics`` answer from the
  event loop at once whatever the load; a client that disconnects cancels its request between verify
  steps (or before it starts); ``stop`` strings and ``stop_token_ids`` end the output (a stream holds
  back any tail that may still become a stop string: streamed text = the plain answer's).
- Requests are strict (``server_models``): bad or unsupported input is a 400 with one error body; an
  engine failure that is not the request's fault is a 500 ``server_error`` in the same body.
FastAPI/uvicorn/prometheus-client are the optional ``server`` extra.
"""

import asyncio
import json
import time
import uuid
from typing import Any

from .units import DDProbeError

POLL_S = 0.2  # how often a waiting request checks that its client is still there


def _need_server_extra():
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise DDProbeError(f"ddprobe serve needs the server extra ({e.name} missing): "
                           "pip install 'ddprobe[server]'") from None


def build_app(backend, spec: bool = True, model_name: str | None = None):
    """FastAPI app around an ``EngineBackend``."""
    _need_server_extra()
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    from . import server_models as m
    from .server_metrics import Metrics, spec_meta
    from .server_worker import EngineWorker, Job, cut_at_stop, held_tail

    name = model_name or f"ddprobe-{backend.preset}"
    metrics = Metrics(name, spec)
    worker = EngineWorker(backend, spec, on_done=lambda job, st: metrics.finished(st))
    metrics.gauges(lambda: worker.running, lambda: worker.waiting)
    max_commit = backend.max_commit()
    app = FastAPI(title="ddprobe serve", version="1")
    app.state.worker = worker

    class ApiError(Exception):
        def __init__(self, code: int, message: str, param: str | None = None):
            self.code, self.message, self.param = code, message, param

    def err(code: int, message: str, param: str | None = None) -> JSONResponse:
        kind = "not_found_error" if code == 404 else "server_error" if code >= 500 else "invalid_request_error"
        return JSONResponse(m.error_body(message, code, param, kind), status_code=code)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return err(exc.code, exc.message, exc.param)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        msg, param = m.validation_message(exc.errors())
        return err(400, msg, param)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        return err(exc.status_code, str(exc.detail))

    def check_ids(ids: list[int]) -> list[int]:
        if not ids:
            raise ApiError(400, "empty prompt", "input_ids")
        vocab = backend.describe()["vocab"]
        if any(i < 0 or i >= vocab for i in ids):
            raise ApiError(400, f"token ids must be integers in [0, {vocab})", "input_ids")
        return ids

    def new_job(ids, max_new, temperature, stop, stop_ids=(), seed=None) -> Job:
        if not spec and temperature > 0:
            raise ApiError(400, "this server decodes greedily (--no-spec): temperature must be 0", "temperature")
        if stop_ids and any(i < 0 for i in stop_ids):
            raise ApiError(400, "stop_token_ids must be non-negative", "stop_token_ids")
        return worker.submit(Job(check_ids(ids), max_new, temperature, list(stop or []), list(stop_ids or []), seed))

    async def events(request: Request, job: Job):
        """The job's events as they come; cancels the job if the client goes away (checked every POLL_S)."""
        getter = asyncio.ensure_future(job.events.get())
        checked = time.monotonic()
        try:
            while True:
                done, _ = await asyncio.wait({getter}, timeout=POLL_S)
                if time.monotonic() - checked >= POLL_S:  # steps may come faster than the poll: check by the clock
                    checked = time.monotonic()
                    if await request.is_disconnected():
                        return
                if not done:
                    continue
                kind, value = getter.result()
                if kind in ("error", "internal"):  # the request's fault (400) or the engine's (500)
                    raise ApiError(400 if kind == "error" else 500, value)
                yield kind, value
                if kind == "done":
                    return
                getter = asyncio.ensure_future(job.events.get())
        finally:
            getter.cancel()
            job.cancel.set()  # no-op once done; otherwise stops the engine at its next step

    async def started(request: Request, job: Job):
        """The job's events for a stream, after its first one: an engine error before any token (e.g. a
        context beyond the cache) is still a plain 400, not a broken stream."""
        agen = events(request, job)
        try:
            first = await agen.__anext__()
        except StopAsyncIteration:
            first = None

        async def rest():
            if first is not None:
                yield first
                async for ev in agen:
                    yield ev
        return rest()

    def texts(job: Job, toks: list[int]) -> str:
        return cut_at_stop(backend.decode(toks), job.stop)

    def finish_reason(st) -> str:
        return st.extra.get("finish_reason", "length")

    def meta_of(job: Job, st, rid: str, t0: float) -> dict[str, Any]:
        fr = finish_reason(st)
        meta = {"id": rid, "finish_reason": {"type": fr, **({"length": job.max_new} if fr == "length" else {})},
                "prompt_tokens": len(job.ids), "completion_tokens": st.completion_tokens, "cached_tokens": 0,
                "e2e_latency": time.perf_counter() - t0}
        if spec:
            meta.update(spec_meta(st, max_commit))
        return meta

    def sse(obj) -> str:
        return "data: " + (obj if isinstance(obj, str) else json.dumps(obj)) + "\n\n"

    def stream(job: Job, evs, on_tokens, on_done) -> StreamingResponse:
        """Server-sent events of a started job: what ``on_tokens(new ids)`` and ``on_done(result)`` return (lists
        of bodies), then [DONE]; the job is cancelled whenever the stream ends, the client gone included."""
        async def chunks():
            try:
                async for kind, value in evs:
                    for item in (on_tokens(value) if kind == "tokens" else on_done(value)):
                        yield sse(item)
                yield sse("[DONE]")
            finally:
                job.cancel.set()
        return StreamingResponse(chunks(), media_type="text/event-stream")

    @app.get("/health")
    async def health():
        return {"status": "ok", "running": worker.running, "waiting": worker.waiting}

    @app.get("/get_model_info")
    async def model_info():
        return {"model_path": name, "tokenizer_path": "word-level", "is_generation": True,
                "max_context_length": backend.max_context(), "speculative_algorithm": "DDTREE" if spec else None,
                "engine": backend.describe()}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "ddprobe",
                                            "max_model_len": backend.max_context()}]}

    @app.post("/tokenize")
    async def tokenize(req: m.TokenizeRequest):
        ids = backend.tokenize(req.prompt)
        return {"tokens": ids, "count": len(ids), "max_model_len": backend.max_context()}

    @app.post("/generate")
    async def generate(req: m.GenerateRequest, request: Request):
        sp, t0, rid = req.sampling_params, time.perf_counter(), req.rid or uuid.uuid4().hex
        ids = req.input_ids if req.input_ids is not None else backend.tokenize(req.text)
        job = new_job(ids, sp.max_new_tokens, sp.temperature, sp.stop, sp.stop_token_ids)
        if req.stream:
            toks: list[int] = []

            def on_tokens(new):
                toks.extend(new)
                text = texts(job, toks)
                return [{"text": text[:len(text) - held_tail(text, job.stop)], "output_ids": list(toks),
                         "meta_info": {"id": rid, "finish_reason": None, "prompt_tokens": len(job.ids),
                                       "completion_tokens": len(toks)}}]

            def on_done(st):
                return [{"text": texts(job, st.tokens), "output_ids": st.tokens, "meta_info": meta_of(job, st, rid, t0)}]

            return stream(job, await started(request, job), on_tokens, on_done)
        async for kind, value in events(request, job):
            if kind == "done":
                return {"text": texts(job, value.tokens), "output_ids": value.tokens,
                        "meta_info": meta_of(job, value, rid, t0)}
        return err(499, "client closed the request")

    @app.post("/v1/completions")
    async def completions(req: m.CompletionRequest, request: Request):
        if req.model is not None and req.model != name:
            raise ApiError(404, f"model {req.model!r} does not exist; this server has {name!r}", "model")
        ids = backend.tokenize(req.prompt) if isinstance(req.prompt, str) else req.prompt
        job = new_job(ids, req.max_tokens, req.temperature, req.stop, seed=req.seed)
        cid, created = "cmpl-" + uuid.uuid4().hex, int(time.time())

        def body(choice: dict, usage=None) -> dict:
            return {"id": cid, "object": "text_completion", "created": created, "model": name,
                    "choices": [choice] if choice else [], "usage": usage}

        def usage(st) -> dict:
            return {"prompt_tokens": len(ids), "completion_tokens": st.completion_tokens,
                    "total_tokens": len(ids) + st.completion_tokens}

        if req.stream:
            toks: list[int] = []
            sent = [""]  # the text already sent

            def on_tokens(new):
                toks.extend(new)
                text = texts(job, toks)
                text = text[:len(text) - held_tail(text, job.stop)]  # what a later step may turn into a stop
                if len(text) <= len(sent[0]):
                    return []
                delta, sent[0] = text[len(sent[0]):], text
                return [body({"index": 0, "text": delta, "finish_reason": None, "logprobs": None})]

            def on_done(st):  # the held-back rest (the text before any stop), with the finish reason
                rest = texts(job, st.tokens)[len(sent[0]):]
                out = [body({"index": 0, "text": rest, "finish_reason": finish_reason(st), "logprobs": None})]
                if req.stream_options and req.stream_options.include_usage:
                    out.append(body({}, usage(st)))
                return out

            return stream(job, await started(request, job), on_tokens, on_done)
        async for kind, value in events(request, job):
            if kind == "done":
                return body({"index": 0, "text": texts(job, value.tokens), "finish_reason": finish_reason(value),
                             "logprobs": None}, usage(value))
        return err(499, "client closed the request")

    @app.get("/metrics")
    async def metrics_text():
        return PlainTextResponse(metrics.text(), media_type="text/plain; version=0.0.4")

    return app


def serve(backend, host: str = "127.0.0.1", port: int = 30000, spec: bool = True, log_level: str = "warning"):
    """Block serving ``backend`` on host:port."""
    _need_server_extra()
    import uvicorn

    uvicorn.run(build_app(backend, spec=spec), host=host, port=port, log_level=log_level)
