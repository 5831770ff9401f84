"""`flashmla`: FlashMLA's dense MLA decode kernel (SGLang's fork, ``sgl-flash-mla``) as a verify path for the chain.

FlashMLA takes no tree mask: it runs the R new rows causally (row i sees the whole prefix and new rows 0..i), which
is exactly a chain's mask (the drafter's top-1 at each depth, row i the parent of row i + 1) and plain decoding's
(R = 1). So it verifies ``--tree chain`` and nothing else: a plan over any other mask is a one-line ValueError (host
plans read the mask; the engine refuses a DDTree step on this path before building one, ``masks`` in
ddprobe.verify_paths). It is what a production server verifies a chain with (SGLang's and vLLM's FlashMLA backends,
page size 64), so advise prices the chain on it where it is installed.

Layout: contiguous (prefix in cache rows 0..P-1, the R new rows after it), read through 64-row pages with an
identity page table (a view of the rows: the cache holds a whole number of pages, ``KV_ROWS_MULTIPLE``, which the
engine's cache rounds its capacity up to). The sequence length is written in ``refresh`` from ``prefix_t``, and
``refresh`` hands the step an empty split schedule: the step's first layer has FlashMLA build it (its scheduler kernel
reads the length from device memory) and the other layers reuse it, as SGLang's backend builds one per step, so a
CUDA-graph step replays at any length up to the plan's bound. Needs an sm_90 GPU, bf16 q and kv, MLA rows of 512 + 64; anything else is one line.

    pip install 'ddprobe[peers]'     # sgl-flash-mla 1.0.0 (and FlashInfer, the benchmark's other peer)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ... import verify_paths
from .plan import PathUnavailable, VerifyPlan, check_diagonal, check_plan_args, check_run_args, split_prefix_arg

name = "flashmla"
layout = verify_paths.BY_NAME[name].layout
device_plans = verify_paths.BY_NAME[name].device_plans
PAGE = 64  # FlashMLA's page (block) size, as SGLang's and vLLM's FlashMLA backends use it
KV_ROWS_MULTIPLE = PAGE  # the cache's rows: a whole number of pages
V_DIM, ROPE = 512, 64


@dataclass(frozen=True)
class FlashMLATuning:
    """No knobs: FlashMLA picks its own split schedule."""


DEFAULT_TUNING = FlashMLATuning()


def _lib():
    try:
        import flash_mla
    except Exception as e:  # noqa: BLE001  (ImportError, or a library that fails to load)
        raise PathUnavailable(f"the flashmla path needs FlashMLA: pip install 'ddprobe[peers]' (flash_mla does not "
                              f"import: {type(e).__name__}: {str(e)[:100]})") from None
    if not all(hasattr(flash_mla, f) for f in ("get_mla_metadata", "flash_mla_with_kvcache")):
        raise PathUnavailable("the flashmla path needs sgl-flash-mla 1.0.0 (flash_mla_with_kvcache, "
                              "get_mla_metadata): pip install 'ddprobe[peers]'")
    return flash_mla


def check_available() -> None:
    """PathUnavailable (one line: what to install) unless FlashMLA loads here."""
    _lib()


def is_causal(tree_mask: torch.Tensor) -> bool:
    """Whether every row sees exactly itself and every earlier row (a chain's mask; host plans)."""
    r = tree_mask.shape[0]
    return bool(torch.equal(tree_mask.cpu(), torch.ones(r, r, dtype=torch.bool).tril()))


def _why_not(dev: torch.device) -> str | None:
    if dev.type != "cuda":
        return f"the flashmla path runs on an sm_90 GPU, not {dev}"
    cap = torch.cuda.get_device_capability(dev)
    if cap[0] != 9:
        return f"the flashmla path runs on sm_90 only (FlashMLA's dense decode), not sm_{cap[0]}{cap[1]}"
    return None


def plan(prefix_len, tree_mask: torch.Tensor, slots: torch.Tensor | None = None, v_dim: int = 512, *,
         tuning: FlashMLATuning | None = None, heads: int | None = None, max_prefix: int | None = None) -> VerifyPlan:
    """FlashMLA's page table, sequence length and split schedule for a causal (chain) step of R rows."""
    lib = _lib()
    dev = tree_mask.device
    why = _why_not(dev)
    if why:
        raise ValueError(why)
    if tuning is not None and not isinstance(tuning, FlashMLATuning):
        raise ValueError(f"the flashmla path takes no tuning, got {type(tuning).__name__}")
    bound, prefix_t, dynamic = split_prefix_arg(prefix_len, max_prefix, dev)
    check_plan_args(bound, tree_mask, slots)
    if slots is not None:
        raise ValueError("the flashmla path reads the contiguous layout (its own 64-row pages), not the token pool")
    if v_dim != V_DIM:
        raise ValueError(f"the flashmla path takes MLA rows of {V_DIM} + {ROPE}, got v_dim {v_dim}")
    r = int(tree_mask.shape[0])
    if not dynamic:
        check_diagonal(tree_mask)
        if not is_causal(tree_mask):
            raise ValueError("the flashmla path verifies causal masks only (a chain, or plain decode): FlashMLA "
                             "takes no tree mask")
    pages = -(-(bound + r) // PAGE)
    i32 = dict(dtype=torch.int32, device=dev)
    e = dict(block_table=torch.arange(pages, **i32)[None], seqlens=torch.zeros(1, **i32), pages=pages, sched=None)
    p = VerifyPlan(prefix_len=bound, tree_mask=tree_mask, slots=None, v_dim=v_dim, prefix_t=prefix_t,
                   dynamic=dynamic, tuning=tuning or DEFAULT_TUNING, extra=e)
    refresh(p)
    return p


def refresh(p: VerifyPlan) -> None:
    """The step's sequence length (prefix + R) from ``prefix_t`` on the device, and an empty split schedule that the
    step's first ``run`` fills (FlashMLA's scheduler kernel, reading that length) and the other layers reuse."""
    torch.add(p.prefix_t, p.num_rows, out=p.extra["seqlens"])
    p.extra["sched"] = _lib().get_mla_metadata()[0]


def run(q: torch.Tensor, kv: torch.Tensor, p: VerifyPlan, sm_scale: float, *, meta: dict | None = None) -> torch.Tensor:
    """q [R, H, 576], kv [rows, 576] (a whole number of 64-row pages) -> out [R, H, 512]."""
    check_run_args(q, kv, p)
    e = p.extra
    if q.dtype != torch.bfloat16 or kv.dtype != torch.bfloat16:
        raise ValueError(f"the flashmla path takes bf16 q and kv, got {q.dtype} and {kv.dtype}")
    if q.shape[2] != V_DIM + ROPE:
        raise ValueError(f"the flashmla path takes MLA rows of {V_DIM} + {ROPE}, got width {q.shape[2]}")
    rows = e["pages"] * PAGE
    if kv.shape[0] < rows:
        raise ValueError(f"the flashmla path reads whole 64-row pages: the cache holds {kv.shape[0]} rows, the plan "
                         f"needs {rows} (round the capacity up to a multiple of {PAGE})")
    if e.get("heads", q.shape[1]) != q.shape[1]:  # the schedule is per heads: a new one for other heads
        refresh(p)
    e["heads"] = q.shape[1]
    k_cache = kv[:rows].view(e["pages"], PAGE, 1, kv.shape[1])
    out, _ = _lib().flash_mla_with_kvcache(q.contiguous()[None], k_cache, e["block_table"], e["seqlens"], V_DIM, e["sched"],
                                           softmax_scale=sm_scale, causal=True, use_legacy=True)
    return out[0]
