"""``ddprobe trace --url``: make a server write its torch-profiler traces, then hand their folder to the analysis.

The protocol is SGLang's (``ddprobe serve`` implements the same two endpoints):
``POST /start_profile`` with ``{"output_dir", "num_steps", "activities": ["CPU", "GPU"], "profile_by_stage": false,
"merge_profiles": false, "profile_prefix"}`` (SGLang stops by itself after ``num_steps`` and writes
``{prefix}{id}-TP-{rank}.trace.json.gz`` per rank), then ``POST /stop_profile``. vLLM takes the same two POSTs
(its body: ``num_steps``; unknown keys ignored) and writes ``..._rank{r}.{ts}.pt.trace.json.gz`` into the
``torch_profiler_dir`` of its ``--profiler-config``, not into a folder the caller names: ``--dir`` must be that
folder. A server that has no profiler answers 404 (vLLM without ``--profiler-config``): one line.

While profiling is on, one request decodes enough tokens for the steps asked (``/generate`` for SGLang and
``ddprobe serve``, ``/v1/completions`` for vLLM), so the profile holds decode / verify steps. The files are taken
once their sizes stop changing.
"""
from __future__ import annotations

import datetime as dt
import threading
import time
from pathlib import Path
from typing import Callable

from ...units import DDProbeError
from ..backends.base import BackendError
from ..backends.http import HttpClient

SUFFIXES = (".trace.json.gz", ".trace.json", ".pt.trace.json.gz", ".pt.trace.json")
PROMPT = "Count on, one number per line: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16"


def _call(client, path: str, body: dict | None = None, method: str = "POST", what: str = ""):
    """``method path`` through the backends' one HTTP client (every failure one line: refused, slow, an error
    status); a 404 says this server has no such endpoint (``None`` back), anything else is raised."""
    try:
        return client.call(method, path, body, expect_json=method == "GET")
    except BackendError as e:
        if "HTTP 404" in str(e):
            return None
        if what:
            raise BackendError(f"{e} ({what})") from None
        raise


def _no_profiler(base: str, what: str) -> DDProbeError:
    return DDProbeError(f"{base} answered 404 to {what}: this server has no profiler enabled (vLLM: start it with "
                        "--profiler-config '{\"profiler\": \"torch\", \"torch_profiler_dir\": DIR}'; SGLang "
                        "always has it)")


def _load(client, steps: int) -> None:
    """One request decoding about ``steps`` x 8 tokens, whichever protocol the server speaks."""
    n, why = max(16, steps * 8), "the request made to profile decode steps"
    sglang = {"text": PROMPT, "sampling_params": {"max_new_tokens": n, "temperature": 0}}
    if _call(client, "/generate", sglang, what=why) is not None:
        return
    models = _call(client, "/v1/models", method="GET", what="neither /generate nor /v1/models answered")
    try:
        model = models["data"][0]["id"]
    except (TypeError, KeyError, IndexError):
        raise DDProbeError(f"{client.url}: neither /generate nor /v1/models answered usably") from None
    body = {"model": model, "prompt": PROMPT, "max_tokens": n, "temperature": 0}
    if _call(client, "/v1/completions", body, what=why) is None:
        raise DDProbeError(f"{client.url}: neither /generate nor /v1/completions exists: not SGLang, vLLM or serve")


def _new_files(folder: Path, before: set[Path]) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith(SUFFIXES) and p not in before)


def _settled(folder: Path, before: set[Path], wait_s: float, say: Callable[[str], None]) -> list[Path]:
    """The new trace files once none has changed size for 2 s (or ``DDProbeError`` after ``wait_s``)."""
    t0, sizes, still = time.monotonic(), {}, 0.0
    while time.monotonic() - t0 < wait_s:
        files = _new_files(folder, before)
        now = {p: p.stat().st_size for p in files}
        if files and now == sizes:
            still += 0.5
            if still >= 2.0:
                return files
        else:
            still, sizes = 0.0, now
        time.sleep(0.5)
    raise DDProbeError(f"no trace files appeared in {folder} within {wait_s:g} s (vLLM writes into its "
                       "--profiler-config torch_profiler_dir: give that folder as --dir)")


def profile_server(url: str, num_steps: int, folder: Path | None, wait_s: float,
                   progress: Callable[[str], None] = lambda s: None, request: bool = True) -> list[Path]:
    """Profile ``num_steps`` decode steps of the server at ``url``; returns the trace files it wrote (only the new
    ones: files already in ``folder`` are left alone and not read). ``request`` False: the user's own traffic makes
    the steps (a long-context request, say); the profile is stopped once ``wait_s`` passes without files."""
    client = HttpClient(url, wait_s)
    base = client.url
    folder = (folder or Path("ddprobe-results") / f"traces-{dt.datetime.now():%Y%m%d-%H%M%S}").resolve()
    made = [p for p in (folder, *folder.parents) if not p.exists()]  # deepest first: the folders this call makes
    before = set(_new_files(folder, set()))
    body = {"output_dir": str(folder), "num_steps": num_steps, "activities": ["CPU", "GPU"],
            "profile_by_stage": False, "merge_profiles": False}
    folder.mkdir(parents=True, exist_ok=True)  # SGLang writes into it; made before asking, removed if refused
    try:
        if _call(client, "/start_profile", body) is None:
            raise _no_profiler(base, "/start_profile")
    except DDProbeError:
        for p in made:  # only the empty ones this call made, nothing else
            try:
                p.rmdir()
            except OSError:
                break
        raise
    progress(f"profiling {num_steps} steps of {base} into {folder}" + ("" if request else
             f": send your requests now (stopped after {wait_s:g} s without files)"))
    errors: list[BaseException] = []
    if request:
        worker = threading.Thread(target=lambda: _catch(errors, _load, client, num_steps), daemon=True)
        worker.start()
        worker.join(wait_s)
    else:
        t0 = time.monotonic()
        while not _new_files(folder, before) and time.monotonic() - t0 < wait_s:
            time.sleep(0.5)
    try:  # SGLang (and serve) stop by themselves after num_steps: a stop then answers 400 "not in progress"
        if _call(HttpClient(url, wait_s), "/stop_profile", {}) is None:
            raise _no_profiler(base, "/stop_profile")
    except BackendError:
        pass
    if errors:
        raise errors[0]
    return _settled(folder, before, wait_s, progress)


def _catch(errors: list, fn, *args) -> None:
    try:
        fn(*args)
    except BaseException as e:  # noqa: BLE001  (re-raised in the caller's thread)
        errors.append(e)
