"""`ddprobe commit`: commit length across contexts."""
from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from ..probes.bench.estimate import fmt_duration
from ..units import fmt_tokens, parse_context_list
from .app import app
from .outputs import check_outputs
from .options import BackendOpt, EngineOptions, ForceOpt, TimeoutOpt, UrlOpt, columns, engine_options, err, errors_exit_1, \
    num_or_dash, out, results_path, text_kinds, warm_up

# (header, narrow header, cell) per column; narrow terminals (< WIDE_COLUMNS) get the short headers and
# lose the columns marked None there.
_COLUMNS = [
    ("text", "text", lambda r: r["text"]),
    ("ctx", "ctx", lambda r: fmt_tokens(r["ctx"])),
    ("prompt", None, lambda r: str(r["prompt_tokens"])),
    ("reused", None, lambda r: num_or_dash(r.get("reused_tokens"), "d")),  # prompt tokens from the kept prefix
    ("commit len", "commit", lambda r: f"{r['commit_len']:.2f}" + (" !" if r.get("suspect") else "")),
    ("p10-p90", "p10-90", lambda r: "-" if r["commit_len_p10"] is None
        else f"{r['commit_len_p10']:.0f}-{r['commit_len_p90']:.0f}"),
    ("accepted", None, lambda r: f"{r['accepted_depth']:.2f}"),  # = commit len - 1: dropped when narrow
    ("drafts", None, lambda r: num_or_dash(r["drafts_per_step"], ".1f")),
    ("steps", "steps", lambda r: str(r["verify_steps"])),
    ("ms/step", "ms/step", lambda r: num_or_dash(r["decode_ms_per_step"], ".1f")),
    ("tok/s", "tok/s", lambda r: num_or_dash(r["tokens_per_s"], ".1f")),
    ("prefill", "prefill", lambda r: "-" if r["prefill_s"] is None else f"{r['prefill_s']:.2f} s"),
]


WIDE_COLUMNS = 116  # the wide table's width: below it, the narrow one (80 columns)


_SHAPE_COLUMNS = [("tree", "tree", lambda r: str(r.get("tree"))), ("budget", "B", lambda r: str(r.get("budget")))]


def commit_table(title: str, narrow: bool, shapes: bool = False) -> tuple[Table, callable]:
    """The commit table and a function adding one row to it; ``narrow`` fits an 80-column terminal; ``shapes``: a
    shape sweep, each row's tree and budget after its context."""
    spec = _COLUMNS[:2] + (_SHAPE_COLUMNS if shapes else []) + _COLUMNS[2:]
    cols = [(n if not narrow else short, cell) for n, short, cell in spec if not (narrow and short is None)]
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=narrow,
                  show_edge=False)  # no blank last line
    for name, _ in cols:
        table.add_column(name, justify="left" if name in ("text", "tree") else "right", no_wrap=True)
    return table, lambda row: table.add_row(*[cell(row) for _, cell in cols])


def announce(eng: EngineOptions, be) -> None:
    """Say what ``auto`` chose (device, dtype, CPU threads) and any note the backend has (random weights...)."""
    threads = getattr(be, "threads", None) if be.name == "engine" else None
    said = [s for s in (eng.chosen() if be.name == "engine" else None, threads.line() if threads else None) if s]
    if said:
        err.print(f"engine: {', '.join(said)}", highlight=False)
    if be.name == "engine" and eng.attn_reason():
        err.print(eng.attn_reason(), highlight=False, markup=False, soft_wrap=True)
    if getattr(be, "note", None):
        err.print(f"[yellow]note:[/] {escape(be.note)}", highlight=False, markup=True)


TreeOpt = Annotated[Optional[str], typer.Option("--tree", help="Draft shapes to compare: ddtree (the budget's most "
                                                  "probable prefixes), chain (the drafter's top-1 per depth); "
                                                  "default ddtree at --budget.")]
BudgetsOpt = Annotated[Optional[str], typer.Option("--budgets", help="Tree budgets to sweep (default with --tree: "
                                                   "2,4,8,16; else --budget).")]
ChainDepthsOpt = Annotated[Optional[str], typer.Option("--chain-depths", help="The chain's depths (default: "
                                                       "min(budget, block size - 1) per budget).")]


@app.command()
@errors_exit_1
@engine_options(compile=False)  # its answer is the commit length: no torch.compile warm-up for a faster step
def commit(
    ctx: Annotated[str, typer.Option("--ctx", help="Context lengths, k = 1024.")] = "1k,4k",
    text: Annotated[str, typer.Option("--text", help="Text kinds: predictable, novel, recall.")] = "predictable,novel",
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Tokens decoded per cell.")] = 128,
    backend: BackendOpt = "engine",
    url: UrlOpt = None,
    timeout: TimeoutOpt = 600.0,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Results file, written after every cell "
                                                                     "(default ddprobe-results/commit-<time>.json).")]
    = None,
    csv_path: Annotated[Optional[Path], typer.Option("--csv", help="Also write the cells as CSV.")] = None,
    force: ForceOpt = False, tree: TreeOpt = None, budgets: BudgetsOpt = None, chain_depths: ChainDepthsOpt = None,
    *, eng: EngineOptions,
):
    """Commit length on predictable vs novel text across context lengths: is the drafter still accepting?"""
    from ..probes.backends import make_backend
    from ..probes.commit import cell_order, check_contexts, run_tree_probe
    from ..results import Result, ResultWriter, RunMeta

    ctxs = parse_context_list(ctx)
    kinds = text_kinds(text)
    sweep = tree_sweep(backend, tree, budgets, chain_depths, eng)
    path = results_path(json_path, "commit")
    # before anything is built or measured; an earlier results file is kept unless --force
    check_outputs({"--json": path, "--csv": csv_path}, force=force, keep_existing=True)
    big = dataclasses.replace(eng, budget=max(b for _, b in sweep or [("", eng.budget)]))
    be = make_backend(backend, url, timeout,
                      engine_factory=lambda: big.backend(big.capacity(max(ctxs), max_new_tokens)))
    configs = sweep and sweep.resolve(be)
    check_contexts(be, ctxs, max_new_tokens, kinds, eng.seed)  # before any file is written
    announce(eng, be)
    warm = warm_up(be, None)  # outside every measured cell, for the largest request
    est = say_estimate(be, cell_order(ctxs, kinds) * len(configs or [1]), max_new_tokens, eng.seed)
    config = {"ctx": ctxs, "text": kinds, "max_new_tokens": max_new_tokens, "seed": eng.seed, **be.describe(),
              **({"warmup": warm} if warm else {}), **({"estimate": est.to_dict()} if est else {}),
              **({"tree": list(dict.fromkeys(s for s, _ in configs)), "sweep": [list(c) for c in configs], "batch": 1,
                  "budget": max(b for _, b in configs)} if configs else {"batch": 1})}
    writer = ResultWriter(Result(kind="commit", meta=RunMeta.collect(), config=config), path, csv_path)
    where = url if url else f"{config.get('preset')}, {config.get('attn')}, {config.get('weights')} weights"
    table, add = commit_table(f"commit length, batch 1 ({be.name}: {where})", narrow=columns() < WIDE_COLUMNS,
                              shapes=bool(configs))
    with measured(table, len(ctxs) * len(kinds) * len(configs or [1]), est) as (display, live):
        try:
            rows = run_tree_probe(be, configs or [None], ctxs, kinds, max_new_tokens, writer, seed=eng.seed,
                                  on_cell=add, progress=display)
        except BaseException:
            _finish(writer, est, display, live, path, csv_path)  # what was measured is said even so
            raise
        _finish(writer, est, display, live, path, csv_path, say=False)
    say_notes(rows)
    out.print(_written(writer, path, csv_path), highlight=False, soft_wrap=True)  # the last line: where the results are


class _Sweep(list):
    """(shape, budget) pairs asked for, resolved against the backend's drafter depth (``resolve``)."""

    def __init__(self, shapes, budgets, depths):
        super().__init__((s, b) for s in shapes for b in budgets)
        self.shapes, self.budgets, self.depths = shapes, budgets, depths

    def resolve(self, be) -> list[tuple[str, int]]:
        from ..probes.commit import tree_configs

        return tree_configs(self.shapes, self.budgets, self.depths, be.max_commit() - 1 if self.budgets else 0)


def tree_sweep(backend: str, tree, budgets, chain_depths, eng: EngineOptions):
    """The shape sweep asked for (None: today's one ddtree at --budget); one line for a server asked for a shape
    (it decides its own) and for bad values."""
    from ..probes.commit import SWEEP_BUDGETS, int_list, tree_shapes
    from ..units import DDProbeError

    if tree is None and budgets is None and chain_depths is None:
        return None
    if backend != "engine":
        raise DDProbeError(f"--tree/--budgets/--chain-depths: the {backend} server decides its own draft shape and "
                           "budget; ddprobe cannot change them (its rows report drafts_per_step, the nodes it drafted "
                           "per step): drop them")
    shapes = tree_shapes(tree or "ddtree")
    sizes = int_list(budgets, "--budgets") if budgets else list(SWEEP_BUDGETS) if tree else [eng.budget]
    return _Sweep(shapes, sizes, int_list(chain_depths, "--chain-depths") if chain_depths else None)


def _finish(writer, est, display, live, path, csv_path, say: bool = True) -> None:
    record_timing(writer, est, display)
    if say:
        live.console.print(_written(writer, path, csv_path))


def _written(writer, path, csv_path) -> str:
    n = len(writer.result.rows)
    return (f"{n} cell(s) written to {path}" + (f" and {csv_path}" if csv_path else "") if n
            else "no cell measured: nothing written")


def say_notes(rows: list[dict]) -> None:
    """The notes after the table: where the commits come from (a shape sweep), loops, timing, a server's
    contradictions, suspect cells and spine-check bugs."""
    from ..probes.commit import loop_notes, spine_bugs, timing_note
    from ..probes.backends.sanity import suspect_notes

    print_provenance(rows)
    for line in [*loop_notes(rows), *filter(None, [timing_note(rows)])]:
        err.print(f"[yellow]note:[/] {escape(line)}", highlight=False, markup=True)
    for r in rows:  # a server's figures that contradict each other (probes.backends.base.histogram_note)
        if r.get("server_note"):
            err.print(f"[yellow]note:[/] {escape(r['text'])} @ {fmt_tokens(r['ctx'])}: {escape(r['server_note'])}",
                      highlight=False, soft_wrap=True, markup=True)
    for line in [*suspect_notes(rows), *spine_bugs(rows)]:
        err.print(f"[bold red]warning:[/] {escape(line)}", highlight=False, soft_wrap=True, markup=True)


def print_provenance(rows: list[dict]) -> None:
    """Where the commits come from, per cell with the engine's per-step ranks: the tree and the chain at the same
    budget side by side (sorted by text, context, budget), acceptance per depth, the share from siblings of rank
    >= 1, the tree's own spine on the same steps and the spine check."""
    from .tables import Col, print_fitted

    known = [r for r in rows if r.get("spine_commit_len") is not None]
    if not known:
        if any(r.get("backend") == "engine" for r in rows):  # the GPU's device tree walk keeps no per-step ranks
            err.print("note: no per-step sibling ranks recorded (the engine's device tree walk, CUDA graphs at "
                      "temperature 0, keeps none): where the commits come from and the spine check need "
                      "--no-graphs", highlight=False, soft_wrap=True)
        return
    order = {k: i for i, k in enumerate(dict.fromkeys(r["text"] for r in known))}
    known.sort(key=lambda r: (order[r["text"]], r["ctx"], r.get("budget") or 0, r.get("tree") or ""))
    cols = [Col("text", 0, "left"), Col("ctx"), Col("tree", 0, "left"), Col("budget"), Col("commit"), Col("spine", 3),
            Col("gain", 2), Col("siblings", 2), Col("accepted per depth", 4, "left"), Col("spine bugs")]
    table = [[r["text"], fmt_tokens(r["ctx"]), str(r.get("tree")), str(r.get("budget")), f"{r['ran_commit_len']:.2f}",
              f"{r['spine_commit_len']:.2f}", f"{r['gain_over_spine']:.2f}x", f"{r['sibling_share']:.0%}",
              " ".join("-" if c is None else f"{c:.2f}" for c in r.get("cond_accept_per_pos") or []),
              str(r["spine_violations"])] for r in known]
    print_fitted("where the commits come from, batch 1, over the steps that ran (a cut last step whole): the tree's "
                 "own spine (rank-0 path) on the same steps, gain = commit / spine, siblings = committed draft "
                 "tokens from rank >= 1, acceptance per depth", cols, table)


def say_estimate(be, order, max_new_tokens: int, seed: int):
    """Calibrate (engine backends) and say how long the cells will take, when that is more than
    ``estimate.SAY_OVER_S``; returns the Estimate (None where the backend cannot be calibrated)."""
    from ..probes.bench.estimate import estimate_run

    est = estimate_run(be, order, max_new_tokens, seed)
    line = est.line() if est is not None else None
    if line:
        err.print(line, highlight=False, markup=False, soft_wrap=True)
    return est


class _Printed:
    """Stands in for the live region when stdout is not a terminal: the table is printed once, at the end
    (each line with its newline), followed by the lines printed meanwhile (``console.print``)."""

    def __init__(self, table):
        self.table, self.console, self.lines = table, self, []

    def print(self, *args, **kwargs):
        self.lines.append((args, kwargs))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        out.print(self.table)
        for args, kwargs in self.lines:
            out.print(*args, **kwargs)


@contextlib.contextmanager
def measured(table, n_cells: int, est):
    """The live results table on stdout and the cells' progress (``progress.CellDisplay``) on stderr; when
    both are one terminal the bars share the table's live region (and leave it at the end). A stdout that is
    not a terminal (a pipe, a file) gets the table once, when the cells are done (or interrupted)."""
    from rich.live import Live

    from .progress import CellDisplay

    out_tty, err_tty = out.is_terminal, err.is_terminal  # read before the live region redirects stderr
    fit = est.calibration.prefill if est is not None and est.calibration is not None else None
    region = Live(table, console=out, refresh_per_second=4, transient=False, redirect_stderr=err_tty) if out_tty \
        else _Printed(table)
    with region as live:
        display = CellDisplay(err, n_cells, fit, embed_in=live if out_tty and err_tty else None, live=err_tty,
                              estimate=None if est is None else f"about {fmt_duration(est.total_s)}")
        display.started_at = time.perf_counter()
        with display:
            yield display, live


def record_timing(writer, est, display) -> None:
    """The estimate next to what the cells took, in the results summary (once there is a row)."""
    from ..probes.bench.estimate import timing_block

    res = writer.result
    if not res.rows:
        return
    took = time.perf_counter() - display.started_at
    pre = sum(r.get("prefill_s") or 0.0 for r in res.rows)
    dec = sum(r.get("decode_s") or 0.0 for r in res.rows)
    res.summary["timing"] = timing_block(took, est, actual_prefill_s=pre, actual_decode_s=dec, cells=len(res.rows),
                                         complete=len(res.rows) == display.n_cells)
    writer.flush()
