"""The findings in plain words, one short list per results file, for the top of a report.

Each function answers one of ddprobe's questions from the rows: is the drafter still
accepting at long context, what bounds each phase, how far from the floor each step is,
and what the split verify path buys over the paged one.
"""
from __future__ import annotations

import json

from collections import defaultdict

from .. import verify_paths
from ..physics.step_model import bound_word
from ..results import Result
from ..units import fmt_bandwidth, fmt_ratio, fmt_time, fmt_tokens
from . import bench
from .diagnosis import FINE, NOVEL_MAX, too_short_cells



def _span(ctxs: list[int]) -> str:
    return f"{fmt_tokens(min(ctxs))}-{fmt_tokens(max(ctxs))}" if len(set(ctxs)) > 1 else fmt_tokens(ctxs[0])


def _drafter_cells(records) -> list:
    """The cells the drafter is judged on: the tree's (a shape sweep's chain cells are the decision's), one per text
    and context, at the largest budget measured there."""
    best: dict = {}
    for r in records:
        if r.commit_len is None or getattr(r, "tree", None) not in (None, "ddtree"):
            continue
        key = (r.text, r.ctx)
        if key not in best or (getattr(r, "budget", None) or 0) > (getattr(best[key], "budget", None) or 0):
            best[key] = r
    return list(best.values())


def commit(result: Result) -> list[str]:
    """One line per text kind, judged by the same rules as the diagnosis (``diagnosis.FINE``, ``NOVEL_MAX``)."""
    by_text = defaultdict(list)
    for r in _drafter_cells(result.records):
        by_text[r.text].append(r)
    short = too_short_cells([r for rs in by_text.values() for r in rs], result.config.get("budget"))
    if short:
        return [short]
    out = []
    for text, rs in sorted(by_text.items()):
        rs.sort(key=lambda r: r.ctx)
        a, b = rs[0], rs[-1]
        where = f"{a.commit_len:.2f} at {fmt_tokens(a.ctx)}" + \
            (f", {b.commit_len:.2f} at {fmt_tokens(b.ctx)}" if b is not a else "")
        low = [r for r in rs if r.commit_len < FINE * a.commit_len]
        if text == "novel":
            out.append(f"Novel text: commit length {where} (about 1 is expected: nothing to predict)."
                       if max(r.commit_len for r in rs) <= NOVEL_MAX else
                       f"Novel text: commit length {where}: the continuation repeats itself, so the drafter "
                       "predicts it.")
        elif max(r.commit_len for r in rs) < 1.5:
            out.append(f"Drafter NOT accepting on {text} text even at short context: commit length {where}; "
                       "the drafter is untrained or does not match the target.")
        elif not low:
            out.append(f"Drafter fine at long context on {text} text: commit length {where}.")
        else:
            out.append(f"Drafter degrades on {text} text from {fmt_tokens(low[0].ctx)}: commit length "
                       f"{low[0].commit_len:.2f} there ({where}).")
    return out or ["No commit-length cells recorded."]


def floor(result: Result) -> list[str]:
    rows = sorted(result.records, key=lambda r: r.ctx)
    if not rows:
        return ["No floor rows recorded."]
    out = []
    whole = all(r.floor_ms for r in rows)  # a file of an older ddprobe holds the attention's floor only
    what, binds = ("The verify step's floor", [r.binds for r in rows]) if whole else \
        ("The attention (an older file: no whole-step floor)", [r.attn_bound for r in rows])
    binds = [bound_word(b) for b in binds]
    if len(set(binds)) == 1:
        out.append(f"{what} is {binds[0]} at every context ({_span([r.ctx for r in rows])}).")
    else:
        out.append(f"{what} is " + ", ".join(f"{b} at {fmt_tokens(r.ctx)}" for r, b in zip(rows, binds)) + ".")
    meas = [r for r in rows if r.step_ms]
    if meas:
        r = meas[-1]
        bw = result.config.get("bw_Bps")
        line = (f"Gap to the floor at {fmt_tokens(r.ctx)}: the measured step {fmt_time(r.step_ms / 1e3)} is "
                f"{fmt_ratio(r.gap)} the floor {fmt_time(r.floor_ms / 1e3)} (the whole step)" if whole else
                f"Attention gap at {fmt_tokens(r.ctx)}: the measured step {fmt_time(r.step_ms / 1e3)} is "
                f"{fmt_ratio(r.attn_gap)} the attention's floor {fmt_time(r.attn_floor_ms / 1e3)}")
        if r.eff_bw_GBps:
            line += f" (effective {fmt_bandwidth(r.eff_bw_GBps * 1e9)}" + \
                    (f" of {fmt_bandwidth(bw)})" if bw else ")")
        if whole and r.attn_gap:
            line += f"; attention gap {fmt_ratio(r.attn_gap)} (KV floor {fmt_time(r.kv_floor_ms / 1e3)})"
        out.append(line + ".")
    an = result.summary.get("anatomy") if isinstance(result.summary, dict) else None
    if an and an.get("verdict"):
        out.append(f"Where the step goes: {an['verdict']}")
    return out


def bench_verify(result: Result) -> list[str]:
    fl = bench.floors(result)
    es = [fl.entry(e) for e in bench.entries(result) if e.time_us]
    if not es:
        return ["No timed benchmark entries (every path failed or none ran)."]
    copy = fl.copy_GBps
    out = []
    fitted = bench.fits(result)
    for heads in sorted({e.heads for e in es if e.kind == "layer"}, key=lambda h: h or 0):
        layer = [e for e in es if e.kind == "layer" and e.heads == heads]
        bounds = {e.ctx: fl.bound(e) for e in layer}
        comp = sorted(c for c, b in bounds.items() if b == "compute-bound")
        kind = ("compute-bound at every context" if comp and len(comp) == len(bounds) else
                f"bandwidth-bound below {fmt_tokens(comp[0])}, compute-bound from there" if comp else
                "bandwidth-bound at every context" if any(bounds.values()) else
                "bound unknown (no ceilings and no datasheet for its GPU)")
        top = max(e.ctx for e in layer)
        at = {e.path: e for e in layer if e.ctx == top}
        best = min(at.values(), key=lambda e: e.time_us)
        line = (f"{heads} heads: {kind}; at {fmt_tokens(top)} the fastest path is {best.path}, "
                f"{fmt_time(best.time_us * 1e-6)} per layer")
        if best.gap:
            line += f", {fmt_ratio(best.gap)} its kernel floor ({fl.said})"
        if best.GBps:
            line += f" ({fmt_bandwidth(best.GBps * 1e9)}" + (f" of {fmt_bandwidth(copy * 1e9)} measured)" if copy
                                                             else ")")
        out.append(line + ".")
        fit = next((f for f in fitted if f.path == best.path and f.heads == heads and f.ctx1 == top), None)
        if fit:
            out.append(f"{bench.describe(fit, fl)}.")
        fast = [n for n in verify_paths.fast_names() if n in at]
        if fast and "paged" in at:
            name = min(fast, key=lambda n: at[n].time_us)
            p, s = at["paged"], at[name]
            out.append(f"{heads} heads: {name} buys {fmt_ratio(p.time_us / s.time_us)} over paged at "
                       f"{fmt_tokens(top)} ({fmt_time(p.time_us * 1e-6)} -> {fmt_time(s.time_us * 1e-6)} per layer).")
    for e in sorted((e for e in es if e.kind == "step"), key=lambda e: (e.ctx, e.path)):
        line = (f"Verify attention of all layers at {fmt_tokens(e.ctx)}, {e.heads} heads, {e.path}: "
                f"{fmt_time(e.time_us * 1e-6)}")
        basis = "" if copy else f" ({fl.said})"
        out.append(line + (f", {fmt_ratio(e.gap)} its kernel floor {fmt_time(e.floor_us * 1e-6)}{basis}." if e.gap
                           else "."))
    bad = [e for e in bench.entries(result) if e.error]
    if bad:
        out.append(f"{len(bad)} entr{'y' if len(bad) == 1 else 'ies'} failed: "
                   + ", ".join(sorted({e.path for e in bad})) + ".")
    return out


def gpu_util(result: Result) -> list[str]:
    per_phase = result.summary.get("per_phase") if isinstance(result.summary, dict) else None
    if not per_phase:  # no stored analysis: the probe's own verdict rules on the samples (missing stays missing)
        from ..gpu_verdict import analyze  # plain Python, no torch

        per_phase = analyze(result.rows, None, result.config.get("sources"))["per_phase"]
    groups = defaultdict(list)
    for d in per_phase:
        if isinstance(d, dict) and d.get("phase") != "idle":
            groups[(d.get("phase", "?"), d.get("verdict", "?"), d.get("evidence", ""))].append(
                str(d.get("name", d.get("gpu", "?"))))
    out = [f"{phase} (GPU {', '.join(gpus)}): {verdict}" + (f" - {ev}." if ev and not ev.endswith(".") else
                                                             (f" - {ev}" if ev else "."))
           for (phase, verdict, ev), gpus in sorted(groups.items(), key=lambda kv: (kv[0][0] != "prefill", kv[0]))]
    summary = result.summary if isinstance(result.summary, dict) else {}
    agree = [f"{a['phase']}: {a['line']}." for a in summary.get("agreement") or [] if isinstance(a, dict)
             and a.get("phase") != "idle" and a.get("line")]
    if summary.get("telemetry_error"):
        out.append(f"Telemetry failed: {summary['telemetry_error']}.")
    return agree + out or ["No telemetry samples recorded."]


def advise(result: Result) -> list[str]:
    verdicts = [v for v in (result.summary.get("verdicts") or []) if isinstance(v, dict) and v.get("sentence")]
    out = [v["sentence"][0].upper() + v["sentence"][1:] + "." for v in verdicts]
    table = result.summary.get("vllm_rfc_48627")
    if table:
        out.append(f"vLLM RFC #48627 table (context bucket -> speculative tokens, 0 = off): {json.dumps(table)}")
    return out or ["No speculation verdict recorded."]


def trace(result: Result) -> list[str]:
    from .trace import findings as trace_findings

    return trace_findings(result)


def bench_launch(r: Result) -> list[str]:
    """The least time per kernel a GPU measured (``ddprobe bench launch``), read by the floor's own reader
    (``physics.gpus.launch_time``), and what the step model makes of it."""
    from ..physics.gpus import launch_time
    from ..units import DDProbeError

    gpus = r.meta.gpus if r.meta else []
    try:
        kt = launch_time({"kind": r.kind, "rows": r.rows, "meta": {"gpus": gpus}}, "this file")
    except DDProbeError as e:
        return [f"{len(r.rows)} row(s) of kind 'bench-launch' the floor cannot use: {e}."]
    us = {x.get("kind"): x.get("us") for x in r.rows}
    rows = " and ".join(f"{k} {us[k]:.3g} us" for k in ("graph-empty", "graph-small") if us.get(k) is not None)
    return [f"On {kt.device or 'this GPU'} a kernel replayed in a CUDA graph takes at least {kt.graph_us:.3g} us "
            f"(the least of {rows}): a step of N kernels cannot be faster than N x {kt.graph_us:.3g} us, whatever it "
            "reads (the step model's launch term; `ddprobe floor --launch-from` this file).",
            f"Launched eagerly from Python each kernel costs {kt.eager_us:.3g} us, and a host synchronisation "
            f"{kt.sync_us:.3g} us: what a step without CUDA graphs pays."]


BY_KIND = {"commit": commit, "floor": floor, "bench-verify": bench_verify, "gpu-util": gpu_util, "advise": advise,
           "trace": trace, "bench-launch": bench_launch}


def findings(result: Result) -> list[str]:
    fn = BY_KIND.get(result.kind)
    if fn is None:
        return [f"{len(result.rows)} row(s) of kind {result.kind!r}; this report has no analysis for it yet."]
    return fn(result)
