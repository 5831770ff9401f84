"""Background sampler over every GPU, with phase markers.

The driver of the load calls ``mark("prefill")``, ``mark("decode")`` (first token), ``mark("idle")``
(request end); ``assign_phases`` gives each row the phase in force at the middle of its window, so GPM
numbers (which cover the window between two ticks) land where they were earned. The GPUs are read through
a ``sources.TelemetrySource`` (NVML by default, dcgm-exporter endpoints, or a stand-in from
``reader_factory``); with ``reader_factory=None`` the sampler only keeps the clock and the markers (the
Prometheus source reads its window afterwards). Nothing here imports torch.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable

from ...units import DDProbeError
from .sources import SourceUnavailable, undo_resets
from .nvml import DEFAULT_PERIOD_S, NvmlReader


class Sampler:
    """Background thread sampling every GPU each ``period_s``; ``mark(phase)`` from the load's driver.

    ``reader_factory`` returns the source (default ``NvmlReader``). When it cannot open the thread does not
    start: ``available`` is False and ``sources[kind]`` says why (kind ``nvml`` unless the factory names
    another). ``t0_unix`` is the wall-clock time of ``t_s = 0``.
    """

    def __init__(self, period_s: float = DEFAULT_PERIOD_S,
                 reader_factory: Callable[[], Any] | None = NvmlReader,
                 clock: Callable[[], float] = time.perf_counter):
        if not 0 < period_s <= 60:
            raise DDProbeError(f"sampling period must be in (0, 60] s, got {period_s}")
        self.period_s, self._factory, self._clock = period_s, reader_factory, clock
        self.rows: list[dict[str, Any]] = []
        self.markers: list[tuple[float, str]] = []
        self.sources: dict[str, str] = {}
        self.gpus: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.available = False
        self.t0_unix = 0.0
        self.kind = getattr(reader_factory, "kind", "nvml")
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
        self._t0, self.t0_unix = self._clock(), time.time()
        if self._factory is None:
            return self
        try:
            self._reader = self._factory()
            self.gpus = self._reader.open()
        except SourceUnavailable as e:
            self.sources[self.kind] = f"missing: {e}"
            if self._reader is not None:
                self._reader.close()
                self._reader = None
            return self
        self.available = True
        self.sources[self.kind] = "ok"
        self._tick()  # opens the GPM windows at t = 0
        self._thread = threading.Thread(target=self._run, name="ddprobe-telemetry", daemon=True)
        self._thread.start()
        return self

    def _tick(self) -> None:
        t = self.now()
        for i, (g, read) in enumerate(zip(self.gpus, self._reader.sample())):
            row = {"t_s": round(t, 4), "gpu": i, "window_s": None, "phase": None}
            row.update({k: g[k] for k in ("node", "node_gpu") if k in g})
            row.update(read)
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
            self.notes += getattr(self._reader, "notes", [])
            self._reader.close()
            self._reader = None
        undo_resets(self.rows, self.notes)
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
