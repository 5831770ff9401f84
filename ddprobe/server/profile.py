"""SGLang's two profiling endpoints for ``ddprobe serve``: ``POST /start_profile`` and ``POST /stop_profile``.

Everything the profiler does runs on the engine's own thread, between forward steps (``EngineWorker.call``): the
routes only check the body and hand the engine a command, so a stop while a profile runs, two stops at once, a stop
during a generate or a storm of starts and stops are each one command after another on one thread (a
``torch.profiler`` started on one thread and stopped from another crashed the server, exit 139).

Steps are counted as SGLang counts them: every forward pass, the prefill included (one step per request's prefill,
one per verify step). ``/start_profile`` takes SGLang's body (strict as every route):

- ``num_steps`` (steps per profile; none: until ``/stop_profile``), ``output_dir``, ``activities`` ("CPU", "GPU");
- ``start_step``: the server's forward-step count at which to start (SGLang's absolute count; one already past:
  the next step);
- ``profile_by_stage``: one profile per stage, ``num_steps`` steps each, written as ``...-TP-0-EXTEND`` (prefill)
  and ``...-TP-0-DECODE`` (verify steps); ``profile_stages`` (``prefill``/``extend``, ``decode``) keeps only those;
  without ``num_steps`` each stage is recorded once: the prefill until decoding starts, the decode until
  ``/stop_profile`` (a later request's prefill is not recorded again: each file is written once);
- ``with_stack`` (SGLang's default: on), ``record_shapes``;
- ``detailed_annotations`` (or ``roofline_annotations``): each step carries SGLang's span
  ``step[TARGET_VERIFY bs=1 g_sq=9 g_sqsq=81 g_sqsk=.. g_sk=N]`` (``step[EXTEND bs=1 toks=N c_sq=.. c_sk=N]`` for
  the prefill), N the context the step attends over;
- ``merge_profiles`` true is refused by name (one rank: nothing to merge); ``profile_prefix`` must be a plain file
  name piece (no ``/``, no ``..``): the file is ``{output_dir}/{profile_prefix}{id}-TP-0[-STAGE].trace.json.gz``.

A second start while one runs: 400; a stop with none running: 400. A trace that cannot be written fails the
``/stop_profile`` that wrote it (a 500 naming the file); one that finishes by itself during a request keeps the
request whole and fails the next ``/stop_profile`` instead.
"""
from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Optional

from fastapi import Request
from fastapi.responses import Response
from pydantic import field_validator

from ..jsonfile import SYSTEM_TREES
from .models import Strict
from .served import ApiError, served

STAGES = {"prefill": "EXTEND", "extend": "EXTEND", "decode": "DECODE"}
COMMAND_S = 600.0  # the longest a route waits for the engine thread to take its command (writing a trace included)
PREFIX_MAX = 128
STEPS_MAX = 10**9  # num_steps and start_step: a billion forward steps is weeks of decoding; beyond, a typo


class ProfileRequest(Strict):
    """SGLang's ``ProfileReqInput``: strict as every route (an unknown field, a float step count: 400), except
    that the step counts take the decimal strings SGLang's own clients send (``python -m sglang.profiler`` and
    ``bench_serving --profile`` post ``"num_steps": "5"``)."""
    output_dir: Optional[str] = None
    start_step: Optional[int] = None
    num_steps: Optional[int] = None
    profile_stages: Optional[list[str]] = None
    activities: Optional[list[str]] = None
    profile_by_stage: bool = False
    with_stack: Optional[bool] = None
    record_shapes: Optional[bool] = None
    merge_profiles: bool = False
    profile_prefix: Optional[str] = None
    detailed_annotations: Optional[bool] = None
    roofline_annotations: Optional[bool] = None

    @field_validator("start_step", "num_steps", mode="before")
    @classmethod
    def _decimal_string(cls, v):
        return int(v) if isinstance(v, str) and v.isdecimal() and v.isascii() else v


def _prefix(p: str | None) -> str:
    p = p or ""
    if len(p) > PREFIX_MAX or any(c in p for c in "/\\\0") or p in (".", "..") or p.startswith(".."):
        raise ApiError(400, f"profile_prefix {p[:40]!r}: a file name prefix (no '/', '\\' or '..', at most "
                            f"{PREFIX_MAX} characters): the trace is written inside output_dir", "profile_prefix")
    return p


def _folder(req: ProfileRequest, default_dir: str) -> Path:
    folder = Path(req.output_dir or default_dir).expanduser()
    real = os.path.realpath(folder)
    if any(real == t or real.startswith(t + "/") for t in SYSTEM_TREES):
        raise ApiError(400, f"output_dir {folder}: a system folder, never written", "output_dir")
    if os.path.lexists(folder) and not folder.is_dir():  # a file, or a symbolic link loop or to nothing
        what = "a symbolic link to no folder (a loop, or a dangling link)" if folder.is_symlink() else "not a folder"
        raise ApiError(400, f"output_dir {folder}: {what}", "output_dir")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (OSError, RuntimeError) as e:
        raise ApiError(400, f"output_dir {folder}: {getattr(e, 'strerror', None) or e}", "output_dir") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ApiError(400, f"output_dir {folder}: not writable by this server", "output_dir")
    return folder


def plan_of(req: ProfileRequest, default_dir: str) -> dict:
    """The profile ``req`` asks for, checked (ApiError 400 naming the field), before the engine sees it."""
    if req.merge_profiles:
        raise ApiError(400, "merge_profiles true: this server is one rank, its trace is already whole (send false)",
                       "merge_profiles")
    if req.num_steps is not None and not 1 <= req.num_steps <= STEPS_MAX:
        raise ApiError(400, f"num_steps must be 1 to {STEPS_MAX:,}", "num_steps")
    if req.start_step is not None and not 0 <= req.start_step <= STEPS_MAX:
        raise ApiError(400, f"start_step must be 0 to {STEPS_MAX:,} (a forward-step count)", "start_step")
    bad = [a for a in req.activities or [] if a.upper() not in ("CPU", "GPU", "CUDA")]
    if bad:
        raise ApiError(400, f"activities {bad}: this server records CPU and GPU only", "activities")
    stages = [s.lower() for s in req.profile_stages or []]
    if any(s not in STAGES for s in stages):
        raise ApiError(400, f"profile_stages {req.profile_stages}: this server has the stages prefill (extend) and "
                            "decode", "profile_stages")
    if stages and not req.profile_by_stage:
        raise ApiError(400, "profile_stages needs profile_by_stage true", "profile_stages")
    prefix = _prefix(req.profile_prefix)
    folder = _folder(req, default_dir)
    return {"dir": folder, "steps": req.num_steps, "acts": [a.upper() for a in req.activities or ["CPU", "GPU"]],
            "shapes": bool(req.record_shapes), "stack": req.with_stack is not False,
            "start": req.start_step, "by_stage": req.profile_by_stage,
            "stages": {STAGES[s] for s in stages} or {"EXTEND", "DECODE"},
            "labels": bool(req.detailed_annotations or req.roofline_annotations),
            "name": f"{prefix}{time.time()}-TP-0"}


class EngineProfiler:
    """The profiler of the engine thread: ``arm`` and ``stop`` come as commands (``EngineWorker.call``), ``before``
    and ``after`` are called by the worker around every forward step. Nothing here is touched from another
    thread."""

    def __init__(self, default_dir: str = "/tmp"):
        self.default_dir = default_dir
        self.plan: dict | None = None  # armed or running
        self.prof = None
        self.stage: str | None = None  # the stage the running profile records (by_stage), else None
        self.steps = 0  # steps of the running profile
        self.done: dict[str, int] = {}  # by_stage: steps recorded per stage
        self.forward_ct = 0  # the server's forward steps since it started (SGLang's forward_ct)
        self.label = None  # the open step span (detailed annotations)
        self.pending: str | None = None  # the stage of the step announced by ``before`` and not run yet
        self.written: list[str] = []
        self.failed: str | None = None  # a trace that could not be written when it finished by itself

    # commands (engine thread)
    def arm(self, plan: dict) -> None:
        if self.plan is not None:
            raise ApiError(400, "profiling is already in progress")
        self.plan, self.steps, self.done, self.stage = plan, 0, {}, None

    def stop(self) -> None:
        if self.plan is None:
            failed, self.failed = self.failed, None
            if failed:
                raise ApiError(500, failed)
            raise ApiError(400, "profiling is not in progress")
        err = self._finish() if self.prof is not None else None
        self.plan = None
        if err:
            raise ApiError(500, err)

    # step hooks (engine thread)
    def before(self, stage: str, ctx: int, rows: int) -> None:
        """A forward step of ``stage`` ("EXTEND" or "DECODE") at context ``ctx`` is about to run."""
        self.forward_ct += 1
        self.pending = stage
        p = self.plan
        if p is None:
            return
        if p["start"] is not None and self.forward_ct < p["start"]:
            return
        if p["by_stage"]:
            if stage not in p["stages"] or self.done.get(stage, 0) >= (p["steps"] or 1 << 62):
                return  # a step this profile does not record (a prefill between decode steps): it goes on
            if self.prof is not None and self.stage != stage:
                if p["steps"] is None:  # no num_steps: each stage is recorded once, until the next stage starts
                    self.done[self.stage] = 1 << 62
                self._finished_by_itself()  # SGLang flushes the prefill's profile when decoding starts
            if self.prof is None:
                self._begin(stage)
        elif self.prof is None:
            self._begin(None)
        if p["labels"] and self.prof is not None:
            self._open_label(stage, ctx, rows)

    def after(self, stage: str) -> None:
        """The step announced by ``before`` has run."""
        self.pending = None
        if self.label is not None:
            self.label.__exit__(None, None, None)
            self.label = None
        if self.prof is None or (self.stage is not None and self.stage != stage):
            return
        self.prof.step()
        self.steps += 1
        if self.stage is not None:
            self.done[self.stage] = self.done.get(self.stage, 0) + 1
        if self.plan["steps"] is not None and self.steps >= self.plan["steps"]:
            self._finished_by_itself()
            p = self.plan
            if p is not None and (not p["by_stage"] or all(self.done.get(s, 0) >= p["steps"] for s in p["stages"])):
                self.plan = None

    def broken(self, e: Exception) -> None:
        """A step hook raised: the profile is dropped, the next /stop_profile says why."""
        self.failed = f"the profiler failed: {type(e).__name__}: {e}"
        self.plan = self.prof = self.label = self.pending = None
        self.stage = None

    def idle(self) -> None:
        """The request ended: the step announced last never ran (not counted; its span closed)."""
        if self.pending is not None:
            self.forward_ct -= 1
            self.pending = None
        if self.label is not None:
            self.label.__exit__(None, None, None)
            self.label = None

    def _open_label(self, stage: str, ctx: int, rows: int) -> None:
        from torch.profiler import record_function

        if stage == "EXTEND":
            name = f"step[EXTEND bs=1 toks={rows} c_sq={rows} c_sqsq={rows * rows} c_sqsk={rows * ctx} c_sk={ctx}]"
        else:  # a verify step (the tree's rows), or a plain decode step (--no-spec: one row)
            mode = "TARGET_VERIFY" if rows > 1 else "DECODE"
            name = f"step[{mode} bs=1 g_sq={rows} g_sqsq={rows * rows} g_sqsk={rows * ctx} g_sk={ctx}]"
        self.label = record_function(name)
        self.label.__enter__()

    def _begin(self, stage: str | None) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule

        p = self.plan
        acts = [ProfilerActivity.CPU] if "CPU" in p["acts"] else []
        if torch.cuda.is_available() and {"GPU", "CUDA"} & set(p["acts"]):
            acts.append(ProfilerActivity.CUDA)
        steps = p["steps"] or 1 << 30
        self.prof = profile(activities=acts or [ProfilerActivity.CPU], record_shapes=p["shapes"],
                            with_stack=p["stack"], schedule=schedule(wait=0, warmup=0, active=steps + 1))
        self.prof.start()
        self.stage, self.steps = stage, 0

    def _finish(self) -> str | None:
        """Stop the running profile and write its trace; the error line when it cannot be written."""
        prof, stage = self.prof, self.stage
        self.prof, self.stage = None, None
        if self.label is not None:
            self.label.__exit__(None, None, None)
            self.label = None
        path = self.plan["dir"] / (self.plan["name"] + (f"-{stage}" if stage else "") + ".trace.json.gz")
        try:
            prof.stop()
            prof.export_chrome_trace(str(path))
        except Exception as e:  # noqa: BLE001  (a full disk, a folder removed: the profile's failure, no one else's)
            return f"the trace {path} could not be written: {type(e).__name__}: {e}"
        self.written.append(str(path))
        return None

    def _finished_by_itself(self) -> None:
        err = self._finish()
        if err:
            self.failed, self.plan = err, None


def profiler(request: Request) -> EngineProfiler:
    return served(request).worker.profiler


async def _on_engine(request: Request, fn) -> None:
    fut = served(request).worker.call(fn)
    try:
        await asyncio.wait_for(asyncio.wrap_future(fut), COMMAND_S)
    except asyncio.TimeoutError:
        raise ApiError(503, f"the engine did not take the profiler command within {COMMAND_S:g} s") from None


async def start_profile(request: Request, req: Optional[ProfileRequest] = None):
    prof = profiler(request)
    plan = await asyncio.to_thread(plan_of, req or ProfileRequest(), prof.default_dir)
    await _on_engine(request, lambda: prof.arm(plan))
    return Response("Start profiling.\n", status_code=200)


async def stop_profile(request: Request):
    prof = profiler(request)
    await _on_engine(request, prof.stop)  # writing the trace takes a while: the engine thread does it
    return Response("Stop profiling. This will take some time.\n", status_code=200)
