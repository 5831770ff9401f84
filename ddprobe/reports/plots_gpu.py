"""GPU telemetry plots: timelines per GPU with phases shaded, per-GPU bars of pipe use and power, and a heat
strip of tensor and DRAM activity per GPU over time (many GPUs on many nodes)."""
from __future__ import annotations

from collections import defaultdict
from statistics import fmean

from matplotlib import colormaps
from matplotlib.patches import Patch

from .. import signals
from ..schema import GpuUtilRow
from ..signals import LABELS, gpu_name
from .plots import PHASE_COLORS, Figure, _new, _png

# (row key, label) from the signals table; the power fraction is derived from power_W / power_limit_W
SERIES = [(k, LABELS[k]) for k in signals.SERIES]
BARS = [(k, LABELS[k]) for k in signals.BARS]
HEAT = [(k, LABELS[k]) for k in signals.HEAT]


def _val(r: GpuUtilRow, key: str) -> float | None:
    """A signal of a typed telemetry row (``schema.GpuUtilRow``: % , W, MHz...), or the derived power share."""
    if key == "power_pct":
        p, lim = r.power_W, r.power_limit_W
        return 100.0 * p / lim if p is not None and lim else None
    return getattr(r, key)


def by_gpu(rows: list[GpuUtilRow]) -> dict:
    out = defaultdict(list)
    for r in rows:
        out[r.gpu].append(r)
    return {g: sorted(v, key=lambda r: r.t_s) for g, v in sorted(out.items(), key=lambda kv: str(kv[0]))}


def _phase_spans(rs: list[GpuUtilRow]) -> list[tuple[float, float, str]]:
    spans: list[tuple[float, float, str]] = []
    for i, r in enumerate(rs):
        end = rs[i + 1].t_s if i + 1 < len(rs) else r.t_s
        phase = r.phase or "idle"
        if spans and spans[-1][2] == phase:
            spans[-1] = (spans[-1][0], end, phase)
        else:
            spans.append((r.t_s, end, phase))
    return spans


def timelines(rows: list[GpuUtilRow], name: str, most: int = 4) -> Figure:
    """One panel per GPU (the first ``most``; many GPUs are read from the heat strip)."""
    gpus = dict(list(by_gpu(rows).items())[:most])
    fig, axs = _new(len(gpus), 1, w=8.0, h=2.8)
    for ax, (gpu, rs) in zip(axs[:, 0], gpus.items()):
        phases = set()
        for t0, t1, phase in _phase_spans(rs):
            ax.axvspan(t0, t1, color=PHASE_COLORS.get(phase, "#dddddd"), alpha=0.5, lw=0)
            phases.add(phase)
        handles = []
        for key, label in SERIES:
            pts = [(r.t_s, _val(r, key)) for r in rs if _val(r, key) is not None]
            if pts:
                handles += ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label, lw=1.4)
        handles += [Patch(color=PHASE_COLORS.get(p, "#dddddd"), alpha=0.5, label=p) for p in sorted(phases)]
        ax.set_ylim(0, 105)
        ax.set_ylabel("%")
        ax.set_title(f"GPU {gpu_name(rs[0])}", loc="left", fontsize="medium")
        ax.grid(True, alpha=0.3)
        ax.legend(handles=handles, fontsize="x-small", ncol=4, loc="upper right")
    axs[-1][0].set_xlabel("time (s)")
    title = "Telemetry timeline per GPU (phases shaded)" + \
        (f": the first {len(gpus)} of {len(by_gpu(rows))}" if len(by_gpu(rows)) > len(gpus) else "")
    fig.suptitle(title)
    return Figure(name, title, _png(fig), wide=len(gpus) > 2)


def phase_means(rows: list[GpuUtilRow]) -> dict[tuple, dict[str, float]]:
    """(gpu, phase) -> mean of each bar metric over that phase's samples."""
    acc: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        for key, _ in BARS:
            v = _val(r, key)
            if v is not None:
                acc[(r.gpu, r.phase or "idle")][key].append(v)
    return {k: {m: fmean(v) for m, v in d.items()} for k, d in acc.items()}


def bars(rows: list[GpuUtilRow], name: str) -> Figure:
    means = phase_means(rows)
    phases = [p for p in ("prefill", "decode") if any(k[1] == p for k in means)] or \
        sorted({k[1] for k in means})
    fig, axs = _new(1, len(phases), w=5.0 if len(phases) > 1 else 7.0)
    for ax, phase in zip(axs[0], phases):
        gpus = sorted({k[0] for k in means if k[1] == phase}, key=str)
        width = 0.8 / len(BARS)
        for j, (key, label) in enumerate(BARS):
            xs = [i + (j - (len(BARS) - 1) / 2) * width for i in range(len(gpus))]
            vals = [means[(g, phase)].get(key) for g in gpus]  # None: not measured, no bar
            ax.bar([x for x, v in zip(xs, vals) if v is not None], [v for v in vals if v is not None], width,
                   label=label + ("" if all(v is not None for v in vals) else " (n/a on some GPUs)"))
        names = {r.gpu: gpu_name(r) for r in rows}
        ax.set_xticks(range(len(gpus)), [names.get(g, str(g)) for g in gpus], rotation=45 if len(gpus) > 4 else 0,
                      fontsize="x-small" if len(gpus) > 4 else None)
        ax.set_ylim(0, 105)
        ax.set_ylabel("mean %")
        ax.set_title(phase)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize="x-small")
    title = "Tensor, DRAM, SM and power fraction per GPU"
    fig.suptitle(title)
    return Figure(name, title, _png(fig), wide=len(phases) > 1)


def heat_strip(rows: list[GpuUtilRow], name: str) -> Figure:
    """Tensor and DRAM activity (%) per GPU over time: one row per GPU, one panel per signal, phases marked
    in a band above; a GPU that does something else stands out as a differently coloured row."""
    import numpy as np

    gpus = by_gpu(rows)
    t_all = sorted({r.t_s for rs in gpus.values() for r in rs})
    col = {t: j for j, t in enumerate(t_all)}
    step = (t_all[-1] - t_all[0]) / max(len(t_all) - 1, 1) or 1.0
    edges = np.array(t_all + [t_all[-1] + step])
    first = next(iter(gpus.values()))
    cmap = colormaps["viridis"].with_extremes(bad="#dddddd")
    fig, axs = _new(len(HEAT), 1, w=8.0, h=0.9 + 0.26 * len(gpus))
    for ax, (key, label) in zip(axs[:, 0], HEAT):
        grid = np.full((len(gpus), len(t_all)), np.nan)
        for y, rs in enumerate(gpus.values()):
            for r in rs:
                v = _val(r, key)
                if v is not None:
                    grid[y, col[r.t_s]] = v
        mesh = ax.pcolormesh(edges, np.arange(len(gpus) + 1), np.ma.masked_invalid(grid), cmap=cmap, vmin=0,
                             vmax=100)
        for t0, t1, phase in _phase_spans(first):
            ax.axvspan(t0, t1, ymin=0.97, ymax=1.0, color=PHASE_COLORS.get(phase, "#dddddd"), lw=0)
        ax.set_yticks(np.arange(len(gpus)) + 0.5, [gpu_name(rs[0]) for rs in gpus.values()], fontsize="x-small")
        ax.invert_yaxis()
        ax.set_title(f"{label} active, % (grey: not measured; phases in the band on top)", loc="left",
                     fontsize="medium")
        fig.colorbar(mesh, ax=ax, fraction=0.03, label="%")
    axs[-1][0].set_xlabel("time (s)")
    title = f"Tensor and DRAM activity per GPU over time ({len(gpus)} GPUs)"
    fig.suptitle(title)
    return Figure(name, title, _png(fig), wide=True)
