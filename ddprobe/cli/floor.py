"""`ddprobe floor`: the bandwidth floor of a verify step."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich import box
from rich.table import Table

from ..units import DDProbeError, fmt_bandwidth, fmt_bytes, fmt_ratio, fmt_tokens, parse_bandwidth, \
    parse_rows, parse_step_times, parse_tflops, parse_time_list, parse_token_list
from .app import app
from .options import checked, errors_exit_1, out, output_file


@app.command()
@errors_exit_1
def floor(
    model: Annotated[str, typer.Option("--model", "-m", help="Model preset: kimi-k2.6, kimi-k2, deepseek-v3, "
                                                             "qwen3-8b, llama-3.1-8b.")] = "kimi-k2.6",
    config: Annotated[Optional[Path], typer.Option("--config", help="Hugging Face config.json instead of a preset "
                                                                    "(MLA or GQA).")] = None,
    ctx: Annotated[str, typer.Option("--ctx", help="Context length(s), k = 1024: 128k or 1k,16k,64k,128k.")] = "128k",
    queries: Annotated[int, typer.Option("--queries", help="Verify rows per step (budget + 1).",
                                         callback=checked(parse_rows))] = 9,
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel GPUs (MLA keeps the whole latent cache on "
                                                 "each; heads are split).")] = 1,
    gpu: Annotated[Optional[str], typer.Option("--gpu", help="GPU preset for bandwidth and tensor rate "
                                                             "(default h200 unless --bw).")] = None,
    bw: Annotated[Optional[str], typer.Option("--bw", help="Memory bandwidth instead of a preset, e.g. 1.8TB/s "
                                                           "(a measured ceiling beats a datasheet).",
                                                      callback=checked(parse_bandwidth))] = None,
    tflops: Annotated[Optional[float], typer.Option("--tflops", help="Dense bf16 tensor rate in TFLOP/s "
                                                                     "(default: the GPU preset's).",
                                                            callback=checked(parse_tflops))] = None,
    step_ms: Annotated[Optional[str], typer.Option("--step-ms", help="Measured step time(s): one for all "
                                                                     "contexts or one per context; bare numbers "
                                                                     "are ms (714 or 714ms,1.43s).",
                                                            callback=checked(parse_step_times))] = None,
    include_weights: Annotated[bool, typer.Option("--include-weights", help="Add the active weights to the "
                                                                            "bytes read per step.")] = False,
    weight_dtype: Annotated[str, typer.Option("--weight-dtype", help="Bytes per weight for --include-weights: "
                                                                     "bf16, fp8, int8, int4, fp4.")] = "bf16",
    kv_dtype: Annotated[str, typer.Option("--kv-dtype", help="KV cache dtype: bf16, fp16, fp8, fp32.")] = "bf16",
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON instead of a table.")] = False,
    save: Annotated[Optional[Path], typer.Option("--out", "-o", help="Also write the results file (JSON).",
                                                 callback=output_file)] = None,
):
    """Bandwidth floor of a verify step: bytes read, floor time, and the gap to a measured step."""
    from ..probes.floor import FloorInput, floor_table
    from ..probes.models import get_model, model_from_config
    from ..results import Result, RunMeta
    from ..shapes import get_gpu

    spec = model_from_config(config) if config else get_model(model)
    ctxs = parse_token_list(ctx)
    steps = [t * 1e3 for t in parse_time_list(step_ms, default_unit="ms")] if step_ms else None
    gpu_spec = get_gpu(gpu) if gpu else (None if bw else get_gpu("h200"))
    bw_Bps = parse_bandwidth(bw) if bw else gpu_spec.bw_Bps
    if tflops is not None and not tflops > 0:
        raise DDProbeError(f"--tflops must be greater than zero, got {tflops}")
    rate = tflops * 1e12 if tflops else (gpu_spec.bf16_flops if gpu_spec else None)
    active = spec.params(active=True)
    inp = FloorInput(attn=spec.attn, bw_Bps=bw_Bps, queries=queries, tp=tp, kv_dtype=kv_dtype, flops_per_s=rate,
                     weights=weight_dtype if include_weights else None, active_params=active)
    rows = floor_table(inp, ctxs, steps)

    config_d = {"model": spec.name, "queries": queries, "tp": tp, "gpu": gpu_spec.name if gpu_spec else None,
                "bw_Bps": bw_Bps, "flops_per_s": rate, "kv_dtype": inp.kv_dtype,
                "weights": inp.weights, "active_params": active}
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
