"""What a request body must be before any route reads it (an ASGI middleware, ``BodyLimits``): at most
``max_bytes`` (413), arrived whole within ``read_s`` seconds of the request's start (408: a client declaring
more body than it sends no longer holds its connection), sent as JSON (``Content-Type: application/json``;
missing, or a form as ``curl -d`` sends, is a 415 saying so; a request with no body at all, as ``curl -X POST
/stop_profile`` sends, has nothing to type) and not compressed (``Content-Encoding`` other
than identity: 415; nothing is decompressed). The body is read here once and handed to the app as read; the
app's later ``receive`` calls (disconnect checks) go to the client as before."""
from __future__ import annotations

import asyncio
import json
import time

from .models import error_body

MAX_BODY_BYTES = 64 * 1024 * 1024  # ddprobe serve --max-body default
BODY_READ_S = 30.0  # the whole body must arrive within this


def _content_type_problem(headers: dict[bytes, bytes]) -> str | None:
    enc = headers.get(b"content-encoding", b"identity").decode("latin-1").strip().lower()
    if enc not in ("", "identity"):
        return (f"Content-Encoding {enc!r} is not accepted: send the body uncompressed (ddprobe serve decompresses "
                "nothing)")
    ctype = headers.get(b"content-type")
    if ctype is None:
        return "the Content-Type header is missing: send the JSON body with Content-Type: application/json"
    kind = ctype.decode("latin-1").split(";")[0].strip().lower()
    if kind != "application/json" and not kind.endswith("+json"):
        return (f"Content-Type {kind or '(empty)'} is not JSON: send the body with Content-Type: application/json"
                + (" (curl -d sends a form: add -H 'Content-Type: application/json')"
                   if kind == "application/x-www-form-urlencoded" else ""))
    return None


class BodyLimits:
    def __init__(self, app, max_bytes: int = MAX_BODY_BYTES, read_s: float = BODY_READ_S):
        self.app, self.max_bytes, self.read_s = app, max_bytes, read_s

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        declared = headers.get(b"content-length")
        if declared is not None and (not declared.strip().isdigit() or int(declared) > self.max_bytes):
            return await refuse(send, 413, f"the request body is larger than the {self.max_bytes:,} bytes this "
                                           "server takes (--max-body)")
        bodiless = declared is not None and declared.strip() == b"0" or declared is None and \
            b"transfer-encoding" not in headers  # no body (curl -X POST /stop_profile): no type to check
        problem = None if bodiless else _content_type_problem(headers)
        if problem:
            return await refuse(send, 415, problem)
        body, deadline = bytearray(), time.monotonic() + self.read_s
        while True:
            try:
                msg = await asyncio.wait_for(receive(), max(deadline - time.monotonic(), 0.0))
            except asyncio.TimeoutError:
                return await refuse(send, 408, f"the request body did not arrive within {self.read_s:g} s "
                                               f"({len(body):,} bytes came)")
            if msg["type"] == "http.disconnect":
                return None
            body += msg.get("body", b"")
            if len(body) > self.max_bytes:
                return await refuse(send, 413, f"the request body is larger than the {self.max_bytes:,} bytes "
                                               "this server takes (--max-body)")
            if not msg.get("more_body"):
                break
        handed = False

        async def replay():
            nonlocal handed
            if not handed:
                handed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)


async def refuse(send, code: int, message: str) -> None:
    """The one error body (``models.error_body``) with status ``code``; the connection is closed after it."""
    payload = json.dumps(error_body(message, code)).encode()
    await send({"type": "http.response.start", "status": code,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": payload})
