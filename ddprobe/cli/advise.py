"""`ddprobe advise`: should speculation stay on at this context, with this verify kernel, at which tree budget?"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..units import DDProbeError, fmt_tokens, parse_context_list, parse_step_times, parse_time_list
from .app import app
from .floor_options import COMM, SHARDING, FloorOptions, floor_options
from .options import ForceOpt, checked, err, errors_exit_1, label, out, output_file, typed_flags
from .tables import Col, print_fitted

from ..probes.advise import FLOOR_PATH as _FLOOR
_MEASURED = "Measured on this machine (no typed numbers, no --from)"


def _opt(flag: str, help_: str, measured: bool = False, **kw):
    """One option of `advise` (``measured``: shown in the panel of the options of a measurement here)."""
    return typer.Option(flag, help=help_, **({"rich_help_panel": _MEASURED} if measured else {}), **kw)


CtxOpt = Annotated[Optional[str], _opt("--ctx", "Contexts, k = 1024: 32k,128k,185k.")]
StepMsOpt = Annotated[Optional[str], _opt("--step-ms", "Verify step time per context (bare numbers are ms).",
                                          callback=checked(parse_step_times))]
CommitLenOpt = Annotated[Optional[str], _opt("--commit-len", "Commit length (tokens per verify step, bonus "
                                             "included): one for all contexts or one per context.")]
DecodeMsOpt = Annotated[Optional[str], _opt("--decode-ms", "Plain (non-speculative) decode step per context, or one "
                                            "for all (default: the step model's floor of the one-row step: plain "
                                            "decoding at its best).", callback=checked(parse_step_times))]
BudgetOpt = Annotated[int, _opt("--budget", "Tree budget of the typed verify steps (rows = budget + 1).")]
PathOpt = Annotated[str, _opt("--path", "What the typed verify steps ran (a label: sglang, paged, ...).",
                                      callback=checked(label))]
TextOpt = Annotated[str, _opt("--text", "What text the commit lengths were measured on (a label).",
                                      callback=checked(label))]
FromOpt = Annotated[Optional[Path], _opt("--from", "A commit results file (any backend): its commit lengths and "
                                         "verify steps per text and context.")]
ModelOpt = Annotated[str, typer.Option("--model", "-m", help="Model preset of the step model (the plain decode step "
                                       "and the floor row).")]
PathsOpt = Annotated[Optional[str], _opt("--paths", "Measured here (no typed numbers): the verify paths to time "
                                         "(default: sglang, or paged without it, and --attn auto's choice on a GPU, "
                                         "reference on the CPU).", True)]
BudgetsOpt = Annotated[str, _opt("--budgets", "Measured here: tree budgets to sweep.", True)]
PresetOpt = Annotated[Optional[str], _opt("--preset", "Measured here: the engine preset whose steps are timed "
                                          "(default k2 on a GPU, tiny on the CPU); commit lengths always come from "
                                          "the shipped trained tiny pair.", True)]
DeviceOpt = Annotated[str, _opt("--device", "Measured here: auto, cpu or cuda.", True)]
HeadsOpt = Annotated[Optional[int], _opt("--heads", "Measured here: attention heads of the timed preset (default 8 "
                                         "for k2: one GPU of tp 8).", True)]
TextsOpt = Annotated[str, _opt("--texts", "Measured here: text kinds for commit length.", True)]
StepsOpt = Annotated[int, _opt("--steps", "Measured here: timed steps per cell (their median).", True)]
MaxNewOpt = Annotated[int, _opt("--max-new-tokens", "Measured here: tokens decoded per commit cell.", True)]
TreeOpt = Annotated[str, _opt("--tree", "Measured here: draft shapes to compare, ddtree (the budget's most probable "
                              "prefixes) and chain (the drafter's top-1 per depth).", True)]
ChainDepthsOpt = Annotated[Optional[str], _opt("--chain-depths", "Measured here: the chain's depths (default: "
                                               "min(budget, block size - 1) per budget).", True)]
JsonOpt = Annotated[bool, _opt("--json", "Print the result as JSON instead of a table.")]
OutOpt = Annotated[Optional[Path], typer.Option("--out", "-o", help="Also write the results file (JSON).",
                                                callback=output_file)]


@app.command()
@errors_exit_1
@floor_options(exclude=("budget",))  # advise's own --budget is the typed steps' tree
def advise(
    tctx: typer.Context, ctx: CtxOpt = None, step_ms: StepMsOpt = None, commit_len: CommitLenOpt = None,
    decode_ms: DecodeMsOpt = None, budget: BudgetOpt = 8, path: PathOpt = "typed", text: TextOpt = "typed",
    from_file: FromOpt = None, model: ModelOpt = "kimi-k2.6", paths: PathsOpt = None,
    budgets: BudgetsOpt = "4,8", preset: PresetOpt = None, device: DeviceOpt = "auto", heads: HeadsOpt = None,
    texts: TextsOpt = "predictable,novel", steps: StepsOpt = 10, max_new_tokens: MaxNewOpt = 64,
    tree: TreeOpt = "ddtree,chain", chain_depths: ChainDepthsOpt = None,
    as_json: JsonOpt = False, save: OutOpt = None, force: ForceOpt = False, fo: FloorOptions = FloorOptions(),
):
    """Tokens/s with speculation (commit length / verify step) against without (1 / decode step) per context: the
    crossover, the best budget per context, and a vLLM RFC #48627 table (context bucket -> speculative tokens).
    The floor options shape --model's step model (the plain decode step, the floor row); measured here, the engine's
    own (--gpu, --bw, --tflops, --launch-from)."""
    from ..probes.advise import advise_result, floats, measure_here, points_from_file, points_typed
    from ..physics.models import get_model
    from .outputs import check_file

    if save is not None:  # never over its own input or results measured earlier, unless --force
        check_file("--out", save, force=force, inputs=[("--from", from_file),
                                                      ("--allreduce-from", fo.allreduce_from)], keep_existing=True)
    step_model, config = fo.floor_model(get_model(model))
    decode_source = None if decode_ms is None else "typed (--decode-ms)"
    _measured_only(tctx, from_file is not None or bool(step_ms or commit_len or decode_ms))
    if from_file is not None:
        if typed_flags(tctx, ("ctx", "step_ms", "commit_len")):
            raise DDProbeError("give --from or typed numbers (--ctx, --step-ms, --commit-len), not both")
        points = points_from_file(from_file, budget if typed_flags(tctx, ("budget",)) else None, lambda ctxs: _decode(
            decode_ms, ctxs, step_model), path, say=_note, spec=get_model(model))
    elif not (step_ms or commit_len or decode_ms):  # nothing typed: measure the engine here
        _engine_floor_only(tctx)
        points, step_model, config = measure_here(ctx, paths, budgets, preset, device, heads, texts, steps, fo.gpu,
                                                  max_new_tokens, _say, _note, _cells, tree, chain_depths,
                                                  rates={"bw_Bps": fo.bw_Bps(), "flops_per_s": fo.flops_per_s(),
                                                         "launch": fo.launch(), "launch_any_gpu": fo.launch_any_gpu})
        decode_source = "measured: the engine's plain one-row decode step through the same path"
    else:
        if not (ctx and step_ms and commit_len):
            raise DDProbeError("give --ctx, --step-ms and --commit-len (the typed numbers), or --from a commit file, "
                               "or none of them to measure the engine here")
        ctxs = parse_context_list(ctx)
        points = points_typed(ctxs, [t * 1e3 for t in parse_time_list(step_ms, default_unit="ms")],
                              floats(commit_len, "commit length"), _decode(decode_ms, ctxs, step_model), budget, path,
                              text, "typed")
    result, points, verdicts = advise_result(points, config, step_model=step_model, decode_source=decode_source)
    if save:
        result.save(save)
    if as_json:
        typer.echo(result.to_json())
        return
    _print(points, verdicts, result.summary)
    if save:
        out.print(f"results written to {save}")


MEASURED_ONLY = ("paths", "budgets", "preset", "device", "heads", "texts", "steps", "max_new_tokens", "tree",
                 "chain_depths")


def _measured_only(tctx: typer.Context, typed: bool) -> None:
    """Typed numbers or --from (``typed``): the options of a measurement here do not apply (one line, never ignored
    unsaid: a typed chain would be priced as a tree)."""
    given = typed_flags(tctx, MEASURED_ONLY) if typed else []
    if given:
        raise DDProbeError(f"{', '.join(given)}: only for a measurement here (no typed numbers, no --from); typed steps "
                           "are one tree at --budget (a file's cells carry their own shapes)")


def _engine_floor_only(tctx: typer.Context) -> None:
    """Measured here, the floor is the timed engine preset's own: the served model's sharding, dtypes, kernels and
    communication do not apply (one line, before anything is measured)."""
    given = typed_flags(tctx, SHARDING + COMM + ("kernels", "kv_dtype"))
    if given:
        raise DDProbeError(f"{', '.join(given)}: measured here, the floor is the timed engine preset's own (its "
                           "weights, one GPU); these options shape --model's floor with typed steps or --from")


def _say(m: str) -> None:  # what a measurement is doing, as it goes
    err.print(m, highlight=False, markup=False)


def _cells(n: int):
    """The commit cells' progress on stderr (``progress.CellDisplay``: a live display on a terminal)."""
    from .progress import CellDisplay

    return CellDisplay(err, n, label="commit cells")


def _note(m: str) -> None:
    err.print(m, highlight=False, markup=False, soft_wrap=True)


def _decode(decode_ms: Optional[str], ctxs: list[int], step_model) -> list[float]:
    """The plain decode step per context: typed, or the step model's one-row floor."""
    if decode_ms:
        vals = [t * 1e3 for t in parse_time_list(decode_ms, default_unit="ms")]
        if len(vals) not in (1, len(ctxs)):
            raise DDProbeError(f"give one --decode-ms or one per context: {len(ctxs)} contexts, {len(vals)} times")
        return vals * len(ctxs) if len(vals) == 1 else vals
    return [step_model.cost(c, 1).floor_ms for c in ctxs]


def _print(points, verdicts, summary: dict) -> None:
    bound = {(v.path, v.text) for v in verdicts if not v.plain_measured}  # a loss there is a bound, not a verdict
    cols = [Col("path", 1), Col("text", 1), Col("ctx"), Col("tree", 1), Col("budget", 2), Col("commit", 2),
            Col("verify", 3),
            Col("decode", 3), Col("break-even", 3), Col("spec tok/s"), Col("plain tok/s"), Col("x")]
    rows = [[p.path, p.text, fmt_tokens(p.ctx), p.tree, str(p.budget), f"{p.commit_len:.3g}", f"{p.verify_ms:.4g} ms",
             f"{p.decode_ms:.4g} ms", f"{p.verify_ms / p.commit_len:.4g} ms", f"{p.spec_tok_s:.3g}",
             f"{p.plain_tok_s:.3g}", f"{p.speedup:.2f}" + ("" if p.speedup >= 1 else " bound" if (p.path, p.text)
                                                          in bound else " off")] for p in points]
    print_fitted(f"speculation on or off, batch {summary.get('batch', 1)}: tokens/s with speculation (commit length / "
                 "verify step) against without (1 / decode step); break-even: the plain step below which it loses",
                 cols, rows)
    _print_decisions(summary)
    for v in verdicts:
        what = " (the verify step at its floor: what a kernel at physics would give)" if v.path == _FLOOR else ""
        out.print(f"- {v.sentence[0].upper()}{v.sentence[1:]}{what}.", highlight=False, soft_wrap=True)
    for note in dict.fromkeys(p.note for p in points if p.note):
        err.print(f"note: {note}", highlight=False, soft_wrap=True)
    out.print(f"plain decode: {summary['decode_source']}", highlight=False, style="dim")
    out.print(f"vLLM RFC #48627 (context bucket from -> speculative tokens, 0 = off; batch {summary.get('batch', 1)}):",
              highlight=False)
    if summary.get("rfc_note"):
        out.print(f"({summary['rfc_note']})", highlight=False, soft_wrap=True)
    out.print(json.dumps(summary["vllm_rfc_48627"]), highlight=False, soft_wrap=True)


def _print_decisions(summary: dict) -> None:
    """Tree, chain or off per path, text and context: each one's best tokens/s, the choice and its margin."""
    ds = summary.get("decisions") or []
    if not ds or not any(d["chain_tok_s"] is not None for d in ds):
        return
    num = lambda v, f=".3g": "-" if v is None else format(v, f)  # noqa: E731
    cols = [Col("path", 1), Col("text", 1), Col("ctx"), Col("tree@budget", 0), Col("tok/s"), Col("chain@depth", 0),
            Col("tok/s "), Col("off tok/s"), Col("choice", 0, "left"), Col("margin", 1)]
    rows = [[d["path"], d["text"], fmt_tokens(d["ctx"]), f"ddtree@{num(d['ddtree_budget'], 'd')}",
             num(d["ddtree_tok_s"]), f"chain@{num(d['chain_depth'], 'd')}", num(d["chain_tok_s"]),
             num(d["plain_tok_s"]), d["choice"], num(d["margin"], ".2f") + "x"] for d in ds]
    print_fitted(f"tree, chain or off, batch {summary.get('batch', 1)}: the best of each (tokens/s), the choice and "
                 "its margin over the next best", cols, rows)
