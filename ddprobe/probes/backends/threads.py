"""How many CPU threads the engine's torch should use: the cores this process may run on, less the ones other
work keeps busy. Stdlib only (reads /proc); the engine backend applies the choice (``torch.set_num_threads``).

Why: torch's intra-op pool spins threads that wait for each other at every operation. With one of two cores busy
elsewhere, two threads make every op wait for the thread that is descheduled: a tiny-preset decode step took
622 ms with two threads against 19 ms with one (issue 36). One thread per idle core avoids that.

Order of choice: ``--threads N``; else ``OMP_NUM_THREADS`` when set (the user's own choice); else
``auto``: cores in ``os.sched_getaffinity`` (at most the cgroup CPU quota, ceil(quota / period), read from
``cpu.max`` under cgroup v2 or ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` under v1) minus the cores found busy (the summed non-idle share of those
cores in /proc/stat over ``SAMPLE_S``, rounded), at least one. Where /proc/stat cannot be read (not Linux), the
1-minute load average (/proc/loadavg, or ``os.getloadavg``) stands in; failing that, every core.
``OMP_NUM_THREADS`` may be OpenMP's nested list ("4,2"): its first field is the count here.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from ...units import DDProbeError

CGROUP_ROOT = "/sys/fs/cgroup"

SAMPLE_S = 0.25  # the window over which other work's CPU use is measured
BUSY_ROUNDING = 0.35  # a core counts as busy from this share of use upward (0.65 busy -> 1 core)


@dataclass(frozen=True)
class ThreadChoice:
    threads: int
    cores: int  # cores this process may use
    busy: float | None  # cores' worth of other work seen (None: not measured)
    how: str  # "--threads", "OMP_NUM_THREADS", "auto"

    def line(self) -> str:
        """'1 thread (auto: 2 cores, 1.0 busy)' for the engine line."""
        n = f"{self.threads} thread{'s' if self.threads != 1 else ''}"
        if self.how == "auto":
            seen = f", {self.busy:.1f} busy" if self.busy is not None else ""
            return f"{n} (auto: {self.cores} core{'s' if self.cores != 1 else ''}{seen})"
        return f"{n} ({self.how})"

    def to_dict(self) -> dict:
        return {"threads": self.threads, "cores": self.cores, "busy_cores": self.busy, "how": self.how}


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def cpu_quota(root: str | os.PathLike = CGROUP_ROOT) -> int | None:
    """Cores' worth of CPU time the cgroup quota allows, ceil(quota / period); None where not limited."""
    root = Path(root)
    pairs = []
    v2 = _read(root / "cpu.max")  # "max 100000" or "150000 100000"
    if v2 is not None:
        pairs.append(tuple(v2.split()[:2]))
    for d in (root, root / "cpu", root / "cpu,cpuacct"):
        q, p = _read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us")
        if q is not None and p is not None:
            pairs.append((q, p))
    for pair in pairs:
        try:
            quota, period = int(pair[0]), int(pair[1])
        except (ValueError, IndexError):
            continue  # "max" (v2) or garbage: not limited
        if quota > 0 and period > 0:
            return max(1, math.ceil(quota / period))
    return None


def allowed_cores(cgroup_root: str | os.PathLike = CGROUP_ROOT) -> list[int]:
    """The cores in this process's affinity, at most the cgroup quota's worth of them (the first ones)."""
    try:
        cores = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = list(range(os.cpu_count() or 1))
    quota = cpu_quota(cgroup_root)
    return cores[:quota] if quota else cores


def omp_threads(value: str) -> int | None:
    """OMP_NUM_THREADS's count: "4" or nested "4,2" -> 4; "" -> None; anything else is an error."""
    value = value.strip()
    if not value:
        return None
    first = value.split(",")[0].strip()
    if not first.isdigit() or int(first) < 1:
        raise DDProbeError(f"OMP_NUM_THREADS={value!r} is not a thread count (e.g. 4, or 4,2 nested); "
                           "fix or unset it, or pass --threads")
    return int(first)


def _cpu_times(path: str = "/proc/stat") -> dict[int, tuple[int, int]] | None:
    """Per core: (total jiffies, idle + iowait jiffies); None when unreadable."""
    try:
        with open(path) as f:
            lines = f.readlines()
    except OSError:
        return None
    out = {}
    for line in lines:
        parts = line.split()
        if parts and parts[0].startswith("cpu") and parts[0][3:].isdigit():
            vals = [int(v) for v in parts[1:9]]
            out[int(parts[0][3:])] = (sum(vals), vals[3] + (vals[4] if len(vals) > 4 else 0))
    return out or None


def busy_between(before: dict, after: dict, cores: list[int]) -> float | None:
    """Cores' worth of non-idle time on ``cores`` between two /proc/stat readings."""
    busy, seen = 0.0, False
    for c in cores:
        if c in before and c in after:
            total = after[c][0] - before[c][0]
            idle = after[c][1] - before[c][1]
            if total > 0:
                busy += max(0.0, min(1.0, 1.0 - idle / total))
                seen = True
    return busy if seen else None


def busy_cores(cores: list[int], sample_s: float = SAMPLE_S) -> float | None:
    """Other work's use of ``cores`` now, in cores (this process waits meanwhile, so the use is others')."""
    before = _cpu_times()
    if before is not None:
        time.sleep(sample_s)
        after = _cpu_times()
        if after is not None:
            got = busy_between(before, after, cores)
            if got is not None:
                return got
    try:
        return min(float(os.getloadavg()[0]), float(len(cores)))
    except (AttributeError, OSError):
        return None


def threads_for(cores: int, busy: float | None) -> int:
    """One thread per core not kept busy by other work, at least one."""
    if busy is None:
        return cores
    return max(1, min(cores, cores - int(busy + BUSY_ROUNDING)))


def choose_threads(requested: int | None = None, env: dict | None = None,
                   cgroup_root: str | os.PathLike = CGROUP_ROOT) -> ThreadChoice:
    """The thread count to use (see the module docstring for the order of choice)."""
    env = os.environ if env is None else env
    cores = allowed_cores(cgroup_root)
    if requested is not None:
        return ThreadChoice(int(requested), len(cores), None, "--threads")
    omp = omp_threads(str(env.get("OMP_NUM_THREADS", "")))
    if omp is not None:
        return ThreadChoice(omp, len(cores), None, "OMP_NUM_THREADS")
    busy = busy_cores(cores) if len(cores) > 1 else None
    return ThreadChoice(threads_for(len(cores), busy), len(cores), busy, "auto")
