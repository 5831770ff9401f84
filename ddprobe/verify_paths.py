"""The verify-attention paths: one table that the kernels' registry, the CLI, the probes, the reports, the
benchmark and the tests read (stdlib only, so every layer can import it). Adding a path touches this table and the
path's own module under ddprobe/engine/kernels/.

Fields of a row:
  name          the ``--attn`` value and the registry key
  layout        "paged" (page_size=1 token pool), "contiguous" (prefix in rows 0..P-1) or "any"
  label         how reports and plots name it
  colour        its matplotlib colour, the same in every plot
  ncu_regex     the kernel names it launches (ncu ``--kernel-name regex:``; also matched against profiler names)
  device_plans  whether ``plan`` takes a device prefix length (what a CUDA-graph-captured engine step needs)
  archs         the GPUs it runs on: "any" (every CUDA GPU, and the Triton interpreter on the CPU) or sm
                versions such as "sm_90"
  module        the kernels module that implements it (relative to ddprobe.engine.kernels)
  verify        False for helpers behind the same seam that are not verify paths (prefill)
  baseline      True for SGLang's design (``paged``, ddprobe's rendering; ``sglang``, SGLang's own kernels): the
                pathology measured, never a fix
  what          one line for ``--help``
"""
from __future__ import annotations

from dataclasses import dataclass

AUTO = "auto"  # --attn auto: auto_path() on the machine that runs it


@dataclass(frozen=True)
class VerifyPath:
    name: str
    layout: str
    label: str
    colour: str
    ncu_regex: str
    device_plans: bool
    archs: tuple[str, ...]
    module: str
    what: str
    verify: bool = True
    baseline: bool = False


PATHS: tuple[VerifyPath, ...] = (
    VerifyPath("reference", "any", "reference (fp32 PyTorch)", "C4", "", True, ("any",), ".reference",
               "the fp32 PyTorch oracle"),
    VerifyPath("prefill", "any", "prefill (PyTorch SDPA)", "C5", "", False, ("any",), ".prefill",
               "causal prompt prefill through PyTorch's fused attention (not a verify path)", verify=False),
    VerifyPath("paged", "paged", "paged (SGLang page_size=1)", "C1", "_paged_verify|_paged_decode", True, ("any",),
               ".paged", "SGLang's page_size=1 Triton verify (and split-K decode), as it runs today (ddprobe's rendering)",
               baseline=True),
    VerifyPath("sglang", "paged", "sglang (SGLang's own Triton kernels)", "C7",
               "_fwd_kernel|_fwd_grouped_kernel_stage1|_fwd_kernel_stage2|get_num_kv_splits_triton", True, ("any",),
               ".sglang", "SGLang's own extend/decode Triton kernels from an installed sglang: pip install --no-deps "
               "sglang==0.5.14", baseline=True),
    VerifyPath("split", "contiguous", "split (split-K Triton)", "C3", "_split_prefix|_merge_kernel|_merge_flat", True,
               ("any",), ".split", "split-K over the contiguous prefix + masked tree pass + merge (Triton)"),
    VerifyPath("split_ws", "contiguous", "split_ws (Hopper warp-specialized)", "C6",
               "ddp_seesaw|ddp_merge|ws_prefix|ws_tail|_merge_kernel|_merge_flat", True, ("sm_90",), ".split_ws",
               "split with warp-specialized Hopper prefix kernels (CUDA C++ / Gluon; sm_90 only)"),
)
BY_NAME = {p.name: p for p in PATHS}


def get(name: str) -> VerifyPath:
    """The row called ``name`` (ValueError lists the verify paths)."""
    if name not in BY_NAME:
        raise ValueError(f"unknown attention path {name!r}; known: {', '.join(verify_names())}")
    return BY_NAME[name]


def verify_names() -> list[str]:
    return [p.name for p in PATHS if p.verify]


def fast_names() -> list[str]:
    """The verify paths that are fixes: neither the fp32 oracle nor a baseline."""
    return [p.name for p in PATHS if p.verify and not p.baseline and p.name != "reference"]


def runs_on(p: VerifyPath, sm: tuple[int, int] | None) -> bool:
    """Whether path ``p`` runs on a GPU of compute capability ``sm`` (None: no GPU, the CPU)."""
    if "any" in p.archs:
        return True
    return sm is not None and f"sm_{sm[0]}{sm[1]}" in p.archs


def auto_path(sm: tuple[int, int] | None) -> str:
    """``--attn auto``: the fastest verify path where it runs: split_ws on sm_90, split on other GPUs, and the
    fp32 reference on the CPU (``sm`` None: the Triton paths run there only under the interpreter)."""
    if sm is None:
        return "reference"
    return "split_ws" if runs_on(BY_NAME["split_ws"], sm) else "split"


def attn_help() -> str:
    """The ``--attn`` help text."""
    return ("Verify-attention path: auto (split_ws on sm_90, split on other GPUs, reference on the CPU), "
            + "; ".join(f"{p.name} ({p.what})" for p in PATHS if p.verify) + ".")
