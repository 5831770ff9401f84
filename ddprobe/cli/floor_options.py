"""The whole-step floor's sharding and dtype options, declared once for `ddprobe floor` and `ddprobe diagnose`."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..physics.shapes import DTYPE_BYTES, dtype_name
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
