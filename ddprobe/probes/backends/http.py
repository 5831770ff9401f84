"""The HTTP plumbing of the server backends: one session, every failure a one-line ``BackendError``.

The URL is the server's root: an OpenAI base URL (``http://host:port/v1``, what OpenAI clients take) is
read as its root, since the backends add ``/v1/...`` themselves where the protocol has it."""
from __future__ import annotations

import math
from typing import Any

from .base import BackendError


def server_root(url: str) -> str:
    """``url`` without a trailing slash or OpenAI's ``/v1`` (``http://h:p/v1/`` -> ``http://h:p``)."""
    url = url.rstrip("/")
    return url[:-len("/v1")].rstrip("/") if url.endswith("/v1") else url


class HttpClient:
    def __init__(self, url: str, timeout_s: float = 600.0, timeout_flag: str = "--timeout"):
        if not url.startswith(("http://", "https://")):
            raise BackendError(f"bad URL {url!r}: expected http://host:port")
        if timeout_s <= 0:
            raise BackendError(f"timeout must be greater than zero, got {timeout_s}")
        self.url = server_root(url)
        self.timeout_s = timeout_s
        self.timeout_flag = timeout_flag  # the option that set timeout_s, named when an answer is late
        import requests  # lazy: only HTTP backends need it

        self._requests = requests
        self._session = requests.Session()

    def _fetch(self, method: str, url: str, json_body: Any, progress: dict):
        """The whole answer (headers and body), saying in ``progress`` how far it got."""
        progress["stage"] = "waiting for the answer's headers"
        r = self._session.request(method, url, json=json_body, timeout=self.timeout_s, stream=True)
        progress["stage"] = f"HTTP {r.status_code} headers came, the body was still arriving"
        r.content  # read it all here, within the deadline
        return r

    def call(self, method: str, path: str, json_body: Any = None, expect_json: bool = True) -> Any:
        """``method`` ``path`` with the whole answer (not each read) bounded by ``timeout_s``: every failure, a
        slow server included, is one ``BackendError`` naming the URL and what was slow."""
        from ...deadline import Late, within

        url = self.url + path
        rq = self._requests
        progress: dict = {"stage": "connecting"}  # the deadline's and the socket's: either names the stage

        def late(stage: str) -> BackendError:  # one wording, whichever of the two clocks ran out first
            return BackendError(f"{method} {url}: no complete answer within {self.timeout_s:g} s "
                                f"({self.timeout_flag}; {stage})")
        try:
            r = within(lambda p: self._fetch(method, url, json_body, p), self.timeout_s, progress)
        except (Late, rq.exceptions.Timeout):  # the deadline's clock or the socket's, whichever ran out first
            self._session = rq.Session()  # a late answer's thread may still hold the old one
            raise late(progress["stage"]) from None
        except rq.exceptions.ConnectionError as e:
            from urllib3.exceptions import ProtocolError, ReadTimeoutError

            cause = e.args[0] if e.args else None
            if isinstance(cause, ReadTimeoutError):  # requests' name for a body read late
                raise late(progress["stage"]) from None
            if isinstance(cause, ProtocolError):  # connected, then closed or reset before a whole answer
                raise BackendError(dropped(method, url, progress["stage"])) from None
            reason = "connection refused" if "refused" in str(e).lower() else "cannot connect"
            raise BackendError(f"{method} {url}: {reason} (is the server running?)") from None
        except rq.exceptions.ChunkedEncodingError:  # the body cut off mid-way
            raise BackendError(dropped(method, url, progress["stage"])) from None
        except rq.exceptions.RequestException as e:
            raise BackendError(f"{method} {url}: {type(e).__name__}") from None
        if r.status_code >= 400:
            detail = r.text.strip().replace("\n", " ")[:200]
            raise BackendError(f"{method} {url}: HTTP {r.status_code} {detail}")
        if not expect_json:
            return r.text
        from ...jsonfile import parse_json
        from ...units import DDProbeError

        try:
            return parse_json(r.content, "answer")  # strict: no NaN/Infinity, a depth limit
        except DDProbeError:
            raise BackendError(f"{method} {url}: answer is not valid JSON: {r.text[:80]!r}") from None

    def get_optional(self, path: str) -> Any:
        """GET that returns None on 404 or a non-JSON answer (optional endpoints)."""
        try:
            return self.call("GET", path)
        except BackendError as e:
            if "HTTP 404" in str(e) or "not valid JSON" in str(e):
                return None
            raise


def dropped(method: str, url: str, stage: str) -> str:
    """The line for a connection the server closed or reset after it was made: the server took the request and
    went away (it crashed, restarted or was killed), not a server that cannot be reached."""
    return (f"{method} {url}: the connection dropped: the server closed it before a complete answer ({stage}); "
            "did it crash, restart or get killed?")


def field_of(d: Any, key: str, where: str, kind: type | tuple = (int, float)) -> Any:
    if not isinstance(d, dict) or key not in d:
        raise BackendError(f"{where}: answer has no {key!r}")
    v = d[key]
    if not isinstance(v, kind) or isinstance(v, bool):
        raise BackendError(f"{where}: {key!r} has the wrong type ({type(v).__name__})")
    if isinstance(v, float) and not math.isfinite(v):
        raise BackendError(f"{where}: {key!r} is {v}, not a finite number")
    return v


CONTEXT_MAX = 1 << 31  # tokens: no server's context is longer


def context_of(v: Any, where: str) -> int | None:
    """A server's context length as it says it (``where`` names the route and key): None when it says none; a
    value that is not 1..CONTEXT_MAX tokens is one line, not a context check against -5 or 1e30 tokens."""
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or not 0 < v <= CONTEXT_MAX:
        raise BackendError(f"{where} is {str(v)[:40]!r}: not a context length (1 to {CONTEXT_MAX:,} tokens)")
    return v


def number_of(d: dict, key: str) -> float | None:
    """An optional number of an answer: None when absent, not a number, or not finite."""
    v = d.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None
