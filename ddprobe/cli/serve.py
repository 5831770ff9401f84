"""`ddprobe serve`: the reference engine over HTTP (``ddprobe.server``)."""
from __future__ import annotations

from typing import Annotated, Optional

import typer

from ..units import DDProbeError
from .app import app
from .commit import announce
from .options import EngineOptions, engine_options, err, errors_exit_1, warm_up


@app.command()
@errors_exit_1
@engine_options()
def serve(
    host: Annotated[str, typer.Option("--host", help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port.")] = 30000,
    max_ctx: Annotated[Optional[str], typer.Option("--max-ctx", help="KV capacity in tokens, allocated up front "
                                                                      "(default: 8k or the preset's limit).")] = None,
    spec: Annotated[bool, typer.Option("--spec/--no-spec", help="DDTree speculative decoding, or plain greedy "
                                                                "decoding without spec counters.")] = True,
    *, eng: EngineOptions,
):
    """Serve the reference engine over HTTP: SGLang /generate, OpenAI /v1/completions, /tokenize, /metrics."""
    import functools
    import socket
    from types import SimpleNamespace

    from ..server import serve as run_server
    from ..units import parse_tokens

    if not 0 < port < 65536:
        raise DDProbeError(f"--port must be in 1..65535, got {port}")
    try:  # fail here, in one line, rather than in uvicorn after the engine is built
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as e:
        raise DDProbeError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    be = eng.backend(parse_tokens(max_ctx) if max_ctx else None)
    announce(eng, be)
    # the first request is then served at speed (--no-spec: the plain decode step is the one warmed up)
    warm_up(be if spec else SimpleNamespace(warmup=functools.partial(be.warmup, plain=True)), None)
    err.print(f"ddprobe serve: {eng.preset} ({be.attn}, budget {eng.budget}, {'DDTree' if spec else 'greedy'}) on "
              f"http://{host}:{port}")
    run_server(be, host=host, port=port, spec=spec)
