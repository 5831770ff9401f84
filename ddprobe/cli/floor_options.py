"""The whole-step floor's options, declared once: ``@floor_options()`` adds them all to a command, which receives
them as one ``fo: FloorOptions`` (``ddprobe floor``; ``diagnose``, ``advise`` and ``trace`` can take it the same
way). The single ``*Opt`` annotations stay for commands that declare some of them one by one.

    @app.command()
    @errors_exit_1
    @floor_options(exclude=("budget",))  # a command whose engine options already have --budget
    def cmd(tctx: typer.Context, ..., fo: FloorOptions):
        model, config = fo.floor_model(spec)  # rows: fo.rows(eng.budget); or fo.sharding(), fo.launch()
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..physics.shapes import DTYPE_BYTES, dtype_name
from ..units import DDProbeError, parse_bandwidth, parse_tflops
from .options import checked, err, within

DTYPES = ", ".join(DTYPE_BYTES)  # the one dtype table (ddprobe.physics.shapes)
INT4_NOTE = ("int4 counts 0.5 B per weight, without its scales (K2's group-32 bf16 scales add 1/16): a lower "
             "bound")

TpOpt = Annotated[int, typer.Option("--tp", help="Tensor-parallel GPUs (MLA keeps the whole latent cache on each; "
                                                 "heads are split).")]
EpOpt = Annotated[int, typer.Option("--ep", help="Expert-parallel GPUs (divides --tp and the routed experts): each "
                                                 "holds experts / ep whole experts.")]
WeightDtypeOpt = Annotated[str, typer.Option("--weight-dtype", help=f"Weight dtype: {DTYPES}; {INT4_NOTE}.",
                                             callback=checked(dtype_name))]
ExpertDtypeOpt = Annotated[Optional[str], typer.Option("--expert-dtype", help="Routed experts' dtype when it differs "
                                                       "(K2's INT4 experts: int4); default --weight-dtype.",
                                                       callback=checked(dtype_name))]
KvDtypeOpt = Annotated[str, typer.Option("--kv-dtype", help=f"KV cache dtype: {DTYPES}.", callback=checked(dtype_name))]
SHARDING = ("tp", "ep", "weight_dtype", "expert_dtype")  # the parameter names of the options above
DcpOpt = Annotated[int, typer.Option("--dcp", help="Decode context parallelism: the KV is sharded over this many of "
                                                   "the --tp ranks (must divide --tp); 1: MLA's latent is replicated.")]
AllreduceUsOpt = Annotated[Optional[float], typer.Option("--allreduce-us", help="Latency of one tensor-parallel "
                                                         "all-reduce in us (default: the GPU's interconnect, "
                                                         "ddprobe.physics.step_model).")]
AllreduceFromOpt = Annotated[Optional[Path], typer.Option("--allreduce-from", help="A `ddprobe bench allreduce` "
                                                          "results file measured at --tp ranks.")]
COMM = ("dcp", "allreduce_us", "allreduce_from")  # the parameter names of the communication options
KernelsOpt = Annotated[Optional[int], typer.Option("--kernels", callback=checked(within(1, 10_000_000)),
                                                   help="Kernels per step of the server (default: a structural "
                                                        "lower bound, 5 per layer + 2; ddprobe.physics.step_model).")]
GpuOpt = Annotated[Optional[str], typer.Option("--gpu", help="GPU preset for bandwidth and tensor rate (default h200 "
                                                             "unless --bw).")]
BwOpt = Annotated[Optional[str], typer.Option("--bw", help="Memory bandwidth instead of a preset, e.g. 1.8TB/s (a "
                                                           "measured ceiling beats a datasheet).",
                                              callback=checked(parse_bandwidth))]
TflopsOpt = Annotated[Optional[float], typer.Option("--tflops", help="Dense bf16 tensor rate in TFLOP/s (default: the "
                                                                     "GPU preset's).", callback=checked(parse_tflops))]
LaunchFromOpt = Annotated[Optional[Path], typer.Option("--launch-from", help="A `ddprobe bench launch` results file: "
                                                       "its least kernel times replace the GPU's shipped ones (it must "
                                                       "be the --gpu's, unless --launch-any-gpu).")]
LaunchAnyGpuOpt = Annotated[bool, typer.Option("--launch-any-gpu", help="Use a --launch-from file measured on another "
                                                                        "GPU than --gpu (said in the output).")]
BudgetOpt = Annotated[Optional[int], typer.Option("--budget", help="Draft-tree nodes: the verify step has budget + 1 "
                                                                   "rows (default 8).",
                                                  callback=checked(within(1, 4096)))]
DEFAULT_BUDGET = 8

# parameter name -> (annotation, default) of every floor option, in --help order
_FLOOR_OPTS = {"gpu": (GpuOpt, None), "bw": (BwOpt, None), "tflops": (TflopsOpt, None), "tp": (TpOpt, 1),
               "ep": (EpOpt, 1), "dcp": (DcpOpt, 1), "weight_dtype": (WeightDtypeOpt, "bf16"),
               "expert_dtype": (ExpertDtypeOpt, None), "kv_dtype": (KvDtypeOpt, "bf16"),
               "allreduce_us": (AllreduceUsOpt, None), "allreduce_from": (AllreduceFromOpt, None),
               "kernels": (KernelsOpt, None), "launch_from": (LaunchFromOpt, None),
               "launch_any_gpu": (LaunchAnyGpuOpt, False), "budget": (BudgetOpt, None)}
FLOOR_OPTION_NAMES = tuple(_FLOOR_OPTS)


@dataclass(frozen=True)
class FloorOptions:
    """The floor options as typed (``floor_options``); an excluded option keeps its default here."""

    gpu: Optional[str] = None
    bw: Optional[str] = None
    tflops: Optional[float] = None
    tp: int = 1
    ep: int = 1
    dcp: int = 1
    weight_dtype: str = "bf16"
    expert_dtype: Optional[str] = None
    kv_dtype: str = "bf16"
    allreduce_us: Optional[float] = None
    allreduce_from: Optional[Path] = None
    kernels: Optional[int] = None
    launch_from: Optional[Path] = None
    launch_any_gpu: bool = False
    budget: Optional[int] = None

    def rows(self, budget: Optional[int] = None) -> int:
        """Verify rows: ``budget`` (a command's own, e.g. the engine's) or --budget (default 8), + 1."""
        return (budget if budget is not None else self.budget if self.budget is not None else DEFAULT_BUDGET) + 1

    def bw_Bps(self) -> Optional[float]:
        return parse_bandwidth(self.bw) if self.bw else None

    def flops_per_s(self) -> Optional[float]:
        if self.tflops is not None and not self.tflops > 0:
            raise DDProbeError(f"--tflops must be greater than zero, got {self.tflops}")
        return self.tflops * 1e12 if self.tflops else None

    def sharding(self):
        """The sharding, dtypes and all-reduce source (``probes.floor.Sharding``)."""
        from ..probes.floor import Sharding

        return Sharding(tp=self.tp, ep=self.ep, dcp=self.dcp, weight_dtype=self.weight_dtype,
                        expert_dtype=self.expert_dtype, kv_dtype=self.kv_dtype, allreduce_us=self.allreduce_us,
                        allreduce_from=str(self.allreduce_from) if self.allreduce_from else None)

    def launch(self):
        """The least kernel times of --launch-from (``physics.gpus.load_launch``), or None: the GPU's shipped ones.
        --launch-any-gpu without --launch-from is refused."""
        from ..physics.gpus import load_launch

        if self.launch_from is None:
            if self.launch_any_gpu:
                raise DDProbeError("--launch-any-gpu needs --launch-from (a `ddprobe bench launch` results file)")
            return None
        return load_launch(self.launch_from)

    def floor_model(self, spec, *, kernels: Optional[int] = None, kernels_source: str = ""):
        """(step model, config) of served model ``spec`` under these options (``probes.floor.served_model``): the
        one planner's input filled from them; ``kernels`` a count the command found (``kernels_source``: where,
        e.g. counted on the GPU) where --kernels is not given."""
        from ..probes.floor import served_model

        note_dense(spec, self.ep)
        return served_model(spec, self.sharding(), self.gpu, self.bw_Bps(), self.flops_per_s(),
                            self.kernels if self.kernels is not None else kernels, launch=self.launch(),
                            launch_any_gpu=self.launch_any_gpu,
                            kernels_source="--kernels" if self.kernels is not None else kernels_source)


def floor_options(*, exclude: tuple[str, ...] = (), **defaults):
    """Add the floor options (``FLOOR_OPTION_NAMES`` but ``exclude``; ``defaults`` override theirs per command) to a
    Typer command, which receives them as one ``fo: FloorOptions`` keyword."""
    unknown = (set(exclude) | set(defaults)) - set(_FLOOR_OPTS)
    if unknown:
        raise TypeError(f"unknown floor options {sorted(unknown)}")
    names = [n for n in _FLOOR_OPTS if n not in exclude]

    def deco(fn):
        sig = inspect.signature(fn, eval_str=True)
        params = [p for p in sig.parameters.values() if p.name != "fo"]
        taken = {p.name for p in params}
        clash = taken & set(names)
        if clash:
            raise TypeError(f"{fn.__name__} declares floor options itself: {sorted(clash)} (exclude them)")
        params += [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, annotation=_FLOOR_OPTS[n][0],
                                     default=defaults.get(n, _FLOOR_OPTS[n][1])) for n in names]

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            fo = FloorOptions(**{n: kwargs.pop(n) for n in names if n in kwargs})
            return fn(*args, fo=fo, **kwargs)

        wrapper.__signature__ = sig.replace(parameters=params)
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        del wrapper.__wrapped__  # typer must read the new signature, not fn's
        return wrapper

    return deco


def check_latency(rows) -> None:
    """A step time below its latency floor (kernels x least kernel time + syncs) is refused in one line."""
    from ..units import DDProbeError, fmt_time, fmt_tokens

    for r in rows:
        if r.step_ms is not None and r.step_ms < r.latency_floor_ms:
            raise DDProbeError(f"--step-ms {fmt_time(r.step_ms / 1e3)} at {fmt_tokens(r.ctx)} is below the latency "
                               f"floor {fmt_time(r.latency_floor_ms / 1e3)} ({r.kernels} kernels x "
                               f"{r.kernel_us:.3g} us): no step of these kernels is that fast (give --kernels if the "
                               "server launches fewer)")


def note_dense(spec, ep: int) -> None:
    """``--ep`` on a dense model changes nothing: said in one line (floor, diagnose)."""
    if ep > 1 and not spec.n_routed_experts:
        err.print(f"note: {spec.name} is dense (no routed experts): --ep {ep} has no effect", highlight=False)
