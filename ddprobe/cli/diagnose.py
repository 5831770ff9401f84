"""`ddprobe diagnose`: the whole investigation in one command, ending in one report."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from ..schema import one_step_tokens
from ..units import DDProbeError, parse_context_list
from .app import app
from ..probes.bench.estimate import fmt_duration
from .commit import announce
from .gpu_source import ExporterUrlOpt, MatchOpt, PromUrlOpt, SourceOpt
from .outputs import check_folder
from .progress import CellDisplay
from .floor_options import COMM, SHARDING, FloorOptions, floor_options, note_dense
from .options import BackendOpt, EngineOptions, ForceOpt, TimeoutOpt, UrlOpt, engine_options, err, errors_exit_1, \
    out, typed_flags, warm_up


@app.command()
@errors_exit_1
@engine_options()
@floor_options(exclude=("budget",))  # the engine options' --budget is the tree's
def diagnose(
    tctx: typer.Context,
    ctx: Annotated[str, typer.Option("--ctx", help="Context lengths, k = 1024.")] = "1k,4k",
    out_dir: Annotated[Optional[str], typer.Option("--out-dir", help="Folder for every results file and the "
                                                                      "report (default ddprobe-diagnose-<time>).")]
    = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Tokens decoded per commit cell.")] = 64,
    decode_tokens: Annotated[int, typer.Option("--decode-tokens", help="Tokens decoded under telemetry.")] = 64,
    backend: BackendOpt = "engine",
    url: UrlOpt = None,
    timeout: TimeoutOpt = 600.0,
    model: Annotated[str, typer.Option("--model", help="Floor model preset for a server backend.")] = "kimi-k2.6",
    source: SourceOpt = "nvml",
    prom_url: PromUrlOpt = None,
    match: MatchOpt = None,
    exporter_url: ExporterUrlOpt = None,
    force: ForceOpt = False,
    tree: Annotated[Optional[str], typer.Option("--tree", help="Draft shapes the decision compares on the engine: "
                                                "ddtree, chain (default both).")] = None,
    *, eng: EngineOptions, fo: FloorOptions = FloorOptions(),
):
    """The whole investigation in one run: commit length, GPU telemetry, floor, paged vs split; one report. The floor
    options: --gpu defaults to the GPU NVML sees; the engine backend's floor uses its own weights and dtype."""
    import datetime as dt

    from ..probes.backends import make_backend
    from ..probes.commit import check_contexts
    from ..probes.diagnose import FILES, GPU_UTIL_PERIOD_S, Diagnose, DiagnoseOptions
    from .gpu_source import check_source, open_source

    ctxs = parse_context_list(ctx)
    bw_Bps, trees = _checked(tctx, backend, model, fo, max_new_tokens, decode_tokens, tree)
    if backend == "engine" and max_new_tokens < (need := one_step_tokens(eng.budget)):
        raise DDProbeError(f"--max-new-tokens {max_new_tokens}: too few for a commit length at budget {eng.budget} "
                           f"(the first token is the prefill's, a step commits up to {eng.budget + 1}): give {need} "
                           "or more")
    folder = Path(out_dir) if out_dir is not None else Path(f"ddprobe-diagnose-{dt.datetime.now():%Y%m%d-%H%M%S}")
    if out_dir == "":
        raise DDProbeError("--out-dir: empty path (give a folder name)")
    check_folder("--out-dir", folder, names=FILES, force=force)  # before anything is built or measured
    # a fleet's source is checked and asked now (open_source), before any model is built; with NVML only the
    # options are checked here, NVML itself by the gpu-util step (skipped with the reason without a GPU)
    if source == "nvml":
        check_source(source, prom_url, match, exporter_url)
    telemetry = None if source == "nvml" else open_source(source, prom_url, match, exporter_url, GPU_UTIL_PERIOD_S)
    be = make_backend(backend, url, timeout, engine_factory=lambda: eng.backend(
        eng.capacity(max(ctxs), max(max_new_tokens, decode_tokens))))
    check_contexts(be, ctxs, max(max_new_tokens, decode_tokens))  # the longer of its two requests
    announce(eng, be)
    warm_up(be, None)  # outside every measured step, for the largest request
    opts = DiagnoseOptions(ctxs=ctxs, max_new_tokens=max_new_tokens, decode_tokens=decode_tokens, bw_Bps=bw_Bps,
                           model=model, seed=eng.seed, telemetry=telemetry, trees=trees, **_floor_fields(fo))
    report_path = folder / "report.html"
    run = Diagnose(be, opts, folder, say=lambda m: err.print(m, highlight=False, markup=False))
    run.estimate = diagnose_estimate(be, run, opts)
    _print_claims(_run_shown(run, report_path), report_path)
    steps = [r for r in run.record.result.rows if r.get("step")]
    if steps and not any(r.get("status") == "ok" for r in steps):
        said = ", ".join(f"{r['step']}: {r['status']}" for r in steps)
        raise DDProbeError(f"no step of the diagnosis succeeded ({said}); {report_path} says why")


def _floor_fields(fo: FloorOptions) -> dict:
    """The floor options as ``DiagnoseOptions`` holds them (dtypes by their canonical names)."""
    from ..physics.shapes import dtype_name

    return dict(gpu=fo.gpu, tp=fo.tp, ep=fo.ep, dcp=fo.dcp, weight_dtype=dtype_name(fo.weight_dtype),
                expert_dtype=dtype_name(fo.expert_dtype or fo.weight_dtype), kv_dtype=dtype_name(fo.kv_dtype),
                allreduce_us=fo.allreduce_us, allreduce_from=str(fo.allreduce_from) if fo.allreduce_from else None,
                kernels=fo.kernels, flops_per_s=fo.flops_per_s(), launch=fo.launch(),
                launch_any_gpu=fo.launch_any_gpu)


def _print_claims(claims: list, report_path: Path) -> None:
    for c in claims:
        out.print(f"[bold]{escape(c.title)}[/] " + (f"[yellow]\\[{c.status}][/] " if c.status != "ok" else "")
                  + escape(c.text), highlight=False, markup=True)
    out.print(f"report: {report_path}", highlight=False)


def _checked(tctx: typer.Context, backend: str, model: str, fo: FloorOptions, max_new_tokens: int,
             decode_tokens: int, tree: Optional[str]):
    """Refuse, before anything runs, what the steps would refuse later; returns the floor's bandwidth (--bw) and
    the draft shapes to compare (a server decides its own: --tree refused there)."""
    from ..probes.commit import tree_shapes
    from ..probes.floor import Sharding
    from ..probes.gpu_util import check_decode_tokens
    from ..physics.models import get_model
    from ..physics.gpus import get_gpu

    tp, ep, dcp = fo.tp, fo.ep, fo.dcp
    if fo.gpu is not None:
        get_gpu(fo.gpu)  # unknown names ('' included) fail before anything runs
    if max_new_tokens < 2:  # the first token is the prefill's: commit length needs a verify step
        raise DDProbeError(f"--max-new-tokens must be at least 2, got {max_new_tokens}")
    if backend == "engine" and typed_flags(tctx, ("model",)):
        raise DDProbeError("--model: the engine backend's floor uses the engine's own model (--preset); --model is "
                           "for a server backend (sglang, vllm)")
    sharding = typed_flags(tctx, SHARDING + COMM + ("kernels", "kv_dtype"))
    if backend == "engine" and sharding:
        raise DDProbeError(f"{', '.join(sharding)}: the engine backend's floor uses the engine's own weights; "
                           "these options are for a server backend (sglang, vllm)")
    if backend != "engine":
        spec = get_model(model)
        spec.moe.check(tp, ep)  # a sharding the model cannot have fails before anything runs
        spec.attn.check_tp(tp)
        Sharding(tp=tp, ep=ep, dcp=dcp)  # --dcp must divide --tp: refused before anything runs
        note_dense(spec, ep)
    bw_Bps = fo.bw_Bps()
    from ..physics.plan import launch_for

    launch_for(fo.launch(), fo.gpu, fo.launch_any_gpu)  # a file that cannot be read, or another GPU's: refused now
    check_decode_tokens(decode_tokens)
    if backend != "engine" and tree is not None:
        raise DDProbeError(f"--tree: the {backend} server decides its own draft shape; ddprobe cannot change it (its "
                           "commit rows report drafts_per_step, the nodes it drafted per step): drop --tree")
    return bw_Bps, tuple(tree_shapes(tree or "ddtree,chain")) if backend == "engine" else ("ddtree",)


def _run_shown(run, report_path: Path) -> list:
    """``run_and_report`` under the requests' progress display (with the estimate, when there is one)."""
    est = run.estimate
    with CellDisplay(err, sum(len(v) for v in run.requests().values()),
                     est.calibration.prefill if est is not None and est.calibration is not None else None,
                     label="requests", estimate=None if est is None else f"about {fmt_duration(est.total_s)}") \
            as display:
        run.progress = display
        return run_and_report(run, report_path)


def diagnose_estimate(be, run, opts):
    """The estimate of the diagnosis' measured requests (commit cells with prefix reuse, then the gpu-util
    request), said when long (``estimate.SAY_OVER_S``); None where the backend cannot be calibrated."""
    from ..probes.bench.estimate import estimate_run

    reqs = run.requests()
    est = estimate_run(be, reqs["commit"], opts.max_new_tokens, opts.seed)
    if est is not None and "gpu-util" in reqs:
        est = est.plus(estimate_run(be, reqs["gpu-util"], opts.decode_tokens, opts.seed, reuse=False,
                                    calibration=est.calibration))
    line = est.line() if est is not None else None
    if line:
        err.print(line, highlight=False, markup=False, soft_wrap=True)
    return est


def run_and_report(run, report_path: Path) -> list:
    """Run every diagnose step, then write the report from the files written, also when a step or the
    user interrupts (the report shows what was measured); returns the diagnosis claims."""
    from ..reports.render import build, write

    try:
        run.run()
    finally:
        built = build(run.written(), command=run.meta.command, title="ddprobe diagnosis", with_diagnosis=True)
        write(built, report_path)
    return built.diagnosis
