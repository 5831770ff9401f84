"""SGLang's two profiling endpoints for ``ddprobe serve``: ``POST /start_profile`` and ``POST /stop_profile``.

``/start_profile`` takes SGLang's body (``output_dir``, ``num_steps``, ``activities``: "CPU", "GPU"; ``start_step``,
``profile_by_stage``, ``with_stack``, ``record_shapes``, ``merge_profiles`` and ``profile_prefix`` accepted as SGLang
does; strict as every route: an unknown field or a value of another type is a 400). The engine's worker thread starts a real ``torch.profiler`` at its next verify step, steps it once per verify
step (``ProfilerStep#N`` markers), and after ``num_steps`` steps, or at ``/stop_profile``, writes
``{output_dir}/{profile_prefix}{id}-TP-0.trace.json.gz`` (SGLang's name for one rank). "GPU" records CUDA kernels
where the engine runs on a GPU; on the CPU only the operators exist. A second start while one runs: 400; a stop with
none running: 400; an output folder that cannot be made: 400.
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Optional

from fastapi import Request
from fastapi.responses import Response
from pydantic import field_validator

from ..jsonfile import SYSTEM_TREES
from .models import Strict
from .served import ApiError, served


class ProfileRequest(Strict):
    """SGLang's ``ProfileReqInput`` (0.5.14): strict as every route (an unknown field, a float step count: 400),
    except that the step counts take the decimal strings SGLang's own clients send (``python -m sglang.profiler``
    and ``bench_serving --profile`` post ``"num_steps": "5"``)."""
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

    @field_validator("start_step", "num_steps", mode="before")
    @classmethod
    def _decimal_string(cls, v):
        return int(v) if isinstance(v, str) and v.isdecimal() and v.isascii() else v


class EngineProfiler:
    """Armed from the event loop (``start``), run by the worker thread (``tick`` between verify steps)."""

    def __init__(self, default_dir: str = "/tmp"):
        self.lock = threading.Lock()
        self.default_dir = default_dir
        self.plan: dict | None = None  # armed, not started yet
        self.prof = None
        self.steps = 0
        self.written: list[str] = []

    def start(self, req: ProfileRequest) -> Path:
        folder = Path(req.output_dir or self.default_dir).expanduser()
        real = os.path.realpath(folder)
        if any(real == t or real.startswith(t + "/") for t in SYSTEM_TREES):
            raise ApiError(400, f"output_dir {folder}: a system folder, never written", "output_dir")
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ApiError(400, f"output_dir {folder}: {e.strerror or e}", "output_dir") from None
        if req.num_steps is not None and req.num_steps < 1:
            raise ApiError(400, "num_steps must be at least 1", "num_steps")
        bad = [a for a in req.activities or [] if a.upper() not in ("CPU", "GPU", "CUDA")]
        if bad:
            raise ApiError(400, f"activities {bad}: this server records CPU and GPU only", "activities")
        with self.lock:
            if self.plan is not None or self.prof is not None:
                raise ApiError(400, "profiling is already in progress")
            self.plan = {"dir": folder, "steps": req.num_steps, "acts": [a.upper() for a in req.activities or
                                                                        ["CPU", "GPU"]],
                         "shapes": bool(req.record_shapes), "stack": bool(req.with_stack),
                         "name": f"{req.profile_prefix or ''}{time.time()}-TP-0.trace.json.gz"}
        return folder

    def tick(self) -> None:
        """Between two verify steps (the worker thread): start an armed profile, or count a step."""
        with self.lock:
            if self.prof is not None:
                self.prof.step()
                self.steps += 1
                if self.plan["steps"] is not None and self.steps >= self.plan["steps"]:
                    self._finish()
            elif self.plan is not None:
                self._begin()

    def _begin(self) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule

        acts = [ProfilerActivity.CPU] if "CPU" in self.plan["acts"] else []
        if torch.cuda.is_available() and {"GPU", "CUDA"} & set(self.plan["acts"]):
            acts.append(ProfilerActivity.CUDA)
        steps = self.plan["steps"] or 1 << 30
        self.prof = profile(activities=acts or [ProfilerActivity.CPU], record_shapes=self.plan["shapes"],
                            with_stack=self.plan["stack"], schedule=schedule(wait=0, warmup=0, active=steps + 1))
        self.prof.start()
        self.steps = 0

    def _finish(self) -> None:
        prof, plan = self.prof, self.plan
        self.prof = self.plan = None
        prof.stop()
        path = plan["dir"] / plan["name"]
        prof.export_chrome_trace(str(path))
        self.written.append(str(path))

    def stop(self) -> None:
        with self.lock:
            if self.prof is None and self.plan is None:
                raise ApiError(400, "profiling is not in progress")
            if self.prof is None:  # armed but no step came: nothing to write
                self.plan = None
                return
            self._finish()


def profiler(request: Request) -> EngineProfiler:
    return served(request).worker.profiler


async def start_profile(request: Request, req: Optional[ProfileRequest] = None):
    profiler(request).start(req or ProfileRequest())
    return Response("Start profiling.\n", status_code=200)


async def stop_profile(request: Request):
    import asyncio

    await asyncio.to_thread(profiler(request).stop)  # writing the trace takes a while: off the event loop
    return Response("Stop profiling. This will take some time.\n", status_code=200)
