"""The one planner: every command's step model comes from ``plan(StepInput)`` (stdlib only).

A ``StepInput`` is everything a floor depends on, typed once: the model (a served model or a ddprobe engine preset,
``physics.models.get_model``), its sharding (tp / ep / dcp), its weight, expert and KV dtypes, the GPU (a preset, or
a bandwidth and tensor rate), the kernels per step and where that count comes from, graphs or eager, host syncs,
and where the communication time comes from. ``floor``, ``diagnose``, ``advise``, ``trace`` and ``gpu-util`` fill
it from their options (or from what they measured) and call ``plan``; nothing else builds a ``StepModel``
(``tests/test_physics.py`` walks the package to hold that).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from ..units import DDProbeError
from .gpus import KernelTime, get_gpu
from .interconnect import Comm
from .models import ModelSpec
from .shapes import dtype_name
from .step_model import StepModel, with_launches

DEFAULT_GPU = "h200"  # the GPU a floor is for when neither a preset nor a bandwidth is given (said in the result)


@dataclass(frozen=True)
class StepInput:
    """What one GPU's decode step is, for its floor (see the module docstring)."""

    model: ModelSpec
    tp: int = 1
    ep: int = 1
    dcp: int = 1
    weight_dtype: str = "bf16"
    expert_dtype: str | None = None  # None: weight_dtype
    kv_dtype: str = "bf16"
    gpu: str | None = None  # a GPU preset (``physics.gpus.GPUS``); None with bw_Bps: a GPU given by its numbers
    bw_Bps: float | None = None  # overrides the preset's datasheet bandwidth
    flops_per_s: float | None = None
    kernels: int | Callable[[int], int] | None = None  # per step (rows -> count); None: the structural least count
    kernels_source: str = ""  # where the count comes from ("--kernels", "counted on the GPU: ...", "the trace")
    graphs: bool = True  # the step is a replayed CUDA graph (else eager launches)
    syncs: int = 0  # host synchronisations per step
    comm: Comm | None = None  # None with tp > 1: communication not counted (the caller says why)
    launch: KernelTime | None = None  # a measured least kernel time (``bench launch`` file); None: the GPU's table
    launch_any_gpu: bool = False  # use ``launch`` though it was measured on another GPU than ``gpu`` (said)

    def rates(self) -> tuple[str | None, float, float | None]:
        """(GPU preset name, bandwidth, tensor rate): the preset's datasheet unless numbers are given; h200 when
        neither a preset nor a bandwidth is given."""
        g = get_gpu(self.gpu) if self.gpu is not None else (None if self.bw_Bps else get_gpu(DEFAULT_GPU))
        return (g.name if g else None), self.bw_Bps or g.bw_Bps, self.flops_per_s or (g.bf16_flops if g else None)


def plan(inp: StepInput) -> StepModel:
    """The step model of ``inp``: the one constructor of ``StepModel`` every command reaches."""
    spec = inp.model
    if spec.kind == "engine" and (inp.tp > 1 or inp.ep > 1):
        raise DDProbeError(f"{spec.name} is a ddprobe engine preset, already one GPU's share: --tp/--ep do not apply "
                           "(a served model such as kimi-k2.6 takes them)")
    wd = dtype_name(inp.weight_dtype)
    ed = dtype_name(inp.expert_dtype) if inp.expert_dtype else wd
    spec.moe.check(inp.tp, inp.ep)
    gpu, bw, rate = inp.rates()
    launch = launch_for(inp.launch, gpu, inp.launch_any_gpu)
    m = StepModel(attn=spec.attn, weights=lambda r: spec.step_weights(rows=r, tp=inp.tp, ep=inp.ep, dense_dtype=wd,
                                                                      expert_dtype=ed),
                  bw_Bps=bw, flops_per_s=rate, hidden=spec.hidden_size, tp=inp.tp, dcp=inp.dcp,
                  kv_dtype=dtype_name(inp.kv_dtype), comm=inp.comm, graphs=inp.graphs)
    return with_launches(m, gpu, inp.kernels, syncs=inp.syncs, counted=inp.kernels_source, launch=launch)


def launch_for(kt: KernelTime | None, gpu: str | None, any_gpu: bool) -> KernelTime | None:
    """A measured least kernel time for a floor of GPU preset ``gpu``: refused in one line when it was measured on
    another GPU (a GPU given by its numbers, ``gpu`` None, takes any), unless ``any_gpu``, where its source says so."""
    if kt is None or gpu is None or kt.gpu == gpu:
        return kt
    on = kt.device or "an unnamed GPU"
    if not any_gpu:
        raise DDProbeError(f"{kt.file or 'the launch file'} was measured on {on}, not "
                           f"on the {gpu} this floor is for: its launch times are not this GPU's (give "
                           f"--gpu {kt.gpu or '<that GPU>'}, or --launch-any-gpu to use them anyway)")
    return replace(kt, source=f"{kt.source}; used for the {gpu} as asked (--launch-any-gpu)")
