"""`ddprobe gpu-util`: is the GPU doing work during decode?"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..signals import COLUMNS, LABELS
from ..units import DDProbeError, fmt_bandwidth, fmt_bytes, fmt_ratio
from .app import app
from .gpu_source import SOURCE_PARAMS, ExporterUrlOpt, MatchOpt, PromUrlOpt, SourceOpt, evidence_lines, \
    print_fleet
from .progress import CellDisplay
from .options import ENGINE_OPTION_NAMES, BackendOpt, EngineOptions, ForceOpt, TimeoutOpt, UrlOpt, engine_options, err, errors_exit_1, \
    num_or_dash, out, results_path, text_kinds, typed_flags
from .outputs import check_outputs
from .tables import Col, print_fitted

SIGNALS = [(k, LABELS[k]) for k in COLUMNS]  # the table's columns, from the signals table
# what a narrow terminal keeps longest (tables.Col priorities): the verdict's evidence first
SIGNAL_PRIORITY = {"tensor_active_pct": 1, "dram_active_pct": 1, "sm_active_pct": 2, "power_pct": 2,
                   "util_gpu_pct": 2, "util_mem_pct": 3, "sm_clock_MHz": 4}
# every option but the files: what a --replay does not use
REPLAY_IGNORES = {"prompt_len", "decode_tokens", "period", "text", "backend", "url", "timeout", "deep", "warmup",
                  *ENGINE_OPTION_NAMES, *SOURCE_PARAMS}


@app.command("gpu-util")
@errors_exit_1
@engine_options(preset="k2", device="cuda", dtype="bf16", heads=8)
def gpu_util(
    prompt_len: Annotated[str, typer.Option("--prompt-len", help="Prompt tokens, k = 1024.")] = "64k",
    decode_tokens: Annotated[int, typer.Option("--decode-tokens", help="Tokens decoded (novel text: about one "
                                                                       "per verify step).")] = 100,
    period: Annotated[str, typer.Option("--period", help="Sampling period; bare numbers are ms.")] = "200ms",
    text: Annotated[str, typer.Option("--text", help="Prompt text kind: novel, predictable, recall.")] = "novel",
    backend: BackendOpt = "engine",
    url: UrlOpt = None,
    timeout: TimeoutOpt = 600.0,
    deep: Annotated[bool, typer.Option("--deep", help="Also run Nsight Compute (ncu --clock-control none) over a "
                                                      "few verify kernels of a decode step, when ncu is "
                                                      "installed.")] = False,
    warmup: Annotated[bool, typer.Option("--warmup/--no-warmup", help="First run a short request (256 tokens, "
                                                                     "3 new) so kernels compile outside the "
                                                                     "sampled one.")] = True,
    source: SourceOpt = "nvml",
    prom_url: PromUrlOpt = None,
    match: MatchOpt = None,
    exporter_url: ExporterUrlOpt = None,
    replay: Annotated[Optional[Path], typer.Option("--replay", help="Re-analyse a saved gpu-util results file "
                                                                    "(no GPU needed).")] = None,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Results file (default "
                                                                     "ddprobe-results/gpu-util-<time>.json; with "
                                                                     "--replay: none unless given).")]
    = None,
    csv_path: Annotated[Optional[Path], typer.Option("--csv", help="Also write the timeline as CSV.")] = None,
    force: ForceOpt = False,
    *, ctx: typer.Context, eng: EngineOptions,
):
    """Power, memory-controller, SM and tensor-pipe telemetry during prefill and decode, with a verdict per phase."""
    from ..probes.backends import make_backend
    from ..probes.commit import check_contexts
    from ..probes.gpu_util import DeepRun, check_decode_tokens, gpu_util_run
    from .gpu_source import open_source
    from ..results import Result, ResultWriter, RunMeta
    from ..units import parse_time, parse_tokens

    # a replay writes only the files asked for (its input is the results file); a measurement, always one
    path = json_path if replay is not None else results_path(json_path, "gpu-util")
    check_outputs({"--json": path, "--csv": csv_path}, force=force, inputs={"--replay": replay},
                  keep_existing=True)  # before anything is sampled
    if replay is not None:
        res = _replay(ctx, replay, path, csv_path)
    else:
        n_prompt, period_s, kind = parse_tokens(prompt_len), parse_time(period, default_unit="ms"), _one_kind(text)
        check_decode_tokens(decode_tokens)  # plain values first: no GPU or source is probed for a bad one
        telemetry = open_source(source, prom_url, match, exporter_url, period_s)  # before any model is built
        if backend == "engine" and eng.chosen():
            err.print(f"engine: {eng.chosen()}", highlight=False)
        if backend == "engine" and eng.attn_reason():
            err.print(eng.attn_reason(), highlight=False, markup=False, soft_wrap=True)
        be = make_backend(backend, url, timeout,
                          engine_factory=lambda: eng.backend(eng.capacity(n_prompt, decode_tokens)))
        check_contexts(be, [n_prompt], decode_tokens)  # one line naming --prompt-len when it does not fit
        config = {"prompt_len": n_prompt, "decode_tokens": decode_tokens, **be.describe()}
        writer = ResultWriter(Result(kind="gpu-util", meta=RunMeta.collect(), config=config), path, csv_path)
        deep_run = DeepRun(period, backend, timeout, url, tuple(eng.args()), eng.resolved().attn) if deep else None
        with CellDisplay(err, 1, label="request") as display:
            res = gpu_util_run(be, n_prompt, decode_tokens, period_s, writer, text=kind, seed=eng.seed,
                               telemetry=telemetry, on_event=lambda m: err.print(m, style="dim"), warmup=warmup,
                               progress=display, on_estimate=_said(display), deep=deep_run)
    print_summary(res)
    written = [str(p) for p in (path, csv_path) if p]
    if written:
        out.print(f"{len(res.rows)} sample(s) written to {' and '.join(written)}")
    if res.summary.get("telemetry_error"):
        raise DDProbeError(f"{res.summary['telemetry_error']} (the request's numbers are kept in {path})")


def _replay(ctx: typer.Context, replay: Path, path: Optional[Path], csv_path: Optional[Path]):
    """A saved gpu-util run re-analysed (``probes.gpu_util.replay``), written to the files asked for; the options it
    would ignore are refused."""
    from ..probes.gpu_util import replay as replay_result
    from ..results import Result, ResultWriter

    ignored = typed_flags(ctx, REPLAY_IGNORES)
    if ignored:
        raise DDProbeError(f"--replay re-analyses a saved file: {', '.join(ignored)} would be ignored (drop "
                           f"{'it' if len(ignored) == 1 else 'them'}, or measure without --replay)")
    res = replay_result(Result.load(replay))
    ResultWriter(res, path, csv_path)
    return res


def _one_kind(text: str) -> str:
    kinds = text_kinds(text)
    if len(kinds) > 1:
        raise DDProbeError(f"--text takes one kind for gpu-util, got {text!r}")
    return kinds[0]


def _said(display: CellDisplay):
    """What gpu-util does with its request's estimate: the display's prefill fit, and one line when long."""

    def on_estimate(e) -> None:
        display.fit = e.calibration.prefill if e.calibration is not None else None
        line = e.line()
        if line:
            err.print(line, highlight=False, markup=False, soft_wrap=True)

    return on_estimate


def _print_parts(p) -> None:
    """The decode step's launch part and bandwidth part (``gpu_util.step_parts``)."""
    if not isinstance(p, dict):
        return
    syncs = f" + {p['syncs']} syncs" if p.get("syncs") else ""
    out.print(f"where the step goes: launches >= {p['launch_ms']:.3g} ms ({p['kernels']} kernels x "
              f"{p['kernel_us']:.3g} us{syncs}, {p['launch_share']:.0%} of the step), "
              f"{p.get('work') or 'bytes at the bandwidth'} >= {p['bytes_ms']:.3g} ms ({p['bytes_share']:.0%}): "
              f"{p['bound']}; {p.get('source') or ''}",
              highlight=False, soft_wrap=True)


def print_summary(res) -> None:
    """The per-GPU, per-phase table, the evidence per phase (one line where the GPUs agree) and the step
    numbers."""
    s = res.summary
    cols = [Col("GPU", 1), Col("phase", justify="left"), Col("n", 4)] + \
        [Col(c, SIGNAL_PRIORITY.get(k, 3)) for k, c in SIGNALS] + [Col("verdict", justify="left")]

    def cell(sig):
        m, p = sig.get("median"), sig.get("p90")
        return "-" if m is None else "/".join(f"{v:.0f}" if abs(v) >= 10 else f"{v:.2g}" for v in (m, p))

    rows = [[str(d.get("name", d["gpu"])), d["phase"], str(d["samples"]), *[cell(d["signals"][k]) for k, _ in SIGNALS],
             d["verdict"]] for d in s.get("per_phase", [])]
    print_fitted("gpu-util: median/p90 per GPU and phase", cols, rows)
    for line in evidence_lines(s):
        out.print(line, highlight=False, soft_wrap=True)
    print_fleet(s)
    nums = []
    if s.get("decode_step_ms"):
        nums.append(f"decode step {s['decode_step_ms']:.4g} ms (median)")
    if s.get("eff_bw_GBps"):
        nums.append(f"effective KV bandwidth {fmt_bandwidth(s['eff_bw_GBps'] * 1e9)} "
                    f"({fmt_bytes(s['kv_GB_per_step'] * 1e9)} per step)")
    if s.get("gap"):
        from ..physics.step_model import bound_word

        binds = f", {bound_word(s['floor_binds'])}" if s.get("floor_binds") else ""
        nums.append(f"{fmt_ratio(s['gap'])} the floor {s['floor_ms']:.3g} ms (the whole step{binds})")
    if s.get("attn_gap"):
        nums.append(f"attention gap {fmt_ratio(s['attn_gap'])} (KV floor {s['kv_floor_ms']:.3g} ms)")
    if s.get("energy_J_per_token"):
        nums.append(f"{s['energy_J_per_token']:.3g} J per decoded token")
    elif s.get("request_energy_J_per_token"):  # a server without a first-token time: prefill not separable
        nums.append(f"{s['request_energy_J_per_token']:.3g} J per decoded token with the prefill's energy in it "
                    "(the backend reports no first-token time)")
    if nums:
        out.print("; ".join(nums) + ".", highlight=False)
    _print_parts(s.get("step_parts"))
    deep_d = s.get("deep")
    if isinstance(deep_d, dict):
        out.print(f"ncu: {deep_d['skipped']}" if "skipped" in deep_d else
                  "ncu: " + "; ".join(f"{k.get('kernel')}: {num_or_dash(k.get('time_us'), '.4g')} us, tensor "
                                      f"{k.get('tensor_pct')}%, DRAM {k.get('dram_pct')}%"
                                      for k in deep_d["kernels"]), highlight=False, soft_wrap=True)

