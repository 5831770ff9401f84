"""`paged` vs the auto path (verify_paths.auto_path: `split_ws` on sm_90, `split` elsewhere) verify attention on this GPU, at the engine's own shapes (diagnose's step 4).

A small, in-package cousin of ``benchmarks/bench_verify.py``: per context, one layer's latent
cache of random bf16 rows (page_size=1 pool in shuffled order for ``paged``, contiguous for
``split``), the engine's heads and verify rows, each path checked against the fp32 reference
and timed as the benchmark times it: one CUDA graph calls the path once for each of enough
caches to hold 3x the L2 (replay leaves out the host's launch work and L2 cannot serve the
caches), median of the replays; the floor uses a device-to-device copy measured in the same run. Rows use the benchmark's keys
(path, ctx, heads, rows, time_us, bytes, GBps, floor_us, rel_err) so reports and the gate read them.
"""
from __future__ import annotations

from typing import Any

from .. import verify_paths
from ..shapes import AttnShape, floor_s
from ..timing import copy_bandwidth_Bps, n_cache_sets, timed_graph



def paths_for(sm: tuple[int, int] | None) -> tuple[str, str]:
    """paged (always, the comparison) and the auto path of a GPU of compute capability ``sm`` (verify_paths)."""
    return ("paged", verify_paths.auto_path(sm))


def compare(ctxs: list[int], shape: AttnShape, rows: int, sm_scale: float,
            on_row=None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Time every path at every context for one layer of ``shape`` (its heads, latent and rope widths) in
    bf16; returns (rows, summary with the copy ceiling)."""
    import torch

    from ..engine import kernels
    from ..engine.kernels.trees import shape_mask

    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA GPU visible to torch")
    dev = "cuda"
    heads, v_dim, d = shape.num_heads, shape.v_dim, shape.kv_row
    row_bytes = shape.kv_bytes_per_token("bf16", layers=1)
    copy = copy_bandwidth_Bps(torch)
    mask = shape_mask("lopsided", rows - 1, dev)  # DDTree's typical shape
    ref = kernels.get_path("reference")
    out: list[dict[str, Any]] = []
    for ctx in ctxs:
        n = ctx + rows
        nbytes = n * row_bytes  # one layer's latent cache: what every path must read
        n_sets = n_cache_sets(nbytes)
        caches = [torch.randn(n, d, device=dev, dtype=torch.bfloat16) for _ in range(n_sets)]
        q = torch.randn(rows, heads, d, device=dev, dtype=torch.bfloat16)
        slots = torch.randperm(n, device=dev)
        pools = []
        for c in caches:  # the same rows scattered over a shuffled page_size=1 pool
            p = torch.empty_like(c)
            p[slots] = c
            pools.append(p)
        oracle = ref.run(q, caches[0], ref.plan(ctx, mask, None, v_dim), sm_scale).float()
        for name in paths_for(torch.cuda.get_device_capability(dev)):
            path = kernels.get_path(name)
            plan = path.plan(ctx, mask, slots if path.layout == "paged" else None, v_dim)
            kvs = pools if path.layout == "paged" else caches
            got = path.run(q, kvs[0], plan, sm_scale).float()
            err = float((got - oracle).norm() / oracle.norm())

            def many(path=path, plan=plan, kvs=kvs):  # every cache once: more than L2 holds
                for kv in kvs:
                    path.run(q, kv, plan, sm_scale)

            t = timed_graph(many, len(kvs), min_s=0.1)
            row = {"path": name, "ctx": ctx, "heads": heads, "rows": rows, "time_us": t * 1e6, "n_sets": len(kvs),
                   "bytes": nbytes,
                   "GBps": nbytes / t / 1e9, "floor_us": floor_s(nbytes, bw_Bps=copy)[0] * 1e6, "rel_err": err,
                   "gpu": torch.cuda.get_device_name()}
            out.append(row)
            if on_row:
                on_row(row)
        del caches, pools
    return out, {"copy_GBps": copy / 1e9}
