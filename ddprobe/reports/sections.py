"""One report section per results file: run metadata, findings, tables and plots.

Known kinds get their own tables and plots; any other kind gets a generic table of its
rows, so a results file from a probe this module has not heard of still renders.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..results import Result
from ..schema import FloorRow
from ..physics.step_model import bound_word
from ..physics.step_shape import BELOW_FLOOR
from ..units import DDProbeError, fmt_bandwidth, fmt_bytes, fmt_ratio, fmt_time, fmt_tokens
from ..signals import LABELS
from . import bench, plots, plots_gpu, shapes, trace
from .findings import findings
from .plots import Figure
from .table import Table  # noqa: F401  (Table is also this module's, for callers)

TITLES = {"commit": "Commit length", "floor": "Bandwidth floor", "bench-verify": "Verify-attention benchmark",
          "gpu-util": "GPU utilization", "advise": "Speculation on or off", "trace": "Where the step goes (trace)",
          "bench-launch": "The least time per kernel"}
GENERIC_ROWS, GENERIC_COLS = 50, 12


@dataclass
class Section:
    id: str
    title: str
    kind: str
    source: str
    meta: list[tuple[str, str]]
    findings: list[str]
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)


def _f(v, spec: str = ".3g", none: str = "-") -> str:
    return none if not isinstance(v, (int, float)) or isinstance(v, bool) else format(v, spec)


def meta_rows(path: Path, r: Result) -> list[tuple[str, str]]:
    m = r.meta
    names = sorted({str(g.get("name")) for g in m.gpus}) if m.gpus else []
    drivers = sorted({str(g.get("driver")) for g in m.gpus if g.get("driver")})
    gpu = ", ".join(f"{n} x{sum(1 for g in m.gpus if str(g.get('name')) == n)}" if len(m.gpus) > 1 else n
                    for n in names) or "none (CPU)"
    return [("file", path.name), ("kind", r.kind), ("date (UTC)", m.date_utc), ("host", m.host), ("GPU", gpu),
            ("driver", ", ".join(drivers) or "-"),
            ("ddprobe", f"{m.ddprobe_version}" + (f" ({m.git_sha[:10]})" if m.git_sha else "")),
            ("python", m.python), ("torch", m.torch or "-"), ("triton", m.triton or "-"), ("platform", m.platform),
            ("command", m.command)]


def _commit(r: Result, sid: str) -> tuple[list[Table], list[Figure]]:
    rows = sorted((x for x in r.records if x.commit_len is not None),
                  key=lambda x: (x.text, x.ctx, x.tree or "", x.budget or 0))
    # SGLang's completion / verify (prefill token counted) beside commit_len, when the results carry it
    sgl = any(x.sglang_accept_length is not None for x in rows)
    # a shape sweep (commit --tree): each row's shape and budget after its context, the plot one shape's line
    sweep = len({(x.tree, x.budget) for x in rows}) > 1 and any(x.tree for x in rows)
    t = Table("Commit length per text kind and context",
              ["text", "ctx"] + (["tree", "budget"] if sweep else []) + ["prompt", "commit len"]
              + (["SGLang accept len"] if sgl else [])
              + ["p10-p90", "accepted", "drafts", "steps", "ms/step", "tok/s"],
              [[x.text, fmt_tokens(x.ctx)] + ([str(x.tree or "-"), _f(x.budget, "d")] if sweep else [])
               + [_f(x.prompt_tokens, "d"), _f(x.commit_len, ".2f")]
               + ([_f(x.sglang_accept_length, ".2f")] if sgl else [])
               + [f"{_f(x.commit_len_p10, '.0f')}-{_f(x.commit_len_p90, '.0f')}",
                  _f(x.accepted_depth, ".2f"), _f(x.drafts_per_step, ".1f"),
                  _f(x.verify_steps, "d"), _f(x.decode_ms_per_step, ".1f"),
                  _f(x.tokens_per_s, ".1f")] for x in rows])
    plotted = rows
    if sweep:  # one line per text: the tree at its largest budget (the others are in the tables)
        top = max(((x.tree == "ddtree", x.budget or 0) for x in rows))
        plotted = [x for x in rows if (x.tree == "ddtree", x.budget or 0) == top]
        t.note = (f"The plot: {'ddtree' if top[0] else rows[0].tree} at budget {top[1]}; every shape and budget "
                  "is in the tables.")
    tables = [t] + shapes.commit_tables(r)  # tree and chain side by side (issue 61)
    pos = [x for x in rows if x.cond_accept_per_pos]
    if pos:  # vLLM's per-position counters (or per_step_accepted): where along the draft acceptance stops
        n = max(len(x.cond_accept_per_pos) for x in pos)
        tables.append(Table("Conditional acceptance per draft position",
                            ["text", "ctx"] + (["tree", "budget"] if sweep else []) + ["steps"]
                            + [f"pos {p}" for p in range(n)],
                            [[x.text, fmt_tokens(x.ctx)] + ([str(x.tree or "-"), _f(x.budget, "d")] if sweep else [])
                             + [_f(x.verify_steps, "d")]
                             + [_f(c, ".2f") for c in (list(x.cond_accept_per_pos) + [None] * n)[:n]] for x in pos],
                            "pos p: steps whose draft token at p was accepted / those accepted at p - 1 (pos 0: / "
                            "verify steps), from the server's own per-position counts (accepted_per_pos)."))
    return tables, [plots.commit_length(plotted, f"{sid}-commit-length")] if rows else []


def _ms(v: float | None) -> str:
    return fmt_time(v / 1e3) if v else "-"


def _floor(r: Result, sid: str) -> tuple[list[Table], list[Figure]]:
    rows = sorted(r.records, key=lambda x: x.ctx)
    t = Table(f"Floor per GPU ({r.config.get('model', '?')}, {r.config.get('queries', '?')} rows, tp "
              f"{r.config.get('tp', '?')}, {fmt_bandwidth(r.config['bw_Bps']) if r.config.get('bw_Bps') else '?'})",
              ["ctx", "KV", "weights", "comm", "floor", "bound", "step", "eff bw", "gap", "attn gap"],
              [[fmt_tokens(x.ctx), fmt_bytes(x.kv_GB * 1e9), fmt_bytes(x.weights_GB * 1e9) if x.weights_GB else "-",
                _ms(x.comm_ms), _ms(x.floor_ms), bound_word(x.binds), _ms(x.step_ms),
                fmt_bandwidth(x.eff_bw_GBps * 1e9) if x.eff_bw_GBps else "-",
                fmt_ratio(x.gap) if x.gap else "-", fmt_ratio(x.attn_gap) if x.attn_gap else "-"] for x in rows],
              "floor: the whole step (KV + weights over bandwidth, or compute, plus the all-reduces); gap = step / "
              "floor; attn gap = step / KV floor (the attention alone).")
    figs = [plots.floor_time(rows, f"{sid}-step-time")]
    if any(x.eff_bw_GBps for x in rows):
        figs.append(plots.floor_bandwidth(rows, r.config.get("bw_Bps"), f"{sid}-bandwidth"))
    tables = [t]
    an = r.summary.get("anatomy") if isinstance(r.summary, dict) else None
    if an or any(x.floor_ms for x in rows):  # the whole step: where it goes
        tables.append(_where_the_step_goes(rows, an))
        figs.append(plots.step_anatomy(rows, an, f"{sid}-where"))
    return tables, figs


def _where_the_step_goes(rows: list[FloorRow], an: dict | None) -> Table:
    ms = lambda v: fmt_time(v / 1e3) if v is not None else "-"  # noqa: E731
    body = [[fmt_tokens(x.ctx), ms(x.kv_floor_ms), ms(x.weight_floor_ms), ms(x.compute_floor_ms), ms(x.comm_ms),
             ms(x.floor_ms), bound_word(x.binds), ms(x.step_ms),
             (fmt_ratio(x.gap) + (" below the floor" if x.below_floor else "")) if x.gap else "-"] for x in rows]
    note = (f"A row below the floor: {BELOW_FLOOR} (the floor's inputs do not describe the measured run). "
            if any(x.below_floor for x in rows) else "")
    if an:
        ivs = "; ".join(f"{fmt_tokens(i['ctx0'])} -> {fmt_tokens(i['ctx1'])}: {i['ms_per_1k']:.3g} ms per 1k"
                        + (f" ({fmt_bandwidth(i['kv_GBps'] * 1e9)} of KV)" if i.get("kv_GBps") else "")
                        for i in an["intervals"])
        note += (f"Fit: fixed {an['fixed_ms']:.3g} ms + {an['ms_per_1k']:.3g} ms per 1k tokens ({ivs}). "
                + " ".join(an.get("notes", [])) + " " + an["verdict"])
    return Table("Where the step goes (per GPU)", ["ctx", "KV floor", "weight floor", "compute floor",
                                                   "all-reduces", "floor", "bound", "step", "gap"], body, note.strip())


def _bench(r: Result, sid: str) -> tuple[list[Table], list[Figure]]:
    fl = bench.floors(r)
    es = [fl.entry(e) for e in bench.entries(r)]
    copy = fl.copy_GBps
    layer = sorted((e for e in es if e.kind == "layer"), key=lambda e: (e.heads or 0, e.path, e.ctx))
    step = sorted((e for e in es if e.kind == "step"), key=lambda e: (e.heads or 0, e.path, e.ctx))

    def cells(e: bench.Entry) -> list[str]:
        t = e.time_us * 1e-6 if e.time_us else None
        return [e.path, str(e.heads), fmt_tokens(e.ctx), fmt_time(t) if t else f"failed: {e.error}",
                fmt_time(e.floor_us * 1e-6) if e.floor_us else "-", fmt_ratio(e.gap) if e.gap else "-",
                fmt_bandwidth(e.GBps * 1e9) if e.GBps else "-",
                f"{e.GBps / copy:.0%}" if e.GBps and copy else "-", _f(e.TFLOPs, ".1f"), _f(e.rel_err, ".1e")]

    cols = ["path", "heads", "ctx", "time", "kernel floor", "x kernel floor", "eff bw", "of ceiling", "TFLOP/s",
            "rel err"]
    note = (f"Kernel floor (physics.step_model.kernel_floor): the attention kernels' bytes over the memory bandwidth "
            f"or FLOPs over the tensor rate, here {fl.said}; not the whole step's floor "
            "(`ddprobe floor`).")
    tables = [Table("Per layer call", cols, [cells(e) for e in layer], note)] if layer else []
    figs = []
    if layer:
        figs += [plots.bench_time(layer, f"{sid}-time", "Verify time per layer vs context (kernel floor dashed)"),
                 plots.bench_bandwidth(layer, copy, f"{sid}-bandwidth")]
    fitted = bench.fits(r)
    if fitted:
        tables.append(Table("Fixed part and marginal rate per path (its two longest contexts with one kernel)",
                            ["path", "heads", "kernel", "contexts", "fixed part", "of the time", "marginal KV bw",
                             "marginal TFLOP/s", "of its ceiling"], [_fit_cells(f, fl) for f in fitted],
                            "time(ctx) = fixed part + ctx x marginal cost, the line through the two times (reports/"
                            "bench.py Fit): the fixed part is launches, the pipeline filling and draining, partials "
                            "written and merged; the marginal rate is the pace the kernel takes the added context "
                            "at, over copy (matmul where the kernel floor is compute-bound)."))
    if step:
        tables.append(Table("Whole verify step (all layers)", cols, [cells(e) for e in step]))
        figs.append(plots.bench_time(step, f"{sid}-step", "61 layers of verify attention vs context (kernel floor dashed)", step=True))
    return tables, figs


def _fit_cells(f: bench.Fit, fl: bench.Floors) -> list[str]:
    ctxs = f"{fmt_tokens(f.ctx0)} -> {fmt_tokens(f.ctx1)}"
    if f.fixed_us is None:
        return [f.path, str(f.heads), f.kernel or "-", ctxs, f.note, "-", "-", "-", "-"]
    share = bench.rate_share(f, fl)
    return [f.path, str(f.heads), f.kernel or "-", ctxs,
            fmt_time(f.fixed_us * 1e-6) if f.fixed_us else f"none ({fmt_time(f.intercept_us * 1e-6)})",
            f"{f.fixed_us / f.time1_us:.1%}", fmt_bandwidth(f.marginal_GBps * 1e9), _f(f.marginal_TFLOPs, ".0f"),
            f"{bench.pct(share[0])} of {share[1]}" if share else "-"]


def _gpu_util(r: Result, sid: str) -> tuple[list[Table], list[Figure]]:
    rows = r.records  # typed telemetry rows (schema.GpuUtilRow)
    means = plots_gpu.phase_means(rows)
    keys = [k for k, _ in plots_gpu.BARS]
    t = Table("Mean per GPU and phase", ["GPU", "phase"] + [label for _, label in plots_gpu.BARS],
              [[str(g), p] + [f"{m[k]:.1f}%" if k in m else "-" for k in keys]
               for (g, p), m in sorted(means.items(), key=str)])
    tables = [t]
    per_phase = r.summary.get("per_phase") if isinstance(r.summary, dict) else None
    if per_phase:
        tables.insert(0, Table("Verdict per GPU and phase", ["GPU", "phase", "verdict", "evidence"],
                               [[str(d.get("name", d.get("gpu", "?"))), str(d.get("phase", "?")), str(d.get("verdict", "?")),
                                 str(d.get("evidence", ""))] for d in per_phase if isinstance(d, dict)]))
    figs = [plots_gpu.timelines(rows, f"{sid}-timeline"), plots_gpu.bars(rows, f"{sid}-bars")] if rows else []
    summary = r.summary if isinstance(r.summary, dict) else {}
    if summary.get("nodes"):  # many GPUs: one line per node, the agreement, a heat strip
        from ..gpu_fleet import NODE_SIGNALS

        agree = "; ".join(f"{a['phase']}: {a['line']}" for a in summary.get("agreement") or []
                          if a.get("phase") != "idle")
        tables.insert(0, Table("Per node", ["node", "phase", "GPUs", "verdicts"] + [LABELS[k] for k in NODE_SIGNALS],
                               [[str(n["node"]), str(n.get("phase")), str(n["gpus"]),
                                 ", ".join(f"{c} {v}" for v, c in n["verdicts"].items())] +
                                [_f(n.get(k), ".1f") + ("%" if n.get(k) is not None else "") for k in NODE_SIGNALS] for n in summary["nodes"]],
                               agree))
    if len(plots_gpu.by_gpu(rows)) > 1:
        figs.append(plots_gpu.heat_strip(rows, f"{sid}-heat"))
    return tables, figs


def _generic(r: Result, sid: str) -> tuple[list[Table], list[Figure]]:
    cols: list[str] = []
    for x in r.rows:
        cols += [k for k in x if k not in cols]
    shown = cols[:GENERIC_COLS]
    note = (f"First {GENERIC_ROWS} of {len(r.rows)} rows. " if len(r.rows) > GENERIC_ROWS else "") + \
        (f"{len(cols) - len(shown)} more column(s) in the file." if len(cols) > len(shown) else "")
    rows = [[_f(x.get(c), ".4g", "") if isinstance(x.get(c), (int, float)) else str(x.get(c, "")) for c in shown]
            for x in r.rows[:GENERIC_ROWS]]
    return [Table(f"Rows ({r.kind})", shown, rows, note.strip())], []


def _advise(r: Result, sid: str) -> tuple[list[Table], list[Figure]]:
    rows = r.records
    shaped = any(x.tree for x in rows)  # advise --tree: each row's shape (a chain's budget is its depth)
    t = Table("Tokens/s with and without speculation",
              ["path", "text", "ctx"] + (["tree"] if shaped else []) + ["budget", "commit len", "verify", "decode",
                                                                        "spec tok/s", "plain tok/s", "x"],
              [[x.path, x.text, fmt_tokens(x.ctx)] + ([str(x.tree or "-")] if shaped else [])
               + [_f(x.budget, "d"), _f(x.commit_len, ".3g"),
                fmt_time(x.verify_ms / 1e3), fmt_time(x.decode_ms / 1e3), _f(x.spec_tok_s), _f(x.plain_tok_s),
                _f(x.speedup, ".2f")] for x in rows],
              f"Plain decode: {r.summary.get('decode_source', '?')}. The floor rows put the verify step at the step "
              "model's floor (a verify kernel at physics).")
    return [t] + shapes.advise_tables(r), [plots.advise_tokens(rows, f"{sid}-tokens")] if rows else []


BUILDERS = {"commit": _commit, "floor": _floor, "bench-verify": _bench, "gpu-util": _gpu_util, "advise": _advise,
            "trace": lambda r, sid: trace.section(r, sid)}


def build(path: Path, result: Result, index: int) -> Section:
    sid = f"s{index + 1}-" + re.sub(r"[^a-z0-9]+", "-", result.kind.lower()).strip("-")
    try:
        tables, figs = BUILDERS.get(result.kind, _generic)(result, sid)
        found = findings(result)
    except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError) as e:
        raise DDProbeError(f"{path}: malformed {result.kind} results ({type(e).__name__}: {e})") from None
    title = TITLES.get(result.kind, f"Results of kind {result.kind!r}")
    return Section(id=sid, title=f"{title}: {path.name}", kind=result.kind, source=str(path),
                   meta=meta_rows(path, result), findings=found, tables=tables, figures=figs)
