"""GPUs: datasheet bandwidth, tensor rate and L2 per board, the names NVML reports for them, and the least time one
kernel of a step takes on each (graph-replayed, eager, a host synchronisation), stdlib only.

- ``GPUS``: datasheet peak bandwidth, dense bf16 tensor rate and last-level cache (L2) size.
- ``KERNEL_TIMES``: the least time one kernel of a step takes per GPU, read from the ``ddprobe bench launch`` files
  shipped in ``data/launch/`` (``launch_time``: the one reader, also of ``--launch-from``), else a class bound.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

from ..units import DDProbeError

@dataclass(frozen=True)
class GpuSpec:
    name: str
    label: str
    bw_Bps: float  # peak memory bandwidth, bytes/s (datasheet)
    bf16_flops: float  # dense bf16 tensor rate, FLOP/s (datasheet, no sparsity)
    l2_bytes: int  # last-level on-chip cache (L2; MI300X: Infinity Cache)
    device_names: tuple[str, ...] = ()  # the names NVML / dcgm-exporter's modelName report, matched exactly


_MiB = 1 << 20
# Datasheet values per board; a board's variants with another memory (H100 PCIe's HBM2e, GH200's HBM3e, A100 40 GB)
# are rows of their own, named exactly as NVML names them.
GPUS: dict[str, GpuSpec] = {g.name: g for g in [
    GpuSpec("rtx-pro-6000", "NVIDIA RTX PRO 6000 Blackwell", 1.792e12, 503.8e12, 128 * _MiB,
            ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "NVIDIA RTX PRO 6000 Blackwell Server Edition")),
    GpuSpec("h100", "NVIDIA H100 SXM", 3.35e12, 989e12, 50 * _MiB, ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM5 80GB")),
    GpuSpec("h200", "NVIDIA H200 SXM", 4.8e12, 989e12, 50 * _MiB, ("NVIDIA H200",)),
    GpuSpec("b200", "NVIDIA B200", 8.0e12, 2250e12, 126 * _MiB, ("NVIDIA B200",)),
    GpuSpec("a100", "NVIDIA A100 80GB SXM", 2.039e12, 312e12, 40 * _MiB, ("NVIDIA A100-SXM4-80GB",)),
    GpuSpec("h20", "NVIDIA H20", 4.0e12, 148e12, 60 * _MiB, ("NVIDIA H20",)),
    GpuSpec("l40s", "NVIDIA L40S", 0.864e12, 362e12, 96 * _MiB, ("NVIDIA L40S",)),
    GpuSpec("mi300x", "AMD Instinct MI300X", 5.3e12, 1307e12, 256 * _MiB, ("AMD Instinct MI300X",)),
    GpuSpec("h100-pcie", "NVIDIA H100 PCIe", 2.0e12, 756e12, 50 * _MiB, ("NVIDIA H100 PCIe",)),
    GpuSpec("h100-nvl", "NVIDIA H100 NVL", 3.9e12, 835e12, 50 * _MiB, ("NVIDIA H100 NVL",)),
    GpuSpec("gh200", "NVIDIA GH200 (96 GB HBM3)", 4.0e12, 989e12, 50 * _MiB, ("NVIDIA GH200 480GB",)),
    GpuSpec("gh200-hbm3e", "NVIDIA GH200 (144 GB HBM3e)", 4.9e12, 989e12, 50 * _MiB, ("NVIDIA GH200 144G HBM3e",)),
    GpuSpec("h200-nvl", "NVIDIA H200 NVL", 4.8e12, 835e12, 50 * _MiB, ("NVIDIA H200 NVL",)),
    GpuSpec("a100-80gb-pcie", "NVIDIA A100 80GB PCIe", 1.935e12, 312e12, 40 * _MiB, ("NVIDIA A100 80GB PCIe",)),
    GpuSpec("a100-40gb", "NVIDIA A100 40GB", 1.555e12, 312e12, 40 * _MiB,
            ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB")),
]}
# What the timers assume when they do not know the GPU: the largest L2 of the Hopper parts ddprobe is
# measured on, so "3x the L2" errs towards more caches.
DEFAULT_L2_BYTES = 60 * _MiB


@dataclass(frozen=True)
class KernelTime:
    """The least time one kernel of a decode step costs on a GPU, in us: back to back in a replayed CUDA graph
    (``graph_us``: the smaller of ``bench launch``'s graph-empty and graph-small rows), launched eagerly one after
    another from Python (``eager_us``: its eager-small row), and one host synchronisation (``sync_us``: a one-value
    device-to-host copy's round trip). ``measured`` False: no measurement of this GPU; the figures are a class bound
    (lower than any GPU of the class measured), said wherever they are used. ``device``: the GPU's name as NVML gives
    it (a measurement's), ``gpu``: its preset (``GPUS``) where the table names it."""

    graph_us: float
    eager_us: float
    sync_us: float
    source: str
    measured: bool
    device: str = ""
    gpu: str | None = None
    file: str = ""  # the `bench launch` results file it was read from


# A class bound for GPUs ddprobe has not measured: below the H100's measured figures (``bench launch``: 0.78 us for
# an empty graph-replayed kernel, 0.98 us for a small one), so a floor built on it stays a floor; a GPU measured gets
# its own row.
KERNEL_CLASS_BOUND = KernelTime(0.75, 2.0, 5.0, "not measured by ddprobe: a class bound of 0.75 us per graph-replayed "
                                                "kernel, 2 us eager, 5 us per host sync (below the H100's measured "
                                                "figures)", False)
LEAST_US = 0.1  # below this a kernel time is impossible on any GPU (a launch file saying less is broken)
LAUNCH_ROWS = ("graph-empty", "graph-small", "eager-small", "sync")  # the rows of a `bench launch` results file
LAUNCH_DIR = Path(__file__).parent / "data" / "launch"  # the shipped `bench launch` files, one per measured GPU


MOST_US = 3600e6  # 1 h: no kernel of a step takes longer (a launch file saying more is broken)


def launch_time(data: dict, where: str) -> KernelTime:
    """The least kernel times a ``bench launch`` results file holds (``data``: the file's JSON object; ``where``: its
    name, for the messages): graph_us the smaller of the graph-empty and graph-small rows (either may be absent, not
    both), eager_us the eager-small row, sync_us the sync row. The one reader (the floor's ``--launch-from``, the
    shipped per-GPU defaults, the report). A file of another kind, a missing or repeated row, a time that is not a
    number or outside ``LEAST_US`` .. ``MOST_US``, p10 <= us <= p90 not holding, or a malformed meta is refused in
    one line naming the field."""
    if not isinstance(data, dict) or data.get("kind") != "bench-launch":
        kind = data.get("kind") if isinstance(data, dict) else None
        raise DDProbeError(f"{where}: not a `ddprobe bench launch` results file (kind {kind!r})")
    rows = data.get("rows")
    if not isinstance(rows, list):
        raise DDProbeError(f"{where}: 'rows' is {type(rows).__name__}, not a list of rows")
    us: dict[str, float] = {}
    for i, r in enumerate(rows, 1):
        if not isinstance(r, dict) or not isinstance(r.get("kind"), str):
            what = "has no text 'kind'" if isinstance(r, dict) else f"is {type(r).__name__}, not an object"
            raise DDProbeError(f"{where}: row {i} {what} (a launch results file's rows are {', '.join(LAUNCH_ROWS)})")
        if r["kind"] in LAUNCH_ROWS:
            if r["kind"] in us:
                raise DDProbeError(f"{where}: two {r['kind']} rows (a launch results file has one of each)")
            us[r["kind"]] = _launch_us(r, where)
    graph = [us[k] for k in ("graph-empty", "graph-small") if k in us]
    missing = [k for k in ("eager-small", "sync") if k not in us] + ([] if graph else ["graph-small"])
    if missing:
        raise DDProbeError(f"{where}: a launch results file without the {', '.join(missing)} row(s)")
    device, date = _launch_meta(data.get("meta"), where)
    spec = gpu_spec_for(device)
    return KernelTime(min(graph), us["eager-small"], us["sync"],
                      f"measured by ddprobe bench launch on {device or 'an unnamed GPU'}"
                      + (f", {date}" if date else "") + f" ({where})", True, device, spec.name if spec else None,
                      where)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _launch_us(r: dict, where: str) -> float:
    """One launch row's time in us, held to ``LEAST_US`` .. ``MOST_US`` and to its p10 <= us <= p90 where given."""
    for key in ("us", "p10_us", "p90_us"):
        v, k = r.get(key), r["kind"] + ("" if key == "us" else f" ({key})")
        if key != "us" and v is None:
            continue
        if not _number(v):
            raise DDProbeError(f"{where}: {k} takes {v!r} us per kernel: not a number (a broken measurement)")
        if v < LEAST_US:
            raise DDProbeError(f"{where}: {k} takes {v!r} us per kernel, below {LEAST_US} us: no GPU launches that "
                               "fast (a broken measurement)")
        if v > MOST_US:
            raise DDProbeError(f"{where}: {k} takes {v:g} us per kernel, over 1 h: not a measured launch time (a "
                               "broken measurement)")
    k = r["kind"]
    p10, p90 = r.get("p10_us"), r.get("p90_us")
    if p10 is not None and p90 is not None and not p10 <= r["us"] <= p90:
        raise DDProbeError(f"{where}: {k}: p10_us {p10:g} <= us {r['us']:g} <= p90_us {p90:g} does not hold")
    return float(r["us"])


def _launch_meta(meta, where: str) -> tuple[str, str]:
    """(the GPU's name, the date) of a launch file's meta; a meta, gpus or name of the wrong type, or gpus naming two
    different GPUs, refused in one line naming the field."""
    if meta is None:
        return "", ""
    if not isinstance(meta, dict):
        raise DDProbeError(f"{where}: 'meta' is {type(meta).__name__}, not an object")
    gpus = meta.get("gpus")
    if gpus is None:
        gpus = []
    if not isinstance(gpus, list) or not all(isinstance(g, dict) for g in gpus):
        raise DDProbeError(f"{where}: 'meta.gpus' is {str(gpus)[:40]!r}, not a list of GPUs (objects with a name)")
    names = [g.get("name") for g in gpus if g.get("name") is not None]
    if not all(isinstance(n, str) for n in names):
        raise DDProbeError(f"{where}: 'meta.gpus' names a GPU by {str(names)[:40]!r}, not a string")
    if len(set(names)) > 1:
        raise DDProbeError(f"{where}: 'meta.gpus' names {len(set(names))} different GPUs "
                           f"({', '.join(sorted(set(names)))}): which one the launch times are of is not recorded")
    date = meta.get("date_utc")
    if date is not None and not isinstance(date, str):
        raise DDProbeError(f"{where}: 'meta.date_utc' is {type(date).__name__} {date!r}, not a date")
    return (names[0] if names else ""), (date or "")[:10]


def load_launch(path: str | Path) -> KernelTime:
    """``launch_time`` of the ``bench launch`` results file at ``path``; a missing or unreadable file in one line."""
    from ..jsonfile import read_json  # one reader of user-given JSON: a FIFO, non-UTF-8, NaN literals -> one line

    if not Path(path).exists():
        raise DDProbeError(f"{path}: no such file (a `ddprobe bench launch` results file)")
    return launch_time(read_json(path, "results file"), str(path))


def _shipped() -> dict[str, KernelTime]:
    """The shipped measurements (``LAUNCH_DIR``: one ``bench launch`` file per GPU, named ``<preset>.json``), by
    preset: each file's GPU must be the preset its name says."""
    out = {}
    for f in sorted(LAUNCH_DIR.glob("*.json")):
        kt = load_launch(f)
        kt = replace(kt, source=kt.source.replace(f" ({f})", f" (shipped: {f.name})"))
        if kt.gpu != f.stem:
            raise DDProbeError(f"{f}: measured on {kt.device!r}, not the {f.stem} its name says")
        out[f.stem] = kt
    return out


def get_gpu(name: str) -> GpuSpec:
    key = name.strip().lower()
    if key not in GPUS:
        raise DDProbeError(f"unknown GPU {name!r}; known: {', '.join(GPUS)} (or pass --bw)")
    return GPUS[key]


def _norm(name: str) -> str:
    return " ".join(name.lower().split())


_BY_DEVICE_NAME = {_norm(n): g for g in GPUS.values() for n in (g.name, g.label, *g.device_names)}


def gpu_spec_for(name: str | None) -> GpuSpec | None:
    """The preset of a device name as NVML or dcgm-exporter report it ("NVIDIA H200" -> h200, "NVIDIA H100 PCIe"
    -> h100-pcie), matched exactly (case and spacing aside), never by substring: a board this table does not
    name gets None (no datasheet floor) rather than a sibling's bandwidth."""
    return _BY_DEVICE_NAME.get(_norm(name or ""))


# The least kernel time per GPU preset, read from the shipped `bench launch` files (H100: graph-empty 0.779 us,
# eager-small 5.92 us, sync 9.65 us on an NVIDIA H100 80GB HBM3, driver 580.159.04, torch 2.11, 2026-12-06);
# a GPU without one gets the class bound.
KERNEL_TIMES: dict[str, KernelTime] = _shipped()


def kernel_time(gpu: str | None) -> KernelTime:
    """The least time per kernel of a GPU preset: its measurement, else the class bound (``measured`` False)."""
    return KERNEL_TIMES.get((gpu or "").strip().lower(), KERNEL_CLASS_BOUND)
