"""Named draft-tree shapes as parent arrays, and the ancestor mask they give.

A tree of B nodes plus the root is a parent array of length B+1: parents[0] = -1 (the
root, the bonus token), parents[i] < i for every other node (pop order). The shapes serve
the tests and the benchmark (the engine builds its own trees); ``ancestor_mask`` is the one host
implementation of the mask, which the engine's trees use too (its device twin, on fixed shapes for
CUDA graphs, is ``engine.tree_device.ancestor_mask_device``).
"""
from __future__ import annotations

import numpy as np
import torch


def chain(budget: int) -> list[int]:
    """root -> 1 -> 2 -> ... : one path (a plain draft block)."""
    return [-1] + list(range(budget))


def star(budget: int) -> list[int]:
    """Every node a child of the root."""
    return [-1] + [0] * budget


def fork(budget: int) -> list[int]:
    """Two chains from the root, alternating nodes."""
    return [-1] + [0 if i <= 2 else i - 2 for i in range(1, budget + 1)]


def lopsided(budget: int) -> list[int]:
    """A long chain whose nodes each also carry one leaf (DDTree's typical shape)."""
    parents = [-1]
    spine = 0
    for i in range(1, budget + 1):
        if i % 2 == 1:
            parents.append(spine)
            spine_next = i
        else:
            parents.append(spine)
            spine = spine_next
    return parents


SHAPES = {"chain": chain, "star": star, "fork": fork, "lopsided": lopsided}


def ancestor_mask(parents: list[int], device: torch.device | str | None = None) -> torch.Tensor:
    """[R, R] bool: row i sees itself and its ancestors (row i = parent's row plus i).
    ValueError unless parents[0] = -1 and 0 <= parents[i] < i for every other row."""
    r = len(parents)
    m = np.zeros((r, r), dtype=bool)  # rows built on the host, one copy to a tensor at the end
    for i, p in enumerate(parents):
        if i == 0:
            if p != -1:
                raise ValueError("parents[0] must be -1 (the root)")
        elif not 0 <= p < i:
            raise ValueError(f"parents[{i}] = {p} must be in [0, {i})")
        if p >= 0:
            m[i] = m[p]
        m[i, i] = True
    t = torch.from_numpy(m)
    return t.to(device) if device is not None else t


def shape_mask(shape: str, budget: int, device=None) -> torch.Tensor:
    return ancestor_mask(SHAPES[shape](budget), device)
