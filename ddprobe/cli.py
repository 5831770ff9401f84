"""ddprobe command line: each command parses, calls the library, prints. No logic here.

Domain errors (``DDProbeError``) print one line on stderr and exit 1. GPU libraries are
imported inside the commands that need them, so ``--help`` and ``floor`` run anywhere.
"""
from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from . import __version__
from .units import DDProbeError, fmt_bandwidth, fmt_bytes, fmt_ratio, fmt_tokens, parse_bandwidth, parse_time_list, \
    parse_token_list

app = typer.Typer(
    name="ddprobe",
    help="Why is DDTree speculative decoding slow at long context? Probes, floors and a reference engine.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# Piped output (CI logs, files) gets a wide page instead of rich's default 80 columns.
out = Console(width=None if sys.stdout.isatty() else 132)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 200)


def _errors_exit_1(fn):
    """Turn a domain error into one line on stderr and exit code 1, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except DDProbeError as e:
            err.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
            raise typer.Exit(1) from None
        except OSError as e:  # a results file or folder that cannot be written
            where = f" {e.filename}" if e.filename else ""
            err.print(f"[bold red]error:[/] cannot write{escape(where)}: {escape(e.strerror or str(e))}",
                      highlight=False, soft_wrap=True)
            raise typer.Exit(1) from None

    return wrapper


def _num_or_dash(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _version(value: bool):
    if value:
        out.print(f"ddprobe {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
):
    pass


@app.command()
@_errors_exit_1
def floor(
    model: Annotated[str, typer.Option("--model", "-m", help="Model preset: kimi-k2.6, kimi-k2, deepseek-v3, "
                                                             "qwen3-8b, llama-3.1-8b.")] = "kimi-k2.6",
    config: Annotated[Optional[Path], typer.Option("--config", help="Hugging Face config.json instead of a preset "
                                                                    "(MLA or GQA).")] = None,
    ctx: Annotated[str, typer.Option("--ctx", help="Context length(s), k = 1024: 128k or 1k,16k,64k,128k.")] = "128k",
    queries: Annotated[int, typer.Option("--queries", help="Verify rows per step (budget + 1).")] = 9,
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel GPUs (MLA keeps the whole latent cache on "
                                                 "each; heads are split).")] = 1,
    gpu: Annotated[Optional[str], typer.Option("--gpu", help="GPU preset for bandwidth and tensor rate "
                                                             "(default h200 unless --bw).")] = None,
    bw: Annotated[Optional[str], typer.Option("--bw", help="Memory bandwidth instead of a preset, e.g. 1.8TB/s "
                                                           "(a measured ceiling beats a datasheet).")] = None,
    tflops: Annotated[Optional[float], typer.Option("--tflops", help="Dense bf16 tensor rate in TFLOP/s "
                                                                     "(default: the GPU preset's).")] = None,
    step_ms: Annotated[Optional[str], typer.Option("--step-ms", help="Measured step time(s): one for all "
                                                                     "contexts or one per context; bare numbers "
                                                                     "are ms (714 or 714ms,1.43s).")] = None,
    include_weights: Annotated[bool, typer.Option("--include-weights", help="Add the active weights to the "
                                                                            "bytes read per step.")] = False,
    weight_dtype: Annotated[str, typer.Option("--weight-dtype", help="Bytes per weight for --include-weights: "
                                                                     "bf16, fp8, int8, int4, fp4.")] = "bf16",
    kv_dtype: Annotated[str, typer.Option("--kv-dtype", help="KV cache dtype: bf16, fp16, fp8.")] = "bf16",
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON instead of a table.")] = False,
    save: Annotated[Optional[Path], typer.Option("--out", "-o", help="Also write the results file (JSON).")] = None,
):
    """Bandwidth floor of a verify step: bytes read, floor time, and the gap to a measured step."""
    from .probes.floor import FloorInput, floor_table, get_gpu
    from .probes.models import get_model, model_from_config
    from .results import Result, RunMeta

    spec = model_from_config(config) if config else get_model(model)
    ctxs = parse_token_list(ctx)
    steps = [t * 1e3 for t in parse_time_list(step_ms, default_unit="ms")] if step_ms else None
    gpu_spec = get_gpu(gpu) if gpu else (None if bw else get_gpu("h200"))
    bw_Bps = parse_bandwidth(bw) if bw else gpu_spec.bw_Bps
    if tflops is not None and tflops <= 0:
        raise DDProbeError(f"--tflops must be greater than zero, got {tflops}")
    rate = tflops * 1e12 if tflops else (gpu_spec.bf16_flops if gpu_spec else None)
    inp = FloorInput(model=spec, bw_Bps=bw_Bps, queries=queries, tp=tp, kv_dtype=kv_dtype, flops_per_s=rate,
                     weights=weight_dtype if include_weights else None)
    rows = floor_table(inp, ctxs, steps)

    config_d = {"model": spec.name, "queries": queries, "tp": tp, "gpu": gpu_spec.name if gpu_spec else None,
                "bw_Bps": bw_Bps, "flops_per_s": rate, "kv_dtype": kv_dtype,
                "weights": inp.weights, "active_params": spec.params(active=True)}
    result = Result(kind="floor", meta=RunMeta.collect(probe_gpu=False), config=config_d,
                    rows=[r.to_dict() for r in rows])
    if save:
        result.save(save)
    if as_json:
        sys.stdout.write(result.to_json() + "\n")
        return

    where = gpu_spec.label if gpu_spec and not bw else "given bandwidth"
    t = Table(title=f"{spec.name}: verify floor per GPU ({queries} rows, tp {tp}, {where}, "
                    f"{fmt_bandwidth(bw_Bps)}; KV {rows[0].kv_B_per_token:,.0f} B/token)",
              title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    cols = ["ctx", "KV"] + (["weights", "read"] if include_weights else []) + ["floor", "bound"]
    if steps:
        cols += ["step", "eff bw", "gap", "re-read gap"]
    for c in cols:
        t.add_column(c, justify="right", no_wrap=True)
    for r in rows:
        cells = [fmt_tokens(r.ctx), fmt_bytes(r.kv_GB * 1e9)]
        if include_weights:
            cells += [fmt_bytes(r.weights_GB * 1e9), fmt_bytes(r.read_GB * 1e9)]
        cells += [f"{r.floor_ms:.3g} ms", r.bound]
        if steps:
            cells += [f"{r.step_ms:.4g} ms", fmt_bandwidth(r.eff_bw_GBps * 1e9), fmt_ratio(r.gap),
                      fmt_ratio(r.gap_if_rows_reread)]
        t.add_row(*cells)
    out.print(t)
    if save:
        out.print(f"results written to {save}")


_ENGINE_HELP = "Engine backend"


def _engine_backend(preset: str, attn: str, budget: int, device: str, dtype: str, seed: int, heads: Optional[int],
                    max_ctx: Optional[int], weights: str = "auto"):
    from .probes.engine_backend import EngineBackend

    return EngineBackend(preset=preset, attn=attn, budget=budget, device=device, dtype=dtype, seed=seed, heads=heads,
                         max_ctx=max_ctx, weights=weights)


_WEIGHTS_HELP = "auto (the preset's trained weights when shipped: tiny), trained, or random (from --seed)."

# Options shared by the commands that drive a backend: one definition, one help text.
BackendOpt = Annotated[str, typer.Option("--backend", help="engine (in-process), sglang or vllm (a server on "
                                                           "this host).")]
UrlOpt = Annotated[Optional[str], typer.Option("--url", help="Server URL for sglang/vllm, e.g. "
                                                             "http://127.0.0.1:30000.")]
TimeoutOpt = Annotated[float, typer.Option("--timeout", help="Seconds to wait for one HTTP answer.")]
PresetOpt = Annotated[str, typer.Option("--preset", help="Engine preset: tiny or k2.", rich_help_panel=_ENGINE_HELP)]
AttnOpt = Annotated[str, typer.Option("--attn", help="Verify-attention path: reference, paged, split.",
                                      rich_help_panel=_ENGINE_HELP)]
BudgetOpt = Annotated[int, typer.Option("--budget", help="Draft-tree nodes (verify rows = budget + 1).",
                                        rich_help_panel=_ENGINE_HELP)]
DeviceOpt = Annotated[str, typer.Option("--device", help="cpu or cuda.", rich_help_panel=_ENGINE_HELP)]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="fp32, bf16, fp16.", rich_help_panel=_ENGINE_HELP)]
HeadsOpt = Annotated[Optional[int], typer.Option("--heads", help="Attention heads (k2: 8 = one tensor-parallel "
                                                                 "shard, 64 = all).", rich_help_panel=_ENGINE_HELP)]
WeightsOpt = Annotated[str, typer.Option("--weights", help=_WEIGHTS_HELP, rich_help_panel=_ENGINE_HELP)]
SeedOpt = Annotated[int, typer.Option("--seed", help="Weights seed (engine) and text seed.")]


@app.command()
@_errors_exit_1
def commit(
    ctx: Annotated[str, typer.Option("--ctx", help="Context lengths, k = 1024.")] = "1k,4k",
    text: Annotated[str, typer.Option("--text", help="Text kinds: predictable, novel, recall.")] = "predictable,novel",
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Tokens decoded per cell.")] = 128,
    backend: BackendOpt = "engine",
    url: UrlOpt = None,
    timeout: TimeoutOpt = 600.0,
    preset: PresetOpt = "tiny",
    attn: AttnOpt = "reference",
    budget: BudgetOpt = 8,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "fp32",
    heads: HeadsOpt = None,
    seed: SeedOpt = 0,
    weights: WeightsOpt = "auto",
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Results file, written after every cell "
                                                                     "(default ddprobe-results/commit-<time>.json).")]
    = None,
    csv_path: Annotated[Optional[Path], typer.Option("--csv", help="Also write the cells as CSV.")] = None,
):
    """Commit length on predictable vs novel text across context lengths: is the drafter still accepting?"""
    import datetime as dt

    from rich.live import Live

    from .probes import texts
    from .probes.backends import make_backend
    from .probes.commit import check_contexts, run_commit_probe
    from .results import Result, ResultWriter, RunMeta

    ctxs = parse_token_list(ctx)
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    bad = [k for k in kinds if k not in texts.KINDS]
    if bad or not kinds:
        raise DDProbeError(f"unknown text kind {(bad or [text])[0]!r}; known: {', '.join(texts.KINDS)}")
    need = max(ctxs) + max_new_tokens + budget + 1 + 64
    be = make_backend(backend, url, timeout,
                      engine_factory=lambda: _engine_backend(preset, attn, budget, device, dtype, seed, heads, need,
                                                             weights))
    check_contexts(be, ctxs, max_new_tokens)  # before any file is written
    if getattr(be, "note", None):
        err.print(f"[yellow]note:[/] {escape(be.note)}", highlight=False)
    path = json_path or Path("ddprobe-results") / f"commit-{dt.datetime.now():%Y%m%d-%H%M%S}.json"
    config = {"ctx": ctxs, "text": kinds, "max_new_tokens": max_new_tokens, "seed": seed, **be.describe()}
    writer = ResultWriter(Result(kind="commit", meta=RunMeta.collect(), config=config), path, csv_path)

    where = url if url else f"{config.get('preset')}, {config.get('attn')}, {config.get('weights')} weights"
    table = Table(title=f"commit length ({be.name}: {where})", title_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    for c in ["text", "ctx", "prompt", "commit len", "p10-p90", "accepted", "drafts", "steps", "ms/step", "tok/s",
              "prefill"]:
        table.add_column(c, justify="left" if c == "text" else "right", no_wrap=True)

    def fmt(v, spec):
        return "-" if v is None else format(v, spec)

    def add(row):
        spread = "-" if row["commit_len_p10"] is None else f"{row['commit_len_p10']:.0f}-{row['commit_len_p90']:.0f}"
        table.add_row(row["text"], fmt_tokens(row["ctx"]), str(row["prompt_tokens"]), f"{row['commit_len']:.2f}",
                      spread, f"{row['accepted_depth']:.2f}", fmt(row["drafts_per_step"], ".1f"),
                      str(row["verify_steps"]), fmt(row["decode_ms_per_step"], ".1f"), fmt(row["tokens_per_s"], ".1f"),
                      "-" if row["prefill_s"] is None else f"{row['prefill_s']:.2f} s")

    with Live(table, console=out, refresh_per_second=4, transient=False) as live:
        def start(kind, c, n):
            live.console.print(f"[dim]{kind} @ {fmt_tokens(c)}: prefill {n} tokens, decode {max_new_tokens}...[/]")

        try:
            run_commit_probe(be, ctxs, kinds, max_new_tokens, writer, seed=seed, on_start=start, on_cell=add)
        finally:
            n = len(writer.result.rows)
            live.console.print(f"{n} cell(s) written to {path}" + (f" and {csv_path}" if csv_path else ""))


@app.command()
@_errors_exit_1
def serve(
    host: Annotated[str, typer.Option("--host", help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port.")] = 30000,
    preset: PresetOpt = "tiny",
    attn: AttnOpt = "reference",
    budget: BudgetOpt = 8,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "fp32",
    heads: HeadsOpt = None,
    seed: SeedOpt = 0,
    weights: WeightsOpt = "auto",
    max_ctx: Annotated[Optional[str], typer.Option("--max-ctx", help="KV capacity in tokens, allocated up front "
                                                                      "(default: 8k or the preset's limit).")] = None,
    spec: Annotated[bool, typer.Option("--spec/--no-spec", help="DDTree speculative decoding, or plain greedy "
                                                                "decoding without spec counters.")] = True,
):
    """Serve the reference engine over HTTP: SGLang /generate, OpenAI /v1/completions, /tokenize, /metrics."""
    from .server import serve as run_server
    from .units import parse_tokens

    if not 0 < port < 65536:
        raise DDProbeError(f"--port must be in 1..65535, got {port}")
    import socket

    try:  # fail here, in one line, rather than in uvicorn after the engine is built
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as e:
        raise DDProbeError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    be = _engine_backend(preset, attn, budget, device, dtype, seed, heads, parse_tokens(max_ctx) if max_ctx else None,
                         weights)
    err.print(f"ddprobe serve: {preset} ({attn}, budget {budget}, {'DDTree' if spec else 'greedy'}) on "
              f"http://{host}:{port}")
    run_server(be, host=host, port=port, spec=spec)


@app.command("gpu-util")
@_errors_exit_1
def gpu_util(
    prompt_len: Annotated[str, typer.Option("--prompt-len", help="Prompt tokens, k = 1024.")] = "64k",
    decode_tokens: Annotated[int, typer.Option("--decode-tokens", help="Tokens decoded (novel text: about one "
                                                                       "per verify step).")] = 100,
    period: Annotated[str, typer.Option("--period", help="Sampling period; bare numbers are ms.")] = "200ms",
    text: Annotated[str, typer.Option("--text", help="Prompt text kind: novel, predictable, recall.")] = "novel",
    backend: BackendOpt = "engine",
    url: UrlOpt = None,
    timeout: TimeoutOpt = 600.0,
    preset: PresetOpt = "k2",
    attn: AttnOpt = "paged",
    budget: BudgetOpt = 8,
    device: DeviceOpt = "cuda",
    dtype: DtypeOpt = "bf16",
    heads: HeadsOpt = 8,
    seed: SeedOpt = 0,
    weights: WeightsOpt = "auto",
    deep: Annotated[bool, typer.Option("--deep", help="Also run Nsight Compute (ncu --clock-control none) over a "
                                                      "few verify kernels of a decode step, when ncu is "
                                                      "installed.")] = False,
    warmup: Annotated[bool, typer.Option("--warmup/--no-warmup", help="First run a short request (256 tokens, "
                                                                     "3 new) so kernels compile outside the "
                                                                     "sampled one.")] = True,
    replay: Annotated[Optional[Path], typer.Option("--replay", help="Re-analyse a saved gpu-util results file "
                                                                    "(no GPU needed).")] = None,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Results file (default "
                                                                     "ddprobe-results/gpu-util-<time>.json).")]
    = None,
    csv_path: Annotated[Optional[Path], typer.Option("--csv", help="Also write the timeline as CSV.")] = None,
):
    """Power, memory-controller, SM and tensor-pipe telemetry during prefill and decode, with a verdict per phase."""
    import datetime as dt
    import tempfile

    from .probes import texts
    from .probes.backends import make_backend
    from .probes.gpu_util import deep_child_args, deep_ncu, replay as replay_result, run_gpu_util
    from .probes.telemetry import require_nvml
    from .results import Result, ResultWriter, RunMeta
    from .units import parse_time, parse_tokens

    path = json_path or Path("ddprobe-results") / f"gpu-util-{dt.datetime.now():%Y%m%d-%H%M%S}.json"
    if replay is not None:
        res = replay_result(Result.load(replay))
        ResultWriter(res, path, csv_path)
    else:
        n_prompt, period_s = parse_tokens(prompt_len), parse_time(period, default_unit="ms")
        if text not in texts.KINDS:
            raise DDProbeError(f"unknown text kind {text!r}; known: {', '.join(texts.KINDS)}")
        names = require_nvml()  # before any model is built: one line and exit 1 without a GPU
        err.print(f"sampling {len(names)} GPU(s) every {period_s * 1e3:.0f} ms: {', '.join(sorted(set(names)))}")
        need = n_prompt + decode_tokens + budget + 1 + 64
        be = make_backend(backend, url, timeout,
                          engine_factory=lambda: _engine_backend(preset, attn, budget, device, dtype, seed, heads,
                                                                 need, weights))
        config = {"prompt_len": n_prompt, "decode_tokens": decode_tokens, **be.describe()}
        writer = ResultWriter(Result(kind="gpu-util", meta=RunMeta.collect(), config=config), path, csv_path)
        res = run_gpu_util(be, n_prompt, decode_tokens, period_s, writer, text=text, seed=seed,
                           on_event=lambda m: err.print(f"[dim]{m}[/]"), warmup=warmup)
        if deep:
            with tempfile.TemporaryDirectory() as tmp:
                child = [sys.executable, "-m", "ddprobe.cli", *deep_child_args(sys.argv[1:]), "--json",
                         str(Path(tmp) / "child.json")]
                res.summary["deep"] = deep_ncu(child, attn)
            writer.flush()

    s = res.summary
    t = Table(title="gpu-util: median/p90 per GPU and phase", title_justify="left", box=box.SIMPLE_HEAD,
              pad_edge=False)
    cols = [("util_gpu_pct", "smi util"), ("gpm_sm_util_pct", "SM"), ("gpm_tensor_util_pct", "tensor"),
            ("gpm_dram_bw_util_pct", "DRAM"), ("util_mem_pct", "mem ctl"), ("power_pct", "power/limit"),
            ("sm_clock_MHz", "SM MHz")]
    for c in ["GPU", "phase", "n"] + [c for _, c in cols] + ["verdict"]:
        t.add_column(c, justify="left" if c in ("phase", "verdict") else "right", no_wrap=True)

    def cell(sig):
        m, p = sig.get("median"), sig.get("p90")
        return "-" if m is None else "/".join(f"{v:.0f}" if abs(v) >= 10 else f"{v:.2g}" for v in (m, p))

    for d in s.get("per_phase", []):
        t.add_row(str(d["gpu"]), d["phase"], str(d["samples"]), *[cell(d["signals"][k]) for k, _ in cols],
                  d["verdict"])
    out.print(t)
    for d in s.get("per_phase", []):
        if d["phase"] != "idle":
            out.print(f"GPU {d['gpu']} {d['phase']}: {d['evidence']}", highlight=False, soft_wrap=True)
    nums = []
    if s.get("decode_step_ms"):
        nums.append(f"decode step {s['decode_step_ms']:.4g} ms (median)")
    if s.get("eff_bw_GBps"):
        nums.append(f"effective KV bandwidth {fmt_bandwidth(s['eff_bw_GBps'] * 1e9)} "
                    f"({fmt_bytes(s['kv_GB_per_step'] * 1e9)} per step)")
    if s.get("gap"):
        nums.append(f"{fmt_ratio(s['gap'])} the floor {s['floor_ms']:.3g} ms")
    if s.get("energy_J_per_token"):
        nums.append(f"{s['energy_J_per_token']:.3g} J per decoded token")
    if nums:
        out.print("; ".join(nums) + ".", highlight=False)
    if isinstance(s.get("deep"), dict):
        deep_d = s["deep"]
        out.print(f"ncu: {deep_d['skipped']}" if "skipped" in deep_d else
                  "ncu: " + "; ".join(f"{k.get('kernel')}: {_num_or_dash(k.get('time_us'), '.4g')} us, tensor "
                                      f"{k.get('tensor_pct')}%, DRAM {k.get('dram_pct')}%"
                                      for k in deep_d["kernels"]), highlight=False, soft_wrap=True)
    out.print(f"{len(res.rows)} sample(s) written to {path}" + (f" and {csv_path}" if csv_path else ""))


@app.command()
@_errors_exit_1
def report(
    results: Annotated[list[Path], typer.Argument(help="Results files (JSON from any probe or benchmark); a folder "
                                                       "means every *.json in it.")],
    out_path: Annotated[Path, typer.Option("--out", "-o", help="Report file: .html (one self-contained file) or .md "
                                                               "(images in <name>_files/ beside it).")]
    = Path("report.html"),
):
    """Write one report (summary, tables, plots) from results files."""
    from .reports.render import write_report

    written = write_report(results, out_path, command=" ".join([Path(sys.argv[0]).name, *sys.argv[1:]]))
    extra = f" and {len(written) - 1} image(s) in {written[1].parent}" if len(written) > 1 else ""
    out.print(f"report written to {written[0]}{extra}")


@app.command()
@_errors_exit_1
def gate(
    current: Annotated[Path, typer.Argument(help="Benchmark results of this run (JSON).")],
    baseline: Annotated[Path, typer.Option("--baseline", "-b", help="Committed benchmark results to compare with.")],
    max_drop: Annotated[str, typer.Option("--max-drop", help="Largest allowed loss of effective bandwidth (speed) "
                                                             "per entry: 10% or 0.1.")] = "10%",
    min_bw: Annotated[Optional[str], typer.Option("--min-bw", help="Absolute floor on each entry's effective "
                                                                   "bandwidth, e.g. 3.5TB/s.")] = None,
    min_fraction_of_floor: Annotated[Optional[float], typer.Option("--min-fraction-of-floor",
                                                                   help="Absolute floor on floor time / measured "
                                                                        "time per entry, e.g. 0.8.")] = None,
    paths: Annotated[Optional[str], typer.Option("--paths", help="Gate only these attention paths, e.g. "
                                                                 "split,paged (default: all).")] = None,
    ctx: Annotated[Optional[str], typer.Option("--ctx", help="Gate only these contexts, k = 1024 (default: all).")]
    = None,
    heads: Annotated[Optional[str], typer.Option("--heads", help="Gate only these head counts, e.g. 8 "
                                                                 "(default: all).")] = None,
):
    """Fail (exit 1) when a benchmark entry regressed against the baseline or is missing from the run."""
    from .reports.gate import COLUMNS, compare_files, summary_lines, table_rows
    from .units import parse_fraction

    if min_fraction_of_floor is not None and not 0 < min_fraction_of_floor <= 1:
        raise DDProbeError(f"--min-fraction-of-floor must be in (0, 1], got {min_fraction_of_floor}")
    outcome = compare_files(current, baseline, max_drop=parse_fraction(max_drop, "--max-drop"),
                            min_bw_Bps=parse_bandwidth(min_bw) if min_bw else None,
                            min_fraction_of_floor=min_fraction_of_floor,
                            paths=[p.strip() for p in paths.split(",") if p.strip()] if paths else None,
                            ctxs=parse_token_list(ctx) if ctx else None,
                            heads=[int(h) for h in parse_token_list(heads)] if heads else None)
    t = Table(title=f"gate: {current} vs baseline {baseline}", title_justify="left", box=box.SIMPLE_HEAD,
              pad_edge=False)
    for c in COLUMNS:
        t.add_column(c, justify="left" if c in ("status", "path", "GPU", "why") else "right", no_wrap=c != "why")
    styles = {"ok": "", "new": "cyan"}
    for cells in table_rows(outcome):
        t.add_row(*cells, style=styles.get(cells[0], "bold red"))
    out.print(t)
    *lines, verdict = summary_lines(outcome)
    for line in lines:
        err.print(line, highlight=False, soft_wrap=True)
    out.print(verdict, highlight=False)
    if not outcome.passed:
        raise typer.Exit(1)


@app.command()
@_errors_exit_1
def diagnose(
    ctx: Annotated[str, typer.Option("--ctx", help="Context lengths, k = 1024.")] = "1k,4k",
    out_dir: Annotated[Optional[Path], typer.Option("--out-dir", help="Folder for every results file and the "
                                                                      "report (default ddprobe-diagnose-<time>).")]
    = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Tokens decoded per commit cell.")] = 64,
    decode_tokens: Annotated[int, typer.Option("--decode-tokens", help="Tokens decoded under telemetry.")] = 64,
    backend: BackendOpt = "engine",
    url: UrlOpt = None,
    timeout: TimeoutOpt = 600.0,
    model: Annotated[str, typer.Option("--model", help="Floor model preset for a server backend.")] = "kimi-k2.6",
    gpu: Annotated[Optional[str], typer.Option("--gpu", help="Floor GPU preset (default: the GPU NVML sees).")]
    = None,
    bw: Annotated[Optional[str], typer.Option("--bw", help="Floor bandwidth instead, e.g. 4.8TB/s.")] = None,
    preset: PresetOpt = "tiny",
    attn: AttnOpt = "reference",
    budget: BudgetOpt = 8,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "fp32",
    heads: HeadsOpt = None,
    weights: WeightsOpt = "auto",
    seed: SeedOpt = 0,
):
    """The whole investigation in one run: commit length, GPU telemetry, floor, paged vs split; one report."""
    import datetime as dt

    from .probes.backends import make_backend
    from .probes.commit import check_contexts
    from .probes.diagnose import Diagnose, DiagnoseOptions
    from .probes.floor import get_gpu
    from .probes.models import get_model

    ctxs = parse_token_list(ctx)
    if gpu:
        get_gpu(gpu)  # unknown names fail before anything runs
    if backend != "engine":
        get_model(model)
    bw_Bps = parse_bandwidth(bw) if bw else None
    if decode_tokens < 2:
        raise DDProbeError(f"--decode-tokens must be at least 2, got {decode_tokens}")
    need = max(ctxs) + max(max_new_tokens, decode_tokens) + budget + 1 + 64
    be = make_backend(backend, url, timeout, engine_factory=lambda: _engine_backend(
        preset, attn, budget, device, dtype, seed, heads, need, weights))
    check_contexts(be, ctxs, max_new_tokens)
    check_contexts(be, ctxs, decode_tokens)
    if getattr(be, "note", None):
        err.print(f"[yellow]note:[/] {escape(be.note)}", highlight=False)
    folder = out_dir or Path(f"ddprobe-diagnose-{dt.datetime.now():%Y%m%d-%H%M%S}")
    opts = DiagnoseOptions(ctxs=ctxs, max_new_tokens=max_new_tokens, decode_tokens=decode_tokens, gpu=gpu,
                           bw_Bps=bw_Bps, model=model, seed=seed)
    report = folder / "report.html"
    claims = Diagnose(be, opts, folder, say=lambda m: err.print(m, highlight=False, markup=False)).run(report)
    for c in claims:
        out.print(f"[bold]{escape(c.title)}[/] " + (f"[yellow]\\[{c.status}][/] " if c.status != "ok" else "")
                  + escape(c.text), highlight=False)
    out.print(f"report: {report}", highlight=False)


def main():  # console-script entry point
    app()


if __name__ == "__main__":
    main()
