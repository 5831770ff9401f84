"""`ddprobe advise`: should speculation stay on at this context, with this verify kernel, at which tree budget?"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..units import DDProbeError, fmt_tokens, parse_step_times, parse_time_list, parse_token_list
from .app import app
from .floor_options import AllreduceFromOpt, AllreduceUsOpt, DcpOpt, EpOpt, ExpertDtypeOpt, TpOpt, WeightDtypeOpt
from .options import ForceOpt, checked, err, errors_exit_1, out, output_file, typed_flags
from .tables import Col, print_fitted

from ..probes.advise import FLOOR_PATH as _FLOOR, MODEL_DECODE
_MEASURED = "Measured on this machine (no typed numbers, no --from)"


def _floats(text: str, what: str) -> list[float]:
    vals = []
    for part in text.split(","):
        try:
            vals.append(float(part))
        except ValueError:
            raise DDProbeError(f"bad {what} {part.strip()!r}: expected a number") from None
    return vals


@app.command()
@errors_exit_1
def advise(
    tctx: typer.Context,
    ctx: Annotated[Optional[str], typer.Option("--ctx", help="Contexts, k = 1024: 32k,128k,185k.")] = None,
    step_ms: Annotated[Optional[str], typer.Option("--step-ms", help="Verify step time per context (bare numbers "
                                                   "are ms).", callback=checked(parse_step_times))] = None,
    commit_len: Annotated[Optional[str], typer.Option("--commit-len", help="Commit length (tokens per verify step, "
                                                      "bonus included): one for all contexts or one per "
                                                      "context.")] = None,
    decode_ms: Annotated[Optional[str], typer.Option("--decode-ms", help="Plain (non-speculative) decode step per "
                                                     "context, or one for all (default: the step model's floor of "
                                                     "the one-row step: plain decoding at its best).",
                                                     callback=checked(parse_step_times))] = None,
    budget: Annotated[int, typer.Option("--budget", help="Tree budget of the typed verify steps (rows = budget + "
                                        "1).")] = 8,
    path: Annotated[str, typer.Option("--path", help="What the typed verify steps ran (a label: sglang, paged, "
                                      "...).")] = "typed",
    text: Annotated[str, typer.Option("--text", help="What text the commit lengths were measured on (a label).")]
    = "typed",
    from_file: Annotated[Optional[Path], typer.Option("--from", help="A commit results file (any backend): its "
                                                      "commit lengths and verify steps per text and context.")] = None,
    model: Annotated[str, typer.Option("--model", "-m", help="Model preset of the step model (the plain decode "
                                       "step and the floor row).")] = "kimi-k2.6",
    gpu: Annotated[Optional[str], typer.Option("--gpu", help="GPU preset (default h200).")] = None,
    tp: TpOpt = 1,
    ep: EpOpt = 1,
    dcp: DcpOpt = 1,
    weight_dtype: WeightDtypeOpt = "bf16",
    expert_dtype: ExpertDtypeOpt = None,
    allreduce_us: AllreduceUsOpt = None,
    allreduce_from: AllreduceFromOpt = None,
    paths: Annotated[Optional[str], typer.Option("--paths", help="Measured here (no typed numbers): the verify paths "
                                                 "to time (default: sglang, or paged without it, and --attn auto's choice on a GPU, "
                                                 "reference on the CPU).", rich_help_panel=_MEASURED)] = None,
    budgets: Annotated[str, typer.Option("--budgets", help="Measured here: tree budgets to sweep.",
                                         rich_help_panel=_MEASURED)] = "4,8",
    preset: Annotated[Optional[str], typer.Option("--preset", help="Measured here: the engine preset whose steps "
                                                  "are timed (default k2 on a GPU, tiny on the CPU); commit lengths "
                                                  "always come from the shipped trained tiny pair.",
                                                  rich_help_panel=_MEASURED)] = None,
    device: Annotated[str, typer.Option("--device", help="Measured here: auto, cpu or cuda.",
                                        rich_help_panel=_MEASURED)] = "auto",
    heads: Annotated[Optional[int], typer.Option("--heads", help="Measured here: attention heads of the timed "
                                                 "preset (default 8 for k2: one GPU of tp 8).",
                                                 rich_help_panel=_MEASURED)] = None,
    texts: Annotated[str, typer.Option("--texts", help="Measured here: text kinds for commit length.",
                                       rich_help_panel=_MEASURED)] = "predictable,novel",
    steps: Annotated[int, typer.Option("--steps", help="Measured here: timed steps per cell (their median).",
                                       rich_help_panel=_MEASURED)] = 10,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Measured here: tokens decoded per commit "
                                                "cell.", rich_help_panel=_MEASURED)] = 64,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON instead of a table.")] = False,
    save: Annotated[Optional[Path], typer.Option("--out", "-o", help="Also write the results file (JSON).",
                                                 callback=output_file)] = None,
    force: ForceOpt = False,
):
    """Tokens/s with speculation (commit length / verify step) against without (1 / decode step) per context: the
    crossover, the best budget per context, and a vLLM RFC #48627 table (context bucket -> speculative tokens)."""
    from ..probes.advise import advise as run_advise, points_from_commit, points_typed
    from ..probes.floor import FloorInput, Sharding, floor_row, served_model
    from ..probes.models import get_model
    from ..results import Result

    if save is not None:  # never over its own input or results measured earlier, unless --force
        from .outputs import check_file

        check_file("--out", save, force=force, inputs=[("--from", from_file), ("--allreduce-from", allreduce_from)],
                   keep_existing=True)
    sh = Sharding(tp=tp, ep=ep, dcp=dcp, weight_dtype=weight_dtype, expert_dtype=expert_dtype,
                  allreduce_us=allreduce_us, allreduce_from=str(allreduce_from) if allreduce_from else None)
    step_model, config = served_model(get_model(model), sh, gpu)
    decode_source = None
    if from_file is not None:
        if typed_flags(tctx, ("ctx", "step_ms", "commit_len")):
            raise DDProbeError("give --from or typed numbers (--ctx, --step-ms, --commit-len), not both")
        r = Result.load(from_file)
        if r.kind != "commit":
            raise DDProbeError(f"{from_file}: a {r.kind!r} results file; --from takes a commit file")
        if isinstance(r.config.get("budget"), int):
            budget = r.config["budget"]
        elif not typed_flags(tctx, ("budget",)):
            raise DDProbeError(f"{from_file} does not say its tree budget (config.budget): give --budget")
        left = [x for x in r.rows if not (x.get("commit_len") and x.get("decode_ms_per_step"))]
        if left:
            err.print(f"note: {len(left)} of {len(r.rows)} cells have no commit length or step time: left out",
                      highlight=False)
        ctxs = sorted({int(x["ctx"]) for x in r.rows if x not in left})
        decode = _decode(decode_ms, ctxs, step_model)
        points = points_from_commit(r.rows, {**r.config, "budget": budget}, dict(zip(ctxs, decode)),
                                    str(r.config.get("attn") or r.config.get("backend") or path), str(from_file))
    elif not (step_ms or commit_len or decode_ms):  # nothing typed: measure the engine here
        points, step_model, config = _measured(ctx, paths, budgets, preset, device, heads, texts, steps, gpu,
                                               max_new_tokens)
        decode_source = "measured: the engine's plain one-row decode step through the same path"
    else:
        if not (ctx and step_ms and commit_len):
            raise DDProbeError("give --ctx, --step-ms and --commit-len (the typed numbers), or --from a commit file, "
                               "or none of them to measure the engine here")
        ctxs = parse_token_list(ctx)
        decode = _decode(decode_ms, ctxs, step_model)
        points = points_typed(ctxs, [t * 1e3 for t in parse_time_list(step_ms, default_unit="ms")],
                              _floats(commit_len, "commit length"), decode, budget, path, text, "typed")
    # the same commit lengths with the verify step at its floor: what a verify kernel at physics would give
    floor_pts = [] if step_model is None else \
        [type(p)(_FLOOR, p.text, p.ctx, p.budget, p.commit_len,
                 floor_row(FloorInput(step_model, p.budget + 1), p.ctx).floor_ms, p.decode_ms, "step model")
         for p in {(q.text, q.ctx, q.budget): q for q in points}.values()]
    for p in floor_pts:  # a verify step at its floor beside a measured decode step is no mismatch to report
        p.note = ""
    modelled = decode_source is None and decode_ms is None
    decode_at = (lambda c: step_model.cost(max(1, c), 1).floor_ms) if modelled else None
    verdicts = run_advise(points + floor_pts, decode_at)
    if modelled:  # said in every sentence, not only in the table's footnote
        for v in verdicts:
            v.sentence += " (against plain decoding at its floor)"
    decode_source = decode_source or (MODEL_DECODE if modelled else "typed (--decode-ms)")
    result = _result(points + floor_pts, verdicts, config, decode_source)
    if save:
        result.save(save)
    if as_json:
        typer.echo(result.to_json())
        return
    _print(points + floor_pts, verdicts, result.summary)
    if save:
        out.print(f"results written to {save}")


def _measured(ctx, paths, budgets, preset, device, heads, texts, steps, gpu_name, max_new_tokens):
    """The engine measured on this device (``probes.advise.measure``), with the defaults for it; the step model of
    the timed preset on this GPU (None without a GPU preset to take bandwidth from) and the config to record."""
    import dataclasses

    import torch

    from .. import verify_paths
    from ..probes.advise import MeasureOptions, measure
    from ..probes.engine_backend import preset_step_model
    from ..shapes import get_gpu, gpu_spec_for

    if device not in ("auto", "cpu", "cuda"):
        raise DDProbeError(f"--device must be auto, cpu or cuda, got {device!r}")
    dev = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    gpu = dev.startswith("cuda")
    sm = torch.cuda.get_device_capability() if gpu else None
    preset = preset or ("k2" if gpu else "tiny")
    if paths:
        chosen = [p.strip() for p in paths.split(",")]
    elif gpu:  # auto's path for this preset's MLA rows in bf16 on this GPU (the tiny model: never split_ws)
        from ..engine.config import ModelConfig

        try:
            t = ModelConfig.from_name(preset).target
        except ValueError as e:  # an unknown preset: one line
            raise DDProbeError(str(e)) from None
        chosen = [_baseline(), verify_paths.auto_path(sm, "bf16", (t.kv_lora_rank, t.qk_rope_head_dim))]
    else:
        chosen = ["reference"]
    for p in chosen:
        verify_paths.get(p)
    o = MeasureOptions(paths=tuple(dict.fromkeys(chosen)),
                       ctxs=tuple(parse_token_list(ctx or ("8k,32k,128k" if gpu else "1k,4k"))),
                       budgets=tuple(int(b) for b in _floats(budgets, "budget")), texts=tuple(texts.split(",")),
                       preset=preset, device=dev, dtype="bf16" if gpu else "fp32",
                       heads=heads if heads is not None else (8 if preset == "k2" else None), steps=steps,
                       max_new_tokens=max_new_tokens)
    points = measure(o, say=lambda m: err.print(m, highlight=False, markup=False))
    spec = get_gpu(gpu_name) if gpu_name else (gpu_spec_for(torch.cuda.get_device_name()) if gpu else None)
    model = preset_step_model(o.preset, o.heads, o.dtype, spec.bw_Bps, spec.bf16_flops) if spec else None
    config = {"measured": dataclasses.asdict(o), "gpu": spec.name if spec else None}
    return points, model, config


def _baseline() -> str:
    """The baseline path measured by default: SGLang's own kernels where sglang is installed, else `paged` (ddprobe's
    faithful rendering of them)."""
    from ..engine.kernels.plan import PathUnavailable
    from ..engine.kernels.sglang import check_available

    try:
        check_available()
        return "sglang"
    except PathUnavailable as e:
        err.print(f"note: {e}; the baseline is `paged`, ddprobe's rendering of SGLang's kernels", highlight=False)
        return "paged"


def _decode(decode_ms: Optional[str], ctxs: list[int], step_model) -> list[float]:
    """The plain decode step per context: typed, or the step model's one-row floor."""
    if decode_ms:
        vals = [t * 1e3 for t in parse_time_list(decode_ms, default_unit="ms")]
        if len(vals) not in (1, len(ctxs)):
            raise DDProbeError(f"give one --decode-ms or one per context: {len(ctxs)} contexts, {len(vals)} times")
        return vals * len(ctxs) if len(vals) == 1 else vals
    return [step_model.cost(c, 1).floor_ms for c in ctxs]


def _result(points, verdicts, config: dict, decode_source: str):
    from ..probes.advise import summary
    from ..results import Result, RunMeta

    return Result(kind="advise", meta=RunMeta.collect(probe_gpu="measured" in config), config=config,
                  rows=[p.to_dict() for p in points], summary=summary(verdicts, decode_source))


def _print(points, verdicts, summary: dict) -> None:
    cols = [Col("path", 1), Col("text", 1), Col("ctx"), Col("budget", 2), Col("commit", 2), Col("verify", 3),
            Col("decode", 3), Col("spec tok/s"), Col("plain tok/s"), Col("x")]
    rows = [[p.path, p.text, fmt_tokens(p.ctx), str(p.budget), f"{p.commit_len:.3g}", f"{p.verify_ms:.4g} ms",
             f"{p.decode_ms:.4g} ms", f"{p.spec_tok_s:.3g}", f"{p.plain_tok_s:.3g}",
             f"{p.speedup:.2f}" + ("" if p.speedup >= 1 else " off")] for p in points]
    print_fitted("speculation on or off: tokens/s with speculation (commit length / verify step) against without "
                 "(1 / decode step)", cols, rows)
    for v in verdicts:
        what = " (the verify step at its floor: what a kernel at physics would give)" if v.path == _FLOOR else ""
        out.print(f"- {v.sentence[0].upper()}{v.sentence[1:]}{what}.", highlight=False, soft_wrap=True)
    for note in dict.fromkeys(p.note for p in points if p.note):
        err.print(f"note: {note}", highlight=False, soft_wrap=True)
    out.print(f"plain decode: {summary['decode_source']}", highlight=False, style="dim")
    out.print("vLLM RFC #48627 (context bucket from -> speculative tokens, 0 = off):", highlight=False)
    out.print(json.dumps(summary["vllm_rfc_48627"]), highlight=False, soft_wrap=True)
