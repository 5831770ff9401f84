"""GPU timing shared by the verify comparison and the benchmarks (torch imported lazily).

- ``timed_graph``: capture a function in a CUDA graph and replay it; warm-up and capture happen
  before the measured replays, so the host's launch work and compilation are never timed.
- ``n_cache_sets``: how many distinct caches to cycle through so that L2 cannot serve them.
- ``copy_bandwidth_Bps``: the device-to-device copy ceiling measured in the same run.
- ``NOISE``, ``within_noise``: how far a GPU time moves between runs, below which two times are the same.
"""
from __future__ import annotations

from .physics.gpus import DEFAULT_L2_BYTES

# Times on a GPU move by a percent or two between runs (clocks, other work, the allocator): differences within this
# share of the larger are the measurement's noise, read as flat (never as "it got faster with context").
NOISE = 0.02


def within_noise(t0: float, t1: float) -> bool:
    """Whether two GPU times differ by no more than the measurement's noise (``NOISE`` of the larger)."""
    return abs(t1 - t0) <= NOISE * max(abs(t0), abs(t1))


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


def graph_anatomy(fn, replays: int = 3, trace_path: str | None = None) -> dict:
    """fn() captured in a CUDA graph and replayed ``replays`` times under torch.profiler (after the timing, never
    inside it): per replay the GPU's kernels (``step_kernels``), the sum of their own durations (``kernels_ms``), the replay's span
    from the first kernel's start to the last one's end (``span_ms``) and the time in it with no kernel running
    (``gaps_ms``: launch gaps between kernels, the GPU idle). ``trace_path``: the profile also written there as a
    Chrome trace (what ``ddprobe trace`` reads)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from .foreign import quiet_stderr

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    with quiet_stderr(), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            g.replay()
            torch.cuda.synchronize()
    if trace_path:
        prof.export_chrome_trace(trace_path)
    kernels = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                     if e.device_type.name == "CUDA" and "memcpy" not in e.name.lower()
                     and "memset" not in e.name.lower())
    del g
    return anatomy_of(kernels, replays)


def anatomy_of(kernels: list[tuple[float, float]], replays: int) -> dict:
    """``graph_anatomy``'s figures from the kernels' (start, end) times in us, sorted, of ``replays`` replays: a
    replay begins where the GPU was idle longest before it (the host's synchronisation between replays), so the
    split does not depend on the profiler's own ordering."""
    if not kernels or replays < 1:
        return {"step_kernels": 0, "kernels_ms": 0.0, "span_ms": 0.0, "gaps_ms": 0.0}
    before, end = [], kernels[0][1]  # the idle time before each kernel: its start minus the latest end so far
    for st, en in kernels[1:]:
        before.append(st - end)
        end = max(end, en)
    idle = sorted(range(1, len(kernels)), key=lambda i: before[i - 1], reverse=True)[:replays - 1]
    cuts = [0, *sorted(idle), len(kernels)]
    busy = span = 0.0
    for a, b in zip(cuts, cuts[1:]):
        part = kernels[a:b]
        span += max(e for _, e in part) - part[0][0]
        end = part[0][0]
        for st, en in part:  # the union of the kernels' intervals (overlapping kernels counted once)
            busy += max(0.0, en - max(st, end))
            end = max(end, en)
    n = len(kernels) / replays
    return {"step_kernels": round(n), "kernels_ms": sum(e - st for st, e in kernels) / replays / 1e3,
            "span_ms": span / replays / 1e3, "gaps_ms": (span - busy) / replays / 1e3}


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
