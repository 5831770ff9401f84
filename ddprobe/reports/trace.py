"""The report section of a ``trace`` result (``ddprobe trace``): the step's anatomy per rank as a stacked bar (kernel
classes, then the idle time inside the step), a timeline strip of one step (the median one of the first rank), and
the tables behind them; a ``trace diff`` result (two rows, ``side`` before / after) draws both anatomies side by side,
both strips, and the classes and kernels that moved. No torch."""
from __future__ import annotations

from ..kernel_classes import CLASSES, LABELS
from ..results import Result
from .plots import Figure, _new, _png

COLOURS = {"attention": "#d62728", "moe": "#9467bd", "gemm": "#1f77b4", "communication": "#ff7f0e",
           "norm_elementwise": "#2ca02c", "sampling_tree": "#8c564b", "other": "#7f7f7f", "idle": "#dddddd"}


def _f(v, spec: str = ",.3f") -> str:
    return "-" if v is None else format(v, spec)


def anatomy_bars(rows: list[dict], name: str) -> Figure:
    """One horizontal bar per rank: each class's ms per step, then the idle inside the step."""
    fig, ax = _new(h=1.2 + 0.45 * len(rows))
    ax = ax[0][0]
    for i, r in enumerate(rows):
        left = 0.0
        for c in (*CLASSES, "idle"):
            v = r.get("idle_ms" if c == "idle" else f"{c}_ms") or 0.0
            ax.barh(i, v, left=left, color=COLOURS[c], label=(LABELS.get(c, c) if i == 0 else None))
            left += v
    ax.set_yticks(range(len(rows)), [r.get("side") or f"rank {r['rank']}" for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("ms per step (kernel time by class, then idle inside the step)")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.grid(True, axis="x", alpha=0.3)
    title = "Step anatomy, before and after" if any(r.get("side") for r in rows) else "Step anatomy per rank"
    return Figure(name, title, _png(fig), wide=True)


def timeline_strip(strip: dict, name: str, side: str = "") -> Figure:
    """The kernels of one step on a time line, one lane per class."""
    fig, ax = _new(h=2.6)
    ax = ax[0][0]
    lanes = [c for c in CLASSES if any(k[0] == c for k in strip["kernels"])]
    for y, c in enumerate(lanes):
        bars = [(k[1] / 1e3, max(k[2] / 1e3, 1e-4)) for k in strip["kernels"] if k[0] == c]
        ax.broken_barh(bars, (y - 0.4, 0.8), facecolors=COLOURS[c])
    ax.set_yticks(range(len(lanes)), [LABELS[c] for c in lanes])
    ax.invert_yaxis()
    ax.set_xlabel(f"ms from the step's first kernel ({side or 'rank ' + str(strip['rank'])}, the median step)")
    ax.grid(True, axis="x", alpha=0.3)
    return Figure(name, f"One step's timeline{', ' + side if side else ''}", _png(fig), wide=True)


def diff_tables(d: dict) -> list:
    """``trace diff``: the classes and the kernels whose time moved, before and after."""
    from .table import Table

    t1 = Table("What moved, per class (ms per step)", ["class", "before", "share", "after", "share", "moved"],
               [[LABELS[c["cls"]], _f(c["before_ms"]), _f(c["before_share"], ".1%"), _f(c["after_ms"]),
                 _f(c["after_share"], ".1%"), _f(c["delta_ms"], "+,.3f")]
                for c in d["classes"] if c["before_calls"] or c["after_calls"]],
               f"Step {_f(d['step_before_ms'])} -> {_f(d['step_after_ms'])} ms; what changed most: "
               f"{str(d.get('changed'))[:60]}.")
    t2 = Table("What moved, per kernel (ms per step)", ["kernel", "class", "before", "after", "moved"],
               [[k["name"][:60], LABELS[k["cls"]], _f(k["before_ms"]), _f(k["after_ms"]), _f(k["delta_ms"], "+,.3f")]
                for k in d["kernels"][:12]],
               f"Added: {'; '.join(n[:40] for n in d['added'][:5]) or 'none'}. "
               f"Gone: {'; '.join(n[:40] for n in d['gone'][:5]) or 'none'}.")
    return [t1, t2]


def section(r: Result, sid: str):
    """(tables, figures) of a trace result; the Table type is the sections module's (passed in to avoid a cycle)."""
    from .table import Table

    rows = r.rows
    cols = ["rank", "steps", "found by", "step ms", "idle ms"] + [LABELS[c] for c in CLASSES]
    t1 = Table("Where the step goes (ms per step)", cols,
               [[str(x["rank"]), str(x["steps"]), x["method"], _f(x["step_ms"]), _f(x.get("idle_ms"))] +
                [_f(x.get(f"{c}_ms")) for c in CLASSES] for x in rows],
               "Step: a step's GPU span (first kernel's start to last kernel's end), median over the steps found. "
               "Class times are kernel time per step (mean); kernels on several streams may overlap.")
    t2 = Table("The attention kernel against the GPU",
               ["rank", "kernel", "us per call", "calls", "grid", "eff. GB/s", "kernel floor us", "floor ms", "gap"],
               [[str(x["rank"]), str(x.get("attn_kernel") or "-")[:60], _f(x.get("attn_us"), ",.1f"),
                 _f(x.get("attn_calls"), ".0f"), str(x.get("attn_grid") or "-"), _f(x.get("attn_eff_bw_GBps"), ",.1f"),
                 _f(x.get("attn_kernel_floor_us"), ",.1f"), _f(x.get("floor_ms")), _f(x.get("gap"), ",.1f")]
                for x in rows],
               "Grid: the blocks its launch asked for against the GPU's SMs. With --model --ctx: effective KV "
               "bandwidth, its kernel floor (KV per call / bandwidth), the whole step's floor and gap = step / floor.")
    tables = [t1, t2] + (diff_tables(r.summary["diff"]) if r.summary.get("diff") else [])
    sk = r.summary.get("skew")
    if sk:
        tables.append(Table("Ranks", ["slowest rank", "its step ms", "median step ms", "skew"],
                            [[str(sk["slowest_rank"]), _f(sk["slowest_step_ms"]), _f(sk["median_step_ms"]),
                              _f(sk["skew"], ".3f")]], "Skew: the slowest rank's step over the median rank's."))
    figs = [anatomy_bars(rows, f"{sid}-anatomy")]
    strip = r.summary.get("strip") or {}
    diff = bool(r.summary.get("diff"))
    if strip.get("kernels"):
        figs.append(timeline_strip(strip, f"{sid}-strip", "before" if diff else ""))
    after = r.summary.get("strip_after") or {}
    if diff and after.get("kernels"):
        figs.append(timeline_strip(after, f"{sid}-strip-after", "after"))
    return tables, figs


def findings(r: Result) -> list[str]:
    """One line per rank: the step, its largest class, its idle time, the attention kernel's grid; then the skew."""
    out = []
    for x in r.rows:
        total = sum(x.get(f"{c}_ms") or 0.0 for c in CLASSES) or 1.0
        big = max(CLASSES, key=lambda c: x.get(f"{c}_ms") or 0.0)
        line = (f"{x.get('side') or 'rank ' + str(x['rank'])}: {x['step_ms']:,.3f} ms per step ({x['steps']} steps by {x['method']}); "
                f"{LABELS[big]} takes {(x.get(big + '_ms') or 0) / total:.0%} of the kernel time, the GPU idles "
                f"{_f(x.get('idle_ms'))} ms inside the step")
        if x.get("attn_kernel"):
            line += f"; attention kernel {str(x['attn_kernel'])[:60]}: {x.get('attn_grid') or 'no grid recorded'}"
        if x.get("gap") is not None:
            line += f"; the step is {x['gap']:,.1f}x its floor ({x['floor_ms']:,.3f} ms)"
        out.append(line)
    d = r.summary.get("diff")
    if d:
        out.append(f"trace diff: the step {d['step_before_ms']:,.3f} -> {d['step_after_ms']:,.3f} ms; what changed "
                   f"most: {str(d.get('changed'))[:60]}, {_f(d.get('changed_before_ms'))} -> "
                   f"{_f(d.get('changed_after_ms'))} ms per step")
    sk = r.summary.get("skew")
    if sk:
        out.append(f"skew: rank {sk['slowest_rank']}'s step is {sk['skew']:.3f}x the median rank's")
    return out
