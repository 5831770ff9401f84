"""The engine's own worker thread for ``ddprobe serve``: one request at a time, off the event loop.

Requests queue as ``Job``s. The worker runs each through the backend's ``generate`` with an
``on_tokens`` hook that, between verify steps, (1) stops the decode when the job was cancelled
(the client went away) or a stop string / stop token appeared, and (2) hands the new tokens to the
event loop (one event per verify step: what streaming sends). Plain greedy (``--no-spec``) goes
through the same hook token by token. A job cancelled while still queued never starts. Counters
and the running gauge are updated before the job's last event, so a client that has its answer
reads ``/metrics`` that include it (and no longer count it as running). ``shutdown`` (the server's first
SIGINT/SIGTERM) cancels the running job at its next step and every queued one: each gets a ("shutdown", ...)
event. ``call`` hands the engine thread a command (the profiler's start and stop): it runs between two forward
steps (or at once when the engine is idle), never on another thread. Nothing here imports FastAPI.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from ..probes.backends.base import BackendError, GenStats, StopGeneration


@dataclass
class Job:
    ids: list[int]
    max_new: int
    temperature: float = 0.0
    stop: list[str] = field(default_factory=list)
    stop_ids: list[int] = field(default_factory=list)
    seed: int | None = None
    loop: asyncio.AbstractEventLoop | None = None
    events: asyncio.Queue | None = None  # ("tokens", [ids]) ... then ("done", GenStats), ("error", message)
    # (the request's fault: a 400), ("internal", message) (the engine's: a 500) or ("shutdown", GenStats of the
    # tokens so far, None when it never started) (the server is stopping)
    cancel: threading.Event = field(default_factory=threading.Event)
    prefilled: bool = False  # the engine thread has seen the prefill's token

    def post(self, kind: str, value: Any) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))


def stop_cut(text_of: Callable[[list[int]], str], toks: list[int], stop: list[str], stop_ids: list[int],
             checked: int) -> int | None:
    """How many tokens to keep if a stop applies, else None. A stop token ends the output after it
    (``stop_token_ids``); a stop string ends it at the token that completed it (the server then returns
    the text before the string, as OpenAI does). Only tokens past ``checked`` can complete a new stop;
    when both kinds apply in one step, the earlier cut wins."""
    cuts = [next((i + 1 for i in range(checked, len(toks)) if toks[i] in stop_ids), None)]
    if stop and any(s in text_of(toks) for s in stop):
        cuts.append(next(k for k in range(max(checked, 1), len(toks) + 1) if any(s in text_of(toks[:k]) for s in stop)))
    return min((c for c in cuts if c is not None), default=None)


def held_tail(text: str, stop: list[str]) -> int:
    """How many characters at the end of ``text`` a stream must hold back: the longest tail that is the
    start of some stop string (later tokens may complete it, and then it is never sent)."""
    return max((k for s in stop for k in range(min(len(s) - 1, len(text)), 0, -1) if text.endswith(s[:k])),
               default=0)


def cut_at_stop(text: str, stop: list[str]) -> str:
    """The text before the first stop string (all of it when none occurs)."""
    hits = [text.find(s) for s in stop if s in text]
    return text[:min(hits)] if hits else text


WAKE = object()  # put on the queue so that an idle engine thread runs the commands waiting


class EngineWorker:
    """One thread that owns the engine; ``submit`` from the event loop, await ``job.events``."""

    def __init__(self, backend, spec: bool = True, on_done: Callable[[Job, GenStats], None] | None = None):
        self.backend, self.spec, self.on_done = backend, spec, on_done
        self.queue: queue.Queue[Job | None] = queue.Queue()
        self.running = 0
        self.current: Job | None = None  # the job the engine is on
        self.closing = False
        self.profiler = None  # server.profile.EngineProfiler: told of every forward step, on this thread only
        self.commands: queue.Queue = queue.Queue()  # (fn, Future): run on the engine thread between steps
        self.thread = threading.Thread(target=self.loop, name="ddprobe-engine", daemon=True)
        self.thread.start()

    @property
    def waiting(self) -> int:
        return self.queue.qsize()

    def submit(self, job: Job) -> Job:
        job.loop = asyncio.get_running_loop()
        job.events = asyncio.Queue()
        if self.closing:
            job.post("shutdown", None)
        else:
            self.queue.put(job)
        return job

    def close(self) -> None:
        self.queue.put(None)

    def call(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        """Run ``fn`` on the engine thread between two forward steps (at once when idle); its result or exception
        comes back through the future. After the thread has ended the command is run where it is asked."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self.commands.put((fn, fut))
        self.queue.put(WAKE)
        if not self.thread.is_alive():
            self.run_commands()
        return fut

    def run_commands(self) -> None:
        while True:
            try:
                fn, fut = self.commands.get_nowait()
            except queue.Empty:
                return
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as e:  # noqa: BLE001  (handed back to the caller)
                fut.set_exception(e)

    def shutdown(self) -> None:
        """Stop taking work: the running job ends at its next step, queued ones never start (each gets a
        "shutdown" event); the thread ends after them. Safe to call from a signal handler, and more than once."""
        if self.closing:
            return
        self.closing = True
        job = self.current
        if job is not None:
            job.cancel.set()
        self.close()

    def join(self, timeout_s: float) -> bool:
        """Wait for the thread to end (after ``close`` or ``shutdown``); True when it did."""
        self.thread.join(timeout_s)
        return not self.thread.is_alive()

    def loop(self) -> None:
        while (job := self.queue.get()) is not None:
            self.run_commands()
            if job is WAKE:
                continue
            if self.closing:
                job.post("shutdown", None)
                continue
            if job.cancel.is_set():
                continue  # the client left while the job was queued
            self.current, self.running = job, 1
            if self.closing:  # shutdown came between the check above and ``current``
                job.cancel.set()
            try:
                kind, value = "done", self.run(job)
            except BackendError as e:
                kind, value = "error", str(e)
            except Exception as e:  # never let one request kill the worker
                kind, value = "internal", f"internal error: {type(e).__name__}: {e}"
            self.current, self.running = None, 0  # before the last event: a client that has its answer never
            # sees it running
            if kind == "done" and self.on_done is not None:
                self.on_done(job, value)
            cut_short = kind == "done" and self.closing and value.extra.get("finish_reason") == "abort"
            job.post("shutdown" if cut_short else kind, value)
        self.run_commands()

    def run(self, job: Job) -> GenStats:
        try:
            return self._run(job)
        finally:
            self._tell("idle")

    def _tell(self, what: str, *args) -> None:
        """The profiler's step hook ``what``: a profiler that fails is the profile's failure (said at the next
        /stop_profile), never the request's."""
        if self.profiler is None:
            return
        try:
            getattr(self.profiler, what)(*args)
        except Exception as e:  # noqa: BLE001
            self.profiler.broken(e)

    def _step(self, done: str | None, ctx: int) -> None:
        """Between two forward steps: the commands waiting, then the profiler told that a step of kind ``done``
        ran ("EXTEND" the prefill, "DECODE" a verify step) and that a verify step at context ``ctx`` comes next."""
        self.run_commands()
        if done is not None:
            self._tell("after", done)
        if self.profiler is not None:
            self._tell("before", "DECODE", ctx, self.rows)

    def _run(self, job: Job) -> GenStats:
        sent: list[int] = []
        if self.profiler is not None:  # the prefill is a forward step, as SGLang counts them
            self.rows = self.backend.describe().get("budget", 0) + 1 if self.spec else 1
            self.run_commands()
            self._tell("before", "EXTEND", len(job.ids), len(job.ids))

        def on_tokens(new: list[int]) -> None:
            self._step("DECODE" if job.prefilled else "EXTEND", len(job.ids) + len(sent) + len(new))
            job.prefilled = True
            if job.cancel.is_set():
                raise StopGeneration("abort")
            checked = len(sent)
            sent.extend(new)
            cut = stop_cut(self.backend.decode, sent, job.stop, job.stop_ids, checked) \
                if job.stop or job.stop_ids else None
            if cut is not None:
                keep = cut
                if keep > checked:
                    job.post("tokens", sent[checked:keep])
                raise StopGeneration("stop", keep=keep)
            job.post("tokens", new)

        if not self.spec:
            return self.greedy(job, sent, on_tokens)
        hooks = inspect.signature(self.backend.generate).parameters
        kw = {"on_prefill": self.stop_if_closing} if "on_prefill" in hooks else {}  # a shutdown ends a prefill too
        return self.backend.generate(job.ids, job.max_new, temperature=job.temperature, on_tokens=on_tokens,
                                     seed=job.seed, **kw)

    def stop_if_closing(self, done: int = 0, total: int = 0) -> None:
        self.run_commands()  # a long prefill takes the profiler's commands between its chunks
        if self.closing:
            raise StopGeneration("abort")

    def greedy(self, job: Job, sent: list[int], on_tokens: Callable[[list[int]], None]) -> GenStats:
        """Plain greedy (``--no-spec``): token by token through the backend's ``on_token`` hook, so a
        cancel or a stop ends it at the next token (a backend without the hook: all, then cut)."""
        finish = "length"
        if "on_token" in inspect.signature(self.backend.greedy).parameters:
            try:
                self.backend.greedy(job.ids, job.max_new, on_token=lambda t: on_tokens([t]))
            except StopGeneration as e:
                finish = e.reason
                if e.keep is not None:
                    del sent[e.keep:]
            toks = list(sent)
        else:
            toks = self.backend.greedy(job.ids, job.max_new)
            cut = stop_cut(self.backend.decode, toks, job.stop, job.stop_ids, 0)
            if cut is not None:
                toks, finish = toks[:cut], "stop"
            job.post("tokens", toks)
        return GenStats(prompt_tokens=len(job.ids), completion_tokens=len(toks), verify_steps=0, tokens=toks,
                        extra={"finish_reason": finish})
