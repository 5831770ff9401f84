"""Background sampler over every GPU, with phase markers.

The driver of the load calls ``mark("prefill")``, ``mark("decode")`` (first token), ``mark("idle")``
(request end); ``assign_phases`` gives each row the phase in force at the middle of its window, so GPM
numbers (which cover the window between two ticks) land where they were earned. Nothing here imports
torch; NVML is reached through ``telemetry.NvmlReader`` (or a stand-in from ``reader_factory``).
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable

from ..units import DDProbeError
from .telemetry import DEFAULT_PERIOD_S, NvmlReader, NvmlUnavailable


class Sampler:
    """Background thread sampling every GPU each ``period_s``; ``mark(phase)`` from the load's driver.

    ``reader_factory`` (tests) replaces ``NvmlReader``. Without NVML the thread does not start:
    ``available`` is False and ``sources["nvml"]`` says why.
    """

    def __init__(self, period_s: float = DEFAULT_PERIOD_S, reader_factory: Callable[[], Any] = NvmlReader,
                 clock: Callable[[], float] = time.perf_counter):
        if not 0 < period_s <= 60:
            raise DDProbeError(f"sampling period must be in (0, 60] s, got {period_s}")
        self.period_s, self._factory, self._clock = period_s, reader_factory, clock
        self.rows: list[dict[str, Any]] = []
        self.markers: list[tuple[float, str]] = []
        self.sources: dict[str, str] = {}
        self.gpus: list[dict[str, Any]] = []
        self.available = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0
        self._reader = None

    def now(self) -> float:
        """Seconds since the sampler started (the clock of ``t_s`` and of the markers)."""
        return self._clock() - self._t0

    def mark(self, phase: str, t: float | None = None) -> None:
        self.markers.append((self.now() if t is None else t, phase))

    def start(self) -> "Sampler":
        self._t0 = self._clock()
        try:
            self._reader = self._factory()
        except NvmlUnavailable as e:
            self.sources["nvml"] = f"missing: {e}"
            return self
        self.available = True
        self.sources["nvml"] = "ok"
        self.gpus = [{"index": i, "name": self._reader.name(i)} for i in range(len(self._reader.handles))]
        self._tick()  # opens the GPM windows at t = 0
        self._thread = threading.Thread(target=self._run, name="ddprobe-telemetry", daemon=True)
        self._thread.start()
        return self

    def _tick(self) -> None:
        t = self.now()
        for i in range(len(self.gpus)):
            row = {"t_s": round(t, 4), "gpu": i, "window_s": None, "phase": None}
            row.update(self._reader.read(i))
            prev = next((r for r in reversed(self.rows) if r["gpu"] == i), None)
            row["window_s"] = round(t - prev["t_s"], 4) if prev else 0.0
            self.rows.append(row)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self._tick()

    def stop(self) -> list[dict[str, Any]]:
        """Stop the thread, take one last sample, give each row its phase; returns the rows."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self._tick()
        if self._reader is not None:
            self.sources.update(self._reader.sources)
            self._reader.close()
            self._reader = None
        assign_phases(self.rows, self.markers)
        return self.rows

    def __enter__(self) -> "Sampler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def phase_at(t: float, markers: list[tuple[float, str]]) -> str:
    """The phase of the latest marker at or before ``t``; ``idle`` before the first."""
    phase = "idle"
    for tm, p in sorted(markers, key=lambda m: m[0]):
        if tm <= t:
            phase = p
        else:
            break
    return phase


def assign_phases(rows: list[dict[str, Any]], markers: list[tuple[float, str]]) -> list[dict[str, Any]]:
    """Set each row's ``phase`` from the markers, at the middle of the row's window (``t_s - window_s / 2``)."""
    for r in rows:
        w = r.get("window_s") or 0.0
        r["phase"] = phase_at(r["t_s"] - w / 2, markers)
    return rows
