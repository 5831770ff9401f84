"""Interconnects: the small-message all-reduce latency of each, the one a GPU's tensor-parallel servers use, and
where a step's communication time comes from (a fixed time, a measured table, an interconnect), stdlib only."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from ..units import DDProbeError

@dataclass(frozen=True)
class Interconnect:
    """Small-message all-reduce latency of one interconnect: measured points (bytes, us) at 8 ranks, interpolated in
    log-log and extended by the last segment's slope; or, without points, latency + ring traffic / bus bandwidth."""

    name: str
    label: str
    latency_us: float  # smallest all-reduce
    bus_GBps: float  # per-direction bandwidth a ring all-reduce moves 2 (n - 1) / n x bytes over
    points: tuple[tuple[float, float], ...] = ()
    source: str = ""

    def allreduce_us(self, nbytes: float, ranks: int) -> float:
        if ranks <= 1:
            return 0.0
        if not self.points:
            return self.latency_us + 2 * (ranks - 1) / ranks * nbytes / (self.bus_GBps * 1e9) * 1e6
        return interpolate(self.points, nbytes)


def interpolate(points: tuple[tuple[float, float], ...] | list[tuple[float, float]], nbytes: float) -> float:
    """us at ``nbytes`` from measured (bytes, us) points: log-log between them, the first point's latency below,
    the last segment's slope above (linear in bytes)."""
    pts = sorted(points)
    if nbytes <= pts[0][0] or len(pts) == 1:  # one measured size: its latency for every size (no slope to extend)
        return pts[0][1]
    for (b0, u0), (b1, u1) in zip(pts, pts[1:]):
        if nbytes <= b1:
            f = (math.log(nbytes) - math.log(b0)) / (math.log(b1) - math.log(b0))
            return math.exp(math.log(u0) + f * (math.log(u1) - math.log(u0)))
    (b0, u0), (b1, u1) = pts[-2], pts[-1]
    return u1 + (nbytes - b1) * (u1 - u0) / (b1 - b0)


_SGLANG_2904 = ("SGLang PR #2904: its custom all-reduce on 8x H100 NVLink, 5.9 / 7.8 / 16.7 / 33.8 us at "
                "512 B / 32 KB / 256 KB / 1 MB (vLLM's: 10.1 / 11.8 / 24.1 / 45.0)")
INTERCONNECTS: dict[str, Interconnect] = {i.name: i for i in [
    Interconnect("nvlink4", "NVLink 4 / NVSwitch (H100, H200, H20)", 5.9, 450.0,
                 ((512, 5.9), (32768, 7.8), (262144, 16.7), (1048576, 33.8)), _SGLANG_2904),
    Interconnect("nvlink5", "NVLink 5 / NVSwitch (B200)", 5.9, 900.0,
                 ((512, 5.9), (32768, 7.8), (262144, 16.7), (1048576, 33.8)),
                 "no published B200 figure at hand: NVLink 4's (" + _SGLANG_2904 + "), an upper bound"),
    Interconnect("nvlink3", "NVLink 3 / NVSwitch (A100)", 5.9, 300.0,
                 ((512, 5.9), (32768, 7.8), (262144, 16.7), (1048576, 33.8)),
                 "no published A100 figure at hand: NVLink 4's (" + _SGLANG_2904 + "), a lower bound"),
    Interconnect("pcie-gen5", "PCIe Gen5 x16, NCCL (RTX PRO 6000, no NVLink)", 20.0, 50.0, (),
                 "about 20 us per small NCCL all-reduce over PCIe inside a CUDA graph (SGLang uses no custom "
                 "all-reduce beyond 2 PCIe GPUs); ring traffic at 50 GB/s per direction"),
    Interconnect("pcie-gen4", "PCIe Gen4 x16, NCCL", 20.0, 25.0, (),
                 "about 20 us per small NCCL all-reduce over PCIe; ring traffic at 25 GB/s per direction"),
]}
# the interconnect a GPU preset's tensor-parallel servers use (ddprobe.physics.gpus.GPUS names)
# (the NVL parts bridge pairs of GPUs with NVLink; at tp 8 their all-reduces cross PCIe; GH200 is one GPU per node)
GPU_INTERCONNECT: dict[str, str] = {"h100": "nvlink4", "h200": "nvlink4", "h20": "nvlink4", "b200": "nvlink5",
                                    "a100": "nvlink3", "rtx-pro-6000": "pcie-gen5", "l40s": "pcie-gen4",
                                    "h100-pcie": "pcie-gen5", "h100-nvl": "pcie-gen5", "h200-nvl": "pcie-gen5",
                                    "a100-80gb-pcie": "pcie-gen4"}


def interconnect_for(gpu: str | None) -> Interconnect | None:
    """The interconnect of a GPU preset (None where ddprobe has no figure: give --allreduce-us)."""
    key = GPU_INTERCONNECT.get(gpu or "")
    return INTERCONNECTS[key] if key else None


@dataclass(frozen=True)
class Comm:
    """Where the all-reduce latency comes from: a fixed per-call time, a measured table, or an interconnect."""

    us_at: Callable[[float], float]  # latency of one all-reduce of this many bytes at the step's rank count
    source: str


MOST_ALLREDUCE_US = 3600e6  # 1 h: no all-reduce of a step takes longer (more is a typo)


def comm_fixed(us: float) -> Comm:
    """One all-reduce of ``us`` microseconds whatever its size (``--allreduce-us``): above 0 and at most 1 h."""
    if not (math.isfinite(us) and 0 < us <= MOST_ALLREDUCE_US):
        raise DDProbeError(f"--allreduce-us must be a finite number above 0 and at most 1 h (3.6e9 us), got {us:g}")
    return Comm(lambda _b: us, f"--allreduce-us {us:g}")


def comm_interconnect(ic: Interconnect, ranks: int) -> Comm:
    return Comm(lambda b: ic.allreduce_us(b, ranks), f"{ic.label}: {ic.source}")


def comm_table(points: list[tuple[float, float]], source: str) -> Comm:
    if not points:
        raise DDProbeError(f"{source}: no all-reduce measurements")
    return Comm(lambda b: interpolate(points, b), source)
