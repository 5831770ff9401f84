"""`ddprobe floor`: the floor of a verify step (KV, weights, compute) and, from step times measured at two
or more contexts, the step's anatomy (fixed part + marginal cost per token)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from ..units import DDProbeError, fmt_bandwidth, fmt_bytes, fmt_ratio, fmt_time, fmt_tokens, \
    parse_context_list, parse_step_times, parse_time_list
from .app import app
from .floor_options import FloorOptions, check_latency, floor_options
from .options import ForceOpt, checked, err, errors_exit_1, out, output_file, typed_flags
from .tables import Col, print_fitted


def _ms(v: Optional[float]) -> str:
    return "-" if v is None else fmt_time(v / 1e3)


@app.command()
@errors_exit_1
@floor_options()
def floor(
    tctx: typer.Context,
    model: Annotated[str, typer.Option("--model", "-m", help="Model: a served model (kimi-k2.6, kimi-k2, "
                                       "deepseek-v3, qwen3-8b, llama-3.1-8b) or a ddprobe engine preset (k2: one "
                                       "GPU's share of Kimi K2 at tp 8 / ep 8; tiny).")] = "kimi-k2.6",
    config: Annotated[Optional[Path], typer.Option("--config", help="Hugging Face config.json instead of a preset "
                                                                    "(MLA or GQA, MoE or dense).")] = None,
    ctx: Annotated[str, typer.Option("--ctx", help="Context length(s), k = 1024: 128k or 1k,16k,64k,128k.")] = "128k",
    step_ms: Annotated[Optional[str], typer.Option("--step-ms", help="Measured step time(s): one for all "
                                                                     "contexts or one per context; bare numbers "
                                                                     "are ms (714 or 714ms,1.43s).",
                                                             callback=checked(parse_step_times))] = None,
    steps_from: Annotated[Optional[Path], typer.Option("--steps-from", help="Take contexts and step times from a "
                                                                            "results file (commit cells, gpu-util)."
                                                       )] = None,
    anatomy: Annotated[Optional[bool], typer.Option("--anatomy/--no-anatomy", help="Fit step = fixed + marginal x "
                                                    "ctx (default: when two or more contexts have step times).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON instead of a table.")] = False,
    save: Annotated[Optional[Path], typer.Option("--out", "-o", help="Also write the results file (JSON).",
                                                 callback=output_file)] = None,
    force: ForceOpt = False,
    fo: FloorOptions = FloorOptions(),
):
    """Floor of a verify step per GPU (KV, weights incl. MoE experts touched, compute, all-reduces, launches) and
    the step's anatomy."""
    from ..probes.floor import floor_result

    if save is not None:  # never over its own input (floor --steps-from s.json --out s.json)
        from .outputs import check_file

        check_file("--out", save, force=force, inputs=[("--steps-from", steps_from), ("--config", config),
                                                       ("--launch-from", fo.launch_from)],
                   keep_existing=True, holds="results written earlier")
    if config is not None and typed_flags(tctx, ("model",)):
        raise DDProbeError("give --model or --config, not both (--config describes the model)")
    spec = _spec(tctx, model, config, steps_from)
    ctxs, steps = _contexts(tctx, spec, ctx, step_ms, steps_from, fo)
    counted = _counted(steps_from, fo.kernels)
    step_model, served = fo.floor_model(spec, kernels=counted, kernels_source=f"counted on the GPU ({steps_from})"
                                        if counted else "")
    result, rows = floor_result(step_model, ctxs, steps, queries=fo.rows(), config=served, anatomy=anatomy)
    if step_ms:  # a typed step below the latency floor is a typo or another model: refused, not compared
        check_latency(rows)
    if save:  # the floor rows are kept, with or without an anatomy
        result.save(save)
    if result.summary.get("anatomy_error"):
        raise DDProbeError(result.summary["anatomy_error"] + (f" (the floor rows were written to {save})" if save
                                                               else ""))
    _show(spec, result, rows, as_json, save)


def _counted(steps_from: Optional[Path], kernels: Optional[int]) -> Optional[int]:
    """The kernels per step a --steps-from file counted on the GPU (None: none); --kernels saying otherwise is
    refused in one line."""
    from ..probes.floor import kernels_from_file

    counted = kernels_from_file(steps_from) if steps_from is not None else None
    if counted is not None and kernels is not None and kernels != counted:
        raise DDProbeError(f"--kernels {kernels} contradicts {steps_from}, whose engine counted {counted} kernels per "
                           "step on the GPU: give one of them")
    return counted


def _spec(tctx: typer.Context, model: str, config: Optional[Path], steps_from: Optional[Path]):
    """The model: --config, --model, or (neither typed) the ddprobe engine preset a --steps-from file ran (said)."""
    from ..physics.models import get_model, model_from_config
    from ..probes.floor import file_preset

    if config is not None:
        return model_from_config(config)
    if steps_from is not None and not typed_flags(tctx, ("model",)):
        preset, heads = file_preset(steps_from)
        if preset:
            spec = get_model(preset, heads=heads)
            err.print(f"note: {steps_from} ran ddprobe's {engine_label(spec)}: its floor is that preset's (give "
                      "--model for another)", highlight=False, markup=False, soft_wrap=True)
            return spec
    return get_model(model)


def engine_label(spec) -> str:
    """A ddprobe engine preset named as one (``ModelSpec.kind`` "engine": one GPU's share of a served model, not the
    model), with its experts and hidden size; a served model's name alone."""
    if spec.kind != "engine":
        return spec.name
    from ..physics.presets import K2_EP, K2_TP

    share = f"one GPU's share of Kimi K2 at tp {K2_TP} / ep {K2_EP}, " if spec.name == "k2" else ""
    return (f"{spec.name} engine preset ({share}{spec.n_routed_experts} experts, hidden {spec.hidden_size}, "
            f"{spec.num_heads} heads)")


def _contexts(tctx: typer.Context, spec, ctx: str, step_ms: Optional[str], steps_from: Optional[Path],
              fo: FloorOptions) -> tuple[list[int], Optional[list[float]]]:
    """The contexts and step times (ms) of the options: typed (--ctx, --step-ms), or read --steps-from a file (one
    that cannot be ``spec``'s steps on the floor's GPU is warned about)."""
    from ..physics.plan import StepInput
    from ..probes.floor import steps_from_file

    if steps_from is None:
        ctxs = parse_context_list(ctx)
        return ctxs, [t * 1e3 for t in parse_time_list(step_ms, default_unit="ms")] if step_ms else None
    if step_ms:
        raise DDProbeError("give --step-ms or --steps-from, not both")
    if typed_flags(tctx, ("ctx",)):
        raise DDProbeError("give --ctx or --steps-from, not both (the file's contexts are used)")
    gpu = StepInput(spec, gpu=fo.gpu, bw_Bps=fo.bw_Bps()).rates()[0]
    ctxs, steps, why = steps_from_file(steps_from, spec, gpu=gpu)
    if why:
        err.print(f"warning: {steps_from} cannot be {spec.name}'s steps ({why}): its floor is not these steps' floor",
                  highlight=False, markup=False, soft_wrap=True)
    return ctxs, steps


def _show(spec, result, rows, as_json: bool, save: Optional[Path]) -> None:
    """The floor as JSON on stdout, or as the table with its lines; a step below its floor said either way."""
    from ..physics.step_shape import BELOW_FLOOR

    below = any(r.below_floor for r in rows)
    if as_json:
        if below:
            err.print(BELOW_FLOOR, highlight=False, markup=False)
        sys.stdout.write(result.to_json() + "\n")
        return
    _print(spec, rows, result.config, result.summary.get("anatomy"), result.config["comm"])
    if below:
        out.print(BELOW_FLOOR, highlight=False, markup=False)
    if save:
        out.print(f"results written to {save}")


def _print(spec, rows, config: dict, an: dict | None, said: str) -> None:
    from ..physics.gpus import GPUS
    from ..physics.step_model import bound_word

    g = GPUS.get(config.get("gpu") or "")
    where = g.label if g else "given bandwidth"
    name = f"ddprobe's {engine_label(spec)}" if spec.kind == "engine" else spec.name
    title = (f"{name}: verify step floor per GPU ({config['queries']} rows, tp {config['tp']}, ep "
             f"{config['ep']}, dcp {config['dcp']}, {where}, {fmt_bandwidth(config['bw_Bps'])}; KV "
             f"{rows[0].kv_B_per_token / config['dcp']:,.0f} B/token)")
    timed = any(r.step_ms is not None for r in rows)
    comm = any(r.comm_ms for r in rows)
    cols = [Col("ctx"), Col("KV", 3), Col("weights", 3), Col("KV fl", 2), Col("wt fl", 2), Col("compute", 4)] + \
        ([Col("comm", 2)] if comm else []) + [Col("launches", 2), Col("floor"), Col("bound", 2), Col("decode fl", 3)]
    if timed:
        cols += [Col("step"), Col("eff bw", 1), Col("gap"), Col("attn gap", 1), Col("re-read", 5)]
    cells = []
    for r in rows:
        c = [fmt_tokens(r.ctx), fmt_bytes(r.kv_GB * 1e9), fmt_bytes(r.weights_GB * 1e9), _ms(r.kv_floor_ms),
             _ms(r.weight_floor_ms), _ms(r.compute_floor_ms)] + ([_ms(r.comm_ms)] if comm else []) + \
            [_ms(r.latency_floor_ms), _ms(r.floor_ms), bound_word(r.binds), _ms(r.decode_floor_ms)]
        if timed:
            below = "!" if r.below_floor else ""  # below the whole-step floor (BELOW_FLOOR is printed)
            c += ([f"{r.step_ms:.4g} ms{below}", fmt_bandwidth(r.eff_bw_GBps * 1e9), fmt_ratio(r.gap),
                   fmt_ratio(r.attn_gap), fmt_ratio(r.attn_gap_if_rows_reread)] if r.step_ms is not None
                  else ["-"] * 5)
        cells.append(c)
    print_fitted(title, cols, cells)
    r0 = rows[0]
    if config.get("moe_layers"):
        local = spec.n_routed_experts // config["ep"]
        out.print(f"routed experts ({config['expert_dtype']}): {config['queries']} rows x "
                  f"top-{spec.num_experts_per_tok} of {spec.n_routed_experts}, {local} on this GPU, "
                  f"{config['moe_layers']} MoE layers: {r0.experts_per_layer:.3g} distinct per layer expected "
                  f"(uniform routing), {r0.experts_worst} at worst: weight floor {_ms(r0.weight_floor_ms)} expected, "
                  f"{_ms(r0.weight_floor_worst_ms)} at worst", highlight=False)
    else:
        out.print("dense model (no MoE fields): the routed-expert terms are zero", highlight=False)
    if r0.allreduces:
        dcp = (f", + {r0.allreduces - 2 * spec.num_layers} for dcp (query gathers, output combines)"
               if config["dcp"] > 1 else "")
        out.print(f"communication: {r0.allreduces} collectives per step, {_ms(r0.comm_ms)} (TP all-reduces "
                  f"{r0.allreduce_us:.3g} us each at {fmt_bytes(r0.allreduce_bytes)}{dcp}; {said})", highlight=False,
                  soft_wrap=True)
    elif config["tp"] > 1:
        out.print(said, highlight=False)
    out.print(f"launches: {r0.kernels} kernels x {r0.kernel_us:.3g} us" + (f" + {r0.syncs} host syncs" if r0.syncs
              else "") + f" = {_ms(r0.latency_floor_ms)} (the latency floor; {config.get('launches')})",
              highlight=False, soft_wrap=True)
    for r in (r for r in rows if r.step_ms is not None):
        from ..physics.step_model import parts_bound

        w = parts_bound(r.latency_floor_ms, r.bytes_floor_ms, r.compute_floor_ms, sync_ms=r.sync_ms or 0.0,
                    comm_ms=r.comm_ms or 0.0)
        out.print(f"at {fmt_tokens(r.ctx)} the {r.step_ms:.4g} ms step: launches >= {_ms(r.latency_floor_ms)} "
                  f"({r.launch_share:.0%}), {w.what} >= {_ms(w.ms)} ({r.bytes_share:.0%}): "
                  f"{r.step_bound}", highlight=False)
    out.print("KV fl / wt fl: KV / weight bytes over bandwidth; compute: all FLOPs / tensor rate; floor = max((KV + "
              "weights) / bandwidth, compute, launches) + all-reduces + host syncs (the whole step: kernels serialize, "
              "each moves its bytes inside its own duration, so launches and bytes bound the step together, not "
              "added); decode fl: the plain one-row decode "
              "step's floor; gap = step / floor; attn gap = step / the attention's own floor (KV fl, or its FLOPs' "
              "time where those take longer: short contexts); re-read: the "
              "attention gap if every row re-read the cache", highlight=False, style="dim")
    if an is not None:
        _print_anatomy(an)


def _print_anatomy(an: dict) -> None:
    bw = an.get("bw_GBps")
    rows = [[f"{fmt_tokens(iv['ctx0'])} -> {fmt_tokens(iv['ctx1'])}", f"{iv['ms_per_1k']:.3g}",
             fmt_bandwidth(iv["kv_GBps"] * 1e9) if iv.get("kv_GBps") else "-",
             f"{iv['kv_GBps'] / bw:.2%}" if iv.get("kv_GBps") and bw else "-"] for iv in an["intervals"]]
    rows.append(["fit (all)", f"{an['ms_per_1k']:.3g}", fmt_bandwidth(an["kv_GBps"] * 1e9) if an.get("kv_GBps")
                 else "-", f"{an['kv_GBps'] / bw:.2%}" if an.get("kv_GBps") and bw else "-"])
    print_fitted("where the step goes: step = fixed + marginal x ctx",
                 [Col("interval"), Col("ms per 1k tokens"), Col("marginal KV bw", 1), Col("of GPU bw", 2)], rows)
    wf = f" vs weight floor {an['weight_floor_ms']:.3g} ms" if an.get("weight_floor_ms") is not None else ""
    if an.get("latency_floor_ms"):
        wf += f"{' and' if wf else ' vs'} launches at least {an['latency_floor_ms']:.3g} ms"
    out.print(f"fixed part (fit intercept, >= 0): {an['fixed_ms']:.3g} ms{wf}", highlight=False)
    for n in an.get("notes", []):
        out.print(n, highlight=False)
    out.print(an["verdict"], highlight=False)
