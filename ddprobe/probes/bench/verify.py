"""The verify-attention comparison (``ddprobe bench verify``, diagnose's step 4): every path and peer, checked, timed.

Per layer, for each context and head count: the median time of each verify path (``paged``, ``split``,
``split_ws``...) and of the peers (``peers``: FlashMLA, FlashInfer fa3/fa2, FlexAttention, SDPA), each checked
against the fp32 reference (the peers under the causal mask they run with) and timed under CUDA-graph replay over
enough input sets that L2 cannot serve the caches; bytes and FLOPs per call, GB/s, TFLOP/s, the kernel floor from ceilings
measured in the same run (device copy, bf16 matmul), time over floor. Then the whole multi-layer verify step
(attention only) at one context. Each verify path is planned as the engine plans it (``engine_plan``: device plans
where the path takes them, as its CUDA-graph step does), so the kernel timed is the kernel the engine runs; every
row records the plan kind and the kernel. The document written (``meta``, ``ceilings``, ``results``, ``flex``) is what
``reports.load`` reads as a ``bench-verify`` result and ``ddprobe gate`` compares.
"""
from __future__ import annotations

import dataclasses
import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ... import verify_paths
from ...physics.gpus import DEFAULT_L2_BYTES, gpu_spec_for
from ...physics.shapes import KIMI_K2, AttnShape, dtype_bytes
from ...timing import copy_bandwidth_Bps, graph_anatomy, n_cache_sets, timed_eager, timed_graph
from ...units import DDProbeError, UnitError, parse_tokens
from . import peers

DT = "bf16"
WEAK_PEERS = ("flex", "sdpa")  # PyTorch's own attention
SLOT_LAYOUTS = ("shuffled", "contiguous")
BASELINES = tuple(p.name for p in verify_paths.PATHS if p.baseline)  # paged, sglang: --paged-max-ctx/-heads apply
Variant = tuple[str, dict]  # (path, tuning overrides); {} is the path's run-wide tuning
PLAN_KINDS = ("device", "host")  # a variant's plan=host times a host plan
PLAN_KEYS = ("plan", "bound", "build")  # a variant's keys that shape its plan, not its tuning (plan_kind, plan_bound;
# build=: split's portable build, engine/kernels/portable.py)


@dataclass
class BenchOptions:
    ctxs: list[int]
    heads: list[int] = field(default_factory=lambda: [8, 64])
    paths: list[str] = field(default_factory=list)  # verify paths and peers, in order
    variants: list[Variant] = field(default_factory=list)  # also timed per layer, labelled path[k=v,...]
    tune: dict[str, dict] = field(default_factory=dict)  # path -> run-wide tuning overrides
    budget: int = 8
    tree: str = "lopsided"
    quick: bool = False
    step_ctx: int | None = 128 * 1024  # None: no whole-step timing
    step_variants: list[Variant] = field(default_factory=list)
    step_skip: list[str] = field(default_factory=list)
    paged_max_ctx: int = 256 * 1024
    paged_heads: list[int] = field(default_factory=list)  # empty: every head count
    flex_budget_s: float = 150.0
    shape: AttnShape = KIMI_K2
    sm_scale: float | None = None  # None: the shape's (an engine's carries YaRN's factor)
    slots: str = "shuffled"  # the token pool of the page_size=1 paths: "shuffled" (a random permutation) or "contiguous"
    eager: bool = False  # also time the verify paths' eager launches (eager_us, eager_ratio = eager / graph replay)
    step_trace: str | None = None  # a folder for each step's profile (Chrome trace): ``ddprobe trace`` reads it

    @property
    def scale(self) -> float:
        return self.sm_scale if self.sm_scale is not None else self.shape.sm_scale


def label(path: str, over: dict) -> str:
    return path if not over else f"{path}[{','.join(f'{k}={v}' for k, v in over.items())}]"


def tuned(path, name: str, base: dict, over: dict):
    """The path's frozen tuning: its default on this GPU (``default_tuning()`` where the path has one per GPU, else
    ``DEFAULT_TUNING``) with ``base`` then ``over`` (ints from the command line) applied; the PLAN_KEYS are no
    tuning (``plan_kind`` and ``plan_bound`` read them)."""
    fields = {k: v for k, v in {**base, **over}.items() if k not in PLAN_KEYS}
    default = path.default_tuning() if hasattr(path, "default_tuning") else path.DEFAULT_TUNING
    known = [f.name for f in dataclasses.fields(default)]
    unknown = [k for k in fields if k not in known]
    if unknown:
        raise DDProbeError(f"bad {name} tuning {over or base}: {type(default).__name__} has no field "
                           f"{', '.join(map(repr, unknown))} (its fields: {', '.join(known) or 'none'})")
    try:
        return dataclasses.replace(default, **{k: int(v) for k, v in fields.items()})
    except (TypeError, ValueError) as e:
        raise DDProbeError(f"bad {name} tuning {over or base}: {e}") from None


def check_tunings(opts: "BenchOptions") -> None:
    """Every --variant, --step-variant and --tune of ddprobe's own paths checked before any GPU work: a field its
    tuning does not have (a knob moved to the lab branch among them), a value that is no whole number or that no
    kernel implements, or a plan kind it does not take is one line (DDProbeError) rather than a failure in the middle of a run;
    so are overrides given to a peer (it has no tuning) and a ``bound=`` anywhere but a --variant (the step's caches
    hold the step's context). Paths whose library is not installed here are left to the run (their rows say why)."""
    for name, over in [*opts.variants, *opts.step_variants, *opts.tune.items()]:
        if over and (name in peers.PEERS or name in WEAK_PEERS):
            raise DDProbeError(f"{name} is a peer: it takes no tuning overrides, got {over}")
    for what, items in (("--tune", opts.tune.items()), ("--step-variant", opts.step_variants)):
        for name, over in items:
            for key in ("bound", "build"):
                if key in over:
                    raise DDProbeError(f"{what} {name}: {key}= shapes one layer's plan; give it in a --variant")
    for name, over in opts.variants:
        if "build" in over:
            check_build(name, over)
    try:
        from ...engine import kernels
    except ImportError:  # no torch: the CUDA check that follows says so
        return
    for name, over in [*opts.variants, *opts.step_variants, *((n, {}) for n in opts.tune)]:
        try:
            path = kernels.get_path(name)
        except (ValueError, kernels.PathUnavailable):
            continue
        t = tuned(path, name, opts.tune.get(name, {}), over)
        plan_bound(path, name, {**opts.tune.get(name, {}), **over})
        try:
            getattr(path, "check_tuning", lambda t: None)(t)  # a value no kernel implements (split_ws's tail=2)
        except ValueError as e:
            raise DDProbeError(f"bad {name} tuning {over or opts.tune.get(name)}: {e}") from None


def check_build(name: str, over: dict) -> None:
    """``split:build=sm_120|sm_80``: the portable build of `split` (engine/kernels/portable.py; its names are
    split.ARCHS entries, stdlib-readable here through verify_paths' GPU lists). One line for another path or name."""
    builds = ("sm_120", "sm_80")  # portable.BUILDS (a test checks the two agree)
    if name != "split":
        raise DDProbeError(f"{name}: build= names a portable build of split (split:build={'|'.join(builds)})")
    if over["build"] not in builds:
        raise DDProbeError(f"split: unknown portable build {over['build']!r}; known: {', '.join(builds)}")


def plan_kind(path, name: str, over: dict) -> str:
    """The plan kind an entry is timed with: the engine's (a device plan where the path takes one: what the engine
    builds whenever CUDA graphs are on, its default; engine/graphs.py), or ``plan=host|device`` from the variant's
    overrides or the run-wide --tune (``over`` holds both)."""
    kind = over.get("plan", "device" if path.device_plans else "host")
    if kind not in PLAN_KINDS or (kind == "device" and not path.device_plans):
        raise DDProbeError(f"{name}: plan={kind} is not a plan kind it takes (plan=host"
                           f"{' or plan=device' if path.device_plans else ''})")
    return kind


def plan_bound(path, name: str, over: dict) -> int | None:
    """The bound (max_prefix, tokens) a device plan of this entry is sized for, from ``bound=`` in the variant's
    overrides (``over``): what an engine whose plan has that bound (its KV capacity less the R tree rows,
    engine/graphs.py) runs at every live length, so ``split_ws:bound=128k`` at 8k times the kernel such an engine
    runs there. None: the context itself (a plan sized for it). Contiguous-layout device plans only."""
    kind = plan_kind(path, name, over)
    if "bound" not in over:
        return None
    if kind != "device":
        raise DDProbeError(f"{name}: bound= sizes a device plan; this entry is timed with a host plan")
    if path.layout != "contiguous":
        raise DDProbeError(f"{name}: bound= sizes a contiguous-layout plan; {name} reads a page_size=1 pool")
    try:
        return parse_tokens(over["bound"])
    except UnitError as e:
        raise DDProbeError(f"bad {name} bound: {e}") from None


def engine_plan(torch, path, kind: str, ctx: int, mask, slots, v_dim: int, tuning, heads: int,
                bound: int | None = None):
    """The path's plan for one layer at ``ctx`` tokens: a host plan (prefix_len an int), or a device plan as the
    engine's CUDA-graph step builds it (prefix_len a [1] int32 device tensor holding ctx, max_prefix = ``bound``,
    at least ctx (default ctx), then ``refresh``)."""
    if kind == "host":
        return path.plan(ctx, mask, slots, v_dim, tuning=tuning, heads=heads)
    prefix_t = torch.full((1,), ctx, dtype=torch.int32, device=mask.device)
    p = path.plan(prefix_t, mask, slots, v_dim, tuning=tuning, heads=heads, max_prefix=max(ctx, bound or ctx))
    path.refresh(p)
    return p


def kernel_of(name: str, p) -> str:
    """The kernel a verify path's plan runs: split_ws's choice (WsPlan.kernel: cuda or tail), "reference"
    where the plan fell back to the fp32 reference (split on a GPU its table does not fit), else the path's own name
    (one kernel family per path)."""
    if (getattr(p, "extra", None) or {}).get("fallback"):
        return "reference"
    return getattr(p.detail, "kernel", None) or name


def _check_no_fallback(fn, lab: str) -> None:
    """A path whose plan fell back to the fp32 reference (split on a GPU its table does not fit, or a kernel that
    did not build there: the plan's ``fallback``) ran nothing of its own: its row is skipped, saying why."""
    fell = (getattr(getattr(fn, "plan", None), "extra", None) or {}).get("fallback")
    if fell:
        raise peers.PeerUnavailable(f"{lab} runs the fp32 reference on this GPU: {fell}")


def call_cost(shape: AttnShape, ctx: int, heads: int, rows: int, layers: int = 1) -> tuple[float, float]:
    """(bytes, useful FLOPs) of verify attention over ctx + rows columns: the latent rows read once, q read, out
    written; FLOPs scale with the heads timed (the shape's count is the model's)."""
    n = ctx + rows
    nbytes = shape.kv_bytes_per_token(DT, layers=layers) * n
    nbytes += layers * rows * heads * (shape.kv_row + shape.v_dim) * dtype_bytes(DT)
    return nbytes, shape.attn_flops_per_token(rows, layers=layers) * n * heads / shape.num_heads


def ceilings(torch) -> dict[str, float]:
    """Device copy GB/s and bf16 matmul TFLOP/s, measured now."""
    copy_bw = copy_bandwidth_Bps(torch)
    m = 8192
    x, y = (torch.randn(m, m, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        x @ y
    torch.cuda.synchronize()
    ts = []
    for _ in range(20):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record(); x @ y; e1.record(); torch.cuda.synchronize()  # noqa: E702
        ts.append(e0.elapsed_time(e1) / 1e3)
    del x, y
    torch.cuda.empty_cache()
    return {"copy_GBps": copy_bw / 1e9, "bf16_mm_TFLOPs": 2 * m**3 / statistics.median(ts) / 1e12}


def floor_of(nbytes: float, flops: float, ceil: dict) -> float:
    """The kernel floor in seconds over this run's measured ceilings (``step_model.kernel_floor``: the one
    definition)."""
    from ...physics.step_model import kernel_floor

    return kernel_floor(nbytes, flops, copy_Bps=ceil["copy_GBps"] * 1e9,
                        matmul_flops=ceil["bf16_mm_TFLOPs"] * 1e12).us / 1e6


def rel_err(out, ref) -> float:
    if not bool(out.isfinite().all()):
        return float("nan")
    return float((out.float() - ref.float()).norm() / ref.float().norm())


class Progress:
    """Entries done of the run's total, time elapsed and an ETA, for a run of minutes. An entry's cost grows with
    its context (the caches filled, the slow baselines' kernels): each weighs 1 + ctx / 32k (a step entry 8), and
    the ETA is the weight left at the pace measured so far. ``report(done, total, elapsed_s, eta_s)`` after each."""

    def __init__(self, weights: list[float], report: Callable[[int, int, float, float | None], None] | None):
        self.weights, self.report, self.done, self.t0 = weights, report, 0, time.monotonic()

    @staticmethod
    def weight(ctx: int) -> float:
        return 1.0 + ctx / 32768

    def tick(self) -> None:
        self.done += 1
        if self.report is None:
            return
        el = time.monotonic() - self.t0
        w_done, w_all = sum(self.weights[:self.done]), sum(self.weights)
        eta = el * (w_all - w_done) / w_done if w_done > 0 and self.done < len(self.weights) else 0.0
        self.report(self.done, len(self.weights), el, eta)


class Bench:
    """One run: the options, the ceilings (measured on creation), the rows so far; ``on_row`` sees each row."""

    def __init__(self, opts: BenchOptions, on_row: Callable[[dict], None] | None = None):
        import torch

        from ...engine import kernels
        from ...engine.kernels.trees import SHAPES
        if not torch.cuda.is_available():
            raise DDProbeError("no CUDA GPU visible to torch: the verify comparison times kernels on a GPU")
        if opts.tree not in SHAPES:
            raise DDProbeError(f"unknown tree shape {opts.tree!r}; known: {', '.join(SHAPES)}")
        if opts.slots not in SLOT_LAYOUTS:
            raise DDProbeError(f"unknown slot layout {opts.slots!r}; known: {', '.join(SLOT_LAYOUTS)}")
        self.torch, self.kernels, self.opts, self.on_row = torch, kernels, opts, on_row or (lambda row: None)
        self.ceil = ceilings(torch)
        self.results: list[dict[str, Any]] = []
        self.progress: Progress | None = None
        self.flex = {"failed": None, "spent": 0.0}
        spec = gpu_spec_for(torch.cuda.get_device_name())
        self.l2 = spec.l2_bytes if spec else DEFAULT_L2_BYTES

    def slots(self, n: int):
        """The token-pool slots of n columns: a random permutation (a pool that has served many requests) or
        0..n-1 (``--slots contiguous``)."""
        if self.opts.slots == "contiguous":
            return self.torch.arange(n, device="cuda")
        return self.torch.randperm(n, device="cuda")

    def _entries(self, ctx: int, heads: int) -> list[Variant]:
        o = self.opts
        skip_paged = ctx > o.paged_max_ctx or (o.paged_heads and heads not in o.paged_heads)
        todo = [(p, {}) for p in o.paths] + list(o.variants)
        return [(p, over) for p, over in todo if not (p in BASELINES and skip_paged)]

    def _kv_rows(self, ctx: int, heads: int, n: int) -> int:
        """Rows each cache set spans: the context and its tree rows (n), or more where an entry's device plan is
        sized for a larger bound (``bound=``: a plan checks that the cache holds its bound + R rows; the kernels
        read only the live rows). Entries whose path does not load here are skipped by the run: not counted."""
        most = n
        for name, over in self._entries(ctx, heads):
            if "bound" in over:
                try:
                    b = plan_bound(self.kernels.get_path(name), name, self._both(name, over))
                except self.kernels.PathUnavailable:
                    continue
                most = max(most, b + self.opts.budget + 1)
        return most

    def _both(self, name: str, over: dict) -> dict:
        """An entry's overrides over the path's run-wide --tune: what its plan kind and bound are read from."""
        return {**self.opts.tune.get(name, {}), **over}

    def _runner(self, name: str, over: dict, ctx: int, heads: int, mask, slots, rec: dict):
        """(fn(q, kv, meta=None), the reference it is checked against: "tree", "paged" (the tree over the shuffled
        slots) or "causal" (the production peers' mask)) for one entry; fills rec's tuning and config."""
        o, sh = self.opts, self.opts.shape
        rows, scale = o.budget + 1, o.scale
        if name in peers.PEERS:
            f = peers.make(name, ctx, rows, heads, sh.v_dim, sh.rope_dim, scale)
            return (lambda q, kv, meta=None: f(q, kv)), "causal"
        if name in WEAK_PEERS:
            if name == "flex" and (self.flex["failed"] or self.flex["spent"] > o.flex_budget_s):
                return None, None
            t0 = time.time()
            make = peers.flex_peer if name == "flex" else peers.sdpa_peer
            f = make(ctx, mask, heads, sh.v_dim)
            self.flex["spent"] += (time.time() - t0) if name == "flex" else 0.0
            return (lambda q, kv, meta=None: f(q, kv, scale)), "tree"
        try:
            path = self.kernels.get_path(name)
        except self.kernels.PathUnavailable as e:  # sglang not installed: a skipped row that says how
            raise peers.PeerUnavailable(str(e)) from None
        both = self._both(name, over)
        if "build" in both:
            return self._portable(both, ctx, heads, mask, rec)
        tun = tuned(path, name, o.tune.get(name, {}), over)
        paged = path.layout == "paged"
        kind, bound = plan_kind(path, name, both), plan_bound(path, name, both)
        pl = engine_plan(self.torch, path, kind, ctx, mask, slots if paged else None, sh.v_dim, tun, heads, bound)
        rec.update(plan=kind, kernel=kernel_of(name, pl), tuning=dataclasses.asdict(tun))
        if bound is not None:
            rec["bound"] = max(ctx, bound)
        if pl.extra.get("config") is not None:
            rec["config"] = pl.extra["config"]

        def call(q, kv, meta=None):
            return path.run(q, kv, pl, scale, meta=meta)
        call.plan = pl  # point() reads a fallback the first call recorded in it
        return call, ("paged" if paged else "tree")

    def _portable(self, over: dict, ctx: int, heads: int, mask, rec: dict):
        """split's portable build ``over["build"]`` (portable.py) on the engine's plan kind: its row says what it is
        (``proxy``); where it cannot run here (the card, the driver's JIT, the tiling) a skipped row saying why."""
        from ...engine.kernels import portable

        torch, o = self.torch, self.opts
        kind = plan_kind(self.kernels.get_path("split"), "split", over)
        prefix = ctx if kind == "host" else torch.full((1,), ctx, dtype=torch.int32, device=mask.device)
        fields = {k: v for k, v in over.items() if k not in PLAN_KEYS}
        try:
            base = portable.base_tuning(over["build"])
            tun = dataclasses.replace(base, **{k: int(v) for k, v in fields.items()})
        except (TypeError, ValueError) as e:
            raise DDProbeError(f"bad split:build={over['build']} tuning {fields}: {e}") from None
        try:
            pl = portable.plan(prefix, mask, o.shape.v_dim, build=over["build"], heads=heads, tuning=tun,
                               max_prefix=None if kind == "host" else ctx)
        except portable.PortableUnavailable as e:
            raise peers.PeerUnavailable(str(e)) from None
        rec.update(plan=kind, kernel=f"portable {over['build']}", proxy=portable.describe(over["build"],
                   torch.cuda.get_device_name()), tuning=dataclasses.asdict(pl.tuning), config=pl.extra["config"])

        def call(q, kv, meta=None):
            try:
                return portable.run(q, kv, pl, o.scale, meta=meta)
            except portable.PortableUnavailable as e:
                raise peers.PeerUnavailable(str(e)) from None
        return call, "tree"

    def _keep(self, rec: dict) -> None:
        """One row, checked against the bench-verify schema first (a bad row is a bug: raise), then kept."""
        from ...results import _finite
        from ...schema import parse_row

        parse_row("bench-verify", _finite(rec), f"bench verify: row {len(self.results) + 1}")
        self.results.append(rec)
        self.on_row(rec)
        if self.progress is not None:
            self.progress.tick()

    def plan_progress(self, report: Callable[[int, int, float, float | None], None] | None) -> None:
        """Count the run's entries (every point's, then the step's) for ``Progress``."""
        o = self.opts
        w = [Progress.weight(c) for h in o.heads for c in o.ctxs for _ in self._entries(c, h)]
        if o.step_ctx:
            steps = [p for p in o.paths if p not in o.step_skip and p not in WEAK_PEERS] + list(o.step_variants)
            w += [8.0] * len(steps)
        self.progress = Progress(w, report)

    def point(self, ctx: int, heads: int) -> None:
        """Every entry at one (context, heads): checked, then timed; one row each (an error or skip recorded)."""
        torch, o, sh = self.torch, self.opts, self.opts.shape
        ref_path = self.kernels.get_path("reference")
        rows, n = o.budget + 1, ctx + o.budget + 1
        from ...engine.kernels.trees import shape_mask
        n_sets = n_cache_sets(int(sh.kv_bytes_per_token(DT, layers=1) * n), self.l2, most=48 if o.quick else 96)
        g = torch.Generator(device="cuda").manual_seed(ctx * 131 + heads)
        # rows padded to FlashMLA's 64-row pages; every path reads only the first n
        # the sets side by side in one buffer, set i the rows from i x its padded length: their live rows are
        # disjoint, and a set seen by a plan of a larger bound (bound=) spans the next sets' rows, not a copy of its own
        step, span = peers.rows_for(n), peers.rows_for(self._kv_rows(ctx, heads, n))
        flat = torch.randn((n_sets - 1) * step + span, sh.kv_row, device="cuda", dtype=torch.bfloat16, generator=g)
        kvs = [flat[i * step:i * step + span] for i in range(n_sets)]
        qs = [torch.randn(rows, heads, sh.kv_row, device="cuda", dtype=torch.bfloat16, generator=g)
              for _ in range(n_sets)]
        mask, causal = shape_mask(o.tree, o.budget, "cuda"), shape_mask("chain", o.budget, "cuda")
        slots = self.slots(n)  # the page_size=1 allocation over the same rows
        refs = {kind: ref_path.run(qs[0], kvs[0], ref_path.plan(ctx, m, s, sh.v_dim), o.scale)
                for kind, m, s in (("tree", mask, None), ("paged", mask, slots), ("causal", causal, None))}
        nbytes, flops = call_cost(sh, ctx, heads, rows)
        floor = floor_of(nbytes, flops, self.ceil)
        for name, over in self._entries(ctx, heads):
            lab = label(name, over)
            rec = dict(ctx=ctx, heads=heads, rows=rows, path=lab, n_sets=n_sets, bytes=nbytes, flops=flops,
                       floor_us=floor * 1e6)
            try:
                t0 = time.time()
                fn, kind = self._runner(name, over, ctx, heads, mask, slots, rec)
                if fn is None:  # flex left out: no row, but the entry is done
                    if self.progress is not None:
                        self.progress.tick()
                    continue
                kmeta: dict = {}  # the compiled kernels' reports (registers, spills, shared memory)
                rec["rel_err"] = rel_err(fn(qs[0], kvs[0], meta=kmeta), refs[kind])
                _check_no_fallback(fn, lab)
                rec["ok"] = bool(rec["rel_err"] < 2e-2)
                if name == "flex":
                    self.flex["spent"] += time.time() - t0

                def many(fn=fn):
                    for i in range(n_sets):
                        fn(qs[i], kvs[i])
                t = timed_graph(many, n_sets, min_s=0.1 if o.quick else 0.3)
                rec.update(us=t * 1e6, GBps=nbytes / t / 1e9, TFLOPs=flops / t / 1e12, gap=t / floor,
                           bw_frac=nbytes / t / 1e9 / self.ceil["copy_GBps"],
                           mm_frac=flops / t / 1e12 / self.ceil["bf16_mm_TFLOPs"])
                if o.eager and name not in peers.PEERS and name not in WEAK_PEERS:
                    te = timed_eager(many, n_sets, min_s=0.1 if o.quick else 0.3)
                    rec.update(eager_us=te * 1e6, eager_ratio=te / t)
                if kmeta:
                    rec["kernels"] = kmeta
            except peers.PeerUnavailable as e:
                rec = dict(ctx=ctx, heads=heads, rows=rows, path=lab, skipped=str(e))
            except Exception as e:  # noqa: BLE001  (a path that fails here is a row, never the end of the run)
                rec["error"] = f"{type(e).__name__}: {str(e)[:400]}"
                if name == "flex":
                    self.flex["failed"] = rec["error"]
            self._keep(rec)
        del kvs, qs, flat
        torch.cuda.empty_cache()

    def step(self) -> None:
        """The whole verify step (every layer of the shape, attention only) at 8 heads under CUDA-graph replay."""
        torch, o, sh = self.torch, self.opts, self.opts.shape
        from ...engine.kernels.trees import shape_mask
        ctx, heads, rows = o.step_ctx, 8, o.budget + 1
        n = ctx + rows
        g = torch.Generator(device="cuda").manual_seed(7)
        caches = [torch.randn(peers.rows_for(n), sh.kv_row, device="cuda", dtype=torch.bfloat16, generator=g)
                  for _ in range(sh.num_layers)]
        q = torch.randn(rows, heads, sh.kv_row, device="cuda", dtype=torch.bfloat16, generator=g)
        mask = shape_mask(o.tree, o.budget, "cuda")
        slots = self.slots(n)
        nbytes, flops = call_cost(sh, ctx, heads, rows, layers=sh.num_layers)
        floor = floor_of(nbytes, flops, self.ceil)
        todo = [(p, {}) for p in o.paths if p not in o.step_skip and p not in WEAK_PEERS] + list(o.step_variants)
        for name, over in todo:
            lab = label(name, over)
            try:
                made: dict = {}
                fn, _ = self._runner(name, over, ctx, heads, mask, slots, made)

                def whole(fn=fn):
                    for kv in caches:
                        fn(q, kv)
                t = timed_graph(whole, 1, min_s=0.5, max_reps=10)
                _check_no_fallback(fn, lab)
                trace = str(Path(o.step_trace) / f"step61-{re.sub(r'[^A-Za-z0-9._-]+', '_', lab)}-{ctx}-{heads}h.json"
                            ) if o.step_trace else None
                anat = graph_anatomy(whole, trace_path=trace)  # the step's kernels and gaps (after its timing)
                rec = dict(kind="step61", ctx=ctx, heads=heads, path=lab, step_ms=t * 1e3, floor_us=floor * 1e6,
                           gap=t / floor, GBps=nbytes / t / 1e9, bytes=nbytes,
                           **{k: made[k] for k in ("plan", "kernel") if k in made}, **anat,
                           **({"trace": trace} if trace else {}))
            except Exception as e:  # noqa: BLE001  (a peer that cannot run: recorded, not fatal)
                rec = dict(kind="step61", ctx=ctx, heads=heads, path=lab, skipped=f"{type(e).__name__}: {str(e)[:300]}")
            self._keep(rec)
        del caches
        torch.cuda.empty_cache()


def run(opts: BenchOptions, write: Callable[[dict], None], on_row: Callable[[dict], None] | None = None,
        command: str = "", on_ceilings: Callable[[dict], None] | None = None,
        on_progress: Callable[[int, int, float, float | None], None] | None = None) -> dict[str, Any]:
    """The whole comparison: every (heads, context) point, then the step; ``write(doc)`` after each point so a run
    cut short keeps what it measured; ``on_progress(done, total, elapsed_s, eta_s)`` after each row. Returns the
    document."""
    import platform

    import triton

    b = Bench(opts, on_row)
    b.plan_progress(on_progress)
    torch = b.torch
    meta = dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                triton=triton.__version__, python=platform.python_version(), command=command,
                sm_count=torch.cuda.get_device_properties(0).multi_processor_count, tune=opts.tune,
                budget=opts.budget, tree=opts.tree, slots=opts.slots)
    if on_ceilings:
        on_ceilings(b.ceil)
    doc = dict(meta=meta, ceilings=b.ceil, results=b.results, flex=b.flex)
    for heads in opts.heads:
        for ctx in opts.ctxs:
            b.point(ctx, heads)
            write(doc)
    if opts.step_ctx:
        b.step()
        write(doc)
    return doc


def paths_for(sm: tuple[int, int] | None, shape: AttnShape = KIMI_K2) -> list[str]:
    """``paged`` (always: the comparison) and ``--attn auto``'s path for ``shape``'s MLA rows in bf16 (what the
    benchmark runs) on a GPU of compute capability ``sm``."""
    return ["paged", verify_paths.auto_path(sm, DT, (shape.kv_lora_rank, shape.qk_rope_head_dim))]


def compare(ctxs: list[int], shape: AttnShape, rows: int, sm_scale: float, on_row=None):
    """Diagnose's step 4: ``paged`` vs the auto path for this shape (``paths_for``) for one layer of the
    engine's own shape (its heads) at every context; returns (rows, the ceilings). ``sm_scale`` is the engine's
    (YaRN-corrected) scale."""
    import torch

    if not torch.cuda.is_available():
        raise DDProbeError("the verify comparison needs a CUDA GPU visible to torch")
    paths = paths_for(torch.cuda.get_device_capability(), shape)
    opts = BenchOptions(ctxs=list(ctxs), heads=[shape.num_heads], paths=paths, budget=rows - 1,
                        quick=True, step_ctx=None, paged_max_ctx=max(ctxs), shape=shape, sm_scale=sm_scale)
    b = Bench(opts, on_row)
    for ctx in ctxs:
        b.point(ctx, shape.num_heads)
    return b.results, b.ceil
