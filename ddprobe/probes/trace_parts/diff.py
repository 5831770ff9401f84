"""``ddprobe trace diff A B``: two traces of one step, before and after a change (a kernel swapped, a setting
moved): per step, per kernel class and per kernel, the time on each side, the share of the step that moved, the
kernels added and gone, and with a model the floor gap of each side. AMD's TraceLens diffs traces the same way;
this is the verify step's view of it.

The two sides must be one rank each of the same model: two ranks of one run are skew (``ddprobe trace``), not a
change, and two models' steps do not compare (their layer counts differ: refused in one line, as is a side holding
several ranks). The result is a ``trace`` result whose two rows are the two sides (``side`` "before" / "after")
and whose ``summary.diff`` holds the comparison; ``ddprobe report`` draws both anatomies side by side.
"""
from __future__ import annotations

from pathlib import Path

from ...kernel_classes import CLASSES
from ...units import DDProbeError

TOP = 25  # kernels listed, by the time that moved


def _side(path: Path, model: str | None, ctx: int | None):
    from ..trace import run_trace

    result, ranks = run_trace([path], model=model, ctx=ctx)
    if len(ranks) != 1:
        raise DDProbeError(f"{path}: {len(ranks)} ranks; trace diff compares one rank with one rank")
    return result, ranks[0]


def _attn_per_step(r) -> float:
    return next((k.per_step for k in r.steps.kernels if k.cls == "attention" and k.role in ("verify", "decode", "")),
                0.0)


def check_same_model(a, b, ra, rb) -> None:
    """Two sides of one model: the same attention launches per step (layers) unless a kernel was split."""
    na, nb = _attn_per_step(ra), _attn_per_step(rb)
    if na and nb and round(na) != round(nb) and max(na, nb) % min(na, nb):
        raise DDProbeError(f"{ra.path} runs {na:.0f} attention calls per step, {rb.path} {nb:.0f}: not one model's "
                           "step (trace diff compares one model before and after a change)")
    if ra.rank != rb.rank:
        raise DDProbeError(f"{ra.path} is rank {ra.rank}, {rb.path} rank {rb.rank}: two ranks of one run are skew "
                           "(ddprobe trace A B), not a change; diff one rank with the same rank")


def kernel_rows(ra, rb, step_a: float, step_b: float) -> tuple[list[dict], list[str], list[str]]:
    a = {k.name: k for k in ra.steps.kernels}
    b = {k.name: k for k in rb.steps.kernels}
    rows = []
    for name in set(a) | set(b):
        ka, kb = a.get(name), b.get(name)
        ua, ub = (ka.us_per_step if ka else 0.0), (kb.us_per_step if kb else 0.0)
        rows.append({"name": name, "cls": (ka or kb).cls, "before_ms": ua / 1e3, "after_ms": ub / 1e3,
                     "delta_ms": (ub - ua) / 1e3, "before_calls": ka.per_step if ka else 0.0,
                     "after_calls": kb.per_step if kb else 0.0,
                     "before_share": ua / 1e3 / step_a if step_a else 0.0,
                     "after_share": ub / 1e3 / step_b if step_b else 0.0})
    rows.sort(key=lambda r: -abs(r["delta_ms"]))
    gone = sorted((n for n in a if n not in b), key=lambda n: -a[n].us_per_step)
    added = sorted((n for n in b if n not in a), key=lambda n: -b[n].us_per_step)
    return rows, added, gone


def run_diff(before: Path, after: Path, *, model: str | None = None, ctx: int | None = None,
             command: str | None = None):
    """The ``trace`` result of the comparison (see the module docstring)."""
    from ...results import Result, RunMeta

    if Path(before).resolve() == Path(after).resolve():
        raise DDProbeError(f"{before} is given twice: diff two traces")
    res_a, ra = _side(Path(before), model, ctx)
    res_b, rb = _side(Path(after), model, ctx)
    check_same_model(res_a, res_b, ra, rb)
    row_a, row_b = dict(res_a.rows[0], side="before"), dict(res_b.rows[0], side="after")
    sa, sb = row_a["step_ms"], row_b["step_ms"]
    classes = [{"cls": c, "before_ms": row_a[f"{c}_ms"], "after_ms": row_b[f"{c}_ms"],
                "delta_ms": row_b[f"{c}_ms"] - row_a[f"{c}_ms"],
                "before_share": row_a[f"{c}_ms"] / sa if sa else 0.0,
                "after_share": row_b[f"{c}_ms"] / sb if sb else 0.0,
                "before_calls": row_a[f"{c}_per_step"], "after_calls": row_b[f"{c}_per_step"]} for c in CLASSES]
    kernels, added, gone = kernel_rows(ra, rb, sa, sb)
    top = kernels[0] if kernels else None
    diff = {"before": str(before), "after": str(after), "step_before_ms": sa, "step_after_ms": sb,
            "step_delta_ms": sb - sa, "speedup": sa / sb if sb else None,
            "changed": top["name"] if top else None, "changed_before_ms": top["before_ms"] if top else None,
            "changed_after_ms": top["after_ms"] if top else None,
            "classes": classes, "kernels": kernels[:TOP], "added": added[:TOP], "gone": gone[:TOP],
            "gap_before": row_a.get("gap"), "gap_after": row_b.get("gap"),
            "floor_before_ms": row_a.get("floor_ms"), "floor_after_ms": row_b.get("floor_ms")}
    summary = {"diff": diff, "skew": None,
               "strip": res_a.summary["strip"], "strip_after": res_b.summary["strip"],
               "top": {"0": res_a.summary["top"][str(ra.rank)], "after": res_b.summary["top"][str(rb.rank)]},
               "detail": {"before": ra.detail, "after": rb.detail}}
    config = {**res_a.config, "files": [str(before), str(after)], "diff": True}
    meta = RunMeta.collect(command=command, probe_gpu=False)
    return Result(kind="trace", meta=meta, config=config, rows=[row_a, row_b], summary=summary)
