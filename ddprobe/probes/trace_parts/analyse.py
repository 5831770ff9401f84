"""One rank's steps, measured: the GPU span, the busy and idle time inside it, the split by kernel class
(``ddprobe.kernel_classes``), the largest kernels per class, and each attention kernel's launch against the GPU."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property

from ...kernel_classes import CLASSES, classify
from .read import Kernel

STRIP_MAX = 4000  # kernels kept in the timeline strip of one step


@dataclass
class KernelStat:
    name: str
    cls: str
    what: str
    role: str
    us_per_step: float  # summed time per step (mean over steps)
    per_step: float  # launches per step
    mean_us: float  # one launch
    launch: dict | None = None  # grid, block, occupancy ... of its most common launch


@dataclass
class RankSteps:
    steps: int
    span_ms: list[float]  # each step's GPU span: first kernel's start to last kernel's end
    busy_ms: list[float]  # the union of its kernels' intervals
    class_ms: dict[str, float]  # mean per step, summed kernel time
    class_count: dict[str, float]  # launches per step
    kernels: list[KernelStat]
    overlap_ms: float = 0.0  # mean per step: summed kernel time beyond the busy time (work on several streams)
    strip: list[list] = field(default_factory=list)  # the median step: [class, start us, duration us, name index]
    strip_names: list[str] = field(default_factory=list)

    @cached_property
    def median_step(self) -> int:
        """The step whose span is the median (the upper one of an even count): its span, busy and idle time are
        the headline, so that span = busy + idle, and it is the step the strip draws."""
        return median_index(self.span_ms)

    @property
    def median_span_ms(self) -> float:
        return self.span_ms[self.median_step]

    @property
    def median_busy_ms(self) -> float:
        return self.busy_ms[self.median_step]

    @property
    def median_idle_ms(self) -> float:
        return max(0.0, self.span_ms[self.median_step] - self.busy_ms[self.median_step])


def median_index(values: list[float]) -> int:
    order = sorted(range(len(values)), key=lambda i: values[i])
    return order[len(order) // 2]


def _busy(ks: list[Kernel]) -> float:
    total, end = 0.0, None
    for k in sorted(ks, key=lambda k: k.ts):
        a, b = k.ts, k.ts + k.dur
        if end is None or a > end:
            total += k.dur
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def _launch(args: tuple | None) -> dict | None:
    if not args:
        return None
    grid, block, regs, smem, bps, wps, occ = args
    blocks = 1
    for g in grid or (1,):
        blocks *= int(g)
    return {"grid": list(grid), "block": list(block), "blocks": blocks, "registers_per_thread": regs,
            "shared_memory_B": smem, "blocks_per_SM": bps, "warps_per_SM": wps, "achieved_occupancy_pct": occ}


def measure(steps: list[list[Kernel]]) -> RankSteps:
    n = len(steps)
    spans, busy, summed = [], [], 0.0
    cls_us: dict[str, float] = defaultdict(float)
    cls_n: dict[str, int] = defaultdict(int)
    by_name: dict[str, list] = {}
    for ks in steps:
        spans.append((max(k.ts + k.dur for k in ks) - min(k.ts for k in ks)) / 1e3)
        b = _busy(ks)
        busy.append(b / 1e3)
        summed += max(0.0, sum(k.dur for k in ks) - b) / 1e3  # never below 0 by rounding (3.12's sum is exact)
        for k in ks:
            m = classify(k.name)
            cls_us[m.cls] += k.dur
            cls_n[m.cls] += 1
            s = by_name.setdefault(k.name, [m, 0.0, 0, defaultdict(float)])
            s[1] += k.dur
            s[2] += 1
            if k.launch:
                s[3][k.launch] += k.dur
    kernels = []
    for name, (m, us, cnt, launches) in by_name.items():
        top = max(launches.items(), key=lambda kv: kv[1])[0] if launches else None
        kernels.append(KernelStat(name, m.cls, m.what, m.role, us / n, cnt / n, us / cnt, _launch(top)))
    kernels.sort(key=lambda s: -s.us_per_step)
    r = RankSteps(n, spans, busy, {c: cls_us[c] / n / 1e3 for c in CLASSES},
                  {c: cls_n[c] / n for c in CLASSES}, kernels, overlap_ms=summed / n)
    r.strip, r.strip_names = _strip(steps, spans)
    return r


def _strip(steps: list[list[Kernel]], spans: list[float]) -> tuple[list[list], list[str]]:
    """The step whose span is the median, as [class, start us from the step's start, duration us, name index]."""
    ks = sorted(steps[median_index(spans)], key=lambda k: k.ts)[:STRIP_MAX]
    t0, names, ix = ks[0].ts, [], {}
    out = []
    for k in ks:
        if k.name not in ix:
            ix[k.name] = len(names)
            names.append(k.name)
        out.append([classify(k.name).cls, round(k.ts - t0, 3), round(k.dur, 3), ix[k.name]])
    return out, names


SMEM_DEFAULT_B = 49152  # CUDA's shared memory per block without the opt-in (every GPU since Volta)


def occupancy_pct(la: dict, smem_limit: int | None = None) -> float | None:
    """The trace's "est. achieved occupancy %", or None where it is no estimate: Kineto's occupancy calculator
    gives 0 for every block over the default shared memory per block (``sharedMemPerBlock``, 48 KB; the opt-in
    limit is ignored), so a 0 there says nothing (seen on the H100 traces in tests/data/traces: all 1,815 such
    launches per trace read 0, SGLang's ``_fwd_kernel`` at 106,496 B among them)."""
    occ = la.get("achieved_occupancy_pct")
    smem = la.get("shared_memory_B")
    if occ == 0 and isinstance(smem, (int, float)) and smem > (smem_limit or SMEM_DEFAULT_B):
        return None
    return occ


def grid_line(k: KernelStat, sms: int | None, smem_limit: int | None = None) -> str:
    """"grid 1 x 8 x 1 = 8 blocks on 132 SMs: at most 6% of the GPU can work on it" (and the occupancy figures;
    ``smem_limit``: the trace's ``sharedMemPerBlock``, for ``occupancy_pct``)."""
    la = k.launch
    if not la:
        return f"{k.name}: no launch configuration in the trace"
    g = " x ".join(str(x) for x in la["grid"])
    line = f"grid {g} = {la['blocks']:,} blocks"
    if sms:
        frac = min(1.0, la["blocks"] / sms)
        line += f" on {sms} SMs: " + (f"at most {frac:.0%} of the GPU can work on it" if frac < 1 else
                                       f"{la['blocks'] / sms:.1f} blocks per SM")
    extra = [f"{la['registers_per_thread']} registers/thread" if la["registers_per_thread"] is not None else "",
             f"{la['shared_memory_B']:,} B shared" if isinstance(la["shared_memory_B"], (int, float)) else "",
             f"{la['warps_per_SM']:.2f} warps per SM" if isinstance(la["warps_per_SM"], (int, float)) else "",
             (f"est. achieved occupancy {occ}%" if (occ := occupancy_pct(la, smem_limit)) is not None else
              "no occupancy estimate: the profiler's reads 0 above 48 KB of shared memory per block"
              if la["achieved_occupancy_pct"] is not None else "")]
    extra = [e for e in extra if e]
    return line + (f" ({', '.join(extra)})" if extra else "")
