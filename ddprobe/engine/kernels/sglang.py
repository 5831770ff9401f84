"""`sglang`: SGLang's own Triton attention kernels, from an installed ``sglang``, called as SGLang calls them.

Tree verify (R > 1) is ``extend_attention_fwd`` launched as ``TritonAttnBackend.forward_extend`` launches it for a
TARGET_VERIFY batch with MLA at page_size=1: ``qo_indptr`` = [0, R], ``kv_indptr`` = [0, prefix] over
``kv_indices`` = the prefix's token-pool slots (int64), the flat bool ``custom_mask`` (row i at
i * (prefix + R), prefix columns 1, then the tree row) with ``mask_indptr`` = [0, R * (prefix + R)],
``max_len_extend`` = R, causal, k_scale = v_scale = 1, ``skip_prefix_custom_mask`` left at SGLang's default (True).
K of the pool is the 576-wide latent row (``k_buffer`` [pool, 1, 576]), V its first 512 values (``v_buffer``, a
view of the same rows, as MLATokenToKVPool.get_value_buffer returns); the new rows' K and V are passed as
``k_extend`` / ``v_extend`` (gathered from the pool here: SGLang hands over the step's fresh projections).

Plain decode (R = 1) is ``decode_attention_fwd`` with ``has_mla=True`` as ``forward_decode`` calls it: kv_indptr
[0, prefix + 1], fp32 ``attn_logits`` / ``attn_lse`` of ``max_kv_splits`` splits (SGLang's MLA cap, paged.max_kv_splits),
``num_kv_splits`` from SGLang's own ``get_num_kv_splits_triton`` launched as its ``get_num_kv_splits`` launches it,
PDL on sm_90 and later as SGLang sets it.

The kernels are loaded by ``_sglang_import`` (SGLang's files executed from the installed package without the
server's imports; nothing copied). Device plans rebuild every buffer with fixed-shape ops in ``refresh``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ... import verify_paths
from . import _sglang_import, paged
from ._common import check_dims, check_rows, sm_count
from ._sglang_import import SGLangUnavailable
from .plan import VerifyPlan, check_run_args, pool_plan_args

name = "sglang"
layout = verify_paths.BY_NAME[name].layout
device_plans = verify_paths.BY_NAME[name].device_plans
DECODE_SHAPES = ((576, 512), (288, 256))  # (row width, V width) SGLang's MLA decode takes (its BLOCK_DMODEL = V)


@dataclass(frozen=True)
class SGLangTuning:
    """No knobs: SGLang picks its own launch configuration."""


DEFAULT_TUNING = SGLangTuning()


def kernels() -> _sglang_import.SGLangKernels:
    """SGLang's kernels (SGLangUnavailable, one line, when sglang is missing or takes other arguments)."""
    return _sglang_import.load()


def check_available() -> None:
    """Raise SGLangUnavailable (one line: how to install) unless SGLang's kernels load here."""
    kernels()


def plan(prefix_len, tree_mask: torch.Tensor, slots: torch.Tensor | None = None, v_dim: int = 512, *,
         tuning: SGLangTuning | None = None, heads: int | None = None, max_prefix: int | None = None) -> VerifyPlan:
    """SGLang's TARGET_VERIFY metadata (R > 1) or its decode metadata (R = 1: ``heads`` sizes the split count as
    SGLang's num_head does; None counts 16)."""
    kernels()
    if tuning is not None and not isinstance(tuning, SGLangTuning):
        raise ValueError(f"the sglang path takes an SGLangTuning, got {type(tuning).__name__}")
    dev = tree_mask.device
    bound, prefix_t, dynamic = pool_plan_args(name, prefix_len, max_prefix, tree_mask, slots)
    r = int(tree_mask.shape[0])
    check_rows(r, name)
    i32, i64 = dict(dtype=torch.int32, device=dev), dict(dtype=torch.int64, device=dev)
    if r == 1:
        sm = sm_count(dev)
        e = dict(decode=True, kv_indptr=torch.zeros(2, **i32), kv_indices=torch.empty(bound + r, **i64),
                 seq_lens=torch.empty(1, **i32), num_kv_splits=torch.empty(1, **i32), heads=heads or 16, sm=sm,
                 max_kv_splits=paged.max_kv_splits(sm, paged.arch(dev)[1]),
                 use_pdl=dev.type == "cuda" and torch.version.hip is None and paged.arch(dev)[0][0] >= 9)
    else:
        e = {"decode": False, **paged.extend_buffers(bound, r, dev)}  # the metadata paged's rendering reads too
    p = VerifyPlan(prefix_len=bound, tree_mask=tree_mask, slots=slots, v_dim=v_dim, prefix_t=prefix_t,
                   dynamic=dynamic, tuning=tuning or DEFAULT_TUNING, extra=e)
    refresh(p)
    return p


def refresh(p: VerifyPlan) -> None:
    """Rebuild the indptrs, indices, mask and split count from prefix_t, slots and tree_mask (fixed shapes)."""
    e = p.extra
    if not e["decode"]:
        paged.refresh_extend(p)
        return
    e["kv_indices"].copy_(p.slots[: p.num_cols])
    e["seq_lens"].copy_(p.prefix_t + 1)
    e["kv_indptr"][1:].copy_(e["seq_lens"])
    kernels().get_num_kv_splits_triton[(1,)](
        e["num_kv_splits"], e["seq_lens"], 1, 1, e["heads"], 1, e["max_kv_splits"], e["sm"], MAX_NUM_SEQ=256)


def run(q: torch.Tensor, kv: torch.Tensor, p: VerifyPlan, sm_scale: float, *, meta: dict | None = None) -> torch.Tensor:
    """q [R, H, D], kv [pool, D] -> out [R, H, v_dim] in q's dtype, through SGLang's kernels. ``meta`` is
    accepted for a uniform seam (SGLang's launches return nothing to report)."""
    check_run_args(q, kv, p)
    check_dims(q, kv, p.v_dim, name)
    if "kv_indices" not in p.extra:
        raise ValueError("plan was not built by sglang.plan")
    k, e = kernels(), p.extra
    r, h, d = q.shape
    out = torch.empty(r, h, p.v_dim, dtype=q.dtype, device=q.device)
    k_buffer, v_buffer = kv.unsqueeze(1), kv[:, : p.v_dim].unsqueeze(1)  # MLA pool: one KV head
    if e["decode"]:
        if (d, p.v_dim) not in DECODE_SHAPES:
            raise ValueError(f"SGLang's MLA decode kernel takes rows of {' or '.join(f'{a} with {b} values' for a, b in DECODE_SHAPES)}, "
                             f"got {d} with {p.v_dim}")
        splits = e["max_kv_splits"]
        logits = torch.empty(1, h, splits, p.v_dim, dtype=torch.float32, device=q.device)
        lse = torch.empty(1, h, splits, dtype=torch.float32, device=q.device)
        k.decode_attention_fwd(q, k_buffer, v_buffer, out, e["kv_indptr"], e["kv_indices"], logits, lse,
                               e["num_kv_splits"], splits, sm_scale, 1.0, 1.0, logit_cap=0.0, sinks=None,
                               xai_temperature_len=-1, has_mla=True, use_pdl=e["use_pdl"])
        return out
    new = paged.extend_rows(kv, p)  # the step's new rows: SGLang passes k.contiguous(), v.contiguous()
    k.extend_attention_fwd(q, new.unsqueeze(1), new[:, : p.v_dim].contiguous().unsqueeze(1), out, k_buffer, v_buffer,
                           e["qo_indptr"], e["kv_indptr"], e["kv_indices"], e["custom_mask"], True,
                           e["mask_indptr"], r, 1.0, 1.0, sm_scale, logit_cap=0.0, sliding_window_size=-1,
                           sinks=None, window_kv_offsets=None, xai_temperature_len=-1)
    return out


__all__ = ["DEFAULT_TUNING", "SGLangTuning", "SGLangUnavailable", "check_available", "plan", "refresh", "run"]
