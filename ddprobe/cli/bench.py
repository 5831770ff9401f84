"""`ddprobe bench verify`: verify attention per layer and per step, every path against the peers, JSON out."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..units import DDProbeError, parse_context_list, parse_token_list
from .app import app
from .options import MAX_TIMEOUT_S, ForceOpt, checked, err, errors_exit_1, out, output_file, within

bench_app = typer.Typer(help="GPU benchmarks (results files that `ddprobe report` and `ddprobe gate` read).",
                        no_args_is_help=True)
app.add_typer(bench_app, name="bench")

DEFAULT_PATHS = "sglang,paged,split,split_ws,flashmla,flashinfer-fa3,flashinfer-fa2,flex,sdpa"


def _names(text: str, what: str) -> list[str]:
    """Comma-separated path and peer names, checked against the verify paths and the peers."""
    from ..engine.kernels import available
    from ..probes.bench.peers import PEERS
    from ..probes.bench.verify import WEAK_PEERS

    known = [p for p in available() if p not in ("reference", "prefill")] + list(PEERS) + list(WEAK_PEERS)
    names = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in names if p not in known]
    if bad:
        raise DDProbeError(f"{what}: unknown path {bad[0]!r}; known: {', '.join(known)}")
    return names


def _overrides(text: str, what: str) -> dict[str, str]:
    """'k=v,k=v' -> {k: v} (the values are checked against the path's tuning when it is built)."""
    pairs = [t.strip() for t in text.split(",") if t.strip()]
    if any("=" not in t for t in pairs):
        raise DDProbeError(f"{what}: tuning overrides are field=value pairs, got {text!r}")
    return dict(t.split("=", 1) for t in pairs)


def _variants(items: list[str], what: str) -> list[tuple[str, dict]]:
    """'split:tma=0,block_n=32' -> ("split", {"tma": "0", "block_n": "32"}) per item."""
    out_ = []
    for item in items:
        path, sep, over = item.partition(":")
        if not sep:
            raise DDProbeError(f"{what} takes PATH:field=value[,field=value], got {item!r}")
        out_.append((_names(path, what)[0], _overrides(over, what)))
    return out_


def _trace_dir(path: Path | None) -> str | None:
    """``--step-trace``: a folder that is new (made here) or empty, so no earlier trace is replaced; one line else."""
    if path is None:
        return None
    try:
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise DDProbeError(f"--step-trace {path}: " + ("not a folder" if not path.is_dir() else
                               "the folder holds files already (an earlier run's traces): give a new or empty one"))
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DDProbeError(f"--step-trace {path}: cannot make the folder ({e.strerror or e})") from None
    return str(path)


@bench_app.command("verify")
@errors_exit_1
def verify(
    ctx: Annotated[str, typer.Option("--ctx", help="Contexts, k = 1024.")] = "1k,4k,16k,32k,64k,128k,256k",
    heads: Annotated[str, typer.Option("--heads", help="Head counts timed per layer (8 = K2 under tp 8).")] = "8,64",
    paths: Annotated[str, typer.Option("--paths", help="Verify paths and peers, in order.")] = DEFAULT_PATHS,
    variant: Annotated[Optional[list[str]], typer.Option("--variant", help="Also time PATH with tuning overrides, "
                                                         "e.g. split:tma=0 (repeatable); plan=host times a host plan, "
                                                         "bound=128k a device plan sized for 128k tokens (as an engine "
                                                         "of about that KV capacity plans) at each context.")] = None,
    tune: Annotated[Optional[list[str]], typer.Option("--tune", help="A path's tuning for the whole run, e.g. "
                                                      "split:block_n=32 (repeatable).")] = None,
    budget: Annotated[int, typer.Option("--budget", help="Tree budget (verify rows = budget + 1).")] = 8,
    tree: Annotated[str, typer.Option("--tree", help="Tree shape: lopsided, fork, chain, star.")] = "lopsided",
    slots: Annotated[str, typer.Option("--slots", help="Token-pool slots of the page_size=1 paths (paged, sglang): "
                                                       "shuffled or contiguous.")] = "shuffled",
    quick: Annotated[bool, typer.Option("--quick", help="Fewer cache sets and shorter timing.")] = False,
    eager: Annotated[bool, typer.Option("--eager", help="Also time each verify path's eager launches (the same "
                                                        "input sets, no graph): eager_us and eager_ratio, eager "
                                                        "over graph replay.")] = False,
    step_ctx: Annotated[str, typer.Option("--step-ctx", help="Context of the whole-step timing (every layer, "
                                                             "8 heads); 0 leaves the step out.")] = "128k",
    step_variant: Annotated[Optional[list[str]], typer.Option("--step-variant", help="Also time PATH with "
                                                              "overrides in the step (repeatable).")] = None,
    step_skip: Annotated[str, typer.Option("--step-skip", help="Paths left out of the step, e.g. paged.")] = "",
    step_trace: Annotated[Optional[Path], typer.Option("--step-trace", help="A new or empty folder: each step's "
                                                       "profile as a Chrome trace (what `ddprobe trace` reads).")]
    = None,
    paged_max_ctx: Annotated[str, typer.Option("--paged-max-ctx", help="Time paged only up to this context.")]
    = "256k",
    paged_heads: Annotated[str, typer.Option("--paged-heads", help="Time paged only at these head counts "
                                                                   "(default: all).")] = "",
    flex_budget_s: Annotated[float, typer.Option("--flex-budget-s", help="Seconds FlexAttention may spend "
                                                                         "compiling before it is left out.",
                                         callback=checked(within(0.0, MAX_TIMEOUT_S, " s")))] = 150.0,
    out_path: Annotated[Path, typer.Option("--out", "-o", help="Results file (JSON), rewritten after every "
                                                               "context.", callback=output_file)]
    = Path("bench-verify.json"),
    force: ForceOpt = False,
):
    """Check and time verify attention (every path, FlashMLA, FlashInfer, Flex, SDPA) against each kernel's floor (its bytes over the measured copy bandwidth, or its FLOPs over the measured
    matmul rate: a kernel floor, not the whole step's); needs CUDA."""
    from ..jsonfile import write_json_atomic
    from ..probes.bench.verify import BenchOptions, check_tunings, run
    from .outputs import check_file

    check_file("--out", out_path, force=force, keep_existing=True)  # an earlier run's results: kept unless --force
    opts = BenchOptions(
        ctxs=parse_context_list(ctx), heads=_counts(heads, "--heads"), paths=_names(paths, "--paths"),
        variants=_variants(variant or [], "--variant"), budget=budget, tree=tree, quick=quick, slots=slots,
        tune={p: o for p, o in _variants(tune or [], "--tune")},
        step_ctx=parse_token_list(step_ctx)[0] if step_ctx.strip() not in ("", "0") else None,
        step_variants=_variants(step_variant or [], "--step-variant"), step_skip=_names(step_skip, "--step-skip"),
        paged_max_ctx=parse_token_list(paged_max_ctx)[0],
        paged_heads=_counts(paged_heads, "--paged-heads") if paged_heads else [],
        flex_budget_s=flex_budget_s, eager=eager, step_trace=_trace_dir(step_trace))
    if budget < 1:
        raise DDProbeError(f"--budget must be at least 1, got {budget}")
    if slots not in ("shuffled", "contiguous"):
        raise DDProbeError(f"--slots takes shuffled or contiguous, got {slots!r}")
    _check_tree(tree)
    check_tunings(opts)
    _need_cuda()

    def write(doc):  # nothing until the first result: a run that dies early leaves no empty file
        if doc["results"]:
            write_json_atomic(out_path, doc)

    doc = run(opts, write, on_row=lambda r: err.print(line(r), highlight=False, markup=False),
              command=" ".join(["ddprobe", *sys.argv[1:]]), on_progress=progress_line,
              on_ceilings=lambda c: err.print(f"ceilings: copy {c['copy_GBps']:.0f} GB/s, bf16 matmul "
                                              f"{c['bf16_mm_TFLOPs']:.0f} TFLOP/s", highlight=False))
    ceil = doc["ceilings"]
    out.print(f"ceilings: copy {ceil['copy_GBps']:.0f} GB/s, bf16 matmul {ceil['bf16_mm_TFLOPs']:.0f} TFLOP/s; "
              f"flex: {doc['flex']['failed'] or 'ok'}", highlight=False)
    for r in doc["results"]:
        out.print(line(r), highlight=False, markup=False)
    for text in fit_lines(out_path) if doc["results"] else []:  # read back from the file this run wrote
        out.print(text, highlight=False, markup=False)
    out.print(f"results written to {out_path}", highlight=False)


def fit_lines(path: Path) -> list[str]:
    """Each path's fixed part and marginal rate (reports.bench.Fit) in the results file at ``path``."""
    from ..reports.bench import fit_lines as lines
    from ..reports.load import load_one

    return lines(load_one(path))


def _counts(text: str, what: str) -> list[int]:
    """Comma-separated head counts: whole numbers from 1 to the model's heads (K2's 64)."""
    from ..physics.shapes import KIMI_K2

    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names or any(not t.isdigit() or not 1 <= int(t) <= KIMI_K2.num_heads for t in names):
        raise DDProbeError(f"{what} takes head counts from 1 to {KIMI_K2.num_heads}, got {text!r}")
    return [int(t) for t in names]


def _check_tree(tree: str) -> None:
    try:
        from ..engine.kernels.trees import SHAPES
    except ImportError:  # no torch: the CUDA check that follows says so
        return
    if tree not in SHAPES:
        raise DDProbeError(f"--tree: unknown tree shape {tree!r}; known: {', '.join(SHAPES)}")


def _need_cuda() -> None:
    try:
        import torch
    except ImportError:
        raise DDProbeError("ddprobe bench verify needs torch with CUDA (pip install 'ddprobe[engine]')") from None
    if not torch.cuda.is_available():
        raise DDProbeError("ddprobe bench verify needs a CUDA GPU; none is visible to torch")


def progress_line(done: int, total: int, elapsed_s: float, eta_s: float | None) -> None:
    """bench verify's progress on stderr after each row: entries done, time elapsed, ETA (probes/bench/verify.Progress)."""
    from .progress import _clock

    err.print(f"  [{done}/{total}] {_clock(elapsed_s)} elapsed, ETA {_clock(eta_s)}", highlight=False, markup=False)


def line(r: dict) -> str:
    """One results row as one line of text (progress on stderr, the table last on stdout)."""
    if r.get("kind") == "step61":
        head = f"step {r['ctx']:>7} {'':>3} {r['path']:<32}"
        if "step_ms" not in r:
            return f"{head} skipped: {r.get('skipped', '')[:100]}"
        return f"{head} {r['step_ms']:9.2f} ms  kernel floor {r['floor_us'] / 1e3:.2f} ms  x {r['gap']:5.2f}  {r['GBps']:6.0f} GB/s"
    head = f"{r['ctx']:>12} {r['heads']:>3} {r['path']:<32}"
    if "us" in r:
        k = (r.get("kernels") or {}).get("prefix") or {}
        regs = f"  regs {k.get('n_regs')} spill {k.get('n_spills')}" if k else ""
        return (f"{head} {r['us']:9.1f} us  {r['GBps']:6.0f} GB/s {r['TFLOPs']:6.1f} TF/s  kernel floor {r['floor_us']:7.1f} "
                f"x {r['gap']:5.2f}  err {r['rel_err']:.1e}{regs}"
                + (f"  eager {r['eager_us']:.1f} us (x {r['eager_ratio']:.2f})" if "eager_us" in r else ""))
    return f"{head} " + (f"skipped: {r['skipped'][:100]}" if "skipped" in r else f"ERROR {r.get('error', '')[:100]}")


@bench_app.command("allreduce")
@errors_exit_1
def allreduce(
    model: Annotated[str, typer.Option("--model", "-m", help="Model preset whose hidden size sets the message: "
                                                             "rows x hidden x dtype bytes.")] = "kimi-k2.6",
    budget: Annotated[int, typer.Option("--budget", help="Tree budget: the verify message has budget + 1 rows, the "
                                                         "plain decode message 1.")] = 8,
    nbytes: Annotated[str, typer.Option("--bytes", help="More message sizes, e.g. 4KB,1MiB.")] = "",
    ranks: Annotated[Optional[int], typer.Option("--ranks", help="Processes (default: the GPUs visible, or 2 on "
                                                                 "the CPU).")] = None,
    device: Annotated[str, typer.Option("--device", help="auto, cuda (NCCL, one GPU per rank) or cpu (gloo).")]
    = "auto",
    dtype: Annotated[str, typer.Option("--dtype", help="Element type of the hidden rows: bf16, fp16, fp32.")] = "bf16",
    graphs: Annotated[Optional[bool], typer.Option("--graphs/--no-graphs", help="NCCL: time the calls captured in a "
                                                                                "CUDA graph (eager where capture "
                                                                                "fails; default: on with cuda).")]
    = None,
    calls: Annotated[int, typer.Option("--calls", help="All-reduces per timed sample.",
                                       callback=checked(within(1, 100000)))] = 20,
    samples: Annotated[int, typer.Option("--samples", help="Timed samples per size (median, p10, p90).",
                                         callback=checked(within(1, 100000)))] = 30,
    timeout_s: Annotated[float, typer.Option("--timeout-s", help="Give up after this many seconds.",
                                             callback=checked(within(1.0, MAX_TIMEOUT_S, " s")))] = 300.0,
    out_path: Annotated[Path, typer.Option("--out", "-o", help="Results file (JSON), rewritten after every size.",
                                           callback=output_file)] = Path("allreduce.json"),
    force: ForceOpt = False,
):
    """All-reduce latency at the verify and plain decode message sizes on N local ranks (NCCL or gloo)."""
    from ..probes.bench.allreduce import AllreduceOptions, check, default_ranks, run_allreduce, step_messages
    from ..physics.models import get_model
    from ..results import Result, ResultWriter, RunMeta
    from ..physics.shapes import dtype_name
    from ..units import parse_bytes_list
    from .outputs import check_file

    check_file("--out", out_path, force=force, keep_existing=True)  # an earlier run's results: kept unless --force
    spec = get_model(model)
    if dtype_name(dtype) not in ("bf16", "fp16", "fp32"):
        raise DDProbeError(f"--dtype: all-reduce rows in bf16, fp16 or fp32, got {dtype!r}")
    dtype = dtype_name(dtype)
    extra = parse_bytes_list(nbytes, "--bytes") if nbytes.strip() else []
    messages = step_messages(spec.hidden_size, budget, dtype, extra)
    if device == "auto":
        try:
            import torch
        except ImportError:
            raise DDProbeError("ddprobe bench allreduce needs torch (pip install 'ddprobe[engine]')") from None
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise DDProbeError(f"--device: unknown device {device!r}; known: auto, cpu, cuda")
    if graphs and device != "cuda":
        raise DDProbeError("--graphs replays CUDA graphs: it needs --device cuda (gloo on the CPU runs eager)")
    n = default_ranks(device) if ranks is None else ranks
    opts = AllreduceOptions(n, messages, device=device, dtype=dtype, graphs=graphs is not False and device == "cuda",
                            calls=calls, samples=samples, timeout_s=timeout_s)
    check(opts)
    config = {"ranks": n, "backend": opts.backend, "graphs": opts.graphs, "device": device, "dtype": dtype,
              "model": spec.name, "hidden": spec.hidden_size, "budget": budget, "calls": calls, "samples": samples}
    writer = ResultWriter(Result(kind="allreduce", meta=RunMeta.collect(), config=config), out_path)
    err.print(f"all-reduce on {n} ranks ({opts.backend}{', CUDA graphs' if opts.graphs else ''}), {spec.name} "
              f"hidden {spec.hidden_size} {dtype}", highlight=False)
    rows = run_allreduce(opts, writer, on_row=_progress(len(messages)))
    for r in rows:
        out.print(allreduce_line(r), highlight=False, markup=False)
    out.print(f"results written to {out_path}", highlight=False)


def _progress(total: int):
    """on_row for the rows as they come: how far, on stderr (the rows themselves are the table on stdout)."""
    t0, done = time.perf_counter(), [0]

    def say(_row: dict) -> None:
        done[0] += 1
        spent = time.perf_counter() - t0
        err.print(f"  {done[0]}/{total} messages ({spent:.0f} s, about {spent / done[0] * (total - done[0]):.0f} s "
                  "left)", highlight=False)
    return say


def allreduce_line(r: dict) -> str:
    from ..units import fmt_bytes

    g = "  graph" if r.get("graphs") else ""
    return (f"{fmt_bytes(r['bytes']):>10} {r['label']:<18} {r['us']:9.1f} us  p10 {r['p10_us']:.1f}  p90 "
            f"{r['p90_us']:.1f}  {r['algbw_GBps']:.2f} GB/s{g}")


@bench_app.command("launch")
@errors_exit_1
def launch(
    kernels: Annotated[int, typer.Option("--kernels", help="Launches per timed sample.",
                                         callback=checked(within(1, 100000)))] = 1000,
    samples: Annotated[int, typer.Option("--samples", help="Timed samples per kind (median, p10, p90).",
                                         callback=checked(within(1, 10000)))] = 20,
    out_path: Annotated[Path, typer.Option("--out", "-o", help="Results file (JSON), rewritten after every row.",
                                           callback=output_file)] = Path("launch.json"),
    force: ForceOpt = False,
):
    """The least time one kernel costs on this GPU: graph-replayed (empty and small), eager, and a host sync."""
    from ..probes.bench.launch import check, measure_launch
    from ..results import Result, ResultWriter, RunMeta
    from .outputs import check_file

    check_file("--out", out_path, force=force, keep_existing=True)  # an earlier run's results: kept unless --force
    check(kernels, samples)
    try:
        import torch  # noqa: F401
    except ImportError:
        raise DDProbeError("ddprobe bench launch needs torch (pip install 'ddprobe[engine]')") from None
    meta = RunMeta.collect()
    writer = ResultWriter(Result(kind="bench-launch", meta=meta, config={"kernels": kernels, "samples": samples}),
                          out_path)
    rows = measure_launch(kernels, samples, on_row=lambda r: writer.add(r.to_dict()))
    for r in rows:
        out.print(f"{r.kind:<12} {r.us:8.3f} us per {'sync' if r.kind == 'sync' else 'kernel'}  p10 {r.p10_us:.3f}  "
                  f"p90 {r.p90_us:.3f}  ({r.kernels} per sample, {r.samples} samples)", highlight=False)
    out.print(f"{meta.gpu_name or 'this GPU'}: results written to {out_path}", highlight=False)
