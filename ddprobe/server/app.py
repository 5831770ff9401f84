"""The FastAPI app of ``ddprobe serve`` (see the package's doc): ``build_app`` wires the engine's worker, the
metrics and the one error body to the routes; the routes that only describe the server are here, the two that
decode in ``routes``."""
import asyncio
import json

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from . import models as m
from . import profile, routes
from .limits import BODY_READ_S, MAX_BODY_BYTES, BodyLimits
from .metrics import Metrics
from .served import ApiError, Served, served
from .worker import EngineWorker


def build_app(backend, spec: bool = True, model_name: str | None = None, max_body: int = MAX_BODY_BYTES,
              body_read_s: float = BODY_READ_S, per_request_spec_metrics: bool = False) -> FastAPI:
    """FastAPI app around an ``EngineBackend``; ``app.state.served`` holds what the routes share,
    ``app.state.worker`` the engine's thread (``worker.close()`` ends it). Bodies pass ``limits.BodyLimits``
    (``max_body`` bytes, whole within ``body_read_s``, JSON, uncompressed) before any route reads them."""
    name = model_name or f"ddprobe-{backend.preset}"
    metrics = Metrics(name, spec, positions=backend.max_commit() - 1 if spec else 0)
    worker = EngineWorker(backend, spec, on_done=lambda job, st: metrics.finished(st))
    worker.profiler = profile.EngineProfiler()
    metrics.gauges(lambda: worker.running, lambda: worker.waiting)
    app = FastAPI(title="ddprobe serve", version="1")
    app.state.served = Served(backend, spec, name, worker, metrics, backend.max_commit())
    app.state.worker = worker
    # /v1/completions answers carry metrics.speculative_decoding, as vLLM's --per-request-spec-decode-metrics detailed
    app.state.per_request_spec_metrics = spec and per_request_spec_metrics
    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(RequestValidationError, invalid_request)
    app.add_exception_handler(StarletteHTTPException, http_error)
    for path, fn, method in (("/health", health, "GET"), ("/get_model_info", model_info, "GET"),
                             ("/v1/models", models, "GET"), ("/tokenize", tokenize, "POST"),
                             ("/generate", routes.generate, "POST"), ("/v1/completions", routes.completions, "POST"),
                             ("/metrics", metrics_text, "GET"), ("/start_profile", profile.start_profile, "POST"),
                             ("/stop_profile", profile.stop_profile, "POST")):
        app.add_api_route(path, fn, methods=[method])
    app.add_middleware(BodyLimits, max_bytes=max_body, read_s=body_read_s)
    return app


def error(code: int, message: str, param: str | None = None) -> JSONResponse:
    kind = "not_found_error" if code == 404 else "server_error" if code >= 500 else "invalid_request_error"
    return JSONResponse(m.error_body(message, code, param, kind), status_code=code)


async def api_error(request: Request, exc: ApiError):
    return error(exc.code, exc.message, exc.param)


async def invalid_request(request: Request, exc: RequestValidationError):
    return error(400, *m.validation_message(exc.errors()))


async def http_error(request: Request, exc: StarletteHTTPException):
    return error(exc.status_code, str(exc.detail))


async def health(request: Request):
    w = served(request).worker
    return {"status": "ok", "running": w.running, "waiting": w.waiting}


async def model_info(request: Request):
    s = served(request)
    return {"model_path": s.name, "tokenizer_path": "word-level", "is_generation": True,
            "max_context_length": s.backend.max_context(), "speculative_algorithm": "DDTREE" if s.spec else None,
            # the draft shape served (serve --tree): ddtree or chain, and its nodes per step (a chain's: its depth)
            "speculative_tree": getattr(s.backend, "tree_shape", None) if s.spec else None,
            "speculative_budget": s.backend.budget if s.spec else None, "engine": s.backend.describe()}


async def models(request: Request):
    s = served(request)
    return {"object": "list", "data": [{"id": s.name, "object": "model", "owned_by": "ddprobe",
                                        "max_model_len": s.backend.max_context()}]}


async def tokenize(req: m.TokenizeRequest, request: Request):
    s = served(request)
    ids = await asyncio.to_thread(s.backend.tokenize, req.prompt)  # off the event loop: /health stays quick
    # so is the answer's JSON: 5 million ids take FastAPI's encoder about 12 s on one core
    body = await asyncio.to_thread(_tokens_json, ids, s.backend.max_context())
    return Response(body, media_type="application/json")


def _tokens_json(ids: list[int], max_len) -> str:
    """The /tokenize answer as JSON, its ids written in pieces: no single call holds the interpreter lock (and so
    the event loop) for the whole list."""
    step = 1 << 13
    tokens = ",".join([",".join(map(str, ids[i:i + step])) for i in range(0, len(ids), step)])
    return f'{{"tokens": [{tokens}], "count": {len(ids)}, "max_model_len": {json.dumps(max_len)}}}'


async def metrics_text(request: Request):
    return PlainTextResponse(served(request).metrics.text(), media_type="text/plain; version=0.0.4")
