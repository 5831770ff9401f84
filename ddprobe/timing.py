"""GPU timing shared by the verify comparison and the benchmarks (torch imported lazily).

- ``timed_graph``: capture a function in a CUDA graph and replay it; warm-up and capture happen
  before the measured replays, so the host's launch work and compilation are never timed.
- ``n_cache_sets``: how many distinct caches to cycle through so that L2 cannot serve them.
- ``copy_bandwidth_Bps``: the device-to-device copy ceiling measured in the same run.
"""
from __future__ import annotations

from .physics.gpus import DEFAULT_L2_BYTES


def copy_bandwidth_Bps(torch, nbytes: int = 1 << 30) -> float:
    """Device-to-device copy, bytes read + written per second (median of do_bench)."""
    from triton.testing import do_bench

    a = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    b = torch.empty_like(a)
    ms = do_bench(lambda: b.copy_(a), warmup=25, rep=200, return_mode="median")
    return 2 * a.numel() * 2 / (ms * 1e-3)


def timed_graph(fn, n_calls: int, min_s: float = 0.25, max_reps: int = 40) -> float:
    """Capture fn() (which makes n_calls layer calls) in a CUDA graph and replay it; median seconds per
    call. Replay leaves out the host's launch work; fn should touch more distinct caches than L2 holds
    (replay does not flush L2)."""
    import statistics

    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record(); g.replay(); e1.record(); torch.cuda.synchronize()  # noqa: E702
    first = e0.elapsed_time(e1) / 1e3
    reps = int(max(3, min(max_reps, min_s / max(first, 1e-6))))
    ts = []
    for _ in range(reps):
        e0.record(); g.replay(); e1.record(); torch.cuda.synchronize()  # noqa: E702
        ts.append(e0.elapsed_time(e1) / 1e3)
    del g
    return statistics.median(ts) / n_calls


def timed_eager(fn, n_calls: int, min_s: float = 0.25, max_reps: int = 40, min_calls: int = 48) -> float:
    """fn() (which makes n_calls layer calls) launched eagerly, repeated within each timed window until it holds
    min_calls calls (a steady stream of launches, as an eager step's layers give: one launch's host latency is not
    charged to a few calls), as timed_graph times its replay: median seconds per call, the host's launch work
    included wherever it outlasts the kernels."""
    import statistics

    import torch

    inner = -(-min_calls // n_calls)
    fn()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts: list[float] = []
    while len(ts) < 3 or (len(ts) < max_reps and sum(ts) * inner < min_s):
        e0.record()
        for _ in range(inner):
            fn()
        e1.record()
        torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1) / 1e3 / inner)
    return statistics.median(ts) / n_calls


def n_cache_sets(per_set: int, l2: int = DEFAULT_L2_BYTES, most: int = 1024) -> int:
    """Distinct caches to cycle through so that together they hold 3x the L2 (at least 2, at most ``most``)."""
    return max(2, min(most, -(-3 * l2 // per_set)))
