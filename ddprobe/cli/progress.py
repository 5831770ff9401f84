"""Progress of the measured cells on the terminal: prefill (tokens done of the prompt, tokens/s, ETA) and
decode (tokens of max_new_tokens), one cell at a time, with the run's cells done and time elapsed.

``CellDisplay`` implements the probes' ``CellProgress``. Where it draws:
- stderr is a terminal: a live display on stderr (``err``), gone when the run ends; when the command
  already keeps a live table on a terminal stdout (``commit``), the bars are drawn under that table in the
  same live region instead (two live regions on one screen would overwrite each other) and removed at the end;
- stderr is not a terminal (tests, CI, pipes): one plain line per cell on stderr, nothing else.
It never writes to stdout itself, so tables, JSON and CSV on stdout stay as they were.

Prefill ETA: with the calibration's fit (``estimate.PrefillFit``) the rest of the prompt costs
T(total) - T(done) (attention makes later chunks slower than earlier ones), scaled by how this cell's chunks
compare with the fit so far; without it, the tokens left at the rate so far.
"""
from __future__ import annotations

import time
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress import BarColumn, Progress, ProgressColumn, SpinnerColumn, TextColumn
from rich.table import Column
from rich.text import Text

from ..probes.commit import CellProgress
from ..probes.bench.estimate import PrefillFit
from ..units import fmt_tokens


def prefill_eta(done: int, total: int, reused: int, elapsed_s: float, fit: PrefillFit | None = None) \
        -> float | None:
    """Seconds left of a prefill at ``done`` of ``total`` tokens (``reused`` of them came from the cache and
    cost nothing), ``elapsed_s`` after it started. None before anything is known."""
    if done >= total:
        return 0.0
    if fit is not None and (fit.a > 0 or fit.b > 0):
        left = fit.cumulative(total) - fit.cumulative(done)
        so_far = fit.cumulative(done) - fit.cumulative(reused)
        if done > reused and so_far > 0 and elapsed_s > 0:
            return left * elapsed_s / so_far  # the fit's shape, at this cell's measured pace
        return max(fit.seconds(total, done) - elapsed_s, 0.0)  # nothing measured yet: the calibration alone
    if done > reused and elapsed_s > 0:
        return (total - done) * elapsed_s / (done - reused)
    return None


def decode_eta(done: int, total: int, elapsed_s: float) -> float | None:
    """Seconds left of a decode at ``done`` of ``total`` tokens, ``elapsed_s`` after its first token."""
    if done >= total:
        return 0.0
    if done > 1 and elapsed_s > 0:
        return (total - done) * elapsed_s / (done - 1)  # the first token came with the prefill
    return None


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "-:--"
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class _CellColumn(ProgressColumn):
    """tokens done/total, tokens/s and ETA of the running phase (ticking down between hook calls)."""

    def render(self, task) -> Text:
        f = task.fields
        if f.get("phase") is None:
            return Text("")
        if f["phase"] == "run":
            return Text(f"{_clock(time.monotonic() - f['t0'])} elapsed" + (f"  (estimate {f['estimate']})"
                                                                          if f.get("estimate") else ""), style="dim")
        if f["phase"] == "wait":  # a backend without progress (HTTP): elapsed only
            return Text(f"{_clock(time.monotonic() - f['t0'])} elapsed", style="dim")
        total, done = int(task.total or 0), int(task.completed)
        parts = [f"{done:,}/{total:,} tok"]
        if f.get("rate"):
            parts.append(f"{f['rate']:,.0f} tok/s")
        deadline = f.get("deadline")
        parts.append("ETA " + (_clock(max(deadline - time.monotonic(), 0.0)) if deadline else "-:--"))
        if f.get("reused"):
            parts.append(f"({fmt_tokens(f['reused'])} reused)")
        return Text(" ".join(parts), style="dim")


class CellDisplay(CellProgress):
    """Draws the cells of a run (see the module docstring). Use as a context manager around the run;
    ``embed_in``: the command's live region on a terminal stdout, whose renderable the bars join."""

    def __init__(self, console: Console, n_cells: int, fit: PrefillFit | None = None, *,
                 embed_in: Live | None = None, label: str = "cells", live: bool | None = None,
                 estimate: str | None = None):
        self.console, self.n_cells, self.fit, self.embed_in, self.label = console, n_cells, fit, embed_in, label
        self.live = (console.is_terminal and not console.is_dumb_terminal) if live is None else live
        self.live = self.live or embed_in is not None
        self.done_cells, self.cell = 0, {}
        self.progress: Progress | None = None
        if self.live:
            narrow = console.width < 100
            self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}", markup=False),
                                     BarColumn(bar_width=10 if narrow else 24),
                                     _CellColumn(table_column=Column(no_wrap=True, overflow="ellipsis")),
                                     console=console, transient=True, refresh_per_second=4,
                                     redirect_stdout=False, redirect_stderr=False)
            self.run_task = self.progress.add_task(f"{label} 0/{n_cells}", total=n_cells, phase="run",
                                                   t0=time.monotonic(), estimate=estimate)
            self.cell_task = self.progress.add_task("", total=None, visible=False, phase=None)
        self._embedded_base: RenderableType | None = None

    # ---- context -------------------------------------------------------------------------
    def __enter__(self) -> "CellDisplay":
        if self.progress is not None:
            if self.embed_in is not None:
                self._embedded_base = self.embed_in.get_renderable()
                self.embed_in.update(Group(self._embedded_base, self.progress), refresh=True)
            else:
                self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.progress is None:
            return
        if self.embed_in is not None:
            self.embed_in.update(self._embedded_base, refresh=True)
        else:
            self.progress.stop()

    # ---- CellProgress --------------------------------------------------------------------
    def cell_started(self, kind: str, ctx: int, prompt_tokens: int, max_new_tokens: int) -> None:
        now = time.monotonic()
        self.cell = {"kind": kind, "ctx": ctx, "prompt": prompt_tokens, "new": max_new_tokens, "t0": now,
                     "phase": "wait", "reused": 0, "t_prefill": None, "t_decode": None, "decoded": 0}
        name = f"[{self.done_cells + 1}/{self.n_cells}] {kind} @ {fmt_tokens(ctx)}"
        if self.progress is None:
            self.console.print(f"{name}: prefill {prompt_tokens:,} tokens, decode {max_new_tokens}",
                               highlight=False, markup=False, soft_wrap=True)
            return
        self.progress.update(self.cell_task, description=self._name("running"), total=None, completed=0, visible=True,
                             phase="wait", t0=now, deadline=None, rate=None, reused=0)

    def prefill(self, done: int, total: int) -> None:
        c = self.cell
        if not c:
            return
        now = time.monotonic()
        if c["t_prefill"] is None:
            c["t_prefill"], c["reused"], c["phase"] = now, done, "prefill"
        elapsed = now - c["t_prefill"]
        left = prefill_eta(done, total, c["reused"], elapsed, self.fit)
        rate = (done - c["reused"]) / elapsed if elapsed > 0 and done > c["reused"] else None
        if self.progress is not None:
            self.progress.update(self.cell_task, description=self._name("prefill"), total=total, completed=done,
                                 phase="prefill", rate=rate, reused=c["reused"],
                                 deadline=None if left is None else now + left)

    def decoded(self, n: int) -> None:
        c = self.cell
        if not c:
            return
        now = time.monotonic()
        if c["t_decode"] is None:
            c["t_decode"], c["phase"] = now, "decode"
        c["decoded"] += n
        elapsed = now - c["t_decode"]
        left = decode_eta(c["decoded"], c["new"], elapsed)
        rate = (c["decoded"] - 1) / elapsed if elapsed > 0 and c["decoded"] > 1 else None
        if self.progress is not None:
            self.progress.update(self.cell_task, description=self._name("decode"), total=c["new"],
                                 completed=min(c["decoded"], c["new"]), phase="decode", rate=rate, reused=0,
                                 deadline=None if left is None else now + left)

    def cell_done(self, row: dict | None) -> None:
        self.done_cells += 1
        self.cell = {}
        if self.progress is not None:
            self.progress.update(self.run_task, completed=self.done_cells,
                                 description=f"{self.label} {self.done_cells}/{self.n_cells}")
            self.progress.update(self.cell_task, visible=False, phase=None)

    def _name(self, phase: str) -> str:
        c = self.cell  # (the run's row above says which cell of how many)
        return f"{c['kind']} @ {fmt_tokens(c['ctx'])} {phase}"

