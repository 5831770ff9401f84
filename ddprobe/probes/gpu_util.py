"""GPU-utilization probe: is the GPU doing work during decode?

``run_gpu_util`` drives one decode-heavy request (novel text: each step commits about one token)
through any backend while ``sampler.Sampler`` samples every GPU, marks the phases (prefill from
the request start, decode from the first token, idle after the end) and returns a ``Result`` of
kind ``gpu-util``: rows = the timeline (one per GPU per tick), summary = ``gpu_verdict.analyze``
(per GPU and phase: medians, p90s, verdict and evidence; decode step time, effective bandwidth,
energy per token). ``replay`` re-analyses a saved timeline anywhere. ``deep_ncu`` (optional) reads
Nsight Compute metrics for a few verify kernels of a decode step.
"""
from __future__ import annotations

import csv
import io
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .. import verify_paths
from ..results import Result, ResultWriter
from .. import schema, signals
from ..physics.gpus import gpu_spec_for
from ..units import DDProbeError
from .backends.base import Backend
from .commit import CellProgress, generate_hooked, prompt_ids
from ..gpu_verdict import analyze, reanalyzed
from ..physics.step_model import parts_bound
from .telemetry.sampler import Sampler, assign_phases
from .telemetry.sources import SourceUnavailable, http_get, undo_resets
from .telemetry.nvml import NvmlReader, NvmlUnavailable

NCU_METRICS = ["sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",
               "dram__throughput.avg.pct_of_peak_sustained_elapsed", "gpu__time_duration.sum"]
# the verify kernels of each path (ncu -k), from the one verify-path table
NCU_KERNELS = {p.name: f"regex:{p.ncu_regex}" for p in verify_paths.PATHS if p.ncu_regex}
IDLE_LEAD_S = 0.5  # idle samples before and after the request: the baseline
MAX_SCRAPE_WAIT_S = 60.0  # the longest wait for Prometheus's scrape of the window's end
DEEP_DECODE_TOKENS = 4  # ncu's child run: a few decode steps are enough to catch the verify kernels


def request_info(backend: Backend, st, gpu_name: str | None) -> dict[str, Any]:
    """What the request measured, plus the KV bytes per token when the backend knows its attention shape
    (the embedded engine does; a server does not say)."""
    attention = getattr(backend, "attention", None)
    kv_tok = None
    spec = gpu_spec_for(gpu_name)
    floor = {}
    if attention is not None:
        shape, kv_dtype, _ = attention()
        kv_tok = shape.kv_bytes_per_token(kv_dtype)
        if spec is not None and st.prompt_tokens:
            floor = _step_floor(backend, spec, st)
    return {"prompt_tokens": st.prompt_tokens, "completion_tokens": st.completion_tokens,
            "verify_steps": st.verify_steps, "commit_len": st.commit_len, "prefill_s": st.prefill_s,
            "decode_s": st.decode_s, "e2e_s": st.e2e_s, "step_ms": [t * 1e3 for t in st.step_times_s],
            "verify_ms_mean": st.extra.get("verify_ms_mean"), "kv_B_per_token": kv_tok,
            "gpu": gpu_name, "gpu_bw_Bps": spec.bw_Bps if spec else None,
            "gpu_bw_source": f"{spec.label} datasheet" if spec else None, **floor}


def _step_floor(backend: Backend, spec, st) -> dict[str, Any]:
    """The step model's floor of the engine's verify step at the middle of the decode (the whole step: KV, weights,
    compute, launches counted on the GPU), its KV floor (the attention alone) and its launch and bytes parts."""
    from .bench.step_times import engine_step_model

    rows = int(backend.describe().get("budget", 8)) + 1
    ctx = int(st.prompt_tokens + (st.completion_tokens or 0) / 2)
    m = engine_step_model(backend, spec.name, spec.bw_Bps, spec.bf16_flops)
    c = m.cost(max(1, ctx), rows)
    return {"floor_ms": c.floor_ms, "kv_floor_ms": c.kv_floor_ms, "floor_binds": c.binds,
            "floor_source": "ddprobe.physics.step_model, the engine's own weights", "kernels": c.kernels,
            "kernel_us": c.kernel_us, "launch_ms": c.launch_ms, "sync_ms": c.sync_ms, "syncs": c.syncs,
            "latency_floor_ms": c.latency_floor_ms, "bytes_floor_ms": c.bytes_floor_ms,
            "compute_floor_ms": c.compute_floor_ms,
            "launches_source": m.kernel_source}


def step_parts(summary: dict) -> dict[str, Any]:
    """{"step_parts": ...}: how much of the measured decode step its launches (kernels x least kernel time + syncs)
    and its bytes (at the GPU's bandwidth) explain, and which is larger; {} without a floor or a step."""
    req, step = summary.get("request") or {}, summary.get("decode_step_ms")
    if not step or req.get("latency_floor_ms") is None or not req.get("bytes_floor_ms"):
        return {}
    lat = req["latency_floor_ms"]
    w = parts_bound(lat, req["bytes_floor_ms"], req.get("compute_floor_ms"), sync_ms=req.get("sync_ms") or 0.0,
                    comm_ms=req.get("comm_ms") or 0.0)
    return {"step_parts": {"step_ms": step, "launch_ms": lat, "bytes_ms": w.ms, "work": f"{w.what} at {w.rate}",
                           "launch_share": lat / step, "bytes_share": w.ms / step, "kernels": req.get("kernels"),
                           "kernel_us": req.get("kernel_us"), "syncs": req.get("syncs"), "bound": w.bound,
                           "source": req.get("launches_source")}}


def check_decode_tokens(decode_tokens: int) -> None:
    """A sampled decode needs two tokens at least (one step to time after the first)."""
    if decode_tokens < 2:
        raise DDProbeError(f"--decode-tokens must be at least 2, got {decode_tokens}")


def believed(rows: list[dict], notes: list[str]) -> list[dict]:
    """Telemetry rows as they may be written (the gpu-util schema): a reading that breaks it (a negative power from
    an exporter, text where a number belongs) kept as unknown (null) and said once per signal in ``notes``; a row
    without a usable time or GPU index dropped, said once."""
    out, said = [], set()
    for r in rows:
        bad = schema.unbelievable("gpu-util", r)
        drop = sorted({"t_s", "gpu"} & set(bad))
        for k in drop or bad:
            if k not in said:
                said.add(k)
                notes.append(f"telemetry: {k} {bad[k]}: " + ("that row dropped" if drop else "not believed, kept as "
                                                                                            "unknown"))
        if not drop:
            out.append({**r, **dict.fromkeys(bad)})
    return out


def run_gpu_util(backend: Backend, prompt_len: int, decode_tokens: int, period_s: float, writer: ResultWriter,
                 text: str = "novel", seed: int = 0, reader_factory: Callable[[], Any] = NvmlReader,
                 on_event: Callable[[str], None] | None = None, warmup: bool = True,
                 progress: CellProgress | None = None, after_warmup: Callable[[], Any] | None = None,
                 window: Any = None) -> Result:
    """Sample every GPU during one request of ``prompt_len`` tokens + ``decode_tokens``; the Result (kind
    "gpu-util") holds the timeline rows and the ``analyze`` summary. Raises ``NvmlUnavailable`` (one line)
    before the request when NVML sees no GPU. ``warmup`` first runs a short request (first 256 prompt tokens,
    3 new) so kernel compilation does not land in the sampled decode; ``after_warmup`` (the CLI's estimate)
    then runs inside the warm-up phase, before the sampled request. ``progress`` (``commit.CellProgress``)
    hears of the request as one cell: its prefill and decode where the backend reports them. ``window``
    (``prometheus.PromWindow``) replaces the live source: the sampler keeps only the clock and the markers,
    and the GPUs' rows are read from Prometheus after the request; if that fails the request's numbers are
    kept and ``summary["telemetry_error"]`` says why in one line."""
    check_decode_tokens(decode_tokens)
    say = on_event or (lambda msg: None)
    ids = prompt_ids(backend, text, prompt_len, seed)
    sampler = Sampler(period_s, reader_factory=None if window is not None else reader_factory).start()
    if window is None and not sampler.available:
        sampler.stop()
        why = sampler.sources[sampler.kind].removeprefix("missing: ")
        raise (NvmlUnavailable if sampler.kind == "nvml" else SourceUnavailable)(why)
    if sampler.kind == "nvml" and window is None:
        sampler.notes += shared_counters_note()
    try:
        if warmup:
            t_w = sampler.now()
            if hasattr(backend, "warmup"):  # the engine: compile, capture and one throwaway step
                done = backend.warmup(None)
                say(f"warm-up {done['warmup_s']:.1f} s: {done['what']}")
            else:
                say("warm-up request (256 tokens, 3 new): kernels compile outside the sampled request")
                backend.generate(ids[:256], 3)
            sampler.mark("warmup", t_w)
            if after_warmup is not None:
                after_warmup()
            sampler.mark("idle")
        time.sleep(IDLE_LEAD_S)
        say(f"prefill {len(ids)} tokens, then decode {decode_tokens}...")
        if progress is not None:
            progress.cell_started(text, prompt_len, len(ids), decode_tokens)
        t0 = sampler.now()
        sampler.mark("prefill", t0)
        try:
            st = generate_hooked(backend, ids, decode_tokens, progress)
        finally:
            if progress is not None:
                progress.cell_done(None)
        t_end = sampler.now()
        if st.prefill_s is not None:
            sampler.mark("decode", t0 + st.prefill_s)  # first token
        else:  # a server without a first-token time: prefill and decode share one phase
            sampler.markers[-1] = (t0, "request")
        sampler.mark("idle", t_end)
        time.sleep(IDLE_LEAD_S)
    finally:
        rows = sampler.stop()
    telemetry_error, engine = None, None
    if window is not None:
        rows, telemetry_error, engine = read_window(window, sampler, say)
    res = writer.result
    gpu_name = sampler.gpus[0]["name"] if sampler.gpus else None
    req = request_info(backend, st, gpu_name)
    res.config.update({"prompt_len": prompt_len, "decode_tokens": decode_tokens, "text": text, "period_s": period_s,
                       "interval_s": period_s, "gpm": any(v.startswith("ok") for k, v in sampler.sources.items()
                                                          if k in signals.PROFILING),
                       "sources": dict(sampler.sources), "sampled_gpus": sampler.gpus,
                       "source": window.kind if window is not None else sampler.kind})
    rows = believed(rows, sampler.notes)
    res.rows.extend(rows)
    res.summary = {**analyze(rows, req, sampler.sources), "request": req,
                   "markers": [[round(t, 4), p] for t, p in sampler.markers], "notes": list(sampler.notes)}
    res.summary.update(step_parts(res.summary))
    if engine:
        res.summary["engine"] = engine
    if telemetry_error:
        res.summary["telemetry_error"] = telemetry_error
    writer.flush()
    return res


def gpu_util_run(backend: Backend, prompt_len: int, decode_tokens: int, period_s: float, writer: ResultWriter, *,
                 text: str = "novel", seed: int = 0, telemetry: dict[str, Any] | None = None,
                 on_event: Callable[[str], None] | None = None, warmup: bool = True,
                 progress: CellProgress | None = None, on_estimate: Callable[[Any], None] | None = None,
                 deep: "DeepRun | None" = None) -> Result:
    """The gpu-util pipeline of `gpu-util` and `diagnose`: ``run_gpu_util`` over one request (``telemetry``: its
    source, ``cli.gpu_source.open_source``; None: NVML here). With ``on_estimate`` (`gpu-util`; `diagnose` estimates
    its whole run itself): the request is estimated after the warm-up (``estimate.estimate_run``), the estimate
    recorded in the config and handed to ``on_estimate``, and the summary's ``timing`` sets it beside what the
    request took. With ``deep``: Nsight Compute over a shorter run of the same request, in the summary's ``deep``."""
    from .bench.estimate import estimate_run, timing_block

    est: list = []

    def estimate() -> None:  # after the warm-up, before the sampled request
        e = estimate_run(backend, [(text, prompt_len)], decode_tokens, seed, reuse=False)
        if e is not None:
            est.append(e)
            writer.result.config["estimate"] = e.to_dict()
            on_estimate(e)

    res = run_gpu_util(backend, prompt_len, decode_tokens, period_s, writer, text=text, seed=seed, on_event=on_event,
                       warmup=warmup, progress=progress, after_warmup=estimate if on_estimate else None,
                       **(telemetry or {}))
    if on_estimate is not None:
        res.summary["timing"] = timing_block(res.summary.get("request", {}).get("e2e_s"), est[0] if est else None)
        writer.flush()
    if deep is not None:
        res.summary["deep"] = deep.run(prompt_len, text)
        writer.flush()
    return res


@dataclass(frozen=True)
class DeepRun:
    """`gpu-util --deep`: the options, as typed, that rebuild the measured request's backend in ncu's child run, and
    the attention path whose verify kernels ncu reads (``NCU_KERNELS``)."""

    period: str
    backend: str
    timeout: float
    url: str | None
    engine_args: tuple[str, ...]
    attn: str

    def command(self, prompt_len: int, text: str, json_path: str) -> list[str]:
        """The same request, shorter (``DEEP_DECODE_TOKENS``), without files of its own (but ``json_path``) or a
        warm-up: ncu's first verify kernels are then the measured decode's, at the prompt's context."""
        return [sys.executable, "-m", "ddprobe", "gpu-util", "--prompt-len", str(prompt_len), "--decode-tokens",
                str(DEEP_DECODE_TOKENS), "--no-warmup", "--period", self.period, "--text", text, "--backend",
                self.backend, "--timeout", str(self.timeout), *(["--url", self.url] if self.url else []),
                *self.engine_args, "--json", json_path]

    def run(self, prompt_len: int, text: str) -> dict[str, Any]:
        """``deep_ncu`` over the child run; its results file lives in a folder removed afterwards."""
        with tempfile.TemporaryDirectory() as tmp:
            return deep_ncu(self.command(prompt_len, text, str(Path(tmp) / "child.json")), self.attn)


def read_window(window: Any, sampler: Sampler, say: Callable[[str], None]) -> tuple[list, str | None, Any]:
    """The GPUs' rows of the sampled window from a window source (Prometheus), phased by the sampler's
    markers, with the engine's counters; (rows, one-line error or None, engine metrics or None)."""
    t0, t1 = sampler.t0_unix, sampler.t0_unix + sampler.now()
    try:
        step = window.interval()
        if step > 0:  # the samples of the window's end land at the next scrape
            say(f"waiting {min(step, MAX_SCRAPE_WAIT_S) + 0.5:.1f} s for Prometheus's next scrape "
                f"(scrape interval {step:g} s)")
            time.sleep(min(step, MAX_SCRAPE_WAIT_S) + 0.5)
        rows, sampler.gpus = window.fetch(t0, t1, t0)
    except SourceUnavailable as e:
        sampler.notes += window.notes
        return [], str(e), None
    sampler.sources.update(window.sources)
    sampler.notes += window.notes
    undo_resets(rows, sampler.notes)
    assign_phases(rows, sampler.markers)
    try:
        engine = window.engine(t0, t1, t0)
    except SourceUnavailable as e:
        engine = {"error": str(e)}
    return rows, None, engine


def shared_counters_note(url: str = "http://127.0.0.1:9400/metrics") -> list[str]:
    """A note when a dcgm-exporter on this node also reads the profiling counters NVML GPM reads."""
    try:
        text = http_get(url, 0.5, "dcgm-exporter")
    except SourceUnavailable:
        return []
    if "DCGM_FI_PROF_" not in text:
        return []
    return ["a dcgm-exporter on this node (127.0.0.1:9400) also reads the profiling counters (DCGM_FI_PROF_*); "
            "NVML GPM and DCGM share that hardware: the two can disturb each other's readings, and each reads "
            "the same activity, so compare rather than add them"]


def replay(result: Result) -> Result:
    """Re-analyse a saved gpu-util timeline (phases as recorded); returns a new Result with a fresh summary."""
    if result.kind != "gpu-util":
        raise DDProbeError(f"--replay needs a gpu-util results file, got kind {result.kind!r}")
    if not result.rows:
        raise DDProbeError("--replay: the file holds no telemetry samples")
    summary = reanalyzed(result.summary, result.rows, result.config.get("sources"))
    return Result(kind="gpu-util", meta=result.meta, config=dict(result.config), rows=list(result.rows),
                  summary=summary)


NCU_TIME_TO_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3,
                  "second": 1e6, "s": 1e6}


def parse_ncu_csv(text: str) -> list[dict[str, Any]]:
    """ncu --csv output (one line per kernel and metric) -> one dict per kernel launch with the metric values."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    kernels: dict[str, dict[str, Any]] = {}
    for rec in csv.DictReader(io.StringIO("\n".join(lines))):
        key = rec.get("ID", "?")
        k = kernels.setdefault(key, {"id": key, "kernel": rec.get("Kernel Name")})
        name, unit, val = rec.get("Metric Name"), rec.get("Metric Unit", ""), rec.get("Metric Value", "")
        try:
            v: Any = float(str(val).replace(",", ""))
        except ValueError:
            v = val
        if name == "gpu__time_duration.sum" and isinstance(v, float):
            # ncu writes the unit long ("nsecond") or short ("ns") depending on version and options
            scale = NCU_TIME_TO_US.get(unit)
            k["time_us"] = v * scale if scale is not None else None
            if scale is None:
                k["time_unit"] = unit
        elif name and name.startswith("sm__pipe_tensor"):
            k["tensor_pct"] = v
        elif name and name.startswith("dram__throughput"):
            k["dram_pct"] = v
    return list(kernels.values())


def deep_ncu(child_cmd: list[str], attn: str, count: int = 4, timeout_s: float = 300) -> dict[str, Any]:
    """Nsight Compute (``--clock-control none``) over ``count`` verify kernels of a decode step of ``child_cmd``
    (a shorter run of the same request). The verify kernels run only in decode, so a kernel-name filter
    picks decode-step kernels. Returns {"kernels": [...]} or {"skipped": why}."""
    ncu = shutil.which("ncu") or ("/usr/local/cuda/bin/ncu" if os.path.exists("/usr/local/cuda/bin/ncu")
                                  else None)
    if ncu is None:
        return {"skipped": "ncu not found on PATH or in /usr/local/cuda/bin"}
    if attn not in NCU_KERNELS:
        return {"skipped": f"--deep knows the verify kernels of {', '.join(NCU_KERNELS)}, not {attn!r}"}
    cmd = [ncu, "--clock-control", "none", "--csv", "--metrics", ",".join(NCU_METRICS), "-k", NCU_KERNELS[attn],
           "--launch-count", str(count), *child_cmd]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"skipped": f"ncu failed: {e}", "command": " ".join(cmd)}
    kernels = parse_ncu_csv(p.stdout)
    if not kernels:
        tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or [f"exit {p.returncode}"]
        return {"skipped": f"ncu returned no kernel metrics: {tail[0]}", "command": " ".join(cmd)}
    return {"kernels": kernels, "command": " ".join(cmd), "period": "one decode step's first kernels"}
