"""Plots for reports, drawn with matplotlib's Agg canvas straight to PNG bytes (no pyplot, no display).

Each function takes rows already read from a results file and returns ``Figure``s; the
section builders decide which to draw. Axes carry units; context axes are log base 2.
"""
from __future__ import annotations

import io
from collections import defaultdict
from dataclasses import dataclass

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure as MplFigure
from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

from .. import verify_paths
from ..schema import AdviseRow, CommitRow, FloorRow
from ..units import fmt_tokens
from .bench import Entry

# same in every plot: the verify paths' colours from their table, and the benchmark's peers
PATH_COLORS = {**{p.name: p.colour for p in verify_paths.PATHS}, "flex": "C0", "sdpa": "C2"}
PHASE_COLORS = {"prefill": "#f6c85f", "decode": "#9dd9d2", "idle": "#eeeeee"}


@dataclass
class Figure:
    name: str  # file stem, unique within a report
    title: str
    png: bytes
    wide: bool = False  # spans the whole page width (several panels)


def _new(nrows: int = 1, ncols: int = 1, w: float = 7.0, h: float = 3.8):
    fig = MplFigure(figsize=(w * ncols if ncols > 1 else w, h * nrows), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(nrows, ncols, squeeze=False)


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _ctx_axis(ax) -> None:
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(LogLocator(base=2, numticks=12))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt_tokens(int(v)) if v >= 1 else f"{v:g}"))
    ax.set_xlabel("context (tokens)")
    ax.grid(True, which="major", alpha=0.3)


def commit_length(rows: list[CommitRow], name: str) -> Figure:
    fig, axs = _new()
    ax = axs[0][0]
    lines = defaultdict(list)
    for r in rows:
        if r.commit_len is not None:
            lines[(r.text, r.backend)].append(r)
    multi = len({b for _, b in lines}) > 1
    for (text, backend), rs in sorted(lines.items(), key=lambda kv: str(kv[0])):
        rs.sort(key=lambda r: r.ctx)
        xs = [r.ctx for r in rs]
        ax.plot(xs, [r.commit_len for r in rs], marker="o", label=f"{text} ({backend})" if multi else text)
        if all(r.commit_len_p10 is not None and r.commit_len_p90 is not None for r in rs):
            ax.fill_between(xs, [r.commit_len_p10 for r in rs], [r.commit_len_p90 for r in rs], alpha=0.15)
    _ctx_axis(ax)
    ax.set_ylabel("commit length (tokens / verify step)")
    ax.set_ylim(bottom=0)
    ax.legend(title="text", fontsize="small")
    ax.set_title("Commit length vs context (band: p10-p90)")
    return Figure(name, "Commit length vs context, one line per text kind", _png(fig))


def _by_path(es: list[Entry]) -> dict[str, list[Entry]]:
    out = defaultdict(list)
    for e in es:
        out[e.path].append(e)
    return {p: sorted(v, key=lambda e: e.ctx) for p, v in sorted(out.items())}


def _floor_line(ax, es: list[Entry], scale: float = 1.0) -> None:
    floor = {e.ctx: e.floor_us * scale for e in es if e.floor_us}
    if floor:
        xs = sorted(floor)
        ax.plot(xs, [floor[x] for x in xs], "k--", lw=2, marker="_", ms=18, mew=2, label="floor")


def bench_time(es: list[Entry], name: str, title: str, step: bool = False) -> Figure:
    """Time vs context per path on log axes, one panel per head count, the kernel floor dashed."""
    groups = sorted({e.heads for e in es}, key=lambda h: h or 0)
    fig, axs = _new(1, len(groups), w=6.0 if len(groups) > 1 else 7.0)
    scale, unit = (1e-3, "ms") if step else (1.0, "us")
    for ax, heads in zip(axs[0], groups):
        sub = [e for e in es if e.heads == heads]
        for path, pes in _by_path(sub).items():
            ok = [e for e in pes if e.time_us]
            ax.plot([e.ctx for e in ok], [e.time_us * scale for e in ok], marker="o", label=path,
                    color=PATH_COLORS.get(path))
        _floor_line(ax, sub, scale)
        _ctx_axis(ax)
        ax.set_yscale("log")
        ax.set_ylabel(f"time per {'step' if step else 'layer call'} ({unit})")
        ax.set_title(f"{heads} heads" if heads else "")
        ax.legend(fontsize="small")
    fig.suptitle(title)
    return Figure(name, title, _png(fig), wide=len(groups) > 1)


def bench_bandwidth(es: list[Entry], ceiling_GBps: float | None, name: str) -> Figure:
    """Achieved bandwidth vs context per path (log), the measured copy ceiling drawn."""
    groups = sorted({e.heads for e in es}, key=lambda h: h or 0)
    fig, axs = _new(1, len(groups), w=6.0 if len(groups) > 1 else 7.0)
    for ax, heads in zip(axs[0], groups):
        for path, pes in _by_path([e for e in es if e.heads == heads]).items():
            ok = [e for e in pes if e.GBps]
            ax.plot([e.ctx for e in ok], [e.GBps for e in ok], marker="o", label=path,
                    color=PATH_COLORS.get(path))
        if ceiling_GBps:
            ax.axhline(ceiling_GBps, color="k", ls="--", lw=2, label=f"measured ceiling {ceiling_GBps:,.0f} GB/s")
        _ctx_axis(ax)
        ax.set_yscale("log")
        ax.set_ylabel("effective bandwidth (GB/s)")
        ax.set_title(f"{heads} heads" if heads else "")
        ax.legend(fontsize="small")
    title = "Achieved bandwidth vs context"
    fig.suptitle(title)
    return Figure(name, title, _png(fig), wide=len(groups) > 1)


def floor_time(rows: list[FloorRow], name: str) -> Figure:
    fig, axs = _new()
    ax = axs[0][0]
    rows = sorted(rows, key=lambda r: r.ctx)
    key, label = ("floor_ms", "floor (whole step)") if all(r.floor_ms for r in rows) else \
        ("attn_floor_ms", "attention floor (an older file: no whole-step floor)")
    ax.plot([r.ctx for r in rows], [getattr(r, key) for r in rows], "k--", lw=2, marker="o", label=label)
    meas = [r for r in rows if r.step_ms]
    if meas:
        ax.plot([r.ctx for r in meas], [r.step_ms for r in meas], marker="s", label="measured step")
    return _log_ctx_figure(fig, ax, "verify step (ms)", "Verify step vs context: measured and floor", name,
                           "Verify step time vs context with the floor")


def step_anatomy(rows: list[FloorRow], anatomy: dict | None, name: str) -> Figure:
    """Where the step goes: measured step time vs context beside the KV, weight and whole-step floors, and
    the anatomy's fit (fixed + marginal x ctx) when there is one."""
    fig, axs = _new()
    ax = axs[0][0]
    rows = sorted(rows, key=lambda r: r.ctx)
    xs = [r.ctx for r in rows]
    for key, style, label in (("floor_ms", "k--", "floor (whole step)"), ("kv_floor_ms", "C0:", "KV floor"),
                              ("weight_floor_ms", "C2:", "weight floor")):
        if all(getattr(r, key) for r in rows):
            ax.plot(xs, [getattr(r, key) for r in rows], style, lw=2, label=label)
    meas = [r for r in rows if r.step_ms]
    if meas:
        ax.plot([r.ctx for r in meas], [r.step_ms for r in meas], "C3", marker="s", label="measured step")
    if anatomy:
        fit = [anatomy["fixed_ms"] + anatomy["ms_per_1k"] * x / 1024 for x in xs]
        ax.plot(xs, fit, "C1-.", label=f"fit: {anatomy['fixed_ms']:.3g} ms + {anatomy['ms_per_1k']:.3g} ms per 1k")
    return _log_ctx_figure(fig, ax, "step (ms)", "Where the step goes: measured vs floors", name,
                           "Measured step time vs context beside the KV, weight and whole-step floors")


def floor_bandwidth(rows: list[FloorRow], bw_Bps: float | None, name: str) -> Figure:
    fig, axs = _new()
    ax = axs[0][0]
    meas = sorted((r for r in rows if r.eff_bw_GBps), key=lambda r: r.ctx)
    ax.plot([r.ctx for r in meas], [r.eff_bw_GBps for r in meas], marker="o", label="effective")
    if bw_Bps:
        ax.axhline(bw_Bps / 1e9, color="k", ls="--", lw=2,
                   label=f"bandwidth used for the floor {bw_Bps / 1e9:,.0f} GB/s")
    return _log_ctx_figure(fig, ax, "effective bandwidth (GB/s)", "Effective bandwidth of the measured step vs context",
                           name, "Effective bandwidth vs context with the ceiling")


def _log_ctx_figure(fig, ax, ylabel: str, title: str, name: str, caption: str) -> Figure:
    """One axis over context (log y), its legend and title, as a Figure."""
    _ctx_axis(ax)
    ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize="small")
    ax.set_title(title)
    return Figure(name, caption, _png(fig))


def advise_tokens(rows: list[AdviseRow], name: str) -> Figure:
    """Tokens/s with speculation (the best budget per context) per path and text, and plain decoding's, vs
    context: where a path's line falls under its text's plain line, speculation loses."""
    fig, axs = _new()
    ax = axs[0][0]
    best: dict[tuple[str, str], dict[int, AdviseRow]] = defaultdict(dict)
    plain: dict[int, float] = {}
    for r in rows:
        if r.spec_tok_s is None or r.plain_tok_s is None:
            continue
        key = (r.path, r.text)
        if r.ctx not in best[key] or r.spec_tok_s > best[key][r.ctx].spec_tok_s:
            best[key][r.ctx] = r
        plain[r.ctx] = r.plain_tok_s
    for (path, text), by in sorted(best.items()):
        xs = sorted(by)
        ax.plot(xs, [by[c].spec_tok_s for c in xs], marker="o", color=PATH_COLORS.get(path),
                ls="--" if path == "floor" else "-", label=f"{path}, {text}")
    xs = sorted(plain)
    ax.plot(xs, [plain[c] for c in xs], "k:", lw=2, marker="s", label="plain decoding")
    _ctx_axis(ax)
    ax.set_yscale("log")
    ax.set_ylabel("tokens / s (one request)")
    ax.legend(fontsize="small")
    ax.set_title("Speculation on or off: tokens/s vs context")
    return Figure(name, "Tokens/s with speculation (best budget per context) against plain decoding", _png(fig))
