"""``ddprobe trace --url``: make a server write its torch-profiler traces of decode steps at the asked context,
then hand their folder to the analysis.

The protocol is SGLang's (``ddprobe serve`` implements the same two endpoints):
``POST /start_profile`` with ``{"output_dir", "num_steps", "activities": ["CPU", "GPU"], "profile_by_stage": true,
"profile_stages": ["decode"], "with_stack": false, "detailed_annotations": true, "merge_profiles": false}``:
SGLang counts every forward pass from the start, the prefill included, so without ``profile_by_stage`` a long
request's profile would be its prefill; by stage it writes the decode steps apart (``-DECODE``), and with the
detailed annotations each step names its mode, batch and context (``step[TARGET_VERIFY bs=1 ... g_sk=N]``). A server
that refuses the newer fields (an older SGLang answers 400 naming one) is asked again without them.
``with_stack`` false: SGLang's default (true) makes traces several times heavier. Then ``POST /stop_profile``.
vLLM takes the same two POSTs (its body: ``num_steps``; unknown keys ignored; it has no stage option: its
profile may hold the prefill, which its step annotations set apart) and writes ``..._rank{r}.{ts}.pt.trace.json.gz``
into the ``torch_profiler_dir`` of its ``--profiler-config``, not into a folder the caller names: ``--dir`` must
be that folder. A server that has no profiler answers 404 (vLLM without ``--profiler-config``): one line.

While profiling is on, one request of ``ctx`` prompt tokens (token ids 100-199 repeated, valid in any
vocabulary of 200 or more; or the user's prompt file as text) decodes enough tokens for the steps asked
(``/generate`` for SGLang and ``ddprobe serve``, ``/v1/completions`` for vLLM), so the profile holds decode /
verify steps at that context. The files are taken once their sizes stop changing. Every answer is bounded by
``--wait`` (a server that trickles its answer included) and a late one says so, naming ``--wait``.
"""
from __future__ import annotations

import datetime as dt
import os
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


def prompt_of(ctx: int | None, prompt_file: Path | None) -> tuple[str, object]:
    """("text", str) from the user's prompt file, ("ids", list) of ``ctx`` token ids, or ("text", a short prompt)."""
    if prompt_file is not None:
        from ...jsonfile import read_regular  # a FIFO or a device refused, never read until its writer comes

        text = read_regular(prompt_file, "--prompt-file").decode("utf-8", errors="replace")
        if not text.strip():
            raise DDProbeError(f"--prompt-file {prompt_file}: empty")
        return "text", text
    if ctx:
        return "ids", [100 + i % 100 for i in range(ctx)]
    return "text", PROMPT


def _load(client, steps: int, prompt: tuple[str, object]) -> None:
    """One request decoding about ``steps`` x 8 tokens after ``prompt``, whichever protocol the server speaks."""
    n, why = max(16, steps * 8), "the request made to profile decode steps"
    kind, value = prompt
    sglang = {("input_ids" if kind == "ids" else "text"): value,
              "sampling_params": {"max_new_tokens": n, "temperature": 0}}
    if _call(client, "/generate", sglang, what=why) is not None:
        return
    models = _call(client, "/v1/models", method="GET", what="neither /generate nor /v1/models answered")
    try:
        model = models["data"][0]["id"]
    except (TypeError, KeyError, IndexError):
        raise DDProbeError(f"{client.url}: neither /generate nor /v1/models answered usably") from None
    body = {"model": model, "prompt": value, "max_tokens": n, "temperature": 0}
    if _call(client, "/v1/completions", body, what=why) is None:
        raise DDProbeError(f"{client.url}: neither /generate nor /v1/completions exists: not SGLang, vLLM or serve")


NEWER = ("profile_stages", "detailed_annotations")  # fields an older SGLang may not know


def _start(client, body: dict) -> bool:
    """POST /start_profile; asked again without ``NEWER``'s fields when the server refuses one by name. False: 404."""
    try:
        return _call(client, "/start_profile", body) is not None
    except BackendError as e:
        if "HTTP 400" in str(e) and any(k in str(e) for k in NEWER):
            return _call(client, "/start_profile", {k: v for k, v in body.items() if k not in NEWER}) is not None
        raise


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
                   progress: Callable[[str], None] = lambda s: None, request: bool = True, ctx: int | None = None,
                   prompt_file: Path | None = None) -> list[Path]:
    """Profile ``num_steps`` decode steps of the server at ``url``; returns the trace files it wrote (only the new
    ones: files already in ``folder`` are left alone and not read). ``request`` False: the user's own traffic makes
    the steps (a long-context request, say); the profile is stopped once ``wait_s`` passes without files.
    ``ctx`` / ``prompt_file``: the request's prompt (``prompt_of``)."""
    client = HttpClient(url, wait_s, timeout_flag="--wait")  # a late answer names --wait, trace's own option
    base = client.url
    prompt = prompt_of(ctx, prompt_file)
    folder = Path(os.path.realpath(folder or Path("ddprobe-results") / f"traces-{dt.datetime.now():%Y%m%d-%H%M%S}"))
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):  # realpath stops at a loop, never raises
        raise DDProbeError(f"--dir {folder}: not a folder (a symbolic link loop, or a file)")
    made = [p for p in (folder, *folder.parents) if not p.exists()]  # deepest first: the folders this call makes
    before = set(_new_files(folder, set()))
    body = {"output_dir": str(folder), "num_steps": num_steps, "activities": ["CPU", "GPU"],
            "profile_by_stage": True, "profile_stages": ["decode"], "with_stack": False,
            "detailed_annotations": True, "merge_profiles": False}
    folder.mkdir(parents=True, exist_ok=True)  # SGLang writes into it; made before asking, removed if refused
    try:
        if not _start(client, body):
            raise _no_profiler(base, "/start_profile")
    except DDProbeError:
        for p in made:  # only the empty ones this call made, nothing else
            try:
                p.rmdir()
            except OSError:
                break
        raise
    at = (f" at {ctx:,} tokens of context" if ctx and not prompt_file else " after the prompt file" if prompt_file
          else " (no --ctx: a short prompt, so steps at a few dozen tokens of context)" if request else "")
    progress(f"profiling {num_steps} decode steps{at} of {base} into {folder}" + ("" if request else
             f": send your requests now (stopped after {wait_s:g} s without files)"))
    errors: list[BaseException] = []
    if request:
        worker = threading.Thread(target=lambda: _catch(errors, _load, client, num_steps, prompt), daemon=True)
        worker.start()
        worker.join(wait_s)
        if worker.is_alive():
            errors.append(DDProbeError(f"{base}: the request made to profile decode steps did not finish within "
                                       f"{wait_s:g} s (--wait)"))
    else:
        t0 = time.monotonic()
        while not _new_files(folder, before) and time.monotonic() - t0 < wait_s:
            time.sleep(0.5)
    try:  # SGLang (and serve) stop by themselves after num_steps: a stop then answers 400 "not in progress"
        if _call(HttpClient(url, wait_s, timeout_flag="--wait"), "/stop_profile", {}) is None:
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
