"""`ddprobe trace`: where a server's verify step goes, read from its torch-profiler traces (``probes.trace``)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from ..kernel_classes import CLASSES, LABELS
from ..units import DDProbeError, parse_tokens
from .app import app
from .floor_options import FloorOptions, floor_options
from .options import MAX_TIMEOUT_S, ForceOpt, checked, err, errors_exit_1, out, results_path, within

BIG_FILE = 16 << 20  # files this large get a progress line with an ETA


class ReadProgress:
    """Bytes of each trace read, with an ETA, on stderr (a live bar on a terminal, a line per 10% elsewhere)."""

    def __init__(self):
        self.t0, self.file, self.shown = time.perf_counter(), None, -1

    def __call__(self, file: str, done: int, size: int) -> None:
        if size < BIG_FILE:
            return
        if file != self.file:
            self.file, self.t0, self.shown = file, time.perf_counter(), -1
        frac = min(1.0, done / size) if size else 1.0
        step = int(frac * 10)
        if step == self.shown:
            return
        self.shown = step
        el = time.perf_counter() - self.t0
        eta = el * (1 - frac) / frac if frac > 0 else float("nan")
        err.print(f"reading {Path(file).name}: {frac:.0%} of {size / 1e6:,.0f} MB, {el:.0f} s, about {eta:.0f} s "
                  "left", highlight=False)


def _ms(v) -> str:
    return "-" if v is None else f"{v:,.3f}" if v < 10 else f"{v:,.1f}"


def print_rank(row: dict, top: list[dict], detail: str) -> None:
    sms = f", {row['sms']} SMs" if row.get("sms") else ""
    where = row.get("gpu") or ("the CPU" if row.get("work") == "CPU operators" else "GPU not named")
    out.print(f"[bold]rank {row['rank']}[/]: {escape(Path(row['file']).name)} ({escape(where)}{sms})",
              highlight=False, markup=True)
    idle = row["idle_ms"] / row["step_ms"] if row["step_ms"] else 0.0
    gpu = row.get("work") != "CPU operators"
    period = f" (step period {_ms(row['period_ms'])} ms)" if row.get("period_ms") else ""
    out.print(f"  {row['steps']} steps by {row['method']} ({detail}); median {'GPU ' if gpu else ''}span "
              f"{_ms(row['step_ms'])} ms{period}, {'kernels' if gpu else 'CPU operators'} busy {_ms(row['busy_ms'])} "
              f"ms, idle inside the step {_ms(row['idle_ms'])} ms ({idle:.1%})",
              highlight=False, soft_wrap=True)
    total = sum(row[f"{c}_ms"] for c in CLASSES) or 1.0
    out.print(f"  {'class':<20} {'ms/step':>10} {'share':>7} {'launches':>9}  largest kernels (ms/step x launches; "
              f"summed time, mean over the steps)",
              highlight=False)
    for c in CLASSES:
        if not row[f"{c}_per_step"]:
            continue
        big = [k for k in top if k["cls"] == c][:3]
        names = "; ".join(f"{k['name'][:48]} {k['us_per_step'] / 1e3:.3f} x {k['per_step']:.0f}" for k in big)
        out.print(f"  {LABELS[c]:<20} {_ms(row[f'{c}_ms']):>10} {row[f'{c}_ms'] / total:>7.1%} "
                  f"{row[f'{c}_per_step']:>9.0f}  {names}", highlight=False, soft_wrap=True)
    if row.get("overlap_ms", 0.0) > 0.01 * row["busy_ms"]:  # summed times count overlapping work twice
        on = "kernels ran on several streams at once" if gpu else "operators ran on several threads at once"
        out.print(f"  {_ms(row['overlap_ms'])} ms per step (mean) of the classes' summed time overlaps other work: "
                  f"{on}", highlight=False, soft_wrap=True)
    print_attention(row)


def print_attention(row: dict) -> None:
    if not row.get("attn_kernel"):
        out.print("  no attention kernel in the step", highlight=False)
        return
    ex = row  # the keys the schema does not name (attn_what, attn_grid, ...) are kept in the row as they are
    out.print(f"  attention kernel {row['attn_kernel'][:80]} ({ex.get('attn_what', '')}): {row['attn_us']:,.1f} us "
              f"x {row['attn_calls']:.0f} per step; {ex.get('attn_grid', '')}", highlight=False, soft_wrap=True)
    for a in ex.get("attn_kernels", [])[1:]:
        if a["name"] != row["attn_kernel"]:
            out.print(f"    also {a['name'][:60]} ({a['role'] or a['what']}): {a['us']:,.1f} us x {a['per_step']:.0f}; "
                      f"{a['grid']}", highlight=False, soft_wrap=True)
    if row.get("attn_eff_bw_GBps") is not None:
        out.print(f"  with the model: {ex['attn_kv_B_per_call'] / 1e6:,.1f} MB of KV per call, effective "
                  f"{row['attn_eff_bw_GBps']:,.1f} GB/s; kernel floor {row['attn_kernel_floor_us']:,.1f} us over "
                  f"{ex.get('attn_kernel_floor_basis', 'the datasheet')} ({row['attn_vs_kernel_floor']:,.1f}x it); all attention kernels together "
                  f"{row.get('attn_class_eff_bw_GBps') or 0:,.1f} GB/s of the step's KV; the step {_ms(row['step_ms'])} ms against the floor "
                  f"{_ms(row['floor_ms'])} ms (gap {row['gap']:,.1f}x, {ex.get('binds', '')}-bound)", highlight=False,
                  soft_wrap=True)
        out.print(f"  the floor at {row['ctx']:,} tokens of context (from {row['ctx_from']}): {row['floor_from']}",
                  highlight=False, soft_wrap=True)
        if row.get("attn_calls_vs_layers") not in (None, 1.0):
            out.print(f"  {row['attn_calls']:.0f} calls of {row['attn_kernel'][:40]} per step for the model's layers: "
                      "the step's KV is divided over the calls counted", highlight=False, soft_wrap=True)
        if row["gap"] < 1:  # physics cannot be beaten: the model, context or sharding is not the trace's
            out.print("  step below the floor: check --model, --ctx and --tp (the trace's step is not this model's)",
                      highlight=False, soft_wrap=True)


def print_ranks(rows: list[dict], skew: dict) -> None:
    out.print(f"[bold]{len(rows)} ranks[/]: rank, step ms, attention ms, communication ms, idle ms", highlight=False,
              markup=True)
    for r in rows:
        out.print(f"  {r['rank']:>4} {_ms(r['step_ms']):>10} {_ms(r['attention_ms']):>10} "
                  f"{_ms(r['communication_ms']):>10} {_ms(r['idle_ms']):>10}", highlight=False)
    out.print(f"  skew: rank {skew['slowest_rank']}'s step {_ms(skew['slowest_step_ms'])} ms is {skew['skew']:.3f}x "
              f"the median rank's {_ms(skew['median_step_ms'])} ms", highlight=False)


def print_diff(result) -> None:
    """Both sides' steps, the classes side by side, the kernels whose time moved most, added and gone."""
    d = result.summary["diff"]
    out.print(f"[bold]before[/]: {escape(Path(d['before']).name)}  [bold]after[/]: {escape(Path(d['after']).name)}",
              highlight=False, markup=True)
    sp = f" ({d['speedup']:.2f}x)" if d.get("speedup") else ""
    out.print(f"  step {_ms(d['step_before_ms'])} -> {_ms(d['step_after_ms'])} ms ({d['step_delta_ms']:+,.3f} ms{sp})"
              + (f"; floor gap {d['gap_before']:,.1f}x -> {d['gap_after']:,.1f}x (floor {_ms(d['floor_before_ms'])}"
                 f" / {_ms(d['floor_after_ms'])} ms)" if d.get("gap_before") else ""), highlight=False, soft_wrap=True)
    if d.get("changed"):
        out.print(f"  what changed most: {d['changed'][:60]}, {_ms(d['changed_before_ms'])} -> "
                  f"{_ms(d['changed_after_ms'])} ms per step", highlight=False, soft_wrap=True)
    out.print(f"  {'class':<20} {'before ms':>10} {'share':>7} {'after ms':>10} {'share':>7} {'moved ms':>10}",
              highlight=False)
    for c in d["classes"]:
        if c["before_calls"] or c["after_calls"]:
            out.print(f"  {LABELS[c['cls']]:<20} {_ms(c['before_ms']):>10} {c['before_share']:>7.1%} "
                      f"{_ms(c['after_ms']):>10} {c['after_share']:>7.1%} {c['delta_ms']:>+10.3f}", highlight=False)
    out.print("  kernels whose time moved most (ms per step, before -> after):", highlight=False)
    for k in d["kernels"][:8]:
        out.print(f"    {k['name'][:60]:<60} {_ms(k['before_ms']):>9} -> {_ms(k['after_ms']):>9} "
                  f"({k['delta_ms']:+,.3f})", highlight=False)
    for what in ("added", "gone"):
        if d[what]:
            out.print(f"  {what}: {'; '.join(n[:100] for n in d[what][:6])}", highlight=False, soft_wrap=True)


def _model(name: str) -> None:
    from ..physics.models import get_model

    try:
        get_model(name)
    except DDProbeError as e:
        raise DDProbeError(str(e).split(" (or pass")[0]) from None


def _gpu(name: str) -> None:
    from ..physics.gpus import get_gpu

    try:
        get_gpu(name)
    except DDProbeError as e:
        raise DDProbeError(str(e).split(" (or pass")[0]) from None


def _regex(text: str) -> None:
    from ..probes.trace_parts.read import check_marker

    check_marker(text)


FilesArg = Annotated[Optional[list[Path]], typer.Argument(help="Trace files (.json or .json.gz, one per rank) or "
                                                               "folders of them.", show_default=False)]


@app.command()
@errors_exit_1
@floor_options(tp=None, weight_dtype=None, kv_dtype=None)  # None: the trace's ranks; a dtype not given
def trace(
    files: FilesArg = None,
    url: Annotated[Optional[str], typer.Option("--url", help="Profile this SGLang / vLLM / ddprobe serve server: "
                                                             "/start_profile, a request, /stop_profile, then read "
                                                             "the traces it writes into --dir.")] = None,
    num_steps: Annotated[int, typer.Option("--num-steps", help="With --url: decode steps to profile.",
                                           callback=checked(within(1, 10_000, " steps")))] = 8,
    trace_dir: Annotated[Optional[Path], typer.Option("--dir", help="With --url: the folder the server writes its "
                                                                    "traces into (SGLang's output_dir; vLLM's "
                                                                    "torch_profiler_dir). Default: "
                                                                    "ddprobe-results/traces-<time>.")] = None,
    wait: Annotated[float, typer.Option("--wait", help="With --url: seconds to wait for the trace files.",
                                        callback=checked(within(1.0, MAX_TIMEOUT_S, " s")))] = 300.0,
    request: Annotated[bool, typer.Option("--request/--no-request", help="With --url: send one short request to make "
                                                                          "the steps, or let your own traffic make "
                                                                          "them (a long-context request).")] = True,
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="Model preset (kimi-k2.6, kimi-k2, "
                                                                       "deepseek-v3, ...): adds the attention "
                                                                       "kernel's bandwidth and floors.",
                                                    callback=checked(_model))] = None,
    ctx: Annotated[Optional[str], typer.Option("--ctx", help="Context the traced steps attended over, k = 1024 "
                                                             "(needed with --model when the trace has no step "
                                                             "labels; with --url the request's prompt length).",
                                                callback=checked(parse_tokens))] = None,
    prompt_file: Annotated[Optional[Path], typer.Option("--prompt-file", help="With --url: the request's prompt, "
                                                                              "a text file, instead of --ctx "
                                                                              "tokens.")] = None,
    marker: Annotated[str, typer.Option("--marker", help="Regular expression of the step annotations.",
                                        callback=checked(_regex))]
    = r"^ProfilerStep#\d+$",
    cpu_ops: Annotated[bool, typer.Option("--cpu-ops", help="Analyse the CPU operators of a trace without GPU "
                                                            "kernels (a CPU engine's).")] = False,
    out_path: Annotated[Optional[Path], typer.Option("--out", "-o", help="Results file (JSON). Default: "
                                                                         "ddprobe-results/trace-<time>.json.")] = None,
    force: ForceOpt = False,
    fo: FloorOptions = FloorOptions(),
):
    """Read torch-profiler traces (SGLang, vLLM, any Kineto trace): per verify step, where the GPU time went.
    `ddprobe trace diff A B`: two traces' steps side by side. The floor options: the GPU defaults to the trace's
    when known (else h200), tp to the trace's ranks, the kernels to those the trace counted, the communication to
    what it measured."""
    import sys

    from ..probes.trace import run_trace
    from .outputs import check_file

    if files and str(files[0]) == "diff" and not files[0].exists():
        return trace_diff(files[1:], model, ctx, out_path, force, {
            "--url": url, "--prompt-file": prompt_file, "--cpu-ops": cpu_ops,
            "--marker": marker != r"^ProfilerStep#\d+$", **floor_given(fo)})
    if bool(files) == bool(url):
        raise DDProbeError("give trace files or folders, or --url to profile a server (one of the two)")
    _unused(url, model, fo, {"--num-steps": num_steps != 8, "--dir": trace_dir, "--wait": wait != 300.0,
                             "--no-request": not request, "--prompt-file": prompt_file})
    path = check_file("--out", results_path(out_path, "trace"), force=force, keep_existing=True,
                      inputs=[("FILES", f) for f in files or []])
    n = parse_tokens(ctx) if ctx else None
    if url:
        from ..probes.trace_parts.trigger import profile_server

        files = profile_server(url, num_steps, trace_dir, wait, progress=err.print, request=request, ctx=n,
                               prompt_file=prompt_file)
        n = None if model is None else n  # the labels say the context; --ctx was the request's prompt
    result, ranks = run_trace(files, marker=marker, cpu_ops=cpu_ops, model=model, tp=fo.tp, rows=fo.rows(),
                              gpu=fo.gpu, ctx=n, dtypes=trace_dtypes(fo), floor=trace_floor(fo),
                              progress=ReadProgress(), command=" ".join(sys.argv))
    for row, r in zip(result.rows, ranks):
        print_rank(row, result.summary["top"][str(r.rank)], r.detail)
    if result.summary.get("skew"):
        print_ranks(result.rows, result.summary["skew"])
    result.save(path)
    err.print(f"results: {path}", highlight=False)


def _unused(url: str | None, model: str | None, fo: FloorOptions, url_only: dict) -> None:
    """An option its combination ignores, refused by name: those of ``--url`` (``url_only``, given) without it, and
    --budget without --model (it sets the floor's rows; the other floor options are refused by ``trace_model``)."""
    given = [k for k, v in url_only.items() if v]
    if given and not url:
        raise DDProbeError(f"{given[0]} is for --url (profiling a server); reading trace files it has no use: "
                           "leave it out, or give --url")
    if fo.budget is not None and model is None:
        raise DDProbeError("--budget needs --model: it sets the rows of the floor, which needs the model")


def floor_given(fo: FloorOptions) -> dict:
    """The floor options given (not at trace's defaults), by flag: what `trace diff` refuses by name."""
    from dataclasses import asdict

    return {"--" + k.replace("_", "-"): v for k, v in asdict(fo).items() if v not in (None, False) and
            not (k in ("ep", "dcp") and v == 1)}


def trace_dtypes(fo: FloorOptions) -> dict:
    if fo.gpu is not None:
        try:
            _gpu(fo.gpu)
        except DDProbeError as e:
            raise DDProbeError(f"--gpu: {e}") from None
    return {"weight_dtype": fo.weight_dtype, "expert_dtype": fo.expert_dtype, "kv_dtype": fo.kv_dtype}


def trace_floor(fo: FloorOptions) -> dict:
    """The floor options besides tp, GPU and dtypes, as ``probes.trace.trace_model`` takes them."""
    return {"ep": fo.ep, "dcp": fo.dcp, "bw_Bps": fo.bw_Bps(), "flops_per_s": fo.flops_per_s(), "launch": fo.launch(),
            "launch_any_gpu": fo.launch_any_gpu, "kernels": fo.kernels, "allreduce_us": fo.allreduce_us,
            "allreduce_from": str(fo.allreduce_from) if fo.allreduce_from else None}


def trace_diff(files: list[Path], model: str | None, ctx: str | None, out_path: Path | None, force: bool,
               unused: dict) -> None:
    """``ddprobe trace diff A B``: per step, class and kernel, before and after (``trace_parts.diff``); ``unused``:
    the options a diff does not take, refused by name when given."""
    import sys

    from ..probes.trace_parts.diff import run_diff
    from .outputs import check_file

    given = [k for k, v in unused.items() if v]
    if given:
        raise DDProbeError(f"trace diff takes --model, --ctx, --out and --force, not {given[0]}")
    if len(files) != 2:
        raise DDProbeError(f"trace diff takes two traces (before, after), got {len(files)}")
    path = check_file("--out", results_path(out_path, "trace-diff"), force=force, keep_existing=True,
                      inputs=[("FILES", f) for f in files])
    result = run_diff(files[0], files[1], model=model, ctx=parse_tokens(ctx) if ctx else None,
                      command=" ".join(sys.argv))
    print_diff(result)
    result.save(path)
    err.print(f"results: {path}", highlight=False)
