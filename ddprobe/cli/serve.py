"""`ddprobe serve`: the reference engine over HTTP (``ddprobe.server``)."""
from __future__ import annotations

from typing import Annotated, Optional

import typer

from ..units import DDProbeError
from .app import app
from .commit import announce
from .options import MAX_TIMEOUT_S, EngineOptions, checked, engine_options, err, errors_exit_1, warm_up, within


def parse_bytes(text: str, flag: str) -> int:
    """A byte count: 1000, 64k, 64M, 1G (k = 1024); one line naming ``flag`` otherwise."""
    t = text.strip().upper().removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    digits = t[:-1] if t[-1:] in "KMG" and t else t
    if not digits.isdigit() or not 1 <= int(digits) * scale <= 1 << 40:
        raise DDProbeError(f"{flag}: bad byte count {text!r} (e.g. 1000, 64k, 64M)")
    return int(digits) * scale


def served_shape(tree: str | None, spec: bool) -> str | None:
    """``--tree``: the one draft shape this server decodes with (None: the engine's default, ddtree); one line for
    two shapes (a server decodes with one: run a second serve for the other) or a shape without speculation."""
    if tree is None:
        return None
    from ..probes.commit import tree_shapes

    shapes = tree_shapes(tree)
    if len(shapes) > 1:
        raise DDProbeError(f"--tree: ddprobe serve decodes with one draft shape, not {', '.join(shapes)}: give "
                           "--tree ddtree or --tree chain (a second serve on another --port for the other)")
    if not spec:
        raise DDProbeError(f"--tree {shapes[0]}: --no-spec drafts nothing; drop one of them")
    return shapes[0]


def set_shape(be, shape: str | None, budget: int, spec: bool) -> str:
    """Give the backend ``shape`` (a chain: min(budget, L) nodes, one per depth) and say it for the start line."""
    if shape == "chain":
        be.set_tree("chain", be.max_commit() - 1)  # max_commit = min(budget, L) + 1
        return f"chain of {be.budget} nodes: min(budget {budget}, block size - 1)"
    return f"budget {budget}, {'DDTree' if spec else 'greedy'}"


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
    max_body: Annotated[str, typer.Option("--max-body", help="Largest request body in bytes, k = 1024 (larger: "
                                                             "413).")] = "64M",
    body_timeout: Annotated[float, typer.Option("--body-timeout", help="Seconds a request's body may take to "
                                                                       "arrive (slower: 408).",
                                                callback=checked(within(1e-3, MAX_TIMEOUT_S, " s")))] = 30.0,
    tree: Annotated[Optional[str], typer.Option("--tree", help="The draft shape served: ddtree (the budget's most "
                                                               "probable prefixes) or chain (the drafter's top-1 per "
                                                               "depth, min(budget, block size - 1) nodes); one "
                                                               "shape per server (default ddtree).")] = None,
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
    body_bytes = parse_bytes(max_body, "--max-body")
    shape = served_shape(tree, spec)
    be = eng.backend(parse_tokens(max_ctx) if max_ctx is not None else None)  # --max-ctx '' is refused, not default
    announce(eng, be)
    said = set_shape(be, shape, eng.budget, spec)
    # the first request is then served at speed (--no-spec: the plain decode step is the one warmed up)
    warm_up(be if spec else SimpleNamespace(warmup=functools.partial(be.warmup, plain=True)), None)
    err.print(f"ddprobe serve: {eng.preset} ({be.attn}, {said}) on "
              f"http://{host}:{port}")
    run_server(be, host=host, port=port, spec=spec, max_body=body_bytes, body_read_s=body_timeout)
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM):  # stopped: a late second Ctrl-C while the process exits (Python
        signal.signal(sig, signal.SIG_IGN)        # resets its handlers then) must not turn exit 0 into a kill
