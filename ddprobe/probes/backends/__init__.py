"""The servers a probe talks to, behind one small interface (``base``: ``Backend``, ``GenStats``, ``BackendError``):
the reference engine in this process (``engine``), SGLang (``sglang``) and vLLM (``vllm``) over HTTP (``http``).
``make_backend`` chooses one by name; none of the implementations imports this choice. The embedded engine is
built by the caller (``engine_factory``), so torch is imported only when it is asked for.
"""
from __future__ import annotations

from typing import Callable

from .base import Backend, BackendError
from .sglang import SGLangBackend
from .vllm import VLLMBackend

BACKENDS = ("engine", "sglang", "vllm")
SERVERS = {"sglang": SGLangBackend, "vllm": VLLMBackend}


def make_backend(kind: str, url: str | None = None, timeout_s: float = 600.0,
                 engine_factory: Callable[[], Backend] | None = None) -> Backend:
    """Backend by name: ``engine`` (needs ``engine_factory``), ``sglang`` or ``vllm`` (need ``url``)."""
    if kind == "engine":
        if url:
            raise BackendError("--url is for --backend sglang or vllm: the engine backend runs in this process")
        if engine_factory is None:
            raise BackendError("the engine backend needs an engine")
        return engine_factory()
    if kind in SERVERS:
        if not url:
            raise BackendError(f"--backend {kind} needs --url http://host:port")
        return SERVERS[kind](url, timeout_s)
    raise BackendError(f"unknown backend {kind!r}; known: {', '.join(BACKENDS)}")


__all__ = ["BACKENDS", "Backend", "BackendError", "make_backend"]
