"""Step times on this device, without a prompt: the DDTree step per (context, budget) and the plain
decode step per context, for ``ddprobe advise`` (tokens/s with speculation = commit length / DDTree
step; without = 1 / decode step).

    rows = measure_step_times(StepTimeOptions(preset="k2", attn="split", device="cuda", dtype="bf16"),
                              ctxs=[8192, 32768], budgets=[4, 8])   # -> [StepTime, ...]

Each cell fills the engine's caches at the context with random values (``graphs.fill_synthetic``: a
step's time does not depend on them; no prefill runs), runs the cell's steps once untimed (Triton
compiles, cuBLAS picks, with graphs the capture came before), fills again and runs them timed: the
median of ``steps`` steps. The DDTree step is the engine's own (``loop.decode`` with the strategy
``steps.step_for`` picks: graph-replayed with the device tree on CUDA) from its CUDA-event phase
marks (``clock.StepClock``), draft + tree + verify + walk/commit; ``verify_ms`` is its verify phase
(the target over R = budget + 1 rows). The plain decode step (budget 0, one row) is
``graphs.DecodeStep`` replayed back to back (graphs), or the eager one-row step (``loop.plain_step``).
torch is imported when measuring.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

from ...units import DDProbeError, fmt_tokens
from ..backends.engine import MAX_BUDGET

DEFAULT_STEPS = 10  # timed steps per cell (their median)


@dataclass(frozen=True)
class StepTime:
    path: str  # the verify path
    ctx: int  # committed tokens before the step
    budget: int  # drafted nodes; 0 = plain decode
    rows: int  # query rows: budget + 1 (1 for plain decode)
    step_ms: float  # median whole step: DDTree draft + tree + verify + walk/commit; decode: the one-row step
    verify_ms: float  # median verify phase (the target over the rows); decode: = step_ms
    steps: int  # steps in the median
    graphs: bool  # replayed as CUDA graphs (CPU: the same static step, eagerly)

    @property
    def plain(self) -> bool:
        return self.budget == 0

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class StepTimeOptions:
    """The engine to time (``probes.backends.engine.EngineBackend``'s options; random weights)."""

    preset: str = "k2"
    attn: str = "split"
    device: str = "cuda"
    dtype: str = "bf16"
    heads: int | None = None
    graphs: bool | None = None  # None: the engine's default (on for CUDA); True on CPU: static steps, eagerly
    seed: int = 0
    steps: int = DEFAULT_STEPS
    threads: int | None = None


def capacity(ctxs: list[int], budgets: list[int], steps: int) -> int:
    """Cache rows the cells need: the longest context, then the warm and timed steps' rows (each commits at
    most budget + 1), and the verify rows of the last."""
    return max(ctxs) + (steps + 2) * (max(budgets, default=0) + 1) + 1


def check(opts: StepTimeOptions, ctxs: list[int], budgets: list[int]) -> int:
    """One line for anything that does not fit (before an engine is built) -> the cache capacity."""
    from ...physics.presets import ModelConfig

    if not ctxs:
        raise DDProbeError("step times need at least one context")
    if min(ctxs) < 1:
        raise DDProbeError(f"contexts must be at least 1 token, got {min(ctxs)}")
    bad = [b for b in budgets if not 1 <= b <= MAX_BUDGET]
    if bad:
        raise DDProbeError(f"budgets must be in 1..{MAX_BUDGET}, got {bad[0]}")
    if opts.steps < 1:
        raise DDProbeError(f"steps must be at least 1, got {opts.steps}")
    try:
        limit = ModelConfig.from_name(opts.preset, heads=opts.heads).position_limit
    except ValueError as e:
        raise DDProbeError(str(e)) from None
    cap = capacity(ctxs, budgets, opts.steps)
    if cap > limit:
        raise DDProbeError(f"context {fmt_tokens(max(ctxs))} with budget {max(budgets, default=0)} needs {cap:,} "
                           f"cache rows ({opts.steps} steps); the {opts.preset} preset holds {limit:,}")
    return cap


def measure_step_times(opts: StepTimeOptions, ctxs: list[int], budgets: list[int], on_row=None) -> list[StepTime]:
    """The DDTree step per (ctx, budget) and the plain decode step per ctx (budget 0), on opts' engine;
    on_row(StepTime) after each cell. Contexts and budgets in the order given, decode first per context."""
    from ..backends.engine import EngineBackend

    cap = check(opts, list(ctxs), list(budgets))
    be = EngineBackend(opts.preset, opts.attn, budget=max(budgets, default=1), device=opts.device,
                       dtype=opts.dtype, seed=opts.seed, heads=opts.heads, max_ctx=cap, weights="random",
                       graphs=opts.graphs if opts.device.startswith("cuda") else None, threads=opts.threads)
    eng, rows = be.engine, []
    if opts.graphs and not eng.graphs:  # CPU: the static steps, run eagerly (what a GPU captures)
        if not eng.path.device_plans:
            raise DDProbeError(f"attention path {opts.attn!r} takes host plans only: no static steps")
        eng.graphs = True

    def add(row: StepTime) -> None:
        rows.append(row)
        if on_row is not None:
            on_row(row)

    for ctx in ctxs:
        add(_decode_cell(eng, ctx, opts.steps, cap))
    eng.release()
    for b in budgets:
        eng.budget = b  # a new runner (and, with graphs, a new captured step) for this budget
        for ctx in ctxs:
            add(_ddtree_cell(eng, ctx, opts.steps, cap))
        eng.release()
    return rows


def _median_ms(eng, run, steps: int) -> float:
    """Median ms of ``steps`` calls of run() between clock marks (CUDA events on a GPU)."""
    from ...engine.clock import StepClock

    clock = StepClock(eng.device)
    marks = []
    for _ in range(steps):
        m0 = clock.mark()
        run()
        marks.append((m0, clock.mark()))
    return statistics.median(clock.times_ms([a, b])[0] for a, b in marks)


def _decode_cell(eng, ctx: int, steps: int, cap: int) -> StepTime:
    import torch

    from ...engine.graphs import fill_synthetic
    from ...engine.loop import plain_step

    runner, ms = eng.runner, None
    with torch.no_grad():
        if eng.graphs:
            st = runner.decode_for(eng.models, cap)[0]
            for _ in range(2):  # untimed, then timed: the same replays from the same context
                st.synthetic(ctx)
                ms = _median_ms(eng, st.run, steps)
        else:
            kv = runner.new_cache(cap)
            for _ in range(2):
                fill_synthetic(kv, ctx)
                ms = _median_ms(eng, lambda: plain_step(runner, eng.models, kv, 1), steps)
    return StepTime(eng.attn, ctx, 0, 1, ms, ms, steps, eng.graphs)


def _ddtree_caches(eng, cap: int):
    """The caches a DDTree step of ``eng`` runs on, for ``cap`` tokens: the held static step's under graphs (what its
    captured step reads), fresh ones otherwise."""
    from ...engine.runner import Caches

    runner, models = eng.runner, eng.models
    if eng.graphs:
        st = runner.static_for(models, cap)[0]
        return Caches(st.kv, st.dctx, st)
    return Caches(runner.new_cache(cap), models.drafter.new_context(cap))


def _ddtree_cell(eng, ctx: int, steps: int, cap: int) -> StepTime:
    import torch

    from ...engine.graphs import fill_synthetic
    from ...engine.loop import decode

    runner, models = eng.runner, eng.models
    with torch.no_grad():
        c = _ddtree_caches(eng, cap)
        recs = []
        for _ in range(2):  # untimed, then timed
            fill_synthetic(c.kv, ctx, c.dctx)
            recs = decode(runner, models, c, 1, steps * eng.budget + steps + 1, max_steps=steps)[1]
    return StepTime(eng.attn, ctx, eng.budget, eng.budget + 1, statistics.median(r.step_ms for r in recs),
                    statistics.median(r.verify_ms for r in recs), len(recs), eng.graphs)


def count_kernels(run, steps: int = 3) -> tuple[float, float]:
    """(GPU operations, device-to-host copies) per call of run(), counted by torch.profiler on the GPU over ``steps``
    calls after one untimed: every kernel, memcpy and memset the GPU ran (a replayed CUDA graph's nodes one by one),
    as ``benchmarks/bench_engine.py`` counts a step's kernels. The copies to the host are the step's
    synchronisations (the host reads what the step decided)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from ...foreign import quiet_stderr

    run()
    torch.cuda.synchronize()
    with quiet_stderr(), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            run()
        torch.cuda.synchronize()
    n = d2h = 0
    for ev in prof.events():
        if ev.device_type.name != "CUDA":
            continue
        n += 1
        d2h += "DtoH" in ev.name or "Device -> Pageable" in ev.name or "Device -> Pinned" in ev.name
    return n / steps, d2h / steps


def engine_kernels(eng, steps: int = 3, decode_step: bool = True) -> dict | None:
    """The engine's kernels per step counted on its GPU (``count_kernels``): {"ddtree": kernels of the DDTree step
    (draft + tree + verify + walk/commit), "decode": of the plain one-row step (None where it could not be built),
    "syncs": device-to-host copies per DDTree step}; None off CUDA (no kernels to count). Runs on the engine's
    held static step at a short context (a captured step's kernels do not depend on the context); the plain step
    only with ``decode_step`` (its capture compiles the one-row functions: seconds on k2)."""
    import torch

    from ...engine.graphs import fill_synthetic
    from ...engine.loop import decode

    if eng.device.type != "cuda":
        return None
    runner, models, r = eng.runner, eng.models, eng.budget + 1
    need = 64 + (steps + 3) * r + 1
    with torch.no_grad():
        c = _ddtree_caches(eng, need)

        def ddtree():
            fill_synthetic(c.kv, 64, c.dctx)
            decode(runner, models, c, 1, r + 1, max_steps=1)
        dd, syncs = count_kernels(ddtree, steps)
        dec = None
        if eng.graphs and decode_step:
            try:
                ds = runner.decode_for(models, eng.max_ctx)[0]  # the capacity plain_decode_ms replays at
                ds.synthetic(64)
                dec = count_kernels(ds.run, steps)[0]
            except Exception:  # noqa: BLE001 - the plain step's count is left out (None), the DDTree one stands
                dec = None
    # fill_synthetic's own operations run inside the counted call: count them alone and take them off
    fill = count_kernels(lambda: fill_synthetic(c.kv, 64, c.dctx), steps)[0]
    return {"ddtree": max(1, round(dd - fill)), "decode": round(dec) if dec else None, "syncs": round(syncs)}


def engine_step_model(backend, gpu: str | None, bw_Bps: float, flops_per_s: float | None, decode_step: bool = False,
                      launch=None, launch_any_gpu: bool = False):
    """The embedded engine's step model (``backend.step_model``) with its launches: kernels per step counted on the
    GPU once per backend (``engine_kernels``, the plain step's too with ``decode_step``; the structural least count
    off CUDA or where not counted), at ``gpu``'s least kernel time."""
    from dataclasses import replace

    from ...physics.plan import launch_for
    from ...physics.step_model import structural_kernels, with_launches

    launch = launch_for(launch, gpu, launch_any_gpu)  # another GPU's file: refused unless asked (the planner's rule)
    m = backend.step_model(bw_Bps, flops_per_s)
    counts = getattr(backend, "kernel_counts", "unset")
    if counts == "unset":
        try:
            counts = engine_kernels(backend.engine, decode_step=decode_step)
        except Exception as e:  # noqa: BLE001 - a profiler that fails must not lose the floor: the bound stands
            counts = {"error": f"{type(e).__name__}: {e}".splitlines()[0][:160]}
        backend.kernel_counts = counts
    if not counts or "error" in counts:
        m = with_launches(m, gpu, None, launch=launch)
        return replace(m, kernel_source=m.kernel_source + (f" (the GPU count failed: {counts['error']})"
                                                           if counts else ""))
    least = structural_kernels(m.attn.num_layers)
    dd, dec = counts["ddtree"], counts.get("decode") or least

    def kernels(rows: int) -> int:
        return dd if rows > 1 else dec
    said = (f"counted on the GPU: {dd} per DDTree step, " +
            (f"{dec} per plain decode step" if counts.get("decode") else f"plain decode at least {least}"))
    return with_launches(m, gpu, kernels, syncs=counts.get("syncs") or 0, counted=said, launch=launch)


def plain_decode_ms(eng, ctxs: list[int], steps: int = DEFAULT_STEPS) -> dict[int, float]:
    """The plain one-row decode step per context on an engine already built (``diagnose``'s), through the same path
    as `advise` (``_decode_cell``: graph-replayed on CUDA, the eager one-row step elsewhere); contexts the engine's
    capacity cannot hold with the steps' rows are left out."""
    out = {}
    for ctx in sorted(set(ctxs)):
        cap = capacity([ctx], [], steps)
        if cap > eng.max_ctx:
            continue
        out[ctx] = _decode_cell(eng, ctx, steps, eng.max_ctx).step_ms
    eng.release()
    return out
