"""The HTTP plumbing of the server backends: one session, every failure a one-line ``BackendError``.

The URL is the server's root: an OpenAI base URL (``http://host:port/v1``, what OpenAI clients take) is
read as its root, since the backends add ``/v1/...`` themselves where the protocol has it."""
from __future__ import annotations

from typing import Any

from .backends import BackendError


def server_root(url: str) -> str:
    """``url`` without a trailing slash or OpenAI's ``/v1`` (``http://h:p/v1/`` -> ``http://h:p``)."""
    url = url.rstrip("/")
    return url[:-len("/v1")].rstrip("/") if url.endswith("/v1") else url


class HttpClient:
    def __init__(self, url: str, timeout_s: float = 600.0):
        if not url.startswith(("http://", "https://")):
            raise BackendError(f"bad URL {url!r}: expected http://host:port")
        if timeout_s <= 0:
            raise BackendError(f"timeout must be greater than zero, got {timeout_s}")
        self.url = server_root(url)
        self.timeout_s = timeout_s
        import requests  # lazy: only HTTP backends need it

        self._requests = requests
        self._session = requests.Session()

    def call(self, method: str, path: str, json_body: Any = None, expect_json: bool = True) -> Any:
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

    def get_optional(self, path: str) -> Any:
        """GET that returns None on 404 or a non-JSON answer (optional endpoints)."""
        try:
            return self.call("GET", path)
        except BackendError as e:
            if "HTTP 404" in str(e) or "not valid JSON" in str(e):
                return None
            raise


def field_of(d: Any, key: str, where: str, kind: type | tuple = (int, float)) -> Any:
    if not isinstance(d, dict) or key not in d:
        raise BackendError(f"{where}: answer has no {key!r}")
    v = d[key]
    if not isinstance(v, kind) or isinstance(v, bool):
        raise BackendError(f"{where}: {key!r} has the wrong type ({type(v).__name__})")
    return v
