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
  dtypes        the q/kv dtypes it takes ("fp32", "bf16", "fp16"; "any")
  rows          the MLA latent rows it takes, v_dim + rope: "any", "pow2" (both powers of two >= 16) or exact
                widths such as "512+64"
  cpu           runs natively on the CPU (the Triton paths run there only under TRITON_INTERPRET: never auto's
                choice there)
  speed         auto's preference among the paths that run a model here (highest first; the fp32 reference is 0;
                a baseline is never auto's choice)
  theirs        another project's kernels loaded as a dependency (``sglang``): measured beside ddprobe's, never
                gated as ddprobe's own (``ddprobe gate`` shows them for reference, like FlashMLA)
  masks         "tree" (any tree mask: DDTree, chain, plain decode) or "causal" (row i sees rows 0..i only: the
                chain and plain decode; never auto's choice, and the engine refuses a DDTree step on it)
  tested        the GPUs its kernels are configured and compile-checked for ("any": no caveat): `split`'s are
                split.ARCHS's (tests/test_split_targets.py compiles them for each and keeps the two equal; sm_90 is
                also timed); on another GPU auto says that its kernels were not (they run sm_90's tuning there, and
                a kernel that does not build falls back to the fp32 reference in one line)

``auto_path(sm, dtype, row)`` reads only these fields: a new row declares its capabilities and auto weighs it.
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
    dtypes: tuple[str, ...] = ("any",)
    rows: tuple[str, ...] = ("any",)
    cpu: bool = False
    speed: int = 0
    baseline: bool = False
    theirs: bool = False
    masks: str = "tree"
    tested: tuple[str, ...] = ("any",)


TRITON_DTYPES = ("fp32", "bf16", "fp16")  # what the Triton kernels' tl.dot takes (kernels/_common.DTYPES)
SPLIT_TESTED = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_120")  # split.ARCHS's GPUs (a test keeps them equal)

PATHS: tuple[VerifyPath, ...] = (
    VerifyPath("reference", "any", "reference (fp32 PyTorch)", "C4", "", True, ("any",), ".reference",
               "the fp32 PyTorch oracle", cpu=True),
    VerifyPath("prefill", "any", "prefill (PyTorch SDPA)", "C5", "", False, ("any",), ".prefill",
               "causal prompt prefill through PyTorch's fused attention (not a verify path)", verify=False, cpu=True),
    VerifyPath("paged", "paged", "paged (SGLang page_size=1)", "C1", "_paged_verify|_paged_decode", True, ("any",),
               ".paged", "SGLang's page_size=1 Triton verify (and split-K decode), as it runs today (ddprobe's rendering)",
               baseline=True, dtypes=TRITON_DTYPES, rows=("pow2",), speed=1),
    VerifyPath("sglang", "paged", "sglang (SGLang's own Triton kernels)", "C7",
               "_fwd_kernel|_fwd_grouped_kernel_stage1|_fwd_kernel_stage2|get_num_kv_splits_triton", True, ("any",),
               ".sglang", "SGLang's own extend/decode Triton kernels from an installed sglang: pip install --no-deps "
               "sglang==0.5.14", baseline=True, theirs=True),  # what it takes: SGLang's own checks say (one line)
    VerifyPath("split", "contiguous", "split (split-K Triton)", "C3", "_split_prefix|_merge_kernel|_merge_flat", True,
               ("any",), ".split", "split-K over the contiguous prefix + masked tree pass + merge (Triton)",
               dtypes=TRITON_DTYPES, rows=("pow2",), speed=2, tested=SPLIT_TESTED),
    VerifyPath("split_ws", "contiguous", "split_ws (Hopper warp-specialized)", "C6",
               "ddp_seesaw|ddp_merge|ws_tail|_merge_kernel|_merge_flat", True, ("sm_90",), ".split_ws",
               "split with warp-specialized Hopper prefix kernels (CUDA C++ / Gluon; sm_90 only)",
               dtypes=("bf16", "fp16"), rows=("512+64",), speed=3),
    VerifyPath("flashmla", "contiguous", "flashmla (FlashMLA, causal: chain only)", "C8",
               "flash_fwd_splitkv_mla|flash_fwd_mla_combine|get_mla_metadata", True, ("sm_90",), ".flashmla",
               "FlashMLA's dense decode kernel, causal: the chain (--tree chain) and plain decode only, as production "
               "servers verify a chain (sm_90, sgl-flash-mla)",
               dtypes=("bf16",), rows=("512+64",), theirs=True, masks="causal"),
)
BY_NAME = {p.name: p for p in PATHS}


def get(name: str) -> VerifyPath:
    """The row called ``name`` (ValueError lists the verify paths)."""
    if name not in BY_NAME:
        raise ValueError(f"unknown attention path {name!r}; known: {', '.join(verify_names())}")
    return BY_NAME[name]


def verify_names() -> list[str]:
    return [p.name for p in PATHS if p.verify]


def sm_name(sm: tuple[int, int] | None) -> str:
    """``(9, 0)`` -> ``sm_90``; None (no GPU) -> ``the CPU``."""
    return "the CPU" if sm is None else f"sm_{sm[0]}{sm[1]}"


def fast_names() -> list[str]:
    """The verify paths that are fixes: neither the fp32 oracle nor a baseline."""
    return [p.name for p in PATHS if p.verify and not p.baseline and not p.theirs and p.name != "reference"]


def runs_on(p: VerifyPath, sm: tuple[int, int] | None) -> bool:
    """Whether path ``p`` runs on a GPU of compute capability ``sm`` (None: no GPU, the CPU)."""
    if "any" in p.archs:
        return True
    return sm is not None and sm_name(sm) in p.archs


def _row_fits(spec: str, row: tuple[int, int]) -> bool:
    if spec == "any":
        return True
    if spec == "pow2":
        return all(w >= 16 and w & (w - 1) == 0 for w in row)
    return spec == f"{row[0]}+{row[1]}"


def rows_why_not(p: VerifyPath, row: tuple[int, int]) -> str | None:
    """None when path ``p`` takes MLA latent rows of ``row`` = (v_dim, rope), else why not (one line)."""
    if any(_row_fits(s, row) for s in p.rows):
        return None
    takes = " or ".join("v_dim and rope powers of two >= 16" if s == "pow2" else s.replace("+", " + ") for s in p.rows)
    return f"{p.name} takes MLA rows of {takes}; this model's are {row[0]} + {row[1]}"


def why_not(p: VerifyPath, sm: tuple[int, int] | None, dtype: str | None = None,
            row: tuple[int, int] | None = None) -> str | None:
    """None when path ``p`` runs a model of MLA rows ``row`` (v_dim, rope) in ``dtype`` on ``sm`` (None: the CPU),
    else why not, in one line (None for ``dtype`` or ``row``: not asked)."""
    why = rows_why_not(p, row) if row is not None else None  # the model first: true on any machine
    if why:
        return why
    if dtype is not None and "any" not in p.dtypes and dtype not in p.dtypes:
        return f"{p.name} takes {' / '.join(p.dtypes)}, not {dtype}"
    if not runs_on(p, sm):
        return f"{p.name} runs on {' / '.join(p.archs)} only, not {sm_name(sm)}"
    return None


def auto_choice(sm: tuple[int, int] | None, dtype: str | None = None,
                row: tuple[int, int] | None = None) -> tuple[str, str]:
    """``--attn auto``: (the fastest verify path that runs a model of MLA rows ``row`` in ``dtype`` on ``sm``, one
    line saying why). On the CPU (``sm`` None) only the paths that run natively there count (the Triton ones run
    only under the interpreter)."""
    ranked = sorted((p for p in PATHS if p.verify and not p.baseline and p.masks == "tree"),  # never a baseline
                    key=lambda p: -p.speed)
    passed: list[str] = []
    for p in ranked:
        if sm is None and not p.cpu:
            if not passed:
                passed.append("the Triton paths run on the CPU only under TRITON_INTERPRET, slowly")
            continue
        why = why_not(p, sm, dtype, row)
        if why is None:
            where = sm_name(sm) + (f" in {dtype}" if dtype else "")
            return p.name, f"the fastest path that runs this model on {where}" + \
                (f" ({'; '.join(passed)})" if passed else "") + untested(p, sm)
        passed.append(why)
    return "reference", f"no faster path runs this model here ({'; '.join(passed)}); the fp32 reference runs anywhere"


def untested(p: VerifyPath, sm: tuple[int, int] | None) -> str:
    """'' where path ``p``'s kernels are built and checked for ``sm`` (or the CPU), else a clause saying they are
    not and what happens there."""
    if sm is None or "any" in p.tested or sm_name(sm) in p.tested:
        return ""
    return (f"; {p.name}'s kernels are not configured or compile-checked for {sm_name(sm)} (only "
            f"{', '.join(p.tested)}): they run sm_90's tuning there, and fall back to the fp32 reference in one line "
            "if they do not build")


def auto_path(sm: tuple[int, int] | None, dtype: str | None = None, row: tuple[int, int] | None = None) -> str:
    """The path ``auto_choice`` picks (without its reason)."""
    return auto_choice(sm, dtype, row)[0]


def attn_help() -> str:
    """The ``--attn`` help text."""
    return ("Verify-attention path: auto (the fastest that runs this model on this GPU in this dtype: split_ws for "
            "K2's 512 + 64 rows in bf16/fp16 on sm_90, split on other GPUs and shapes, reference on the CPU), "
            + "; ".join(f"{p.name} ({p.what})" for p in PATHS if p.verify) + ".")
