"""What every route of ``ddprobe serve`` shares: the served engine (``Served``, kept on ``app.state``), the one
error (``ApiError``), and a job's events turned into an answer or a stream of server-sent events."""
import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from .metrics import Metrics, spec_meta
from .worker import EngineWorker, Job, cut_at_stop

POLL_S = 0.2  # how often a waiting request checks that its client is still there
SHUTTING_DOWN = "the server is shutting down: the request was cancelled"


class ApiError(Exception):
    """A request that ends in the one error body with this HTTP status."""

    def __init__(self, code: int, message: str, param: str | None = None):
        super().__init__(message)
        self.code, self.message, self.param = code, message, param


@dataclass
class Served:
    """The engine behind the app and what the routes need to answer for it."""

    backend: Any
    spec: bool
    name: str
    worker: EngineWorker
    metrics: Metrics
    max_commit: int

    def check_ids(self, ids: list[int], param: str = "input_ids", empty_ok: bool = False) -> list[int]:
        if not ids and not empty_ok:
            raise ApiError(400, "empty prompt", param)
        vocab = self.backend.describe()["vocab"]
        if any(i < 0 or i >= vocab for i in ids):
            raise ApiError(400, f"{param}: token ids must be integers in [0, {vocab})", param)
        return ids

    def submit(self, ids, max_new, temperature, stop, stop_ids=(), seed=None) -> Job:
        if not self.spec and temperature > 0:
            raise ApiError(400, "this server decodes greedily (--no-spec): temperature must be 0", "temperature")
        stop_ids = self.check_ids(list(stop_ids or []), "stop_token_ids", empty_ok=True)
        return self.worker.submit(Job(self.check_ids(ids), max_new, temperature, list(stop or []), stop_ids, seed))

    def text(self, job: Job, toks: list[int]) -> str:
        return cut_at_stop(self.backend.decode(toks), job.stop)

    def meta(self, job: Job, st, rid: str, t0: float) -> dict[str, Any]:
        """SGLang's ``meta_info`` of a finished request."""
        fr = finish_reason(st)
        meta = {"id": rid, "finish_reason": {"type": fr, **({"length": job.max_new} if fr == "length" else {})},
                "prompt_tokens": len(job.ids), "completion_tokens": st.completion_tokens, "cached_tokens": 0,
                "e2e_latency": time.perf_counter() - t0}
        if self.spec:
            meta.update(spec_meta(st, self.max_commit))
        return meta


def served(request: Request) -> Served:
    return request.app.state.served


def finish_reason(st) -> str:
    return st.extra.get("finish_reason", "length")


async def events(request: Request, job: Job):
    """The job's events as they come, ending with ("done" or "shutdown", GenStats); cancels the job if the client
    goes away (checked every POLL_S). An error is an ``ApiError``: the request's (400), the engine's (500), or a
    shutdown before the job started (503)."""
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
            if kind in ("error", "internal"):
                raise ApiError(400 if kind == "error" else 500, value)
            if kind == "shutdown" and value is None:
                raise ApiError(503, SHUTTING_DOWN)
            yield kind, value
            if kind in ("done", "shutdown"):
                return
            getter = asyncio.ensure_future(job.events.get())
    finally:
        getter.cancel()
        job.cancel.set()  # no-op once done; otherwise stops the engine at its next step


async def result(request: Request, job: Job):
    """The finished job's GenStats, or None when the client left; a shutdown is a 503."""
    async for kind, value in events(request, job):
        if kind == "shutdown":
            raise ApiError(503, SHUTTING_DOWN)
        if kind == "done":
            return value
    return None


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


def sse(obj) -> str:
    return "data: " + (obj if isinstance(obj, str) else json.dumps(obj)) + "\n\n"


def stream(job: Job, evs, on_tokens, on_done) -> StreamingResponse:
    """Server-sent events of a started job: what ``on_tokens(new ids)`` and ``on_done(result)`` return (lists
    of bodies; a shutdown ends the stream through ``on_done``, finish reason abort), then [DONE]; the job is
    cancelled whenever the stream ends, the client gone included."""
    async def chunks():
        try:
            async for kind, value in evs:
                for item in (on_tokens(value) if kind == "tokens" else on_done(value)):
                    yield sse(item)
            yield sse("[DONE]")
        finally:
            job.cancel.set()
    return StreamingResponse(chunks(), media_type="text/event-stream")
