"""`paged` vs `split` verify attention on this GPU, at the engine's own shapes (diagnose's step 4).

A small, in-package cousin of ``benchmarks/bench_verify.py``: per context, one layer's latent
cache of random bf16 rows (page_size=1 pool in shuffled order for ``paged``, contiguous for
``split``), the engine's heads and verify rows, each path checked against the fp32 reference
and timed from CUDA-graph replay (``triton.testing.do_bench_cudagraph``, median; several caches
so L2 cannot serve them);
the floor uses a device-to-device copy measured in the same run. Rows use the benchmark's keys
(path, ctx, heads, rows, time_us, bytes, GBps, floor_us, rel_err) so reports and the gate read them.
"""
from __future__ import annotations

from typing import Any

PATHS = ("paged", "split")


def copy_bandwidth_Bps(torch, nbytes: int = 1 << 30) -> float:
    """Device-to-device copy, bytes read + written per second (median of do_bench)."""
    from triton.testing import do_bench

    a = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    b = torch.empty_like(a)
    ms = do_bench(lambda: b.copy_(a), warmup=25, rep=200, return_mode="median")
    return 2 * a.numel() * 2 / (ms * 1e-3)


def time_call(call) -> tuple[float, str]:
    """Median ms of one call, replayed from a CUDA graph so the host's launch work between the
    two kernels of a path is not counted (the kernels are what is compared); plain ``do_bench``
    (host gaps included) when capture fails. Returns (ms, "cuda-graph" | "do_bench")."""
    from triton.testing import do_bench, do_bench_cudagraph

    try:
        return do_bench_cudagraph(call, rep=100, return_mode="median"), "cuda-graph"
    except Exception:  # noqa: BLE001 - a path that cannot be captured is still timed
        return do_bench(call, warmup=10, rep=100, return_mode="median"), "do_bench"


def compare(ctxs: list[int], heads: int, rows: int, v_dim: int, rope_dim: int, sm_scale: float,
            on_row=None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Time every path at every context; returns (rows, summary with the copy ceiling)."""
    import torch

    from ..engine import kernels
    from ..engine.kernels.trees import shape_mask

    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA GPU visible to torch")
    dev = "cuda"
    d = v_dim + rope_dim
    copy = copy_bandwidth_Bps(torch)
    mask = shape_mask("lopsided", rows - 1, dev)  # DDTree's typical shape
    ref = kernels.get_path("reference")
    out: list[dict[str, Any]] = []
    l2 = 60 << 20
    for ctx in ctxs:
        n = ctx + rows
        per_set = n * d * 2
        n_sets = max(2, min(8, 4 * l2 // per_set + 1))
        caches = [torch.randn(n, d, device=dev, dtype=torch.bfloat16) for _ in range(n_sets)]
        q = torch.randn(rows, heads, d, device=dev, dtype=torch.bfloat16)
        slots = torch.randperm(n, device=dev)
        pools = []
        for c in caches:  # the same rows scattered over a shuffled page_size=1 pool
            p = torch.empty_like(c)
            p[slots] = c
            pools.append(p)
        oracle = ref.run(q, caches[0], ref.plan(ctx, mask, None, v_dim), sm_scale).float()
        nbytes = n * d * 2
        for name in PATHS:
            path = kernels.get_path(name)
            plan = path.plan(ctx, mask, slots if path.layout == "paged" else None, v_dim)
            kvs = pools if path.layout == "paged" else caches
            got = path.run(q, kvs[0], plan, sm_scale).float()
            err = float((got - oracle).norm() / oracle.norm())
            i = [0]

            def call(path=path, plan=plan, kvs=kvs):
                i[0] = (i[0] + 1) % len(kvs)
                path.run(q, kvs[i[0]], plan, sm_scale)

            ms, timing = time_call(call)
            row = {"path": name, "ctx": ctx, "heads": heads, "rows": rows, "time_us": ms * 1e3, "timing": timing,
                   "bytes": nbytes,
                   "GBps": nbytes / (ms * 1e-3) / 1e9, "floor_us": nbytes / copy * 1e6, "rel_err": err,
                   "gpu": torch.cuda.get_device_name()}
            out.append(row)
            if on_row:
                on_row(row)
        del caches, pools
    return out, {"copy_GBps": copy / 1e9}
