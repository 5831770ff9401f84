"""The trace pipeline (``ddprobe trace``): where a real server's verify step goes, read from the torch-profiler
(Kineto Chrome) traces SGLang, vLLM or ``ddprobe serve`` write, one file per rank.

Per rank: the steps (``trace_parts.steps``: markers, graph launches or the repeating kernel sequence, said which),
their median GPU span, busy and idle time inside the step, the split by kernel class (``ddprobe.kernel_classes``),
the largest kernels per class, and each attention kernel's grid against the GPU's SMs with the trace's occupancy
figures. With a model (``--model --ctx --tp``): the largest attention kernel's effective KV bandwidth and its kernel
floor, and the whole step against the step model's floor (``ddprobe.physics.step_model``, via ``probes.floor``). Several
ranks: side by side, the skew (slowest rank's step over the median rank's) and each rank's communication time.

Reading streams (``trace_parts.read``): a 200 MB trace keeps only tuples of what is used (docs/trace.md gives the
measured time and memory). HolisticTraceAnalysis (``traceinsight``) was not used: docs/trace.md says why.
"""
from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..physics.gpus import gpu_spec_for
from ..units import DDProbeError
from .trace_parts.analyse import RankSteps, grid_line, measure, occupancy_pct
from .trace_parts.read import Kernel, Trace, read_trace
from .trace_parts.steps import find_steps

SUFFIXES = (".json", ".json.gz")
_RANK_PATTERNS = (re.compile(r"-TP-(\d+)"), re.compile(r"_rank(\d+)\."), re.compile(r"(?:^|[_-])tp(\d+)[_.-]"),
                  re.compile(r"rank[_-]?(\d+)"))


@dataclass
class TraceModel:
    """What ``--model`` (with the context, tp and dtypes) gives: the model and the shape of the step traced; the
    step model itself is planned per rank from what the rank's trace counted (``rank_floor``)."""
    spec: object  # ddprobe.physics.models.ModelSpec
    name: str
    ctx: int
    rows: int
    tp: int
    gpu: str | None
    dtypes: dict  # weight_dtype, expert_dtype, kv_dtype
    ctx_from: str = "--ctx"  # or "the step labels"
    floor: dict = field(default_factory=dict)  # the other floor options given (``FLOOR_INPUTS``)


@dataclass
class RankResult:
    rank: int
    path: Path
    method: str
    detail: str
    device: dict
    steps: RankSteps
    work: str = "GPU kernels"  # or "CPU operators" (--cpu-ops on a trace without kernels)
    found: object = None  # trace_parts.steps.Steps: graphs, labels' mode and contexts, period
    world_size: int | None = None  # the trace's distributedInfo.world_size
    named: bool = True  # the rank is the trace's own (distributedInfo or file name), not its place in the list


def trace_files(paths: list[str | Path]) -> list[Path]:
    """The trace files named, a folder standing for its ``*.json`` / ``*.json.gz`` files (one line when none)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(f for f in p.iterdir() if f.is_file() and f.name.endswith(SUFFIXES))
            if not found:
                raise DDProbeError(f"{p}: no .json or .json.gz trace files in this folder")
            out += found
        elif p.is_file():
            out.append(p)
        else:
            _unreadable(p)
    return out


def _unreadable(p: Path) -> None:
    """Why ``p`` is neither a file nor a folder, in one line: the system's words where it is there but cannot be read
    (a symbolic link loop: "Too many levels of symbolic links", as ``reports.load.load_one`` says), else not there."""
    try:
        p.stat()
    except FileNotFoundError:
        pass
    except OSError as e:
        raise DDProbeError(f"cannot read trace file {p}: {e.strerror or e}") from None
    else:
        raise DDProbeError(f"{p}: neither a file nor a folder (a trace is a .json or .json.gz file)")
    raise DDProbeError(f"{p}: no such file or folder")


def distinct(files: list[Path]) -> list[Path]:
    """``files`` once each: a file named twice (or through a link), or two files of the same content, are one
    trace, never two ranks (one line)."""
    import hashlib

    seen: dict[str, Path] = {}
    for f in files:
        try:
            real = str(f.resolve())
        except (OSError, RuntimeError) as e:  # a symlink loop
            raise DDProbeError(f"{f}: cannot be resolved ({e})") from None
        if real in seen:
            raise DDProbeError(f"{f} is given twice ({seen[real]}): one trace per rank")
        seen[real] = f
    sums: dict[tuple, Path] = {}
    for f in files:
        h = hashlib.sha256()
        with open(f, "rb") as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
        key = (f.stat().st_size, h.hexdigest())
        if key in sums:
            raise DDProbeError(f"{f} and {sums[key]} hold the same bytes: one trace, not two ranks")
        sums[key] = f
    return files


def by_stage(files: list[Path]) -> tuple[list[Path], list[str]]:
    """SGLang's ``profile_by_stage`` writes ``-EXTEND`` and ``-DECODE`` files per rank: verify steps run in the
    decode stage, so the ``-EXTEND`` files are left out where a ``-DECODE`` one is there (said in the result). A merged
    file of several ranks is refused (one line)."""
    for f in files:
        if f.name.startswith("merged-"):
            raise DDProbeError(f"{f}: a merged trace of several ranks (SGLang's merge_profiles): profile with "
                               "merge_profiles false, one file per rank")
    if not any("-DECODE" in f.name for f in files):
        return files, []
    keep = [f for f in files if "-EXTEND" not in f.name]
    return keep, [f"{f.name}: the prefill (EXTEND) stage, left out" for f in files if f not in keep]


def named_rank(path: Path, header: dict) -> int | None:
    """The rank a trace says: its ``distributedInfo``, else its name (SGLang's ``-TP-3``, vLLM's ``_rank3.`` /
    ``tp3_``), else None (a lone trace is then rank 0; several are refused: ``check_one_run``). A
    ``distributedInfo`` rank that is no rank (negative, not an integer) is not believed: the name is used."""
    info = header.get("distributedInfo")
    r = info.get("rank") if isinstance(info, dict) else None
    if isinstance(r, int) and not isinstance(r, bool) and r >= 0:
        return r
    for rx in _RANK_PATTERNS:
        m = rx.search(path.name)
        if m:
            return int(m.group(1))
    return None


def top_level_ops(t: Trace) -> list[Kernel]:
    """A CPU-only trace's top-level operators per thread (nested ones are inside them), as the step's work."""
    out: list[Kernel] = []
    by_tid: dict[int, list] = {}
    for op in t.cpu_ops:
        by_tid.setdefault(op[3], []).append(op)
    for tid, ops in by_tid.items():
        end = -1.0
        for name, ts, dur, _ in sorted(ops, key=lambda o: (o[1], -o[2])):
            if ts >= end:
                out.append(Kernel(name, ts, dur, tid, -1, "cpu_op"))
                end = ts + dur
    return sorted(out, key=lambda k: k.ts)


def analyse_rank(path: Path, index: int, *, marker: str, cpu_ops: bool, layers: int | None = None,
                 progress: Callable[[int], None] | None = None) -> RankResult:
    t = read_trace(path, marker=marker, cpu_ops=cpu_ops, progress=progress)
    kernels = sorted((k for k in t.kernels if k.cat == "kernel" or k.dur > 0), key=lambda k: k.ts)
    work = "GPU kernels"
    if not any(k.cat == "kernel" for k in kernels):
        if not cpu_ops:
            raise DDProbeError(f"{path}: no GPU kernels in this trace ({t.events:,} events; CPU-only activities?): "
                               "profile with activities CPU and GPU (CUDA), or pass --cpu-ops for a CPU engine's trace")
        kernels, work = top_level_ops(t), "CPU operators"
        if not kernels:
            raise DDProbeError(f"{path}: neither GPU kernels nor CPU operators in this trace")
    found = find_steps(t, kernels, layers)
    info = t.header.get("distributedInfo")
    ws = info.get("world_size") if isinstance(info, dict) else None
    ws = ws if isinstance(ws, int) and not isinstance(ws, bool) and 0 < ws < 1 << 20 else None
    named = named_rank(path, t.header)
    return RankResult(index if named is None else named, path, found.method, found.detail, t.device(),
                      measure(found.steps), work, found, ws, named is not None)


def attention_figures(r: RankResult, tm: TraceModel | None) -> dict:
    """The largest attention kernel: its grid against the SMs, and with a model its effective KV bandwidth and its
    kernel floor (KV bytes one call reads / the GPU's bandwidth)."""
    attn = [k for k in r.steps.kernels if k.cls == "attention"]
    if not attn:
        return {}
    k = next((a for a in attn if a.role in ("verify", "decode")), attn[0])  # the largest that attends (not a merge)
    sms, smem = r.device.get("numSms"), r.device.get("sharedMemPerBlock")
    launch = dict(k.launch, achieved_occupancy_pct=occupancy_pct(k.launch, smem)) if k.launch else None
    out = {"attn_kernel": k.name, "attn_what": k.what, "attn_us": k.mean_us, "attn_calls": k.per_step,
           "attn_grid": grid_line(k, sms, smem), "attn_blocks": (k.launch or {}).get("blocks"), "sms": sms,
           "attn_launch": launch,
           "attn_kernels": [{"name": a.name, "what": a.what, "role": a.role, "us": a.mean_us, "per_step": a.per_step,
                             "grid": grid_line(a, sms, smem)} for a in attn[:6]]}
    if tm is not None:
        from ..physics.step_model import kernel_floor

        model = rank_floor(r, tm)[0]
        kv_B = model.kv_bytes(tm.ctx * _batch(r))
        per_call_B = kv_B / k.per_step  # the step's KV over the calls counted (one per layer: the layer's KV)
        out["attn_kv_B_per_call"] = per_call_B
        out["attn_calls_vs_layers"] = k.per_step / tm.spec.attn.num_layers
        out["attn_eff_bw_GBps"] = per_call_B / (k.mean_us * 1e-6) / 1e9
        kf = kernel_floor(per_call_B, bw_Bps=model.bw_Bps, gpu=tm.gpu or "")  # THE kernel floor: datasheet here
        out["attn_kernel_floor_us"], out["attn_kernel_floor_basis"] = kf.us, kf.basis
        out["attn_vs_kernel_floor"] = k.mean_us / out["attn_kernel_floor_us"]
        if r.steps.class_ms["attention"] > 0:  # every attention kernel together (split-K kernels share the KV)
            out["attn_class_eff_bw_GBps"] = kv_B / (r.steps.class_ms["attention"] * 1e-3) / 1e9
    return out


def _batch(r: RankResult) -> int:
    return getattr(r.found, "batch", None) or 1


def rank_floor(r: RankResult, tm: TraceModel):
    """The step model of the step this rank traced (``physics.plan``): its kernels per step as counted in the trace
    (collectives left out: they are the communication), graph-replayed or eager as its steps were found, its
    communication as measured (a tp > 1 trace without a collective kernel: not counted, said); and the line
    saying so."""
    from ..physics.interconnect import Comm
    from ..physics.plan import StepInput, plan
    from ..physics.step_model import ALLREDUCES_PER_LAYER

    s, fl = r.steps, tm.floor
    comm_n, comm_ms = s.class_count.get("communication", 0.0), s.class_ms.get("communication", 0.0)
    kernels = max(1, round(sum(s.class_count.values()) - comm_n))
    graphs = bool(getattr(r.found, "graphs", False))
    comm, said = None, "tp 1: no communication"
    if fl.get("allreduce_us") is not None or fl.get("allreduce_from"):
        from .floor import Sharding, comm_for

        comm, said = comm_for(Sharding(tp=tm.tp, dcp=fl.get("dcp", 1), allreduce_us=fl.get("allreduce_us"),
                                       allreduce_from=fl.get("allreduce_from")), tm.gpu)
        said += f" (given; the trace measured {comm_ms:.3g} ms per step)"
    elif tm.tp > 1 and comm_n > 0:
        per = comm_ms * 1e3 / (ALLREDUCES_PER_LAYER * tm.spec.attn.num_layers)
        comm = Comm(lambda _b, per=per: per, f"measured in the trace: {comm_ms:.3g} ms per step over "
                                             f"{comm_n:.0f} collective kernels")
        said = comm.source
    elif tm.tp > 1:
        said = f"tp {tm.tp} but no collective kernel in the trace: communication not counted"
    src = (f"counted in the trace: {kernels:,} kernels per step" +
           (f" (its {comm_n:.0f} collectives counted once, in communication)" if comm_n else ""))
    if fl.get("kernels") is not None:
        kernels, src = fl["kernels"], f"--kernels {fl['kernels']:,} (the trace counted {kernels:,})"
    model = plan(StepInput(tm.spec, tp=tm.tp, gpu=tm.gpu, kernels=kernels, kernels_source=src, graphs=graphs,
                           comm=comm, ep=fl.get("ep", 1), dcp=fl.get("dcp", 1), bw_Bps=fl.get("bw_Bps"),
                           flops_per_s=fl.get("flops_per_s"), launch=fl.get("launch"),
                           launch_any_gpu=fl.get("launch_any_gpu", False), **tm.dtypes))
    return model, f"{src}; {'graph-replayed' if graphs else 'eager'}; {said}"


def rank_row(r: RankResult, tm: TraceModel | None) -> dict:
    s = r.steps
    row = {"rank": r.rank, "file": str(r.path), "steps": s.steps, "method": r.method, "work": r.work,
           "step_ms": s.median_span_ms, "busy_ms": s.median_busy_ms, "idle_ms": s.median_idle_ms,
           "overlap_ms": s.overlap_ms,
           "gpu": r.device.get("name")}
    row.update({f"{c}_ms": v for c, v in s.class_ms.items()})
    row.update({f"{c}_per_step": v for c, v in s.class_count.items()})
    row.update(attention_figures(r, tm))
    f = r.found
    if f is not None:
        row.update(period_ms=f.period_ms, graphs=f.graphs, mode=f.mode, batch=f.batch,
                   ctx_labels=int(statistics.median(f.contexts)) if f.contexts else None)
    if tm is not None:
        model, said = rank_floor(r, tm)
        rows = getattr(f, "rows", None) or tm.rows  # the labels' rows per request (1: a plain decode step) first
        if getattr(f, "rows", None):
            said += f"; {rows} query rows per request, from the step labels"
        cost = model.cost(tm.ctx * _batch(r), rows * _batch(r))
        row.update(floor_ms=cost.floor_ms, gap=s.median_span_ms / cost.floor_ms, binds=cost.binds,
                   floor_from=said, kernels_per_step=cost.kernels, ctx=tm.ctx, ctx_from=tm.ctx_from)
    return row


def skew(rows: list[dict]) -> dict:
    """The slowest rank's step against the median rank's, and the communication each rank spent per step."""
    steps = [r["step_ms"] for r in rows]
    med = statistics.median(steps)
    slow = max(rows, key=lambda r: r["step_ms"])
    return {"ranks": len(rows), "median_step_ms": med, "slowest_rank": slow["rank"], "slowest_step_ms": slow["step_ms"],
            "skew": slow["step_ms"] / med if med else None,
            "communication_ms": {str(r["rank"]): r["communication_ms"] for r in rows}}


FLOOR_INPUTS = ("ep", "dcp", "bw_Bps", "flops_per_s", "launch", "launch_any_gpu", "kernels", "allreduce_us",
                "allreduce_from")  # the floor options besides tp, GPU and dtypes that shape a trace's floor


def trace_model(model: str | None, ctx: int | None, tp: int | None, rows: int, gpu: str | None,
                device_name: str | None, dtypes: dict | None = None, labels_ctx: int | None = None,
                world: int = 1, floor: dict | None = None) -> TraceModel | None:
    """What the floor needs (None without ``--model``). The context: the step labels' when the trace has them
    (a ``--ctx`` that contradicts them is refused), else ``--ctx``. tp: ``--tp``, else the trace's world size or
    file count. The GPU: ``--gpu``, else the trace's device when ddprobe knows it, else h200 (said in the result)."""
    if model is None:
        if ctx is not None:
            raise DDProbeError("--ctx needs --model (the model's KV bytes per token)")
        given = [k for k, v in (floor or {}).items() if v not in (None, False, 1)]
        if tp not in (None, 1) or gpu is not None or any((dtypes or {}).values()) or given:
            opt = "--tp" if tp not in (None, 1) else "--gpu" if gpu is not None else \
                "the dtype options" if any((dtypes or {}).values()) else _flag(given[0])
            verb = "need" if opt.startswith("the") else "needs"
            raise DDProbeError(f"{opt} {verb} --model: it only shapes the floor, which needs the model")
        return None
    if ctx is not None and labels_ctx is not None and abs(ctx - labels_ctx) > 0.1 * labels_ctx:
        raise DDProbeError(f"--ctx {ctx:,} contradicts the trace's step labels ({labels_ctx:,} tokens of context "
                           "per request): leave --ctx out, or give the labels' context")
    if ctx is None and labels_ctx is None:
        raise DDProbeError("--model needs --ctx (the context the traced steps attended over; the trace has no step "
                           "labels that say it)")
    from ..physics.models import get_model

    spec = get_model(model)
    if gpu is None:
        known = gpu_spec_for(device_name)
        gpu = known.name if known else None
    dt = {k: v for k, v in (dtypes or {}).items() if v}
    if tp is None:  # an engine preset is one GPU's share already; a served model's tp: the trace's ranks
        tp = 1 if getattr(spec, "kind", "") == "engine" else world
    return TraceModel(spec, spec.name, labels_ctx if labels_ctx is not None else ctx, rows, tp, gpu or "h200", dt,
                      "the step labels" if labels_ctx is not None else "--ctx",
                      {k: v for k, v in (floor or {}).items() if v is not None})


def _flag(key: str) -> str:
    """The option a ``FLOOR_INPUTS`` key comes from."""
    return {"bw_Bps": "--bw", "flops_per_s": "--tflops"}.get(key, "--" + key.replace("_", "-"))


def _layers(model: str | None) -> int | None:
    if model is None:
        return None
    from ..physics.models import get_model

    return get_model(model).attn.num_layers


def analyse_all(paths: list[str | Path], *, marker: str, cpu_ops: bool, layers: int | None,
                progress: Callable[[str, int, int], None] | None) -> tuple[list[Path], list[str], list[RankResult]]:
    """Every rank's steps, measured (one trace per rank: two of one rank refused)."""
    files, stages = by_stage(trace_files(paths))
    files = distinct(files)
    ranks: list[RankResult] = []
    for i, f in enumerate(files):
        size = f.stat().st_size
        cb = (lambda n, f=f, size=size: progress(str(f), n, size)) if progress else None
        ranks.append(analyse_rank(f, i, marker=marker, cpu_ops=cpu_ops, layers=layers, progress=cb))
    check_one_run(ranks)
    seen: dict[int, Path] = {}
    for r in ranks:
        if r.rank in seen:
            raise DDProbeError(f"{seen[r.rank]} and {r.path} are both rank {r.rank}: give one trace per rank")
        seen[r.rank] = r.path
    ranks.sort(key=lambda r: r.rank)
    return files, stages, ranks


def check_one_run(ranks: list[RankResult]) -> None:
    """Several traces are read as the ranks of one run, side by side with a skew: each must say its rank (its
    ``distributedInfo`` or its file name), and those that give a world size must give the same one; one line
    otherwise (unrelated traces would be compared as ranks)."""
    if len(ranks) < 2:
        return
    unnamed = [r.path for r in ranks if not r.named]
    if unnamed:
        raise DDProbeError(f"{unnamed[0]}" + (f" (and {len(unnamed) - 1} more)" if len(unnamed) > 1 else "")
                           + ": several traces are read as the ranks of one run, and this one names no rank (no "
                           "distributedInfo, no -TP-N or _rankN in its name): give one trace at a time, or each "
                           "rank's own file")
    sizes = {r.world_size for r in ranks if r.world_size is not None}
    if len(sizes) > 1:
        raise DDProbeError(f"the traces give different world sizes ({', '.join(map(str, sorted(sizes)))}): they are "
                           "not the ranks of one run; give one run's files")


def run_trace(paths: list[str | Path], *, marker: str = r"^ProfilerStep#\d+$", cpu_ops: bool = False,
              model: str | None = None, ctx: int | None = None, tp: int | None = None, rows: int = 9,
              gpu: str | None = None, dtypes: dict | None = None, floor: dict | None = None,
              progress: Callable[[str, int, int], None] | None = None, command: str | None = None):
    """Analyse one trace per rank; returns (Result of kind "trace", the ranks' RankResults). ``progress(file, bytes
    read, file size)`` is called as each file streams in. ``dtypes``: weight_dtype, expert_dtype, kv_dtype."""
    from ..results import Result, RunMeta

    if model is None:  # refused before anything is read
        trace_model(None, ctx, tp, rows, gpu, None, dtypes, floor=floor)
    files, stages, ranks = analyse_all(paths, marker=marker, cpu_ops=cpu_ops, layers=_layers(model),
                                       progress=progress)
    f0 = ranks[0].found
    labels_ctx = int(statistics.median(f0.contexts)) if f0 is not None and f0.contexts else None
    world = ranks[0].world_size or len(ranks)
    tm = trace_model(model, ctx, tp, rows, gpu, ranks[0].device.get("name"), dtypes, labels_ctx, world, floor)
    rows_out = [rank_row(r, tm) for r in ranks]
    config = {"files": [str(f) for f in files], "left_out": stages, "marker": marker, "cpu_ops": cpu_ops,
              "model": model, "ctx": tm.ctx if tm else ctx, "ctx_from": tm.ctx_from if tm else None,
              "tp": tm.tp if tm else tp, "rows": rows, "gpu": tm.gpu if tm else gpu, **(tm.dtypes if tm else {})}
    summary = {"skew": skew(rows_out) if len(rows_out) > 1 else None,
               "strip": {"rank": ranks[0].rank, "kernels": ranks[0].steps.strip, "names": ranks[0].steps.strip_names},
               "top": {str(r.rank): [k.__dict__ for k in r.steps.kernels[:40]] for r in ranks},
               "detail": {str(r.rank): r.detail for r in ranks}}
    meta = RunMeta.collect(command=command, probe_gpu=False)
    return Result(kind="trace", meta=meta, config=config, rows=rows_out, summary=summary), ranks
