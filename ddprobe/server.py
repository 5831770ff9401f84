"""``ddprobe serve``: the reference engine over HTTP, speaking the protocols the probes read.

- SGLang native: ``POST /generate`` (``input_ids`` or ``text``) with ``meta_info`` fields
  ``prompt_tokens``, ``completion_tokens``, ``spec_verify_ct``, ``spec_accept_length``,
  ``spec_accept_histogram``, ``e2e_latency``; ``GET /get_model_info``.
- OpenAI / vLLM: ``POST /v1/completions``, ``GET /v1/models``, ``POST /tokenize``, and
  ``GET /metrics`` in Prometheus text with vLLM's spec-decode counter names.
- ``--no-spec`` serves plain greedy decoding (no speculative counters), like a server
  without speculative decoding.
FastAPI/uvicorn/prometheus-client are the optional ``server`` extra.
"""
import threading
import time
import uuid
from typing import Any, Optional, Union

from .units import DDProbeError


def _need_server_extra():
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise DDProbeError(f"ddprobe serve needs the server extra ({e.name} missing): "
                           "pip install 'ddprobe[server]'") from None


def build_app(backend, spec: bool = True, model_name: str | None = None):
    """FastAPI app around an ``EngineBackend`` (one request at a time: the engine is not reentrant)."""
    _need_server_extra()
    from fastapi import FastAPI, HTTPException, Request
    from fastapi.responses import JSONResponse, PlainTextResponse
    from prometheus_client import CollectorRegistry, Counter, generate_latest
    from pydantic import BaseModel, Field

    engine = backend.engine
    name = model_name or f"ddprobe-{backend.preset}"
    lock = threading.Lock()
    registry = CollectorRegistry()
    labels = {"model_name": name, "engine": "0"}

    def counter(metric: str, doc: str) -> Counter:
        return Counter(metric, doc, list(labels), registry=registry).labels(**labels)

    prompt_tokens = counter("vllm:prompt_tokens", "Prefill tokens processed.")
    generation_tokens = counter("vllm:generation_tokens", "Generation tokens processed.")
    if spec:
        accepted = counter("vllm:spec_decode_num_accepted_tokens", "Accepted draft tokens.")
        drafts = counter("vllm:spec_decode_num_drafts", "Draft proposals (verify steps).")
        draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Draft tokens proposed.")

    app = FastAPI(title="ddprobe serve", version="1")

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException):
        return JSONResponse({"error": {"message": exc.detail, "code": exc.status_code}}, status_code=exc.status_code)

    def run(ids: list[int], max_new: int, temperature: float) -> dict[str, Any]:
        if not ids:
            raise HTTPException(400, "empty prompt")
        vocab = engine.config.target.vocab_size
        if any((not isinstance(i, int)) or i < 0 or i >= vocab for i in ids):
            raise HTTPException(400, f"token ids must be integers in [0, {vocab})")
        t0 = time.perf_counter()
        with lock:
            try:
                if spec:
                    res = engine.generate(ids, max_new, temperature=temperature)
                    tokens, steps = res.tokens, res.steps
                else:
                    tokens, steps = engine.greedy_reference(ids, max_new), []
            except ValueError as e:
                raise HTTPException(400, str(e)) from None
        e2e = time.perf_counter() - t0
        prompt_tokens.inc(len(ids))
        generation_tokens.inc(len(tokens))
        out = {"tokens": tokens, "steps": steps, "e2e": e2e}
        if spec:
            acc = sum(s.accepted_depth for s in steps)
            accepted.inc(acc)
            drafts.inc(len(steps))
            draft_tokens.inc(sum(s.tree_size for s in steps))
        return out

    def ids_of(text: Optional[str], ids: Optional[list[int]]) -> list[int]:
        if ids is not None:
            return ids
        if text is None:
            raise HTTPException(400, "give input_ids or text")
        return backend.tokenize(text)

    class SamplingParams(BaseModel):
        max_new_tokens: int = Field(128, ge=1)
        temperature: float = Field(0.0, ge=0.0)
        ignore_eos: bool = True

    class GenerateRequest(BaseModel):
        text: Optional[str] = None
        input_ids: Optional[list[int]] = None
        sampling_params: SamplingParams = SamplingParams()

    class TokenizeRequest(BaseModel):
        prompt: str
        model: Optional[str] = None
        add_special_tokens: bool = False

    class CompletionRequest(BaseModel):
        model: Optional[str] = None
        prompt: Union[str, list[int]]
        max_tokens: int = Field(16, ge=1)
        temperature: float = Field(1.0, ge=0.0)
        ignore_eos: bool = True

    @app.get("/health")
    def health():
        return {"status": "ok"}

    @app.get("/get_model_info")
    def model_info():
        return {"model_path": name, "tokenizer_path": "word-level", "is_generation": True,
                "max_context_length": backend.max_context(), "speculative_algorithm": "DDTREE" if spec else None,
                "engine": backend.describe()}

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "ddprobe",
                                            "max_model_len": backend.max_context()}]}

    @app.post("/tokenize")
    def tokenize(req: TokenizeRequest):
        ids = backend.tokenize(req.prompt)
        return {"tokens": ids, "count": len(ids), "max_model_len": backend.max_context()}

    @app.post("/generate")
    def generate(req: GenerateRequest):
        ids = ids_of(req.text, req.input_ids)
        sp = req.sampling_params
        r = run(ids, sp.max_new_tokens, sp.temperature)
        meta: dict[str, Any] = {"id": uuid.uuid4().hex, "finish_reason": {"type": "length", "length": sp.max_new_tokens},
                                "prompt_tokens": len(ids), "completion_tokens": len(r["tokens"]),
                                "cached_tokens": 0, "e2e_latency": r["e2e"]}
        if spec:
            steps = r["steps"]
            hist = [0] * (engine.num_draft + 1)
            for s in steps:
                hist[s.commit_len - 1] += 1
            meta.update(spec_verify_ct=len(steps),
                        spec_accept_length=len(r["tokens"]) / len(steps) if steps else 0.0,
                        spec_accept_histogram=hist)
        return {"text": backend.tokenizer.decode(r["tokens"]), "output_ids": r["tokens"], "meta_info": meta}

    @app.post("/v1/completions")
    def completions(req: CompletionRequest):
        if req.model is not None and req.model != name:
            raise HTTPException(404, f"model {req.model!r} does not exist; this server has {name!r}")
        ids = backend.tokenize(req.prompt) if isinstance(req.prompt, str) else req.prompt
        r = run(ids, req.max_tokens, req.temperature)
        return {"id": "cmpl-" + uuid.uuid4().hex, "object": "text_completion", "created": int(time.time()),
                "model": name, "choices": [{"index": 0, "text": backend.tokenizer.decode(r["tokens"]),
                                            "finish_reason": "length", "logprobs": None}],
                "usage": {"prompt_tokens": len(ids), "completion_tokens": len(r["tokens"]),
                          "total_tokens": len(ids) + len(r["tokens"])}}

    @app.get("/metrics")
    def metrics():
        return PlainTextResponse(generate_latest(registry).decode(), media_type="text/plain; version=0.0.4")

    return app


def serve(backend, host: str = "127.0.0.1", port: int = 30000, spec: bool = True, log_level: str = "warning"):
    """Block serving ``backend`` on host:port."""
    _need_server_extra()
    import uvicorn

    uvicorn.run(build_app(backend, spec=spec), host=host, port=port, log_level=log_level)
