"""The telemetry signals, defined once: row key, what it measures, and where each source reads it.

A telemetry row (one GPU, one tick) carries these keys; every source fills what it can and leaves the
rest None (never 0). NVML reads the profiling signals through GPM (Hopper and newer), dcgm-exporter and
Prometheus through DCGM's profiling fields (``DCGM_FI_PROF_*``, ratios 0..1, here percent). The two read
the same per-GPU profiling counters. The sampler, the verdicts (``gpu_verdict``), the plots
(``reports.plots_gpu``) and the CLI (``cli.gpu``) read this table; results files written before the signals
were named for what they measure (``gpm_*`` keys) are mapped once, by ``upgrade``. Stdlib only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Signal:
    key: str  # row key, unit in the name
    label: str  # short label for tables and plots
    what: str  # what it measures
    gpm: str | None = None  # pynvml constant of the GPM metric (profiling counters, NVML)
    dcgm: str | None = None  # dcgm-exporter / Prometheus metric name
    dcgm_scale: float = 1.0  # DCGM value x scale = row value
    counter: bool = False  # monotonic (resets are undone by the sources)


_MIB_GB = 1048576 / 1e9
TABLE: list[Signal] = [
    Signal("sm_active_pct", "SM", "cycles an SM has at least one warp resident, % (mean over SMs)",
           "NVML_GPM_METRIC_SM_UTIL", "DCGM_FI_PROF_SM_ACTIVE", 100.0),
    Signal("sm_occupancy_pct", "occupancy", "warps resident per SM, % of the maximum",
           "NVML_GPM_METRIC_SM_OCCUPANCY", "DCGM_FI_PROF_SM_OCCUPANCY", 100.0),
    Signal("tensor_active_pct", "tensor", "cycles any tensor pipe is active, % of elapsed",
           "NVML_GPM_METRIC_ANY_TENSOR_UTIL", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 100.0),
    Signal("hmma_active_pct", "HMMA", "cycles the HMMA (fp16/bf16) tensor pipe is active, %",
           "NVML_GPM_METRIC_HMMA_TENSOR_UTIL", "DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE", 100.0),
    Signal("dram_active_pct", "DRAM", "cycles the device-memory interface is sending or receiving, %",
           "NVML_GPM_METRIC_DRAM_BW_UTIL", "DCGM_FI_PROF_DRAM_ACTIVE", 100.0),
    Signal("fp32_active_pct", "FP32", "cycles the FP32 pipe is active, %",
           "NVML_GPM_METRIC_FP32_UTIL", "DCGM_FI_PROF_PIPE_FP32_ACTIVE", 100.0),
    Signal("fp16_active_pct", "FP16", "cycles the FP16 (non-tensor) pipe is active, %",
           "NVML_GPM_METRIC_FP16_UTIL", "DCGM_FI_PROF_PIPE_FP16_ACTIVE", 100.0),
    Signal("power_W", "power W", "board power draw, W", dcgm="DCGM_FI_DEV_POWER_USAGE"),
    Signal("power_avg_W", "power avg W", "board power averaged by the driver, W"),
    Signal("power_limit_W", "limit W", "enforced power limit, W", dcgm="DCGM_FI_DEV_POWER_MGMT_LIMIT"),
    Signal("energy_J", "energy J", "energy since boot, J", dcgm="DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
           dcgm_scale=1e-3, counter=True),
    Signal("sm_clock_MHz", "SM MHz", "SM clock, MHz", dcgm="DCGM_FI_DEV_SM_CLOCK"),
    Signal("mem_clock_MHz", "mem MHz", "memory clock, MHz", dcgm="DCGM_FI_DEV_MEM_CLOCK"),
    Signal("util_gpu_pct", "smi util", "time a kernel was running, % (nvidia-smi's utilization)",
           dcgm="DCGM_FI_DEV_GPU_UTIL"),
    Signal("util_mem_pct", "mem ctl", "time the memory controller was busy, %", dcgm="DCGM_FI_DEV_MEM_COPY_UTIL"),
    Signal("mem_used_GB", "mem GB", "device memory used, GB", dcgm="DCGM_FI_DEV_FB_USED", dcgm_scale=_MIB_GB),
]
BY_DCGM = {s.dcgm: s for s in TABLE if s.dcgm}
# derived from a row, not read: power_W / power_limit_W
DERIVED = {"power_pct": "power / limit"}
LABELS = {**{s.key: s.label for s in TABLE}, **DERIVED}

NUMERIC_KEYS = [s.key for s in TABLE]  # what a row carries (None where not read)
PROFILING = [s.key for s in TABLE if s.gpm]  # the profiling-counter signals (GPM / DCGM_FI_PROF_*)
CORE = ["sm_active_pct", "tensor_active_pct", "dram_active_pct"]  # the verdict needs all three
STATS = ["power_W", "power_avg_W", "power_pct", "sm_clock_MHz", "mem_clock_MHz", "util_gpu_pct", "util_mem_pct",
         "mem_used_GB", *PROFILING]  # median / p90 per GPU and phase
COLUMNS = ["util_gpu_pct", "sm_active_pct", "tensor_active_pct", "dram_active_pct", "util_mem_pct", "power_pct",
           "sm_clock_MHz"]  # the CLI's table
SERIES = ["tensor_active_pct", "dram_active_pct", "sm_active_pct", "power_pct", "util_gpu_pct"]  # timelines
BARS = ["tensor_active_pct", "dram_active_pct", "sm_active_pct", "power_pct"]  # per-GPU bars and means
HEAT = ["tensor_active_pct", "dram_active_pct"]  # heat strip per GPU over time

# datasheet board power (W) by shapes.GPUS name: the power share when a source has no limit reading
DATASHEET_POWER_W = {"h200": 700.0, "h200-nvl": 600.0, "h100": 700.0, "h100-pcie": 350.0, "h100-nvl": 400.0,
                     "b200": 1000.0, "a100": 400.0, "a100-80gb-pcie": 300.0, "a100-40gb": 400.0, "h20": 400.0,
                     "l40s": 350.0, "rtx-pro-6000": 600.0}  # GH200: the module's power, not the GPU's: none

# results files written before the signals were named for what they measure
LEGACY = {"gpm_sm_util_pct": "sm_active_pct", "gpm_sm_occupancy_pct": "sm_occupancy_pct",
          "gpm_tensor_util_pct": "tensor_active_pct", "gpm_hmma_util_pct": "hmma_active_pct",
          "gpm_dram_bw_util_pct": "dram_active_pct", "gpm_fp32_util_pct": "fp32_active_pct",
          "gpm_fp16_util_pct": "fp16_active_pct"}


def _rename(d: Any) -> Any:
    if not isinstance(d, dict) or not any(k in LEGACY for k in d):
        return d
    return {LEGACY.get(k, k): v for k, v in d.items()}


def upgrade(kind: str, rows: list, config: dict, summary: dict) -> tuple[list, dict, dict]:
    """A loaded gpu-util file with its old ``gpm_*`` keys (rows, ``config.sources``, per-phase signals)
    renamed to the signal keys; other kinds and new files come back as they are."""
    if kind != "gpu-util":
        return rows, config, summary
    rows = [_rename(r) for r in rows]
    if isinstance(config, dict) and isinstance(config.get("sources"), dict):
        config = {**config, "sources": _rename(config["sources"])}
    if isinstance(summary, dict) and isinstance(summary.get("per_phase"), list):
        summary = {**summary, "per_phase": [{**d, "signals": _rename(d.get("signals"))} if isinstance(d, dict)
                                            else d for d in summary["per_phase"]]}
    return rows, config, summary


def gpu_name(row: Any) -> str:
    """How a row's GPU (a dict or a typed ``schema.GpuUtilRow``) is named in tables and plots: ``node/index``
    when the row says its node."""
    get = row.get if isinstance(row, dict) else (lambda k, d=None: getattr(row, k, d))
    node, idx = get("node"), get("node_gpu")
    if node:
        return f"{node}/{idx if idx is not None else get('gpu', '?')}"
    return str(get("gpu", "?"))
