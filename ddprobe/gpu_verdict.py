"""Analysis of a telemetry timeline: per GPU and phase, median and p90 of each signal, and a verdict.

Verdicts: compute-bound, bandwidth-bound, latency-bound (busy by nvidia-smi yet low SM activity,
tensor, DRAM and power), host-bound (a kernel runs less than half the time and every unit is low: the GPU
waits on the host), idle, or mixed (busy, no unit near its limit). Thresholds come from what
the lent H200 returned (docs/gpu-util.md, docs/perf.md): bf16 matmul tensor 94% / DRAM 17% / power
~100% of the limit; streaming read DRAM 62% / tensor 0%; paged verify SM 5%, tensor 0.8%, DRAM 0.5%,
power 20% of the limit while nvidia-smi said 100%. A missing signal stays None: it is never read as 0,
and without GPM the verdict falls back to power and NVML memory utilization, saying what was missing.
Nothing here imports torch or pynvml.

These verdicts describe what the counters saw; they are not a step's bound. A step's floor is bandwidth-, compute-,
launch-, communication- or host-bound by the one rule (``physics.step_model.step_bound``, over the floor's terms);
"latency-bound" exists only here (no unit near a limit, so no floor term explains the step), and the two meet where
both say compute- or bandwidth-bound (the step at its floor's limit) or host-bound (docs/gpu-util.md, "How to read
it").
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from . import signals
from .gpu_fleet import agreement, per_node

# ---- thresholds (percent) -------------------------------------------------------------------
IDLE_UTIL_PCT = 10.0  # nvidia-smi util below this: nothing is running
BUSY_UTIL_PCT = 50.0  # nvidia-smi util at or above this: "busy" by nvidia-smi; below it, with every unit low,
# the GPU is mostly idle between kernels, waiting on the host (H200 split decode of the k2 engine: util 25%)
TENSOR_BOUND_PCT = 40.0  # GPM any-tensor util: matmul 94, split verify 43 (tensor-limited), stream 0.04
SIMT_BOUND_PCT = 40.0  # GPM FP32/FP16 (CUDA-core) util: compute-bound without tensor cores
DRAM_BOUND_PCT = 40.0  # GPM DRAM bw util: stream 62, gather 52, split verify 25, matmul 17
LOW_SM_PCT = 20.0  # latency-bound needs GPM SM util below this (paged verify 5.3; split 92)
LOW_TENSOR_PCT = 10.0  # ... tensor below this (paged 0.8)
LOW_DRAM_PCT = 10.0  # ... DRAM below this (paged 0.5)
LOW_POWER_PCT = 40.0  # ... power below this share of the enforced limit (paged 20%, idle 18%, stream 84%)
# fallback without GPM: NVML memory util (memory-controller busy time) and power share of the limit
NVML_MEM_BOUND_PCT = 50.0  # stream 79, matmul 24, split verify 33, paged 1
HIGH_POWER_PCT = 70.0  # matmul ~100% of the limit, split verify 97%
NVML_MEM_LOW_PCT = 10.0

SIGNALS = signals.STATS  # median and p90 of each per GPU and phase
PHASE_ORDER = {"idle": 0, "warmup": 0.5, "prefill": 1, "request": 2, "decode": 3}


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def quantile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    pos = (len(s) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def signal(r: dict[str, Any], key: str) -> float | None:
    """A row's value of ``key`` (``power_pct`` = power / enforced limit), None where missing."""
    if key == "power_pct":
        p, lim = _num(r.get("power_W")), _num(r.get("power_limit_W"))
        return 100.0 * p / lim if p is not None and lim else None
    return _num(r.get(key))


def stats(rows: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Median and p90 of every signal over ``rows``; both None where no row has it."""
    out = {}
    for key in SIGNALS:
        xs = [v for v in (signal(r, key) for r in rows) if v is not None]
        out[key] = {"median": quantile(xs, 0.5), "p90": quantile(xs, 0.9), "n": len(xs)}
    return out


def _below(v: float | None, limit: float) -> bool | None:
    """Whether a value is below ``limit``; None when it is missing (unknown: never read as low)."""
    return None if v is None else v < limit


def _fmt(v: float | None) -> str:
    if v is None:
        return "n/a"
    return "0%" if v == 0 else f"{v:.0f}%" if v >= 10 else f"{v:.1f}%" if v >= 0.1 else f"{v:.2f}%"


def counters_source(sources: dict[str, str] | None) -> str:
    """Where a timeline's profiling counters came from: ``dcgm`` (dcgm-exporter or Prometheus, the
    ``DCGM_FI_PROF_*`` fields) or ``gpm`` (NVML GPM, also for a timeline that does not say)."""
    s = sources or {}
    if "dcgm-exporter" in s or "prometheus" in s or any("DCGM_FI_" in str(v) for v in s.values()):
        return "dcgm"
    return "gpm"


def verdict(s: dict[str, dict[str, float | None]], sources: dict[str, str] | None = None) -> tuple[str, str, str]:
    """(verdict, evidence sentence, basis) from a phase's medians; the basis names where the values came from:
    the profiling counters (``gpm`` or ``dcgm``, ``counters_source``), else power and utilization only
    (``power+nvml`` or ``power+dcgm``)."""
    src = counters_source(sources)
    fb = "power+nvml" if src == "gpm" else f"power+{src}"
    m = {k: v["median"] for k, v in s.items()}
    util, power, mem = m["util_gpu_pct"], m["power_pct"], m["util_mem_pct"]
    sm, tensor, dram = (m[k] for k in signals.CORE)
    simt = max([v for v in (m["fp32_active_pct"], m["fp16_active_pct"]) if v is not None], default=None)
    smi = f"nvidia-smi says {_fmt(util)} busy" if util is not None else "nvidia-smi utilization missing"
    pw = f"power {_fmt(power)} of the limit" if power is not None else "power missing"
    if tensor is not None and dram is not None:  # SM may be missing (dcgm-exporter leaves it off by default)
        low_sm, low_power = _below(sm, LOW_SM_PCT), _below(power, LOW_POWER_PCT)
        # every unit low: tensor and DRAM low, SM and power low where measured (a missing one is unknown, never
        # low), and at least one of them measured
        all_low = tensor < LOW_TENSOR_PCT and dram < LOW_DRAM_PCT and False not in (low_sm, low_power) and \
            True in (low_sm, low_power)
        pipes = f"SM {_fmt(sm)}, tensor pipes {_fmt(tensor)}, DRAM {_fmt(dram)}, {pw}"
        if (util is not None and util < IDLE_UTIL_PCT) or (util is None and sm is not None and sm < 1.0):
            return "idle", f"{smi}; {pipes}: idle", src
        if tensor >= TENSOR_BOUND_PCT and tensor / TENSOR_BOUND_PCT >= dram / DRAM_BOUND_PCT:
            return "compute-bound", f"tensor pipes {_fmt(tensor)} busy (DRAM {_fmt(dram)}, {pw}): compute-bound", src
        if dram >= DRAM_BOUND_PCT:
            return "bandwidth-bound", f"DRAM bandwidth {_fmt(dram)} of peak (tensor pipes {_fmt(tensor)}, {pw}): " \
                                      "bandwidth-bound", src
        if simt is not None and simt >= SIMT_BOUND_PCT:
            return "compute-bound", f"FP32/FP16 pipes {_fmt(simt)} busy, tensor {_fmt(tensor)}, DRAM {_fmt(dram)}: " \
                                    "compute-bound on CUDA cores", src
        if all_low and util is not None and util < BUSY_UTIL_PCT:
            return "host-bound", f"nvidia-smi says {_fmt(util)} busy (a kernel ran {_fmt(util)} of the time); SM " \
                           f"{_fmt(sm)}, tensor pipes {_fmt(tensor)}, DRAM {_fmt(dram)}, {pw}: mostly idle, waiting " \
                           "on the host (launch overhead or CPU work between kernels)", src
        if all_low:
            lead = f"{smi}, but" if util is not None and util >= BUSY_UTIL_PCT else f"{smi};"
            return "latency-bound", f"{lead} SM {_fmt(sm)}, tensor pipes {_fmt(tensor)}, DRAM {_fmt(dram)}, {pw}: " \
                                    "latency-bound", src
        return "mixed", f"{smi}; {pipes}: busy but no unit near its limit (mixed)", src
    # fallback: no (or partial) GPM
    gone = [name for name, v in (("SM", sm), ("tensor", tensor), ("DRAM", dram)) if v is None]
    why = (sources or {}).get("gpm") or (sources or {}).get("tensor_active_pct") or ""
    why = why.removeprefix("missing: ")
    miss = f"{src.upper()} {', '.join(gone)} missing" + (f" ({why})" if why and not why.startswith("ok") else "")
    memtxt = f"memory controller {_fmt(mem)}" if mem is not None else "memory util missing"
    ev = f"{smi}, {pw}, {memtxt}; {miss}, so from power and {'NVML' if src == 'gpm' else 'DCGM'} utilization only"
    if util is None and power is None:
        return "unknown", f"no utilization or power reading; {miss}", "none"
    if util is not None and util < IDLE_UTIL_PCT:
        return "idle", f"{ev}: idle", fb
    if mem is not None and mem >= NVML_MEM_BOUND_PCT:
        return "bandwidth-bound", f"{ev}: probably bandwidth-bound", fb
    if power is not None and power >= HIGH_POWER_PCT:
        return "compute-bound", f"{ev}: probably compute-bound", fb
    if power is not None and power < LOW_POWER_PCT and mem is not None and mem < NVML_MEM_LOW_PCT and \
            (util is None or util >= BUSY_UTIL_PCT):
        return "latency-bound", f"{ev}: probably latency-bound", fb
    if power is not None and power < LOW_POWER_PCT and util is not None and util < BUSY_UTIL_PCT:
        return "host-bound", f"{ev}: mostly idle, probably waiting on the host", fb
    return "mixed", f"{ev}: busy, no clear limit (mixed)", fb


def group_evidence(group: list[dict[str, Any]], sources: dict[str, str] | None = None) -> str:
    """One evidence sentence for GPUs of one phase that share a verdict: the verdict's sentence at the median
    over the GPUs of each signal's median; where those medians would read as another verdict, the sentence
    of the GPU with the median tensor activity."""
    med = {}
    for key in SIGNALS:
        xs = [v for v in ((d.get("signals") or {}).get(key, {}).get("median") for d in group) if _num(v) is not None]
        med[key] = {"median": quantile(xs, 0.5)}
    v, ev, _ = verdict(med, sources)
    if v == group[0].get("verdict"):
        return ev
    by_tensor = sorted(group, key=lambda d: _num((d.get("signals") or {}).get("tensor_active_pct", {})
                                                 .get("median")) or 0.0)
    mid = by_tensor[len(by_tensor) // 2]
    return f"GPU {mid.get('name', mid.get('gpu'))}: {mid.get('evidence', '')}"


def _energy(rows_all: list[dict[str, Any]], phase_rows: list[dict[str, Any]]) -> tuple[float | None, str | None]:
    """Joules a GPU spent in a phase: energy-counter difference (else power x window); rows are one GPU's."""
    if not phase_rows:
        return None, None
    first, last = phase_rows[0], phase_rows[-1]
    i = next(k for k, r in enumerate(rows_all) if r is first)
    before = rows_all[i - 1] if i > 0 else None
    e0 = _num(before.get("energy_J")) if before else None
    e1 = _num(last.get("energy_J"))
    if e0 is not None and e1 is not None and e1 >= e0:
        return e1 - e0, "energy counter"
    pts = [(_num(r.get("power_W")), _num(r.get("window_s"))) for r in phase_rows]
    if all(p is not None and w is not None for p, w in pts):
        return sum(p * w for p, w in pts), "power x time"
    return None, None


def analyze(rows: list[dict[str, Any]], request: dict[str, Any] | None = None,
            sources: dict[str, str] | None = None) -> dict[str, Any]:
    """Summary of a timeline: ``per_phase`` records (gpu, phase, samples, verdict, evidence, basis, signals,
    energy_J) and, from ``request`` (what the load's driver measured), ``decode_step_ms``, ``eff_bw_GBps``,
    ``energy_J_per_token`` and the floor comparison. Works on any saved timeline (``--replay``)."""
    request = request or {}
    by_gpu: dict[Any, list[dict]] = defaultdict(list)
    for r in rows:
        if _num(r.get("t_s")) is not None:
            by_gpu[r.get("gpu", 0)].append(r)
    per_phase, joules_of = [], {"decode": None, "request": None}  # summed over the GPUs
    for gpu, rs in sorted(by_gpu.items(), key=lambda kv: str(kv[0])):
        rs.sort(key=lambda r: r["t_s"])
        phases: dict[str, list[dict]] = defaultdict(list)
        for r in rs:
            phases[str(r.get("phase") or "idle")].append(r)
        for phase, prs in sorted(phases.items(), key=lambda kv: (PHASE_ORDER.get(kv[0], 9), kv[0])):
            s = stats(prs)
            v, ev, basis = verdict(s, sources)
            joules, how = _energy(rs, prs) if phase != "idle" else (None, None)
            if phase in joules_of and joules is not None:
                joules_of[phase] = (joules_of[phase] or 0.0) + joules
            per_phase.append({"gpu": gpu, "name": signals.gpu_name(rs[0]), "node": rs[0].get("node"),
                              "phase": phase, "samples": len(prs),
                              "t0_s": prs[0]["t_s"], "t1_s": prs[-1]["t_s"], "verdict": v, "evidence": ev,
                              "basis": basis, "energy_J": joules, "energy_method": how,
                              "signals": s})
    out: dict[str, Any] = {"per_phase": per_phase, "agreement": agreement(per_phase)}
    for a in out["agreement"]:
        group = [d for d in per_phase if d["phase"] == a["phase"] and d["verdict"] == a["majority"]]
        a["evidence"] = group_evidence(group, sources)
    if any(d.get("node") for d in per_phase):
        out["nodes"] = per_node(per_phase)
    out.update(_request_numbers(request, joules_of["decode"], joules_of["request"]))
    dec = [d for d in per_phase if d["phase"] == "decode"] or [d for d in per_phase if d["phase"] == "request"]
    dec = [d for d in dec if d["verdict"] != "idle"] or dec  # several GPUs: the headline is a working one's
    out["verdict"] = dec[0]["verdict"] if dec else None
    out["evidence"] = dec[0]["evidence"] if dec else \
        "no sample fell in the decode phase: shorten the sampling period or decode more tokens"
    agree = [a for a in out["agreement"] if dec and a["phase"] == dec[0]["phase"]]
    if agree:
        out["agree"] = agree[0]["line"]
    return out


def reanalyzed(summary: Any, rows: list[dict[str, Any]], sources: Any) -> dict[str, Any]:
    """A saved gpu-util summary with its analysis made again from its samples by today's rules (a file keeps what
    its run concluded; ``gpu-util --replay`` and ``report`` show the current verdicts): the request's numbers, the
    phase markers and a telemetry failure as recorded."""
    old = summary if isinstance(summary, dict) else {}
    req = old.get("request") if isinstance(old.get("request"), dict) else {}
    src = sources if isinstance(sources, dict) else {}
    kept = {k: old[k] for k in ("telemetry_error",) if old.get(k)}
    return {**analyze(rows, req, src), "request": req, "markers": old.get("markers", []), **kept}


def _request_numbers(req: dict[str, Any], decode_J: float | None, request_J: float | None = None) -> dict[str, Any]:
    """decode_step_ms, effective bandwidth, energy per token and the floor from what the request measured.
    ``energy_J_per_token`` is the decode phase's energy only; where the backend gave no first-token time (a
    server: prefill and decode share one "request" phase) it stays None and ``request_energy_J_per_token``
    says the whole request's energy per decoded token, prefill included, under its own name."""
    steps = [x for x in (req.get("step_ms") or []) if _num(x) is not None]
    verify_steps, decode_s = _num(req.get("verify_steps")), _num(req.get("decode_s"))
    step_ms = quantile(steps, 0.5) if steps else (decode_s * 1e3 / verify_steps if decode_s and verify_steps
                                                  else None)
    out: dict[str, Any] = {"decode_step_ms": step_ms, "decode_step_p90_ms": quantile(steps, 0.9) if steps else None,
                           "verify_ms_mean": _num(req.get("verify_ms_mean")), "kv_GB_per_step": None,
                           "eff_bw_GBps": None, "verify_eff_bw_GBps": None, "floor_ms": None, "gap": None,
                           "kv_floor_ms": None, "attn_gap": None, "floor_binds": req.get("floor_binds"),
                           "energy_J_per_token": None, "decode_energy_J": decode_J,
                           "request_energy_J_per_token": None}
    kv_tok, prompt = _num(req.get("kv_B_per_token")), _num(req.get("prompt_tokens"))
    done = _num(req.get("completion_tokens")) or 0.0
    if kv_tok and prompt:
        nbytes = kv_tok * (prompt + done / 2)  # committed context at the middle of decode
        out["kv_GB_per_step"] = nbytes / 1e9
        if step_ms:
            out["eff_bw_GBps"] = nbytes / (step_ms / 1e3) / 1e9
        if out["verify_ms_mean"]:
            out["verify_eff_bw_GBps"] = nbytes / (out["verify_ms_mean"] / 1e3) / 1e9
        # the floor is the step model's whole step (the probe computes it: ddprobe.physics.step_model); the KV alone
        # gives the attention gap
        bw = _num(req.get("gpu_bw_Bps"))
        out["floor_ms"] = _num(req.get("floor_ms"))
        out["kv_floor_ms"] = _num(req.get("kv_floor_ms")) or (nbytes / bw * 1e3 if bw else None)
        if step_ms and out["floor_ms"]:
            out["gap"] = step_ms / out["floor_ms"]
        if step_ms and out["kv_floor_ms"]:
            out["attn_gap"] = step_ms / out["kv_floor_ms"]
    tokens = done - 1 if done > 1 else None  # the first token comes out of prefill
    if decode_J is not None and tokens:
        out["energy_J_per_token"] = decode_J / tokens
    elif request_J is not None and tokens:
        out["request_energy_J_per_token"] = request_J / tokens
    return out
