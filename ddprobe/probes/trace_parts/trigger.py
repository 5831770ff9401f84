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

SUFFIXES = (".trace.json.gz", ".trace.json", ".pt.trace.json.gz", ".pt.trace.json")
PROMPT = "Count on, one number per line: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16"


def _post(url: str, body: dict | None, timeout_s: float):
    import requests

    try:
        return requests.post(url, json=body, timeout=timeout_s)
    except requests.RequestException as e:
        raise DDProbeError(f"{url}: {type(e).__name__}: {str(e)[:200]}") from None


def _refused(r, url: str, what: str) -> DDProbeError:
    if r.status_code == 404:
        return DDProbeError(f"{url} answered 404 to {what}: this server has no profiler enabled (vLLM: start it with "
                            "--profiler-config '{\"profiler\": \"torch\", \"torch_profiler_dir\": DIR}'; SGLang "
                            "always has it)")
    return DDProbeError(f"{url} answered {r.status_code} to {what}: {r.text.strip()[:200]}")


def _load(base: str, steps: int, timeout_s: float) -> None:
    """One request decoding about ``steps`` x 8 tokens, whichever protocol the server speaks."""
    n = max(16, steps * 8)
    r = _post(f"{base}/generate", {"text": PROMPT, "sampling_params": {"max_new_tokens": n, "temperature": 0}},
              timeout_s)
    if r.status_code == 404:  # vLLM: OpenAI's completions with the served model's name
        import requests

        try:
            model = requests.get(f"{base}/v1/models", timeout=30).json()["data"][0]["id"]
        except Exception as e:  # noqa: BLE001  (any answer that is not a model list)
            raise DDProbeError(f"{base}: neither /generate nor /v1/models answered usably ({e})") from None
        r = _post(f"{base}/v1/completions", {"model": model, "prompt": PROMPT, "max_tokens": n, "temperature": 0},
                  timeout_s)
    if r.status_code != 200:
        raise DDProbeError(f"{base}: the request made to profile decode steps failed ({r.status_code}: "
                           f"{r.text.strip()[:200]})")


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
    base = url.rstrip("/")
    folder = (folder or Path("ddprobe-results") / f"traces-{dt.datetime.now():%Y%m%d-%H%M%S}").resolve()
    folder.mkdir(parents=True, exist_ok=True)
    before = set(_new_files(folder, set()))
    body = {"output_dir": str(folder), "num_steps": num_steps, "activities": ["CPU", "GPU"],
            "profile_by_stage": False, "merge_profiles": False}
    r = _post(f"{base}/start_profile", body, 60)
    if r.status_code != 200:
        raise _refused(r, base, "/start_profile")
    progress(f"profiling {num_steps} steps of {base} into {folder}" + ("" if request else
             f": send your requests now (stopped after {wait_s:g} s without files)"))
    errors: list[BaseException] = []
    if request:
        worker = threading.Thread(target=lambda: _catch(errors, _load, base, num_steps, wait_s), daemon=True)
        worker.start()
        worker.join(wait_s)
    else:
        t0 = time.monotonic()
        while not _new_files(folder, before) and time.monotonic() - t0 < wait_s:
            time.sleep(0.5)
    r = _post(f"{base}/stop_profile", {}, wait_s)
    if r.status_code == 404:
        raise _refused(r, base, "/stop_profile")
    if errors:
        raise errors[0]
    return _settled(folder, before, wait_s, progress)


def _catch(errors: list, fn, *args) -> None:
    try:
        fn(*args)
    except BaseException as e:  # noqa: BLE001  (re-raised in the caller's thread)
        errors.append(e)
