"""The floor table: one row per context, read from the step model (``ddprobe.physics.step_model``, the one place a floor is
computed). A row carries the whole step's floor (``floor_ms``; ``binds``: the floor is "<binds>-bound", launch,
bandwidth, compute, communication or host, by the one rule ``step_model.step_bound``) with its terms, the plain one-row decode step's floor beside it (``decode_floor_ms``), and the
attention alone under its own names (``attn_floor_ms``, ``attn_bound``). With a measured step time: ``gap`` = step /
floor, the effective KV bandwidth, ``attn_gap`` = step / attention floor and the attention gap if every one of the
R rows re-read the whole cache. A step below its floor (``below_floor``) means the floor's sharding or dtypes are
not the server's (``step_shape.BELOW_FLOOR``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from ..physics.shapes import floor_s
from ..physics.step_model import StepModel, check_dcp, gap_split
from ..units import DDProbeError

MAX_CTX = 1 << 30  # 1G tokens: far beyond any model; larger is a typo, not a context


@dataclass(frozen=True)
class FloorInput:
    model: StepModel
    queries: int = 9  # rows of the verify step (budget + 1)

    def __post_init__(self):
        if self.queries < 1:
            raise DDProbeError(f"a verify step has at least 1 row (budget + 1), got {self.queries}")


@dataclass
class FloorRow:
    ctx: int
    rows: int
    kv_B_per_token: float  # per GPU, before dcp sharding
    kv_GB: float  # KV one GPU reads
    weights_GB: float  # weights read, routed experts expected under uniform routing
    weights_worst_GB: float  # every row on different experts
    experts_per_layer: float  # expected distinct local experts per MoE layer
    experts_worst: int
    GFLOP: float  # attention over the context + 2 x params x rows
    kv_floor_ms: float
    weight_floor_ms: float
    weight_floor_worst_ms: float
    compute_floor_ms: float | None
    allreduces: int
    allreduce_bytes: float
    allreduce_us: float
    comm_ms: float
    kernels: int  # kernels per step (0: not counted)
    kernel_us: float  # the least time of one (``gpus.KERNEL_TIMES`` or ``--launch-from``)
    launch_ms: float  # kernels x kernel_us
    syncs: int  # host synchronisations per step
    sync_ms: float
    latency_floor_ms: float  # launches + syncs: no step of these kernels is faster
    bytes_floor_ms: float  # (KV + weights) / bandwidth
    floor_ms: float  # THE floor: the whole step
    floor_worst_ms: float
    binds: str
    decode_floor_ms: float  # the plain one-row decode step's floor
    attn_GFLOP: float
    attn_floor_ms: float  # the attention alone: max(KV / bandwidth, attention FLOPs / tensor rate)
    attn_bound: str  # "memory" or "compute"
    step_ms: float | None = None
    eff_bw_GBps: float | None = None  # KV bytes / step
    gap: float | None = None  # step / floor
    attn_gap: float | None = None  # step / attention floor
    attn_gap_if_rows_reread: float | None = None
    below_floor: bool | None = None
    launch_share: float | None = None  # latency floor / step: the share of the step its launches explain
    bytes_share: float | None = None  # max(bytes, compute) floor / step
    step_bound: str | None = None  # with a measured step: binds + "-bound" (step_model.step_bound)

    def to_dict(self) -> dict:
        return asdict(self)


def floor_row(inp: FloorInput, ctx: int, step_ms: float | None = None) -> FloorRow:
    """The floor of one verify step at context ``ctx`` (tokens), per GPU."""
    if ctx < 1:
        raise DDProbeError(f"context must be at least 1 token, got {ctx}")
    if step_ms is not None and not step_ms > 0:
        raise DDProbeError(f"step time must be greater than zero, got {step_ms} ms")
    if ctx > MAX_CTX:
        raise DDProbeError(f"context {ctx} tokens is beyond any model (at most {MAX_CTX})")
    m, r = inp.model, inp.queries
    c = m.cost(ctx, r)
    w = m.weights(r)
    kv, aflops = m.kv_bytes(ctx), m.attn_flops(ctx, r)
    afl, abound = floor_s(kv, aflops, bw_Bps=m.bw_Bps, flops_per_s=m.flops_per_s)
    cd = c.to_dict()
    cd.pop("ctx"), cd.pop("rows")
    row = FloorRow(ctx=ctx, rows=r, kv_B_per_token=m.attn.kv_bytes_per_token(m.kv_dtype, m.tp),
                   experts_per_layer=w.experts_per_layer, experts_worst=w.experts_worst, **cd,
                   decode_floor_ms=m.cost(ctx, 1).floor_ms, attn_GFLOP=aflops / 1e9, attn_floor_ms=afl * 1e3,
                   attn_bound=abound)
    if step_ms is not None:
        row.step_ms = step_ms
        row.eff_bw_GBps = kv / (step_ms / 1e3) / 1e9
        row.gap = step_ms / row.floor_ms
        row.below_floor = row.gap < 1
        row.attn_gap = step_ms / row.attn_floor_ms
        reread_s, _ = floor_s(kv * r, aflops, bw_Bps=m.bw_Bps, flops_per_s=m.flops_per_s)
        row.attn_gap_if_rows_reread = step_ms / (reread_s * 1e3)
        split = gap_split(c, step_ms)
        row.launch_share, row.bytes_share, row.step_bound = split["launch_share"], split["bytes_share"], \
            split["bound"]
    return row


def floor_table(inp: FloorInput, ctxs: list[int], step_ms: list[float] | None = None) -> list[FloorRow]:
    """One row per context; ``step_ms`` is None, one time for all, or one per context."""
    if step_ms is not None and len(step_ms) not in (1, len(ctxs)):
        raise DDProbeError(f"give one step time or one per context: {len(ctxs)} contexts, {len(step_ms)} times")
    times = [None] * len(ctxs) if step_ms is None else (step_ms * len(ctxs) if len(step_ms) == 1 else step_ms)
    return [floor_row(inp, c, t) for c, t in zip(ctxs, times)]


@dataclass(frozen=True)
class Sharding:
    """How the served model is laid over GPUs, and how its all-reduces are timed (the options of `floor`,
    `diagnose` and `advise`)."""

    tp: int = 1
    ep: int = 1
    dcp: int = 1
    weight_dtype: str = "bf16"
    expert_dtype: str | None = None  # None: weight_dtype
    kv_dtype: str = "bf16"
    allreduce_us: float | None = None  # one all-reduce, whatever its size
    allreduce_from: str | None = None  # a `ddprobe bench allreduce` results file

    def __post_init__(self):
        if self.tp < 1:
            raise DDProbeError(f"--tp must be at least 1, got {self.tp}")
        check_dcp(self.dcp, self.tp)

    def to_dict(self) -> dict:
        return asdict(self)


def comm_for(sh: Sharding, gpu: str | None) -> tuple[object | None, str]:
    """The all-reduce latency source for ``sh`` on GPU preset ``gpu``, and a line saying where it comes from."""
    from ..physics.interconnect import comm_fixed, comm_interconnect, comm_table, interconnect_for

    if sh.allreduce_us is not None and sh.allreduce_from:
        raise DDProbeError("give --allreduce-us or --allreduce-from, not both")
    if sh.tp <= 1:
        given = "--allreduce-us" if sh.allreduce_us is not None else "--allreduce-from" if sh.allreduce_from else ""
        if given:
            raise DDProbeError(f"{given} times tensor-parallel all-reduces, and at tp 1 there are none: give --tp "
                               "N (N > 1), or leave it out")
        return None, "tp 1: no tensor-parallel communication"
    if sh.allreduce_us is not None:
        c = comm_fixed(sh.allreduce_us)
    elif sh.allreduce_from:
        from .bench.allreduce import allreduce_origin, load_allreduce

        points = load_allreduce(sh.allreduce_from, sh.tp)
        c = comm_table(points, f"measured: {sh.allreduce_from} ({allreduce_origin(sh.allreduce_from, gpu)})")
    else:
        ic = interconnect_for(gpu)
        if ic is None:
            return None, (f"communication not counted: no all-reduce figure for {gpu or 'a GPU given by --bw'}; "
                          "give --allreduce-us or --allreduce-from")
        c = comm_interconnect(ic, sh.tp)
    return c, f"all-reduce latency: {c.source}"


def model_for(spec, sh: Sharding, *, bw_Bps: float | None, flops_per_s: float | None, gpu: str | None,
              kernels: int | None = None, launch=None, launch_any_gpu: bool = False,
              kernels_source: str = "") -> tuple[StepModel, str]:
    """The step model of a model (``ddprobe.physics.models.ModelSpec``) under sharding ``sh`` on one GPU, with its
    launches (``kernels`` per step, None: the structural least count; ``launch``: measured least kernel times, a
    ``physics.gpus.KernelTime`` of another GPU only with ``launch_any_gpu``), from the one planner
    (``physics.plan.plan``), and the line saying where its all-reduce latency comes from."""
    from ..physics.plan import StepInput, plan

    name = StepInput(spec, gpu=gpu, bw_Bps=bw_Bps).rates()[0]
    comm, said = comm_for(sh, name)
    return plan(StepInput(spec, tp=sh.tp, ep=sh.ep, dcp=sh.dcp, weight_dtype=sh.weight_dtype,
                          expert_dtype=sh.expert_dtype, kv_dtype=sh.kv_dtype, gpu=gpu, bw_Bps=bw_Bps,
                          flops_per_s=flops_per_s, kernels=kernels,
                          kernels_source=kernels_source or ("--kernels" if kernels is not None else ""), comm=comm,
                          launch=launch,
                          launch_any_gpu=launch_any_gpu)), said


def served_model(spec, sh: Sharding, gpu: str | None, bw_Bps: float | None = None,
                 flops_per_s: float | None = None, kernels: int | None = None, *, launch=None,
                 launch_any_gpu: bool = False, kernels_source: str = "") -> tuple[StepModel, dict]:
    """The step model of a served model (``ddprobe.physics.models.ModelSpec``) under ``sh`` on one GPU, and the config a
    floor result records of it (model, sharding, GPU, bandwidth, MoE, where the all-reduce latency comes from)."""
    from ..physics.plan import StepInput

    name = StepInput(spec, gpu=gpu, bw_Bps=bw_Bps).rates()[0]
    model, said = model_for(spec, sh, bw_Bps=bw_Bps, flops_per_s=flops_per_s, gpu=gpu, kernels=kernels,
                            launch=launch, launch_any_gpu=launch_any_gpu, kernels_source=kernels_source)
    w = model.weights(9)
    config = {"model": spec.name, **sh.to_dict(), "expert_dtype": sh.expert_dtype or sh.weight_dtype, "gpu": name,
              "bw_Bps": model.bw_Bps, "flops_per_s": model.flops_per_s, "moe": spec.n_routed_experts > 0,
              "n_routed_experts": spec.n_routed_experts, "num_experts_per_tok": spec.num_experts_per_tok,
              "moe_layers": w.moe_layers, "comm": said, "launches": model.kernel_source}
    return model, config


def floor_result(model: StepModel, ctxs: list[int], steps: list[float] | None, *, queries: int = 9,
                 config: dict | None = None, meta=None, anatomy: bool | None = None):
    """The floor pipeline of `floor` and `diagnose`: one floor row per context of ``model`` (with its measured step,
    if any), and the anatomy when two or more contexts are timed (``anatomy`` True: always tried, False: never).
    Returns (Result of kind "floor", rows). An anatomy that cannot be fitted leaves ``summary.anatomy_error`` (the
    rows are kept)."""
    from ..results import Result, RunMeta
    from .bench.anatomy import fit_anatomy

    rows = floor_table(FloorInput(model, queries), ctxs, steps)
    result = Result(kind="floor", meta=meta or RunMeta.collect(probe_gpu=False),
                    config={"queries": queries, "kv_dtype": model.kv_dtype, **(config or {})},
                    rows=[r.to_dict() for r in rows])
    timed = [(r.ctx, r.step_ms) for r in rows if r.step_ms is not None]
    if anatomy or (anatomy is None and len({c for c, _ in timed}) > 1):
        try:
            result.summary["anatomy"] = fit_anatomy([c for c, _ in timed], [t for _, t in timed],
                                                    kv_B_per_token=model.kv_bytes(1), bw_Bps=model.bw_Bps,
                                                    weight_floor_ms=rows[0].weight_floor_ms,
                                                    latency_floor_ms=rows[0].latency_floor_ms or None).to_dict()
        except DDProbeError as e:
            result.summary["anatomy_error"] = str(e)
    return result, rows


def served_floor(spec, sh: Sharding, ctxs: list[int], steps: list[float] | None, *, gpu: str | None = None,
                 bw_Bps: float | None = None, flops_per_s: float | None = None, queries: int = 9,
                 anatomy: bool | None = None, config: dict | None = None, meta=None, kernels: int | None = None,
                 launch=None, launch_any_gpu: bool = False):
    """The floor + anatomy pipeline of a served model (`floor`, and `diagnose` with a server backend): its step model
    under ``sh`` on one GPU (``served_model``), then ``floor_result``; ``config`` (what the caller adds) comes first
    in the result's config. Returns (step model, Result of kind "floor", rows)."""
    model, served = served_model(spec, sh, gpu, bw_Bps, flops_per_s, kernels, launch=launch,
                                 launch_any_gpu=launch_any_gpu)
    result, rows = floor_result(model, ctxs, steps, queries=queries, config={**(config or {}), **served}, meta=meta,
                                anatomy=anatomy)
    return model, result, rows


def steps_from_file(path, spec, gpu: str | None = None) -> tuple[list[int], list[float], str]:
    """The contexts and step times a results file holds (``anatomy.steps_from_result``: commit cells, a gpu-util
    run), and why they cannot be ``spec``'s steps on GPU preset ``gpu`` ("" where they can be: ``not_the_model``)."""
    from ..results import Result
    from .bench.anatomy import steps_from_result

    r = Result.load(path)
    pts = steps_from_result(r.kind, r.rows, r.summary, r.config)
    if not pts:
        raise DDProbeError(f"{path}: no step times per context in this {r.kind!r} results file")
    return [c for c, _ in pts], [t for _, t in pts], not_the_model(r.config, spec, gpu=gpu, meta=r.meta)


def file_preset(path) -> tuple[str | None, int | None]:
    """The ddprobe engine preset (``physics.presets.PRESETS``: k2, tiny) a results file's config names, and its
    heads; (None, None) where it names none."""
    from ..results import Result

    config = Result.load(path).config or {}
    name, heads = _engine_preset(config), config.get("heads")
    return name, (heads if name and isinstance(heads, int) and not isinstance(heads, bool) and heads > 0 else None)


def _engine_preset(config: dict) -> str | None:
    from ..physics.presets import PRESETS

    p = config.get("preset")
    return p if isinstance(p, str) and p in PRESETS else None


def kernels_from_file(path) -> int | None:
    """The kernels per DDTree step a gpu-util results file counted on its GPU (``summary.request.kernels``, written
    where the engine counted them), else None."""
    from ..results import Result

    r = Result.load(path)
    req = (r.summary or {}).get("request") or {}
    src = str(req.get("launches_source") or "")
    n = req.get("kernels")
    return int(n) if isinstance(n, (int, float)) and n > 0 and "counted on the GPU" in src else None


def not_the_model(config: dict, spec, *, gpu: str | None = None, meta=None) -> str:
    """Why a results file's steps cannot be ``spec``'s (its config's engine preset, device and shape, the expert
    count included; heads may be a tensor-parallel share of the model's), nor on GPU preset ``gpu`` (its meta's GPU,
    where ``meta`` is given), or "" where they can be."""
    from ..physics.models import get_model

    why = []
    preset = _engine_preset(config)
    if preset and spec.name != preset:
        why.append(f"the {preset} engine preset")
    if config.get("device") == "cpu":
        why.append("measured on the CPU")
    experts = get_model(preset).n_routed_experts if preset else config.get("experts")
    for key, want, have in (("layers", spec.num_layers, config.get("layers")),
                            ("kv_row", spec.attn.kv_row, config.get("kv_row")),
                            ("vocab", spec.vocab_size, config.get("vocab")),
                            ("experts", spec.n_routed_experts, experts)):
        if isinstance(have, int) and not isinstance(have, bool) and have != want:
            why.append(f"{key} {have}, not {want}")
    heads = config.get("heads")
    if isinstance(heads, int) and (heads <= 0 or spec.num_heads % heads):
        why.append(f"heads {heads}, not {spec.num_heads} or a tensor-parallel share of them")
    device = getattr(meta, "gpu_name", None) if meta is not None else None
    if gpu and device and config.get("device") != "cpu":
        from ..physics.gpus import gpu_spec_for

        g = gpu_spec_for(device)
        if g is None or g.name != gpu:
            why.append(f"measured on {device}, not the {gpu} the floor is of")
    return "; ".join(why)
