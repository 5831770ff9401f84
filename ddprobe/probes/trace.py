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
from dataclasses import dataclass
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
    """What ``--model --ctx --tp`` give: the step model and the shape of the step traced."""
    model: object  # ddprobe.physics.step_model.StepModel
    name: str
    ctx: int
    rows: int
    tp: int
    gpu: str | None


@dataclass
class RankResult:
    rank: int
    path: Path
    method: str
    detail: str
    device: dict
    steps: RankSteps
    work: str = "GPU kernels"  # or "CPU operators" (--cpu-ops on a trace without kernels)


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
            raise DDProbeError(f"{p}: no such file or folder")
    return out


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


def rank_of(path: Path, header: dict, index: int) -> int:
    """The rank of a trace: its ``distributedInfo``, else its name (SGLang's ``-TP-3``, vLLM's ``_rank3.`` /
    ``tp3_``), else its place in the list. A ``distributedInfo`` rank that is no rank (negative, not an integer) is
    not believed: the name or the place is used."""
    info = header.get("distributedInfo")
    r = info.get("rank") if isinstance(info, dict) else None
    if isinstance(r, int) and not isinstance(r, bool) and r >= 0:
        return r
    for rx in _RANK_PATTERNS:
        m = rx.search(path.name)
        if m:
            return int(m.group(1))
    return index


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


def analyse_rank(path: Path, index: int, *, marker: str, cpu_ops: bool,
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
    found = find_steps(t, kernels)
    return RankResult(rank_of(path, t.header, index), path, found.method, found.detail, t.device(),
                      measure(found.steps), work)


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
        layers = tm.model.attn.num_layers
        per_call_B = tm.model.kv_bytes(tm.ctx) / layers
        out["attn_kv_B_per_call"] = per_call_B
        out["attn_eff_bw_GBps"] = per_call_B / (k.mean_us * 1e-6) / 1e9
        out["attn_kernel_floor_us"] = per_call_B / tm.model.bw_Bps * 1e6
        out["attn_vs_kernel_floor"] = k.mean_us / out["attn_kernel_floor_us"]
        if r.steps.class_ms["attention"] > 0:  # every attention kernel together (split-K kernels share the KV)
            out["attn_class_eff_bw_GBps"] = tm.model.kv_bytes(tm.ctx) / (r.steps.class_ms["attention"] * 1e-3) / 1e9
    return out


def rank_row(r: RankResult, tm: TraceModel | None) -> dict:
    s = r.steps
    row = {"rank": r.rank, "file": str(r.path), "steps": s.steps, "method": r.method, "work": r.work,
           "step_ms": s.median_span_ms, "busy_ms": s.median_busy_ms, "idle_ms": s.median_idle_ms,
           "overlap_ms": s.overlap_ms,
           "gpu": r.device.get("name")}
    row.update({f"{c}_ms": v for c, v in s.class_ms.items()})
    row.update({f"{c}_per_step": v for c, v in s.class_count.items()})
    row.update(attention_figures(r, tm))
    if tm is not None:
        cost = tm.model.cost(tm.ctx, tm.rows)
        row.update(floor_ms=cost.floor_ms, gap=s.median_span_ms / cost.floor_ms, binds=cost.binds)
    return row


def skew(rows: list[dict]) -> dict:
    """The slowest rank's step against the median rank's, and the communication each rank spent per step."""
    steps = [r["step_ms"] for r in rows]
    med = statistics.median(steps)
    slow = max(rows, key=lambda r: r["step_ms"])
    return {"ranks": len(rows), "median_step_ms": med, "slowest_rank": slow["rank"], "slowest_step_ms": slow["step_ms"],
            "skew": slow["step_ms"] / med if med else None,
            "communication_ms": {str(r["rank"]): r["communication_ms"] for r in rows}}


def trace_model(model: str | None, ctx: int | None, tp: int, rows: int, gpu: str | None,
                device_name: str | None) -> TraceModel | None:
    """The step model for ``--model`` (None without one; ``--ctx`` then required). The GPU: ``--gpu``, else the
    trace's device name when ddprobe knows it, else h200 (said in the result)."""
    if model is None:
        if ctx is not None:
            raise DDProbeError("--ctx needs --model (the model's KV bytes per token)")
        return None
    if ctx is None:
        raise DDProbeError("--model needs --ctx (the context the traced steps attended over)")
    from ..physics.models import get_model
    from .floor import Sharding, served_model

    spec = get_model(model)
    if gpu is None:
        known = gpu_spec_for(device_name)
        gpu = known.name if known else None
    m, _ = served_model(spec, Sharding(tp=tp), gpu)
    return TraceModel(m, spec.name, ctx, rows, tp, gpu or "h200")


def run_trace(paths: list[str | Path], *, marker: str = r"^ProfilerStep#\d+$", cpu_ops: bool = False,
              model: str | None = None, ctx: int | None = None, tp: int = 1, rows: int = 9, gpu: str | None = None,
              progress: Callable[[str, int, int], None] | None = None, command: str | None = None):
    """Analyse one trace per rank; returns (Result of kind "trace", the ranks' RankResults). ``progress(file, bytes
    read, file size)`` is called as each file streams in."""
    from ..results import Result, RunMeta

    files, stages = by_stage(trace_files(paths))
    ranks: list[RankResult] = []
    for i, f in enumerate(files):
        size = f.stat().st_size
        cb = (lambda n, f=f, size=size: progress(str(f), n, size)) if progress else None
        ranks.append(analyse_rank(f, i, marker=marker, cpu_ops=cpu_ops, progress=cb))
    seen: dict[int, Path] = {}
    for r in ranks:
        if r.rank in seen:
            raise DDProbeError(f"{seen[r.rank]} and {r.path} are both rank {r.rank}: give one trace per rank")
        seen[r.rank] = r.path
    ranks.sort(key=lambda r: r.rank)
    tm = trace_model(model, ctx, tp, rows, gpu, ranks[0].device.get("name"))
    rows_out = [rank_row(r, tm) for r in ranks]
    config = {"files": [str(f) for f in files], "left_out": stages, "marker": marker, "cpu_ops": cpu_ops, "model": model, "ctx": ctx,
              "tp": tp, "rows": rows, "gpu": tm.gpu if tm else gpu}
    summary = {"skew": skew(rows_out) if len(rows_out) > 1 else None,
               "strip": {"rank": ranks[0].rank, "kernels": ranks[0].steps.strip, "names": ranks[0].steps.strip_names},
               "top": {str(r.rank): [k.__dict__ for k in r.steps.kernels[:40]] for r in ranks},
               "detail": {str(r.rank): r.detail for r in ranks}}
    meta = RunMeta.collect(command=command, probe_gpu=False)
    return Result(kind="trace", meta=meta, config=config, rows=rows_out, summary=summary), ranks
