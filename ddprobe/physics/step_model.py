"""The step model: what one GPU's decode step of R query rows costs at its floor (stdlib only).

Every command that says "the floor" reads it from here (``floor``, ``gpu-util``, ``diagnose``, ``advise``, the
reports and the gate). A step of R rows (R = budget + 1 for a verify step, 1 for a plain decode step) costs, per GPU:

- memory: the KV it attends over (MLA's one latent head is replicated by tensor parallelism; decode context
  parallelism, ``dcp``, shards it) plus the weights it reads (``step_shape.StepWeights``: routed experts as the R
  rows touch them; the target only, the drafter is not counted);
- compute: attention over the context plus 2 x params x rows;
- communication: under tensor parallelism every layer ends its attention and its MLP in an all-reduce of
  R x hidden activations (2 per layer: 122 for Kimi K2's 61 layers); with dcp > 1 each layer also gathers the dcp
  group's queries and combines its ranks' partial attention outputs (2 more collectives of R x local heads x dcp
  x 576 and x (v + 1) values; each rank attends with the group's heads over 1 / dcp of the KV). Their latency
  comes from the interconnect table below (or ``--allreduce-us``, or a ``bench allreduce`` file); collectives are
  latency-bound at these sizes and do not overlap a decode step's kernels, so they add;
- launches: a step is a sequence of kernels on one stream, and kernels on a stream serialize: each takes at least
  the GPU's least time per kernel (``gpus.KERNEL_TIMES``: a graph-replayed kernel, or an eager launch where the
  step is not a CUDA graph; measured by ``ddprobe bench launch``, else a class bound said as such). A kernel's bytes
  move inside its own duration, so the launches are not added to the bytes: each kernel costs at least
  max(its bytes / bandwidth, the least kernel time), and summed over the step that is at least
  max(all bytes / bandwidth, kernels x least kernel time). The per-kernel bytes are not known, so the floor takes
  that max (a bound that holds; the true sum of per-kernel maxima lies between it and their sum). Kernels per step
  come from the engine (counted on the GPU) or ``--kernels``; without either, a structural least count
  (``KERNELS_PER_LAYER`` per layer + 2) stands in;
- host synchronisations (a device-to-host copy the host waits on): the GPU's queue drains while the host reads
  and submits again, so nothing overlaps them: they add (syncs x ``sync_us``).

floor = max((KV + weights) / bandwidth, FLOPs / tensor rate, kernels x least kernel time) + communication + syncs.
The step is bandwidth-, compute-, launch-, communication- or host-bound by its largest term (``step_bound``, the one
rule every command prints).
The **latency floor** is kernels x least kernel time + syncs: no step of those kernels is faster, whatever it reads.
The attention alone (KV / bandwidth) is the **KV floor**, and step / KV floor the **attention gap**; one kernel's
floor (``bench verify``) is a **kernel floor**. None of them is called "the floor".
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Callable, NamedTuple

from .gpus import KernelTime, kernel_time
from .interconnect import Comm
from .shapes import AttnShape, dtype_bytes, dtype_name, floor_s
from .step_shape import StepWeights
from ..units import DDProbeError

ALLREDUCES_PER_LAYER = 2  # after attention's o_proj and after the MLP / MoE (SGLang's and vLLM's DeepSeek layers)
# The fewest kernels a decoder layer takes without fusing one GEMM into another: norm + QKV projection, attention,
# output projection, MLP up (activation fused), MLP down; + 2 per step (embedding, norm + lm_head). A lower bound for
# a server whose own count is not given (``--kernels``); a megakernel server would be below it.
KERNELS_PER_LAYER = 5


def structural_kernels(layers: int) -> int:
    """The least kernels of one step of a ``layers``-layer model (``KERNELS_PER_LAYER``): a lower bound."""
    return KERNELS_PER_LAYER * layers + 2


@dataclass
class StepCost:
    """One GPU's step of ``rows`` rows at context ``ctx``, at its floor (times in ms, bytes in GB)."""

    ctx: int
    rows: int
    kv_GB: float
    weights_GB: float
    weights_worst_GB: float
    GFLOP: float
    kv_floor_ms: float
    weight_floor_ms: float
    weight_floor_worst_ms: float
    compute_floor_ms: float | None
    allreduces: int  # collectives per step: 2 TP all-reduces per layer (+ 2 per layer with dcp)
    allreduce_bytes: float  # one TP all-reduce's message
    allreduce_us: float  # one TP all-reduce's latency
    comm_ms: float
    kernels: int  # kernels per step (0: not counted)
    kernel_us: float  # the least time of one of them
    launch_ms: float  # kernels x kernel_us: the launches' floor
    syncs: int  # host synchronisations per step
    sync_ms: float
    latency_floor_ms: float  # launch_ms + sync_ms
    bytes_floor_ms: float  # (KV + weights) / bandwidth
    floor_ms: float
    floor_worst_ms: float
    binds: str  # the floor is <binds>-bound: "launch", "bandwidth", "compute", "communication" or "host" (step_bound)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class StepModel:
    """What a step costs on one GPU besides its rows and context: the model's attention, its weights per row count,
    the GPU, the sharding and the interconnect."""

    attn: AttnShape
    weights: Callable[[int], StepWeights]  # rows -> this GPU's weights for a step of that many rows
    bw_Bps: float
    flops_per_s: float | None = None
    hidden: int = 0  # activations all-reduced per row (0: no tensor-parallel communication counted)
    tp: int = 1
    dcp: int = 1
    kv_dtype: str = "bf16"
    act_dtype: str = "bf16"
    comm: Comm | None = None  # None with tp > 1: communication not counted (said by the caller)
    graphs: bool = True  # the step is a replayed CUDA graph (else its kernels are launched eagerly)
    kernels: Callable[[int], int] | None = None  # rows -> kernels per step (None: launches not counted)
    kernel_us: float = 0.0  # the least time per kernel (``gpus.KernelTime``: graph_us or eager_us)
    syncs: int = 0  # host synchronisations per step
    sync_us: float = 0.0
    kernel_source: str = ""  # where kernels and kernel_us come from (said with the floor)

    def __post_init__(self):
        object.__setattr__(self, "kv_dtype", dtype_name(self.kv_dtype))
        object.__setattr__(self, "act_dtype", dtype_name(self.act_dtype))
        self.attn.check_tp(self.tp)
        check_dcp(self.dcp, self.tp)
        if not self.bw_Bps > 0:
            raise DDProbeError("bandwidth must be greater than zero")
        if self.flops_per_s is not None and not self.flops_per_s > 0:
            raise DDProbeError("tensor rate must be greater than zero")

    def kv_bytes(self, ctx: int) -> float:
        """KV one GPU reads at ``ctx``: MLA's latent replicated by tp, sharded by dcp; GQA's heads split by tp."""
        return self.attn.kv_bytes_per_token(self.kv_dtype, self.tp) * ctx / self.dcp

    def attn_flops(self, ctx: int, rows: int) -> float:
        """dcp: each rank attends with the heads of its dcp group (dcp x its own) over 1 / dcp of the context: the
        same FLOPs as without."""
        return self.attn.attn_flops_per_token(rows, self.tp) * ctx

    def collectives(self, rows: int) -> tuple[int, float, float]:
        """(count, bytes of one TP all-reduce, total us) of one step's communication."""
        if self.tp <= 1 or self.comm is None or not self.hidden:
            return 0, 0.0, 0.0
        a, layers = self.attn, self.attn.num_layers
        nbytes = rows * self.hidden * dtype_bytes(self.act_dtype)
        n = ALLREDUCES_PER_LAYER * layers
        total = n * self.comm.us_at(nbytes)
        if self.dcp > 1:  # per layer: the dcp group's queries gathered, its partial outputs (+ LSE) combined
            group = rows * a.heads_per_gpu(self.tp) * self.dcp * dtype_bytes(self.act_dtype)
            n += 2 * layers
            total += layers * (self.comm.us_at(group * a.kv_row) + self.comm.us_at(group * (a.v_dim + 1)))
        return n, nbytes, total

    def cost(self, ctx: int, rows: int) -> StepCost:
        if ctx < 1:
            raise DDProbeError(f"context must be at least 1 token, got {ctx}")
        if rows < 1:
            raise DDProbeError(f"a step has at least 1 row, got {rows}")
        w = self.weights(rows)
        kv, ms = self.kv_bytes(ctx), 1e3 / self.bw_Bps
        flops = self.attn_flops(ctx, rows) + w.flops
        mem, _ = floor_s(kv + w.total_B, flops, bw_Bps=self.bw_Bps, flops_per_s=self.flops_per_s)
        worst, _ = floor_s(kv + w.total_worst_B, flops, bw_Bps=self.bw_Bps, flops_per_s=self.flops_per_s)
        n, nbytes, comm_us = self.collectives(rows)
        k = int(self.kernels(rows)) if self.kernels else 0
        launch, sync = k * self.kernel_us / 1e3, self.syncs * self.sync_us / 1e3
        comm = comm_us / 1e3
        top, top_worst = max(mem * 1e3, launch), max(worst * 1e3, launch)
        cflops = flops / self.flops_per_s * 1e3 if self.flops_per_s else None
        b = step_bound(bytes_ms=(kv + w.total_B) * ms, compute_ms=cflops, launch_ms=launch, comm_ms=comm,
                       sync_ms=sync)
        return StepCost(ctx=ctx, rows=rows, kv_GB=kv / 1e9, weights_GB=w.total_B / 1e9,
                        weights_worst_GB=w.total_worst_B / 1e9, GFLOP=flops / 1e9, kv_floor_ms=kv * ms,
                        weight_floor_ms=w.total_B * ms, weight_floor_worst_ms=w.total_worst_B * ms,
                        compute_floor_ms=cflops,
                        allreduces=n, allreduce_bytes=nbytes,
                        allreduce_us=self.comm.us_at(nbytes) if n else 0.0, comm_ms=comm, kernels=k,
                        kernel_us=self.kernel_us, launch_ms=launch, syncs=self.syncs, sync_ms=sync,
                        latency_floor_ms=launch + sync, bytes_floor_ms=(kv + w.total_B) * ms,
                        floor_ms=top + comm + sync, floor_worst_ms=top_worst + comm + sync,
                        binds=b.removesuffix("-bound"))


def with_launches(m: StepModel, gpu: str | None, kernels: Callable[[int], int] | int | None, *, syncs: int = 0,
                  counted: str = "", launch: KernelTime | None = None) -> StepModel:
    """``m`` with its launches counted: ``kernels`` per step (rows -> count, or one count for every row count;
    None: the structural least count of the model's layers), at GPU preset ``gpu``'s least kernel time (graph or
    eager as ``m.graphs``; ``gpus.kernel_time``: its measurement or the class bound), ``syncs`` host
    synchronisations per step. ``counted`` says where the count comes from; ``launch``: a measured least kernel
    time (a ``bench launch`` file) in place of the GPU's table."""
    kt = launch or kernel_time(gpu)
    if kernels is None:
        n = structural_kernels(m.attn.num_layers)
        kernels, counted = (lambda _r: n), f"at least {KERNELS_PER_LAYER} per layer + 2 (a structural lower bound)"
    elif isinstance(kernels, int):
        if kernels < 0:
            raise DDProbeError(f"kernels per step must be >= 0, got {kernels}")
        kernels = (lambda _r, k=kernels: k)
    us = kt.graph_us if m.graphs else kt.eager_us
    where = f"{gpu or 'this GPU'}{':' if kt.measured else ''} {kt.source}"  # unmeasured: "<gpu> not measured..."
    mode = "graph-replayed" if m.graphs else "eager"
    return replace(m, kernels=kernels, kernel_us=us, syncs=syncs, sync_us=kt.sync_us,
                   kernel_source=f"kernels: {counted or 'given'}; {us:.3g} us each ({mode}; {where})")


BOUNDS = ("bandwidth-bound", "compute-bound", "launch-bound", "communication-bound", "host-bound")


def step_bound(*, bytes_ms: float | None, compute_ms: float | None = None, launch_ms: float = 0.0,
               comm_ms: float = 0.0, sync_ms: float = 0.0) -> str:
    """THE rule: which of a step's floor terms is the largest, in ``BOUNDS``' words. The terms are those of the
    floor (max(bytes, FLOPs, launches) + communication + host syncs): the work (bytes at the bandwidth:
    "bandwidth-bound", or FLOPs at the tensor rate where those take longer: "compute-bound"), the launches (kernels
    x least kernel time: "launch-bound"), the collectives ("communication-bound") and the host synchronisations
    ("host-bound"). Ties go to the earlier in that order. Every command's "X-bound" about a step's floor comes from
    here (``StepCost.binds``, the floor table, gpu-util's step parts, the reports); gpu-util's telemetry verdicts
    (``gpu_verdict``: latency-bound, host-bound (idle)...) describe counters, not this."""
    flops = (compute_ms or 0.0) > (bytes_ms or 0.0)
    parts = [((compute_ms if flops else bytes_ms) or 0.0, "compute-bound" if flops else "bandwidth-bound"),
             (launch_ms or 0.0, "launch-bound"), (comm_ms or 0.0, "communication-bound"), (sync_ms or 0.0, "host-bound")]
    return max(parts, key=lambda p: p[0])[1]  # max keeps the first of equals


class KernelFloor(NamedTuple):
    us: float  # the least time one kernel (one call) can take
    bound: str  # "bandwidth-bound" or "compute-bound" (``step_bound`` of its two terms)
    basis: str  # what it is over: "measured ceilings (...)" or "the datasheet (...)", said with it


def kernel_floor(nbytes: float, flops: float | None = None, *, copy_Bps: float | None = None,
                 matmul_flops: float | None = None, bw_Bps: float | None = None, flops_per_s: float | None = None,
                 gpu: str = "") -> KernelFloor:
    """THE kernel floor (one kernel's own floor, never "the floor"): its bytes over the memory bandwidth, or its FLOPs
    over the tensor rate where those take longer, over the ceilings measured on the GPU (``copy_Bps``,
    ``matmul_flops``: a ``bench verify`` file's copy and matmul rows) where given, else over the datasheet's
    (``bw_Bps``, ``flops_per_s``: a ``gpus.GPUS`` preset or ``--bw``); ``basis`` says which (``bench verify``,
    ``trace``, the report)."""
    measured = copy_Bps is not None
    bw, rate = (copy_Bps, matmul_flops) if measured else (bw_Bps, flops_per_s)
    if not bw or not bw > 0:
        raise DDProbeError("a kernel floor needs a bandwidth: a measured copy ceiling or the GPU's datasheet")
    mem_us = nbytes / bw * 1e6
    cmp_us = flops / rate * 1e6 if flops and rate else None
    said = f"{bw / 1e12:.3g} TB/s" + (f", {rate / 1e12:.3g} TFLOP/s" if rate else "")
    basis = f"measured ceilings ({said})" if measured else f"the datasheet ({gpu + ': ' if gpu else ''}{said})"
    return KernelFloor(max(mem_us, cmp_us or 0.0), step_bound(bytes_ms=mem_us, compute_ms=cmp_us), basis)


# the words older results files (and the attention's own ``attn_bound``) used for a bound, in ``BOUNDS``' words
_OLD_BINDS = {"KV": "bandwidth", "weights": "bandwidth", "memory": "bandwidth", "launches": "launch"}


def bound_word(binds: str | None) -> str:
    """"X-bound" of a results file's ``binds`` (``StepCost.binds``' stem, or an older file's "KV", "weights",
    "launches"; an ``attn_bound``'s "memory"), "-" for none: how every command and report prints it."""
    if not binds:
        return "-"
    stem = _OLD_BINDS.get(binds, binds)
    return stem if stem.endswith("-bound") else f"{stem}-bound"


class WorkPart(NamedTuple):
    ms: float  # the work's floor: bytes over bandwidth or FLOPs over the tensor rate, the larger
    what: str  # "bytes" or "FLOPs"
    rate: str  # what it is over: "the GPU's bandwidth" or "the tensor rate"
    bound: str  # ``step_bound`` of the parts given


def parts_bound(latency_ms: float, bytes_ms: float | None, compute_ms: float | None = None, *, sync_ms: float = 0.0,
                comm_ms: float = 0.0) -> WorkPart:
    """A step's work part (its bytes at the GPU's bandwidth or its FLOPs at the tensor rate, the larger) and its
    bound by the one rule (``step_bound``); ``latency_ms`` is the latency floor (launches + ``sync_ms``)."""
    flops = (compute_ms or 0.0) > (bytes_ms or 0.0)
    ms = (compute_ms if flops else bytes_ms) or 0.0
    bound = step_bound(bytes_ms=bytes_ms, compute_ms=compute_ms, launch_ms=latency_ms - sync_ms, comm_ms=comm_ms,
                       sync_ms=sync_ms)
    return WorkPart(ms, "FLOPs" if flops else "bytes", "the tensor rate" if flops else "the GPU's bandwidth", bound)


def gap_split(c: StepCost, step_ms: float) -> dict:
    """How much of a measured step its launches and its work (bytes or FLOPs, ``parts_bound``) explain: each part's
    floor and its share of the step, and which bound the step is nearer."""
    w = parts_bound(c.latency_floor_ms, c.bytes_floor_ms, c.compute_floor_ms, sync_ms=c.sync_ms, comm_ms=c.comm_ms)
    return {"step_ms": step_ms, "launch_ms": c.launch_ms, "sync_ms": c.sync_ms, "bytes_ms": w.ms,
            "work": f"{w.what} at {w.rate}", "kernels": c.kernels, "kernel_us": c.kernel_us,
            "launch_share": c.latency_floor_ms / step_ms, "bytes_share": w.ms / step_ms, "bound": w.bound,
            "rest_ms": max(0.0, step_ms - c.floor_ms)}


def check_dcp(dcp: int, tp: int) -> None:
    if not isinstance(dcp, int) or isinstance(dcp, bool) or dcp < 1:
        raise DDProbeError(f"--dcp must be a positive integer, got {dcp!r}")
    if tp % dcp:
        raise DDProbeError(f"--dcp {dcp} does not divide --tp {tp} (decode context parallelism shards the KV over "
                           "tensor-parallel ranks)")
