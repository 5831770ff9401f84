"""``ddprobe serve``: the reference engine over HTTP, speaking the protocols the probes read.

- SGLang native: ``POST /generate`` (``input_ids`` or ``text``; ``stream: true`` for server-sent events,
  one per verify step, each with the text so far and ``meta_info``) with ``meta_info`` fields
  ``prompt_tokens``, ``completion_tokens``, ``spec_verify_ct``, ``spec_accept_histogram`` (index =
  draft tokens accepted in a step), ``commit_len`` = ``spec_accept_length`` (per-step mean of tokens
  committed, a step cut by the limit counted as committed: never above min(budget, L) + 1) and
  ``sglang_accept_length`` (SGLang's completion_tokens / spec_verify_ct); ``GET /get_model_info`` (with
  ``speculative_tree``, the one draft shape served, ``ddtree`` or ``chain`` (``serve --tree``), and its nodes per
  step, ``speculative_budget``).
- OpenAI / vLLM: ``POST /v1/completions`` (``stream: true``: OpenAI's server-sent events, one chunk per
  verify step, then ``data: [DONE]``), ``GET /v1/models``, ``POST /tokenize``, and ``GET /metrics``
  in Prometheus text with vLLM's counter names (spec decode, request success, tokens, queue gauges).
- The engine works on its own thread (``worker``): ``/health`` and ``/metrics`` answer from the
  event loop at once whatever the load; a client that disconnects cancels its request between verify
  steps (or before it starts); ``stop`` strings and ``stop_token_ids`` end the output (a stream holds
  back any tail that may still become a stop string: streamed text = the plain answer's).
- Requests are strict (``models``): bad or unsupported input is a 400 with one error body; an
  engine failure that is not the request's fault is a 500 ``server_error`` in the same body. Bodies are
  checked first (``limits``): over ``--max-body`` bytes 413, not whole within ``--body-timeout`` 408, not sent
  as ``application/json`` or compressed 415. Tokenizing and decoding run off the event loop.
- The first SIGINT/SIGTERM (``run``) prints "shutting down", stops accepting, cancels the running request
  at its next step and the queued ones: a waiting client gets a 503 in the error body, a stream its end
  event (finish reason ``abort``); the process exits 0.

The rooms: ``app`` (the FastAPI app and the small routes), ``routes`` (the two generating routes),
``served`` (what the routes share: the engine, its jobs' events, the error), ``models`` (requests),
``metrics`` (``/metrics``), ``worker`` (the engine's thread), ``run`` (uvicorn and the shutdown).
FastAPI/uvicorn/prometheus-client are the optional ``server`` extra; importing this package needs none.
"""
from __future__ import annotations

from ..units import DDProbeError


def need_server_extra() -> None:
    """One line naming the missing package when the ``server`` extra is not installed."""
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise DDProbeError(f"ddprobe serve needs the server extra ({e.name} missing): "
                           "pip install 'ddprobe[server]'") from None


def build_app(backend, spec: bool = True, model_name: str | None = None, **limits):
    """The FastAPI app around an ``EngineBackend`` (``app.build_app``; ``limits``: ``max_body``, ``body_read_s``)."""
    need_server_extra()
    from .app import build_app as build

    return build(backend, spec=spec, model_name=model_name, **limits)


def serve(backend, host: str = "127.0.0.1", port: int = 30000, spec: bool = True, log_level: str = "warning",
          say=None, **limits) -> None:
    """Block serving ``backend`` on host:port until the first SIGINT/SIGTERM (``run.serve``)."""
    need_server_extra()
    from .run import serve as run

    run(backend, host=host, port=port, spec=spec, log_level=log_level, say=say, **limits)
