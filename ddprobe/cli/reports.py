"""`ddprobe report` (HTML/markdown from results files) and `ddprobe gate` (CI regression gate)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..units import DDProbeError, parse_bandwidth, parse_context_list, parse_count_list
from .app import app
from .options import checked, err, errors_exit_1, out, output_file
from .tables import Col, print_fitted

# what a narrow terminal keeps longest (tables.Col priorities; 0 always): which entry, and how it moved
GATE_PRIORITY = {"why": 1, "current": 2, "baseline": 2, "of floor": 3, "GPU": 3, "current bw": 4, "baseline bw": 4}


@app.command()
@errors_exit_1
def report(
    results: Annotated[list[Path], typer.Argument(help="Results files (JSON from any probe or benchmark); a folder "
                                                       "means every *.json in it.")],
    out_path: Annotated[Path, typer.Option("--out", "-o", help="Report file: .html (one self-contained file) or .md "
                                                               "(images in <name>_files/ beside it).",
                                                   callback=output_file)]
    = Path("report.html"),
    force: Annotated[bool, typer.Option("--force", help="Replace a file at --out that is not a report ddprobe wrote "
                                                        "as it is (an earlier report nobody edited is rendered again "
                                                        "in place; one with notes added is kept), or one that is also "
                                                        "an input.")] = False,
):
    """Write one report (summary, tables, plots) from results files."""
    from ..reports.load import expand
    from ..reports.render import write_report
    from .outputs import check_file

    from ..reports.render import rewritable

    # a report ddprobe wrote, unedited (its digest matches), is rendered again in place (a derived file); any other
    # file there, an edited report included, is kept unless --force
    holds = rewritable(out_path)
    check_file("--out", out_path, force=force, inputs=[("RESULTS", p) for p in expand(results)],
               keep_existing=holds is not None, holds=holds or "")

    written = write_report(results, out_path, command=" ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
                           force=force)
    extra = f" and {len(written) - 1} image(s) in {written[1].parent}" if len(written) > 1 else ""
    out.print(f"report written to {written[0]}{extra}")


@app.command()
@errors_exit_1
def gate(
    current: Annotated[Path, typer.Argument(help="Benchmark results of this run (JSON).")],
    baseline: Annotated[Path, typer.Option("--baseline", "-b", help="Committed benchmark results to compare with, "
                                           "or a folder of them, one per GPU (the run's GPU picks).")],
    max_drop: Annotated[str, typer.Option("--max-drop", help="Largest allowed loss of effective bandwidth (speed) "
                                                             "per entry: 10% or 0.1.")] = "10%",
    min_bw: Annotated[Optional[str], typer.Option("--min-bw", help="Absolute floor on each entry's effective "
                                                                   "bandwidth, e.g. 3.5TB/s.",
                                                  callback=checked(parse_bandwidth))] = None,
    min_fraction_of_floor: Annotated[Optional[float], typer.Option("--min-fraction-of-floor",
                                                                   help="Absolute floor on floor time / measured "
                                                                        "time per entry, e.g. 0.8.")] = None,
    paths: Annotated[Optional[str], typer.Option("--paths", help="Gate only these attention paths, e.g. "
                                                                 "split,paged (default: all).")] = None,
    ctx: Annotated[Optional[str], typer.Option("--ctx", help="Gate only these contexts, k = 1024 (default: all).",
                                               callback=checked(parse_context_list))] = None,
    heads: Annotated[Optional[str], typer.Option("--heads", help="Gate only these head counts, e.g. 8 "
                                                                 "(default: all).",
                                                 callback=checked(lambda v: parse_count_list(v, "head count")))]
    = None,
):
    """Fail (exit 1) when a benchmark entry regressed against the baseline or is missing from the run."""
    from ..reports.gate import COLUMNS, compare_files, paths_option, summary_lines, table_rows
    from ..units import parse_fraction

    if min_fraction_of_floor is not None and not 0 < min_fraction_of_floor <= 1:
        raise DDProbeError(f"--min-fraction-of-floor must be in (0, 1], got {min_fraction_of_floor}")
    outcome = compare_files(current, baseline, max_drop=parse_fraction(max_drop, "--max-drop"),
                            min_bw_Bps=parse_bandwidth(min_bw) if min_bw else None,
                            min_fraction_of_floor=min_fraction_of_floor,
                            paths=paths_option(paths),
                            ctxs=parse_context_list(ctx) if ctx else None,
                            heads=parse_count_list(heads, "head count") if heads else None)
    cols = [Col(c, GATE_PRIORITY.get(c, 0), "left" if c in ("status", "path", "GPU", "why") else "right",
                wrap=c == "why") for c in COLUMNS]
    styles = {"ok": "", "new": "cyan", "ref": "dim"}  # ref: a peer's entry, shown for reference, not gated
    rows = table_rows(outcome)  # text: the consoles print no markup (path names like split_ws[fold_tree=0])
    print_fitted(f"gate: {current} vs baseline {baseline}", cols, rows,  # are text, not rich markup
                 styles=[styles.get(r[0], "bold red") for r in rows])
    *lines, verdict = summary_lines(outcome)
    for line in lines:
        err.print(line, highlight=False, soft_wrap=True)
    out.print(verdict, highlight=False)
    if not outcome.passed:
        raise typer.Exit(1)
