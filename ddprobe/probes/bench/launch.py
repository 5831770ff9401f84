"""`ddprobe bench launch`: the least time one kernel of a step costs on this GPU (``physics.gpus.KERNEL_TIMES``).

Four rows, each the median over ``samples`` timed samples (CUDA events) of ``kernels`` back-to-back launches:

- ``graph-empty``: an empty Triton kernel (one program, no memory touched), captured ``kernels`` times in one CUDA
  graph and replayed: what a replayed kernel node costs with nothing in it;
- ``graph-small``: a small kernel that reads and writes 1,024 fp32 values (``x.add_(1)``, torch's elementwise add:
  a block or two), likewise replayed: the least a kernel that touches memory costs. The step model's ``graph_us``
  is the smaller of the two graph rows (``physics.gpus.launch_time``: a floor takes the least);
- ``eager-small``: the same small kernel launched eagerly from Python one after another (the host's launch rate
  bounds it: what an eager step's kernels cost at least);
- ``sync``: one value copied to the host and waited on (``x.item()``), one after another: a host synchronisation's
  round trip.

torch (and Triton, for the empty kernel) are imported when measuring; a CUDA GPU is needed.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

from ...units import DDProbeError

DEFAULT_KERNELS = 1000  # launches per timed sample
DEFAULT_SAMPLES = 20
SMALL_VALUES = 1024  # the small kernel's fp32 values (a block or two of an elementwise kernel)


@dataclass(frozen=True)
class LaunchRow:
    kind: str  # graph-empty, graph-small, eager-small, sync
    us: float  # median per kernel (or per sync)
    p10_us: float
    p90_us: float
    kernels: int  # launches per sample
    samples: int

    def to_dict(self) -> dict:
        return asdict(self)


def per_kernel(samples_ms: list[float], kernels: int, kind: str) -> LaunchRow:
    """The row of ``kind`` from samples of ``kernels`` launches each (ms per sample -> us per kernel)."""
    if kernels < 1 or not samples_ms:
        raise DDProbeError(f"{kind}: no launches timed")
    us = sorted(t * 1e3 / kernels for t in samples_ms)
    if not all(u > 0 for u in us):
        raise DDProbeError(f"{kind}: a sample of {kernels} launches took no time: the clock did not run")
    q = statistics.quantiles(us, n=10) if len(us) > 1 else [us[0]] * 9
    return LaunchRow(kind, statistics.median(us), q[0], q[-1], kernels, len(us))


def check(kernels: int, samples: int) -> None:
    if not 1 <= kernels <= 100_000:
        raise DDProbeError(f"--kernels must be in 1..100000, got {kernels}")
    if not 1 <= samples <= 10_000:
        raise DDProbeError(f"--samples must be in 1..10000, got {samples}")


def _empty_kernel():
    """An empty Triton kernel's launcher (None where Triton cannot build one here)."""
    try:
        import triton

        @triton.jit
        def _empty(x_ptr):
            pass
    except Exception:  # noqa: BLE001 - no Triton: the empty row is left out, said by the caller
        return None
    return lambda x: _empty[(1,)](x)


def _graph_samples(fn, kernels: int, samples: int) -> list[float]:
    """ms per replay of a CUDA graph holding ``kernels`` calls of fn()."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):  # compile, warm
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(kernels):
            fn()
    g.replay()
    torch.cuda.synchronize()
    return _event_samples(g.replay, samples)


def _event_samples(run, samples: int) -> list[float]:
    import torch

    out = []
    for _ in range(samples):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return out


def measure_launch(kernels: int = DEFAULT_KERNELS, samples: int = DEFAULT_SAMPLES, on_row=None) -> list[LaunchRow]:
    """The four rows (module docstring) on the current CUDA GPU; on_row(LaunchRow) after each."""
    check(kernels, samples)
    import torch

    if not torch.cuda.is_available():
        raise DDProbeError("ddprobe bench launch needs a CUDA GPU (none is visible to torch here)")
    x = torch.zeros(SMALL_VALUES, device="cuda", dtype=torch.float32)
    rows = []

    def add(row: LaunchRow) -> None:
        rows.append(row)
        if on_row is not None:
            on_row(row)

    empty = _empty_kernel()
    if empty is not None:
        try:
            add(per_kernel(_graph_samples(lambda: empty(x), kernels, samples), kernels, "graph-empty"))
        except Exception:  # noqa: BLE001 - Triton could not build or capture it: the row is left out
            torch.cuda.synchronize()
    add(per_kernel(_graph_samples(lambda: x.add_(1), kernels, samples), kernels, "graph-small"))

    def eager():
        for _ in range(kernels):
            x.add_(1)
    eager()
    add(per_kernel(_event_samples(eager, samples), kernels, "eager-small"))
    n = max(1, kernels // 10)  # a round trip is some us: a tenth as many per sample
    add(per_kernel(_wall_samples(lambda: [x[0].item() for _ in range(n)], samples), n, "sync"))
    return rows


def _wall_samples(run, samples: int) -> list[float]:
    """ms per run() on the host's clock (a sync's round trip is the host's wait)."""
    import torch

    torch.cuda.synchronize()
    run()
    out = []
    for _ in range(samples):
        t0 = time.perf_counter()
        run()
        out.append((time.perf_counter() - t0) * 1e3)
    return out
