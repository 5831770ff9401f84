"""Typed rows of every results-file kind: the contract between the probes that write and the reports that read.

One dataclass per kind (``KINDS``). Each field is a JSON key of today's files (files are the interface: other tools
read them, so the names stay) with its type, its unit and its range declared in the annotation:
``floor_ms: Ms`` is ``Annotated[float, Unit("ms"), AT_LEAST_0]``. A field without a default must be in every row;
``X | None`` may be null. Keys a schema does not name are kept (``extra``), never refused.

``parse_row(kind, row, where)`` checks one row and gives the typed row, or raises one ``DDProbeError`` line naming
the field, its value with its unit and the rule it breaks. ``ResultWriter`` checks every row it writes (a probe
that writes a bad row is a bug) and ``results.load`` every row it reads; the reports read ``Result.records``.
``upgrade_row`` maps an older file's floor and bench keys to today's (the telemetry's old keys are mapped by
``signals.upgrade``). Stdlib only.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Annotated, Any, Union

from . import signals
from .units import DDProbeError

SCHEMA = "ddprobe.result/2"
OLD_SCHEMAS = ("ddprobe.result/1",)  # read and upgraded on load


@dataclass(frozen=True)
class Unit:
    symbol: str  # "ms", "GB/s", "tokens", ... ("" for a plain number)


@dataclass(frozen=True)
class Bound:
    """A range physics sets: ``lo`` <= v (or lo < v when ``open_lo``) and v <= ``hi``; always finite."""
    lo: float | None = None
    hi: float | None = None
    open_lo: bool = False

    def problem(self, v: float) -> str | None:
        if not math.isfinite(v):
            return "must be finite"
        if self.lo is not None and (v <= self.lo if self.open_lo else v < self.lo):
            return f"must be {'>' if self.open_lo else '>='} {self.lo:g}"
        if self.hi is not None and v > self.hi:
            return f"must be <= {self.hi:g}"
        return None

    def say(self) -> str:
        """The range as the docs say it: ">= 0", "> 0", "0 to 1" ("" for finite only)."""
        if self.lo is not None and self.hi is not None:
            return f"{self.lo:g} to {self.hi:g}"
        if self.lo is not None:
            return f"{'>' if self.open_lo else '>='} {self.lo:g}"
        return f"<= {self.hi:g}" if self.hi is not None else ""


AT_LEAST_0, AT_LEAST_1, FINITE = Bound(lo=0), Bound(lo=1), Bound()
Ms = Annotated[float, Unit("ms"), AT_LEAST_0]
Us = Annotated[float, Unit("us"), AT_LEAST_0]
Sec = Annotated[float, Unit("s"), AT_LEAST_0]
GB = Annotated[float, Unit("GB"), AT_LEAST_0]
Bytes = Annotated[float, Unit("B"), AT_LEAST_0]
BytesPerToken = Annotated[float, Unit("B/token"), AT_LEAST_0]
GBps = Annotated[float, Unit("GB/s"), AT_LEAST_0]
TFLOPs = Annotated[float, Unit("TFLOP/s"), AT_LEAST_0]
GFLOP = Annotated[float, Unit("GFLOP"), AT_LEAST_0]
Flops = Annotated[float, Unit("FLOP"), AT_LEAST_0]
Tokens = Annotated[int, Unit("tokens"), AT_LEAST_0]
Context = Annotated[int, Unit("tokens"), AT_LEAST_1]
TokensPerStep = Annotated[float, Unit("tokens/step"), AT_LEAST_0]
CommitLen = Annotated[float, Unit("tokens/step"), AT_LEAST_1]  # the bonus token at least
TokensPerSec = Annotated[float, Unit("tokens/s"), Bound(lo=0, hi=1e7)]  # no request decodes 10 M tokens/s
Count = Annotated[int, Unit(""), AT_LEAST_0]
Number = Annotated[float, Unit(""), AT_LEAST_0]
Ratio = Annotated[float, Unit("x"), AT_LEAST_0]  # a ratio of two like quantities (gap, speedup)
Fraction = Annotated[float, Unit("fraction"), AT_LEAST_0]  # of a ceiling (a measurement may pass it)
Share = Annotated[float, Unit("fraction"), Bound(lo=0, hi=1)]  # a part of a whole
Seconds = Annotated[float, Unit("s"), FINITE]  # a clock reading (may be negative before a marker)
STEP_MS = Bound(lo=1e-3, hi=3.6e6)  # a measured step: 1 us to 1 h
StepMs = Annotated[float, Unit("ms"), STEP_MS]  # a measured step: a typed step time's 1 us - 1 h
DeltaMs = Annotated[float, Unit("ms"), FINITE]  # a difference of two times (either sign)
TokS = Annotated[float, Unit("tokens/s"), Bound(lo=0, hi=1e9)]  # at most 1025 tokens a step of at least 1 us
# the telemetry signals' units, read from their keys' suffixes (signals.TABLE names them once)
SIGNAL_UNITS = {"_pct": "%", "_W": "W", "_J": "J", "_MHz": "MHz", "_GB": "GB"}


@dataclass(frozen=True)
class FieldSpec:
    name: str
    base: type  # int, float, str, bool, dict, list or object (anything)
    nullable: bool
    required: bool
    unit: str | None
    bound: Bound | None

    def problem(self, v: Any) -> str | None:
        """Why ``v`` is not a value of this field (None: it is)."""
        if v is None:
            return None if self.nullable else "is null (must be a value)"
        if self.base is object:
            return None
        ok = (isinstance(v, (int, float)) and not isinstance(v, bool)) if self.base is float else \
            (isinstance(v, int) and not isinstance(v, bool)) if self.base is int else isinstance(v, self.base)
        if not ok:
            what = {float: "a number", int: "an integer", str: "text", bool: "true or false", dict: "an object",
                    list: "a list"}[self.base]
            return f"is {type(v).__name__} {str(v)[:40]!r} (must be {what}{' in ' + self.unit if self.unit else ''})"
        why = self.bound.problem(v) if self.bound and self.base in (int, float) else None
        return f"is {v!r}{' ' + self.unit if self.unit else ''} ({why})" if why else None

    def say(self) -> str:
        """The field as the docs list it: ``floor_ms: number, ms, >= 0, optional``."""
        rng = self.bound.say() if self.bound else ""
        what = {float: "number", int: "integer", str: "text", bool: "bool", dict: "object", list: "list",
                object: "any"}[self.base]
        parts = [what, self.unit or "", rng, "or null" if self.nullable else "",
                 "required" if self.required else "optional"]
        return f"{self.name}: {', '.join(p for p in parts if p)}"


def _spec(name: str, hint: Any, required: bool) -> FieldSpec:
    nullable, unit, bound = False, None, None
    if typing.get_origin(hint) in (Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        nullable, hint = True, args[0]
    if typing.get_origin(hint) is Annotated:
        hint, *meta = typing.get_args(hint)
        unit = next((m.symbol for m in meta if isinstance(m, Unit)), None)
        bound = next((m for m in meta if isinstance(m, Bound)), None)
    base = typing.get_origin(hint) or hint
    return FieldSpec(name, object if base is Any else base, nullable, required, unit, bound)


@functools.cache
def fields_of(cls: type) -> tuple[FieldSpec, ...]:
    hints = typing.get_type_hints(cls, include_extras=True)
    return tuple(_spec(f.name, hints[f.name], f.default is dataclasses.MISSING
                       and f.default_factory is dataclasses.MISSING)
                 for f in dataclasses.fields(cls) if f.name != "extra")


@dataclass(frozen=True)
class Row:
    """A typed row; ``extra`` holds the keys its schema does not name."""

    def problem(self, config: dict) -> str | None:  # checks across fields (and the file's config)
        return None


@dataclass(frozen=True)
class FloorRow(Row):
    """``ddprobe floor``: the whole-step floor of one verify step at one context, per GPU. Files written before the
    whole step was modelled carry the attention alone (``attn_*``): their step fields are absent."""
    ctx: Context
    kv_GB: GB  # KV one GPU reads
    attn_floor_ms: Ms  # the attention alone: max(KV / bandwidth, attention FLOPs / tensor rate)
    floor_ms: Ms | None = None  # THE floor: the whole step
    rows: Count | None = None  # query rows (budget + 1)
    kv_B_per_token: BytesPerToken | None = None  # per GPU, before dcp sharding
    weights_GB: GB | None = None  # weights read, routed experts expected under uniform routing
    weights_worst_GB: GB | None = None  # every row on different experts
    experts_per_layer: Number | None = None  # expected distinct local experts per MoE layer
    experts_worst: Count | None = None
    GFLOP: GFLOP | None = None  # attention over the context + 2 x params x rows
    kv_floor_ms: Ms | None = None  # KV bytes / bandwidth
    weight_floor_ms: Ms | None = None  # weight bytes / bandwidth
    weight_floor_worst_ms: Ms | None = None
    compute_floor_ms: Ms | None = None  # the step's FLOPs / tensor rate
    allreduces: Count | None = None  # tensor-parallel all-reduces per step
    allreduce_bytes: Bytes | None = None
    allreduce_us: Us | None = None  # one all-reduce
    comm_ms: Ms | None = None  # all the all-reduces of a step
    launch_ms: Ms | None = None  # kernels x the least time per kernel: the launches' floor
    kernels: Count | None = None  # kernels per step (0: not counted)
    kernel_us: Us | None = None  # the least time of one (ddprobe.physics.gpus.KERNEL_TIMES)
    syncs: Count | None = None  # host synchronisations per step
    sync_ms: Ms | None = None
    latency_floor_ms: Ms | None = None  # launches + syncs
    bytes_floor_ms: Ms | None = None  # (KV + weights) / bandwidth
    floor_worst_ms: Ms | None = None
    binds: str | None = None  # the floor is <binds>-bound: launch, bandwidth, compute, communication or host
    decode_floor_ms: Ms | None = None  # the plain one-row decode step's floor
    attn_GFLOP: GFLOP | None = None
    attn_compute_floor_ms: Ms | None = None
    attn_bound: str | None = None  # "memory" or "compute"
    step_ms: Ms | None = None  # the measured step
    eff_bw_GBps: GBps | None = None  # KV bytes / step
    gap: Ratio | None = None  # step / floor
    attn_gap: Ratio | None = None  # step / attention floor
    attn_gap_if_rows_reread: Ratio | None = None
    below_floor: bool | None = None
    launch_share: Ratio | None = None  # latency floor / step
    bytes_share: Ratio | None = None  # max(bytes, compute) floor / step
    step_bound: str | None = None  # with a step: binds + "-bound" (physics.step_model.step_bound, the one rule)
    extra: dict = field(default_factory=dict)

    def problem(self, config: dict) -> str | None:
        """A gap that is not the step over its floor (the whole step's, or the attention's): what a report prints
        as "12.3x the floor" must be that ratio."""
        for gap, floor in (("gap", "floor_ms"), ("attn_gap", "attn_floor_ms")):
            g, f = getattr(self, gap), getattr(self, floor)
            if g is not None and f and self.step_ms is not None and abs(g - self.step_ms / f) > 0.01 * g + 1e-9:
                return f"{gap!r} is {g:g}, not step / floor ({self.step_ms:g} / {f:g} ms)"
        return None


@dataclass(frozen=True)
class CommitRow(Row):
    """``ddprobe commit``: one (text, context) cell of the commit-length probe. Across fields: ``commit_len`` at most
    ``max_new_tokens`` and, where the file's ``config.budget`` says the tree budget, at most budget + 1;
    ``verify_steps`` at most ``completion_tokens``."""
    ctx: Context
    text: str  # predictable, novel, recall
    commit_len: CommitLen | None  # tokens committed per verify step, bonus included (null: no step)
    backend: str | None = None
    prompt_tokens: Tokens | None = None
    reused_tokens: Tokens | None = None  # prompt tokens served from the previous cell's cache
    max_new_tokens: Tokens | None = None
    completion_tokens: Tokens | None = None  # the first comes from prefill
    verify_steps: Count | None = None
    accepted_depth: TokensPerStep | None = None  # commit_len - 1
    sglang_accept_length: TokensPerStep | None = None  # completion tokens / verify steps (prefill's token counted)
    commit_len_std: TokensPerStep | None = None
    commit_len_p10: TokensPerStep | None = None
    commit_len_p90: TokensPerStep | None = None
    drafts_per_step: Number | None = None  # draft nodes proposed per verify step
    accepted_per_pos: list | None = None  # per draft position p (0 first): steps whose draft token at p was accepted
    cond_accept_per_pos: list | None = None  # conditional acceptance per draft position: at p / at p - 1 (0: / steps)
    prefill_s: Sec | None = None
    decode_s: Sec | None = None
    e2e_s: Sec | None = None  # the request end to end, prefill included
    decode_ms_per_step: Ms | None = None  # decode time / verify steps
    tokens_per_s: TokensPerSec | None = None  # decode tokens / decode time
    output_repeats: Share | None = None  # share of the output that repeats itself
    verify_ms_mean: Ms | None = None
    draft_ms_mean: Ms | None = None
    tree_nodes: Count | None = None
    finish_reason: str | None = None
    recall_copied_words: Count | None = None
    suspect: str | None = None
    tree: str | None = None  # the draft's shape: ddtree or chain (null: a server's, or a file from before shapes)
    budget: Count | None = None  # this cell's draft nodes (a chain: its depth); else config.budget
    ran_commit_len: CommitLen | None = None  # the commit length over the steps that ran, a cut last step whole
    spine_commit_len: CommitLen | None = None  # the tree's own spine (rank-0 path) on the same steps and picks
    gain_over_spine: Ratio | None = None  # ran_commit_len / spine_commit_len
    sibling_share: Share | None = None  # committed draft tokens from siblings of rank >= 1
    spine_violations: Count | None = None  # steps where the tree accepted fewer than its spine: a bug
    spine_violation_first: dict | None = None  # the first such step: step, tree_tokens, spine_tokens
    step_depths: list | None = None  # per step that ran: the accepted depth
    step_ranks: list | None = None  # per step that ran: the sibling rank of each accepted node (0: the spine)
    extra: dict = field(default_factory=dict)

    def problem(self, config: dict) -> str | None:
        """What no measurement can say: a commit length above max_new_tokens or above budget + 1 (the row's budget,
        else the file's; a step commits at most its accepted nodes and the bonus token), more verify steps than
        tokens, a shape other than ddtree or chain, a commit-length statistic or accepted depth above what the budget
        allows."""
        c, n = self.commit_len, self.max_new_tokens
        b = self.budget if self.budget is not None else config.get("budget")
        if self.tree is not None and self.tree not in ("ddtree", "chain"):
            return f"'tree' is {self.tree!r} (must be ddtree or chain)"
        cut_whole = self.backend == "vllm" and _is_int(b)  # vLLM counts a cut last step whole: budget + 1 bounds it
        if c is not None and n is not None and n >= 1 and c > n + 1e-9 and not cut_whole:
            return f"'commit_len' is {c:g} tokens/step (must be <= max_new_tokens, {n})"
        if c is not None and _is_int(b) and b >= 0 and c > b + 1 + 1e-9:
            return f"'commit_len' is {c:g} tokens/step (must be <= budget + 1, {b + 1})"
        if _is_int(b) and b >= 0:  # the commit length's other statistics are bounded as it is
            for key, most in (("commit_len_p10", b + 1), ("commit_len_p90", b + 1), ("commit_len_std", b + 1),
                              ("ran_commit_len", b + 1), ("spine_commit_len", b + 1), ("accepted_depth", b)):
                v = getattr(self, key)
                if v is not None and v > most + 1e-9:
                    return f"{key!r} is {v:g} tokens/step (must be <= {most}, as the tree budget is {b})"
        if self.verify_steps is not None and self.completion_tokens is not None \
                and self.verify_steps > max(self.completion_tokens, 1):
            return f"'verify_steps' is {self.verify_steps} for {self.completion_tokens} tokens (must be <= tokens)"
        return None


def one_step_tokens(budget: int) -> int:
    """The fewest tokens a commit cell must decode for its commit length to be the drafter's: the first is the
    prefill's, and a verify step commits up to budget + 1, so one whole step needs budget + 2 (a cell of 2 tokens
    measures 1.00 whatever the drafter)."""
    return budget + 2


def too_short(rows: list, budget) -> tuple[Any, int] | None:
    """The first commit row (``CommitRow``) that decoded fewer than ``one_step_tokens`` of its budget (the row's own,
    else ``budget``, the file's), with that budget; None where every row with a known length and budget has them."""
    for r in rows:
        b = r.budget if r.budget is not None else budget
        if _is_int(b) and b >= 1 and r.max_new_tokens is not None and r.max_new_tokens < one_step_tokens(b):
            return r, b
    return None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# what one GPU's reading can be, per unit: a percentage of a whole (a sampled ratio may round a little past 100), a
# GPU's power (no card draws 100 kW), a clock (100 GHz), memory (1 PB); an energy counter only grows
SIGNAL_BOUNDS = {"%": Bound(lo=0, hi=105), "W": Bound(lo=0, hi=1e5), "MHz": Bound(lo=0, hi=1e5),
                 "GB": Bound(lo=0, hi=1e6), "J": AT_LEAST_0}


def _signal_field(key: str) -> tuple:
    unit = next((u for suffix, u in SIGNAL_UNITS.items() if key.endswith(suffix)), "")
    bound = Bound(lo=0, hi=1e5, open_lo=True) if key == "power_limit_W" else SIGNAL_BOUNDS.get(unit, AT_LEAST_0)
    return key, Annotated[float, Unit(unit), bound] | None, field(default=None)


_GpuUtilBase = dataclasses.make_dataclass(
    "_GpuUtilBase", [("t_s", Seconds), ("gpu", Count), ("window_s", Sec | None, field(default=None)),
                     ("phase", str | None, field(default=None)), ("node", str | None, field(default=None)),
                     ("node_gpu", Any, field(default=None)),  # as the source labels it ("0", "0.1" for MIG)
                     ("clock_reasons", str | None, field(default=None)),
                     *[_signal_field(k) for k in signals.NUMERIC_KEYS],
                     ("extra", dict, field(default_factory=dict))],
    bases=(Row,), frozen=True, namespace={"__module__": __name__})


class GpuUtilRow(_GpuUtilBase):
    """``ddprobe gpu-util``: one telemetry tick of one GPU: ``t_s`` (s since the start), ``gpu`` (index), the
    phase, and every signal of ``signals.TABLE`` (null where a source does not read it; what each measures and where
    it is read: docs/gpu-util.md), its unit its key's suffix."""


@dataclass(frozen=True)
class BenchVerifyRow(Row):
    """``ddprobe bench verify`` and ``diagnose``: one verify-attention path at one (context, heads); ``kind`` "step61"
    (a whole multi-layer step, timed in ``step_ms``) or absent (one layer's call, timed in ``us``)."""
    path: str
    ctx: Context
    heads: Count | None = None
    rows: Count | None = None
    kind: str | None = None
    us: Us | None = None  # one call
    step_ms: Ms | None = None  # a whole step (kind "step61")
    floor_us: Us | None = None  # the kernel floor: max(bytes / copy bandwidth, FLOPs / matmul rate)
    bytes: Bytes | None = None
    flops: Flops | None = None
    GBps: GBps | None = None
    TFLOPs: TFLOPs | None = None
    gap: Ratio | None = None  # time / kernel floor
    bw_frac: Fraction | None = None
    mm_frac: Fraction | None = None
    rel_err: Number | None = None  # against the fp32 reference
    ok: bool | None = None
    n_sets: Count | None = None
    timing: str | None = None
    plan: str | None = None  # "host" or "device": where the path's plan is built
    bound: Context | None = None  # the device plan's bound (max_prefix, at least ctx) where a variant set it (bound=)
    kernel: str | None = None  # the kernel the path ran
    gpu: str | None = None
    error: str | None = None
    skipped: str | None = None
    kernels: dict | None = None
    config: dict | None = None
    tuning: dict | None = None
    step_kernels: Count | None = None  # kind "step61": the GPU's kernels per step, from a profile of its replay
    kernels_ms: Ms | None = None  # ... the sum of their own durations per step
    span_ms: Ms | None = None  # ... first kernel's start to the last one's end
    gaps_ms: Ms | None = None  # ... the span's time with no kernel running (launch gaps)
    trace: str | None = None  # ... that profile as a Chrome trace (--step-trace)
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class AllreduceRow(Row):
    """``ddprobe bench allreduce``: one message size on the ranks of one host."""
    bytes: Annotated[int, Unit("B"), AT_LEAST_0]
    us: Us | None  # median all-reduce time
    label: str | None = None
    p10_us: Us | None = None
    p90_us: Us | None = None
    algbw_GBps: GBps | None = None
    graphs: bool | None = None
    samples: Count | None = None
    calls: Count | None = None
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class AdviseRow(Row):
    """``ddprobe advise``: one (path, text, context, budget) point: speculation's tokens/s against plain decoding's.
    Across fields: ``commit_len`` at most ``budget`` + 1."""
    path: str
    text: str
    ctx: Context
    budget: Count
    commit_len: CommitLen
    verify_ms: Annotated[float, Unit("ms"), Bound(lo=0, open_lo=True)]
    decode_ms: Annotated[float, Unit("ms"), Bound(lo=0, open_lo=True)]
    source: str | None = None
    spec_tok_s: TokensPerSec | None = None
    plain_tok_s: TokensPerSec | None = None
    speedup: Ratio | None = None  # spec / plain
    note: str | None = None
    tree: str | None = None  # the draft's shape: ddtree (budget = nodes) or chain (budget = its depth)
    kernel: str | None = None  # what the verify step ran on, where it is not the path alone
    decode_kernel: str | None = None  # what the plain decode step ran on, where it is not the path alone
    extra: dict = field(default_factory=dict)

    def problem(self, config: dict) -> str | None:
        if self.tree is not None and self.tree not in ("ddtree", "chain"):
            return f"'tree' is {self.tree!r} (must be ddtree or chain)"
        if self.commit_len > self.budget + 1 + 1e-9:
            return f"'commit_len' is {self.commit_len:g} tokens/step (must be <= budget + 1, {self.budget + 1})"
        return None


@dataclass(frozen=True)
class DiagnoseRow(Row):
    """``ddprobe diagnose``: one step of the pipeline (commit, gpu-util, floor, verify, advise) and how it ended."""
    step: str
    status: str
    reason: str | None = None
    file: str | None = None
    seconds: Sec | None = None
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class LaunchRow(Row):
    """``ddprobe bench launch``: the least time per kernel of one kind of launch (graph-empty, graph-small,
    eager-small, sync) on this GPU."""
    kind: str
    us: Us  # median per kernel (per sync)
    p10_us: Us | None = None
    p90_us: Us | None = None
    kernels: Count | None = None  # launches per sample
    samples: Count | None = None
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class TraceRow(Row):
    """``ddprobe trace``: one rank's profiler trace; its verify steps' median GPU span, the split by kernel class
    (``ddprobe.kernel_classes``, time and launches per step), the largest attention kernel's grid against the SMs,
    and with a model its effective KV bandwidth, kernel floor and the whole step against the floor."""
    rank: Count
    file: str
    steps: Count
    method: str  # "markers", "graph launches" or "repeating kernel sequence"
    step_ms: Ms  # the median step's GPU span: first kernel's start to last kernel's end
    busy_ms: Ms | None = None  # the union of that step's kernels
    idle_ms: Ms | None = None  # span - busy of that step: the GPU idle inside it
    overlap_ms: Ms | None = None  # mean per step: summed kernel time beyond the busy time (several streams)
    gpu: str | None = None
    attention_ms: Ms | None = None
    moe_ms: Ms | None = None
    gemm_ms: Ms | None = None
    communication_ms: Ms | None = None
    norm_elementwise_ms: Ms | None = None
    sampling_tree_ms: Ms | None = None
    other_ms: Ms | None = None
    attn_kernel: str | None = None  # the attention kernel that took most time
    attn_us: Us | None = None  # its mean launch
    attn_calls: Number | None = None  # its launches per step
    attn_blocks: Count | None = None  # its grid's blocks
    sms: Count | None = None  # the GPU's SMs (the trace's deviceProperties)
    attn_eff_bw_GBps: GBps | None = None  # KV bytes one call reads / its time (with --model --ctx)
    attn_kernel_floor_us: Us | None = None  # the kernel floor: KV bytes one call reads / bandwidth
    attn_vs_kernel_floor: Ratio | None = None
    floor_ms: Ms | None = None  # the whole step's floor (the step model)
    gap: Ratio | None = None  # step / floor
    binds: str | None = None  # the floor's bound word (physics.step_model.step_bound, without "-bound")
    floor_from: str | None = None  # where the floor's kernels, launches, communication and rows come from
    kernels_per_step: Count | None = None  # the kernels the floor counts per step
    ctx: Context | None = None  # the context the floor is at (per request)
    ctx_from: str | None = None  # "--ctx" or "the step labels"
    period_ms: Ms | None = None  # median start-to-start time of consecutive steps
    graphs: bool | None = None  # the steps' kernels were replayed from CUDA graphs
    mode: str | None = None  # the step labels' mode measured: verify, decode, extend, mixed
    batch: Count | None = None  # the step labels' requests per step
    ctx_labels: Context | None = None  # the step labels' median context per request
    extra: dict = field(default_factory=dict)

    def problem(self, config: dict) -> str | None:
        """What no trace can say: busy or idle time beyond the step's span, span != busy + idle, a class's time per
        step beyond the span plus the overlap (summed kernel time counts overlapping work twice), a gap that is not
        step / floor. (A class's time is a mean over the steps and the span the median step's: twice is the room.)"""
        span, tol = self.step_ms, 1e-6 + 0.01 * self.step_ms
        for name in ("busy_ms", "idle_ms"):
            v = getattr(self, name)
            if v is not None and v > span + tol:
                return f"'{name}' is {v:g} ms, beyond the step's span 'step_ms' {span:g} ms"
        if self.busy_ms is not None and self.idle_ms is not None and abs(self.busy_ms + self.idle_ms - span) > tol:
            return f"'busy_ms' {self.busy_ms:g} + 'idle_ms' {self.idle_ms:g} is not the span 'step_ms' {span:g} ms"
        room = 2 * (span + (self.overlap_ms or 0.0)) + tol
        for name in ("attention_ms", "moe_ms", "gemm_ms", "communication_ms", "norm_elementwise_ms",
                     "sampling_tree_ms", "other_ms"):
            v = getattr(self, name)
            if v is not None and v > room:
                return f"'{name}' is {v:g} ms per step, over twice the span {span:g} ms plus the overlap"
        if self.gap is not None and self.floor_ms and abs(self.gap - span / self.floor_ms) > 0.01 * self.gap + 1e-9:
            return f"'gap' is {self.gap:g}, not step / floor ({span:g} / {self.floor_ms:g} ms)"
        return None


@dataclass(frozen=True)
class Decision(Row):
    """One entry of an advise file's ``summary.decisions``: tree, chain or off at one (path, text, context), each
    option's best tokens/s (null: not measured), the choice and its margin over the next best."""
    path: str
    text: str
    ctx: Context
    choice: str
    margin: Ratio | None
    ddtree_budget: Count | None
    chain_depth: Count | None
    ddtree_tok_s: TokS | None
    chain_tok_s: TokS | None
    plain_tok_s: TokS | None
    batch: Count | None = None
    chain_kernel: str | None = None  # what the chain's verify step ran on
    plain_kernel: str | None = None  # what plain decoding ran on (measured here; null: typed or modelled)
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class DiffClass(Row):
    """One kernel class of a trace diff's ``summary.diff.classes``: its time, share and launches per step, before
    and after."""
    cls: str
    before_ms: Ms
    after_ms: Ms
    delta_ms: DeltaMs
    before_share: Fraction
    after_share: Fraction
    before_calls: Number
    after_calls: Number
    extra: dict = field(default_factory=dict)

    def problem(self, config: dict) -> str | None:
        from .kernel_classes import CLASSES

        if self.cls not in CLASSES:
            return f"'cls' is {self.cls!r} (must be one of {', '.join(CLASSES)})"
        if abs(self.after_ms - self.before_ms - self.delta_ms) > 1e-6 + 1e-6 * max(self.before_ms, self.after_ms):
            return f"'delta_ms' {self.delta_ms:g} is not after - before ({self.after_ms:g} - {self.before_ms:g} ms)"
        return None


@dataclass(frozen=True)
class DiffKernel(DiffClass):
    """One kernel of ``summary.diff.kernels``: as a class, with its name."""
    name: str = ""


@dataclass(frozen=True)
class TraceDiff(Row):
    """A trace diff's ``summary.diff``: the two sides' files and steps, what changed most, per class and per kernel
    (``DiffClass``, ``DiffKernel``), the kernels added and gone, each side's floor and gap."""
    before: str
    after: str
    step_before_ms: StepMs
    step_after_ms: StepMs
    step_delta_ms: DeltaMs
    classes: list
    kernels: list
    added: list
    gone: list
    speedup: Ratio | None = None
    changed: str | None = None
    changed_before_ms: Ms | None = None
    changed_after_ms: Ms | None = None
    gap_before: Ratio | None = None
    gap_after: Ratio | None = None
    floor_before_ms: Ms | None = None
    floor_after_ms: Ms | None = None
    extra: dict = field(default_factory=dict)

    def problem(self, config: dict) -> str | None:
        a, b = self.step_before_ms, self.step_after_ms
        if abs(b - a - self.step_delta_ms) > 1e-6 * max(a, b):
            return f"'step_delta_ms' {self.step_delta_ms:g} is not after - before ({b:g} - {a:g} ms)"
        if self.speedup is not None and abs(self.speedup - a / b) > 1e-6 * self.speedup:
            return f"'speedup' {self.speedup:g} is not before / after ({a:g} / {b:g} ms)"
        bad = next((n for n in self.added + self.gone if not isinstance(n, str)), None)
        return None if bad is None else f"'added'/'gone' hold {bad!r} (must be kernel names, text)"


def check_summary(kind: str, summary: dict, source: str) -> None:
    """The parts of a file's summary a report reads whole, typed like rows (one line naming the entry and field):
    an advise file's ``decisions`` (``Decision``) and ``verdicts`` (a list of objects), a trace diff's ``diff``
    (``TraceDiff``, its ``classes`` and ``kernels``)."""
    def entries(key: str, value: Any, cls: type | None, where: str) -> None:
        if not isinstance(value, list):
            raise DDProbeError(f"{source}: {where}{key} is {type(value).__name__}, not a list")
        for i, e in enumerate(value, 1):
            at = f"{source}: {where}{key}[{i}]"
            if cls is None and not isinstance(e, dict):
                raise DDProbeError(f"{at} is not an object (got {type(e).__name__}: {str(e)[:40]!r})")
            if cls is not None:
                _typed(cls, e, at, at)

    if kind == "advise":
        for key, cls in (("decisions", Decision), ("verdicts", None)):
            if summary.get(key) is not None:
                entries(key, summary[key], cls, "summary.")
    d = summary.get("diff") if kind == "trace" else None
    if d is not None:
        _typed(TraceDiff, d, f"{source}: summary.diff", f"{source}: summary.diff")
        entries("classes", d["classes"], DiffClass, "summary.diff.")
        entries("kernels", d["kernels"], DiffKernel, "summary.diff.")


def _whole(v: Any, lo: int, hi: int) -> bool:
    return _is_int(v) and lo <= v <= hi


def check_source(kind: str, config: dict, summary: dict, source: str) -> None:
    """The config and summary numbers readers believe (the rest of a config is free-form), one line where one is
    not what it says: a commit file's tree budget and tokens asked per cell (``config.budget``,
    ``config.max_new_tokens``: what the commit-length bounds, report's short-cell check and advise --from read:
    whole numbers >= 1); a gpu-util file's measured step and context (``summary.decode_step_ms``,
    ``config.prompt_len``: what ``floor --steps-from``, report and gate read: StepMs' range, 1 to 2^30 tokens)."""
    if kind == "commit":
        for key in ("budget", "max_new_tokens"):
            if config.get(key) is not None and not _whole(config[key], 1, 1 << 30):
                raise DDProbeError(f"{source}: this commit file's config.{key} is {config[key]!r}: not a whole "
                                   "number >= 1")
    if kind != "gpu-util":
        return
    step, lo, hi = summary.get("decode_step_ms"), STEP_MS.lo, STEP_MS.hi
    if step is not None and (isinstance(step, bool) or not isinstance(step, (int, float)) or not lo <= step <= hi):
        raise DDProbeError(f"{source}: this gpu-util file's decode_step_ms is {step!r}: not a measured step "
                           "(1 us to 1 h)")
    plen = config.get("prompt_len")
    if plen is not None and not _whole(plen, 1, 1 << 30):
        raise DDProbeError(f"{source}: this gpu-util file's config.prompt_len is {plen!r}: not a context "
                           "(1 to 2^30 tokens)")


KINDS: dict[str, type] = {"floor": FloorRow, "commit": CommitRow, "gpu-util": GpuUtilRow,
                          "bench-verify": BenchVerifyRow, "allreduce": AllreduceRow, "advise": AdviseRow,
                          "diagnose": DiagnoseRow, "bench-launch": LaunchRow,
                          "trace": TraceRow}


def parse_row(kind: str, row: Any, where: str, config: dict | None = None, measured: bool = False) -> Row:
    """One row of a ``kind`` file as its typed row; ``where`` starts the one-line error ("FILE: row 3").
    ``measured``: a row a probe is about to write (the error says the measurement was refused, not the user's
    file)."""
    of = f"{where}: a measured {kind} row refused, not written" if measured else f"{where} of this {kind} file"
    cls = KINDS.get(kind)
    if cls is None:
        raise DDProbeError(f"{where}: no schema for kind {kind!r} (known: {', '.join(KINDS)})")
    return _typed(cls, row, where, of, config)


def _typed(cls: type, row: Any, where: str, of: str, config: dict | None = None) -> Row:
    """``row`` as a ``cls`` (a ``Row`` dataclass), every field checked; ``of`` starts a field's error line."""
    if not isinstance(row, dict):
        raise DDProbeError(f"{where} is not an object (got {type(row).__name__}: {str(row)[:40]!r})")
    specs = fields_of(cls)
    values = {}
    for f in specs:
        if f.name not in row:
            if f.required:
                raise DDProbeError(f"{of}: {f.name!r} is missing (required)")
            continue
        why = f.problem(row[f.name])
        if why:
            raise DDProbeError(f"{of}: {f.name!r} {why}")
        values[f.name] = float(row[f.name]) if f.base is float and row[f.name] is not None else row[f.name]
    names = {f.name for f in specs}
    typed = cls(**values, extra={k: v for k, v in row.items() if k not in names})
    why = typed.problem(config or {})
    if why:
        raise DDProbeError(f"{of}: {why}")
    return typed


def unbelievable(kind: str, row: dict) -> dict[str, str]:
    """The fields of a measured ``row`` (a dict) whose values break ``kind``'s schema, each with why: what a probe
    keeps as unknown (null) rather than believe, before the row is written."""
    return {f.name: why for f in fields_of(KINDS[kind]) if f.name in row and (why := f.problem(row[f.name]))}


def parse_rows(kind: str, rows: Any, source: str, config: dict | None = None) -> list[Row] | None:
    """Every row of a file (None for a kind without a schema: its rows are kept as objects, unchecked)."""
    if not isinstance(rows, list):
        raise DDProbeError(f"{source}: 'rows' is not a list")
    if kind not in KINDS:
        for i, row in enumerate(rows, 1):
            if not isinstance(row, dict):
                raise DDProbeError(f"{source}: row {i} is not an object (got {type(row).__name__})")
        return None
    return [parse_row(kind, row, f"{source}: row {i}", config) for i, row in enumerate(rows, 1)]


# keys of older files, mapped on load (today's rows come back as they are). floor: files written before the step
# model named the whole step ``total_floor_ms`` and the attention ``floor_ms``; bench-verify: the layer time was
# ``time_us`` in diagnose's files, a step's kernel floor ``floor_ms`` (today ``floor_us``, like a layer's). The
# telemetry's old keys are mapped by ``signals.upgrade``.
_OLD_FLOOR_KEYS = {"floor_ms": "attn_floor_ms", "bound": "attn_bound", "gap": "attn_gap",
                   "gap_if_rows_reread": "attn_gap_if_rows_reread", "compute_floor_ms": "attn_compute_floor_ms",
                   "step_compute_floor_ms": "compute_floor_ms", "step_GFLOP": "GFLOP", "total_floor_ms": "floor_ms",
                   "total_floor_worst_ms": "floor_worst_ms", "total_gap": "gap"}


def upgrade_row(kind: str, row: Any) -> Any:
    """An older file's row in today's keys (today's rows, and anything not an object, come back as they are)."""
    if not isinstance(row, dict):
        return row
    if kind == "floor" and ("total_floor_ms" in row or "mem_floor_ms" in row):
        return {_OLD_FLOOR_KEYS.get(k, k): v for k, v in row.items() if k not in ("mem_floor_ms", "read_GB")}
    if kind != "bench-verify" or not ("time_us" in row or "floor_ms" in row):
        return row
    out = {("us" if k == "time_us" and "us" not in row else k): v for k, v in row.items() if k != "floor_ms"}
    f = row.get("floor_ms")
    if "floor_us" not in out and "floor_ms" in row:
        out["floor_us"] = f * 1e3 if isinstance(f, (int, float)) and not isinstance(f, bool) else f
    return out


def describe(kind: str) -> list[str]:
    """Every field of a kind, one line each (docs/results.md lists these)."""
    return [f.say() for f in fields_of(KINDS[kind])]


def _comments(cls: type) -> dict[str, str]:
    """The comment beside each field in this module's source (what the field means)."""
    import inspect
    import re

    out = {}
    for c in reversed(cls.__mro__):
        try:
            src = inspect.getsource(c)
        except (OSError, TypeError):
            continue
        out.update(re.findall(r"^\s+(\w+): [^#\n]+#\s*(.+)$", src, re.M))
    return out


def markdown() -> str:
    """Each kind's fields as docs/results.md lists them (``python -m ddprobe.schema`` prints it)."""
    parts = []
    for kind, cls in KINDS.items():
        notes = _comments(cls)
        lines = [f"- `{f.say()}`" + (f": {notes[f.name]}" if f.name in notes else "") for f in fields_of(cls)]
        parts.append(f"## `{kind}`\n\n{' '.join((cls.__doc__ or '').split())}\n\n" + "\n".join(lines) + "\n")
    return "\n".join(parts)


if __name__ == "__main__":
    print(markdown(), end="")
