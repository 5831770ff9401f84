"""The frozen per-step plan every verify-attention path receives.

A plan is built once per verify step (``path.plan(...)``) and reused by every layer
(``path.run(q, kv, plan, sm_scale)``): the tree mask, the token-pool slots and any
path-specific metadata do not change between layers, and nothing in a plan changes after
``plan()`` returns (no buffers or configs are memoized on first use).

Two kinds of plan, one type:
- **host plan**: ``plan(prefix_len: int, ...)``. The prefix length is known on the host; the
  kernels still read it from ``prefix_t`` (a one-element device tensor built by ``plan``).
- **device plan**: ``plan(prefix_t, ..., max_prefix=N)`` with ``prefix_t`` a one-element int32
  device tensor. Every buffer is sized for ``max_prefix`` (grids, partials, flat masks), the
  kernels read the actual length from ``prefix_t``, and the caller rewrites the *contents* of
  ``prefix_t``, ``tree_mask`` and ``slots`` between steps, then calls ``path.refresh(plan)`` to
  rebuild the derived device buffers with fixed-shape ops. Nothing in a device plan depends on a
  host value that changes from step to step, so a CUDA graph of the forward replays it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


class PathUnavailable(ValueError):
    """A path whose kernels cannot run here (an optional library missing, or a version that takes other
    arguments); the message, one line, says what to install."""


@dataclass(frozen=True)
class VerifyPlan:
    """Metadata of one verify step, shared by all layers.

    prefix_len: committed tokens before the new rows (host plans); for device plans the bound
                ``max_prefix`` every buffer is sized for (the actual length is in prefix_t).
    tree_mask:  [R, R] bool on the device; row i may attend to new row j
                (j is i or an ancestor of i). Row 0 is the bonus token (the root).
    slots:      [prefix_len + R] int64 token-pool slot of every column, prefix first,
                then the R new rows (page_size=1 layout); None means the contiguous
                layout: column c lives in cache row c.
    v_dim:      values per row that are V (the latent, 512 for MLA); the rest of the
                576-wide row is the rope part of K.
    prefix_t:   [1] int32 on the device: the actual prefix length the kernels read.
    dynamic:    True for device plans (prefix_t may be less than prefix_len).
    tuning:     the path's frozen tuning dataclass (None for paths without knobs).
    extra:      path-specific device buffers built by ``plan`` (never filled later).
    detail:     a path's typed plan (split_ws.WsPlan), built by ``plan``; None for paths that use ``extra``.
    """

    prefix_len: int
    tree_mask: torch.Tensor
    slots: torch.Tensor | None = None
    v_dim: int = 512
    prefix_t: torch.Tensor | None = None
    dynamic: bool = False
    tuning: Any = None
    extra: dict[str, Any] = field(default_factory=dict)
    detail: Any = None

    @property
    def num_rows(self) -> int:
        return int(self.tree_mask.shape[0])

    @property
    def num_cols(self) -> int:
        """Columns the plan covers: prefix (or its bound) + R."""
        return self.prefix_len + self.num_rows


def split_prefix_arg(prefix_len, max_prefix: int | None, device) -> tuple[int, torch.Tensor, bool]:
    """(bound, prefix_t on ``device``, dynamic) from an int or a one-element device tensor."""
    if isinstance(prefix_len, torch.Tensor):
        if prefix_len.numel() != 1 or prefix_len.dtype != torch.int32:
            raise ValueError(f"a device prefix length must be a one-element int32 tensor, got "
                             f"{tuple(prefix_len.shape)} {prefix_len.dtype}")
        if max_prefix is None or max_prefix < 0:
            raise ValueError("a device prefix length needs max_prefix >= 0 (the bound buffers are sized for)")
        if prefix_len.device != torch.device(device):
            raise ValueError(f"prefix_len on {prefix_len.device} but tree_mask on {device}")
        return int(max_prefix), prefix_len.view(1), True
    prefix_len = int(prefix_len)
    if prefix_len < 0:
        raise ValueError(f"prefix_len must be >= 0, got {prefix_len}")
    return prefix_len, torch.tensor([prefix_len], dtype=torch.int32, device=device), False


def check_plan_args(prefix_len: int, tree_mask: torch.Tensor, slots: torch.Tensor | None) -> None:
    """Shared argument checks for every path's ``plan`` (prefix_len: the host value or bound)."""
    if prefix_len < 0:
        raise ValueError(f"prefix_len must be >= 0, got {prefix_len}")
    if tree_mask.dim() != 2 or tree_mask.shape[0] != tree_mask.shape[1] or tree_mask.shape[0] < 1:
        raise ValueError(f"tree_mask must be [R, R] with R >= 1, got {tuple(tree_mask.shape)}")
    if tree_mask.dtype != torch.bool:
        raise ValueError(f"tree_mask must be bool, got {tree_mask.dtype}")
    if slots is not None:
        want = prefix_len + tree_mask.shape[0]
        if slots.dim() != 1 or slots.shape[0] < want:
            raise ValueError(f"slots must be 1-D with at least prefix_len + R = {want} entries, got {tuple(slots.shape)}")


def check_diagonal(tree_mask: torch.Tensor) -> None:
    """Host plans only (reads the mask on the host): every row must see itself."""
    if not bool(tree_mask.diagonal().all()):
        raise ValueError("tree_mask must let every row see itself")


def check_causal(tree_mask: torch.Tensor, path: str) -> None:
    """Host plans of SGLang's extend kernel (``paged``, ``sglang``): it reads a row block's new columns only up to
    the block's end (is_causal), so a row may see only itself and earlier rows (parents before children)."""
    if bool(tree_mask.triu(1).any()):
        raise ValueError(f"the {path} path takes tree masks whose rows see only earlier rows (parents before "
                         "children), as SGLang's causal extend kernel reads them")


def pool_plan_args(path: str, prefix_len, max_prefix: int | None, tree_mask: torch.Tensor,
                   slots: torch.Tensor | None) -> tuple[int, torch.Tensor, bool]:
    """The checks every plan over SGLang's page_size=1 token pool makes (``paged``, ``sglang``): (prefix bound,
    prefix tensor, device plan?) as ``split_prefix_arg`` gives them, after the shared argument checks, the pool's
    slots and, for host plans, a diagonal and causal tree mask."""
    bound, prefix_t, dynamic = split_prefix_arg(prefix_len, max_prefix, tree_mask.device)
    check_plan_args(bound, tree_mask, slots)
    if slots is None:
        raise ValueError(f"the {path} path needs the page_size=1 token pool: pass slots")
    if not dynamic:
        check_diagonal(tree_mask)
        check_causal(tree_mask, path)
    return bound, prefix_t, dynamic


def check_run_args(q: torch.Tensor, kv: torch.Tensor, plan: VerifyPlan) -> None:
    """Shared shape checks for every path's ``run``."""
    if q.dim() != 3 or q.shape[0] != plan.num_rows:
        raise ValueError(f"q must be [R={plan.num_rows}, heads, D], got {tuple(q.shape)}")
    if kv.dim() != 2 or kv.shape[1] != q.shape[2]:
        raise ValueError(f"kv must be [slots, D={q.shape[2]}], got {tuple(kv.shape)}")
    if plan.v_dim > kv.shape[1]:
        raise ValueError(f"v_dim {plan.v_dim} exceeds row width {kv.shape[1]}")
    if plan.slots is None and kv.shape[0] < plan.num_cols:
        raise ValueError(f"contiguous kv holds {kv.shape[0]} rows, the plan needs {plan.num_cols}")
