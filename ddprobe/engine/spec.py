"""What a decode step is made of: the models (weights) and the frozen step plan (everything else).

``Models(target, drafter)`` is what the loop and the static step compute with; ``StepSpec`` fixes
the shape and the checks of every step an engine runs: the attention paths, the KV layout, the tree
(budget, shape), the device and dtype, the cache's test switches (shuffled slots, NaN poison),
graph mode and the prefill chunking. The engine makes one from its settings; a ``StepRunner`` is
built for one spec and replaced when the settings change.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from .. import verify_paths
from .drafter import Drafter
from .target import TargetModel


class Models(NamedTuple):
    target: TargetModel
    drafter: Drafter


@dataclass(frozen=True)
class StepSpec:
    path: Any  # the verify path (kernels.get_path): verify and single-token decode
    prefill_path: Any  # the prompt's path ("prefill": PyTorch's fused attention)
    kv_layout: str  # "paged" | "contiguous"
    budget: int  # drafted nodes per tree (R = budget + 1 verify rows)
    tree_shape: str  # "ddtree" | "chain"
    device: torch.device
    dtype: torch.dtype
    seed: int = 0  # the cache's slot shuffle
    shuffle_slots: bool = False
    poison: bool = False  # NaN in unused cache rows; a non-finite logit raises
    graphs: bool = False  # static steps (CUDA graphs on a GPU, the same step eagerly on CPU)
    device_tree: bool = True  # static greedy steps build and walk the tree on the device
    fuse: bool = False  # torch.compile around the attention (graph mode on CUDA)
    prefill_max_rows: int = 1024  # prefill chunk rows (the "prefill" path: the chunk grid)
    prefill_score_bytes: float = 256e6  # the reference prefill's fp32 score budget per chunk

    def __post_init__(self):
        row = verify_paths.BY_NAME.get(getattr(self.path, "name", None))
        if row is not None and row.masks == "causal" and self.tree_shape != "chain" and self.budget > 1:
            raise ValueError(f"the {self.path.name} path verifies causal masks only (a chain, or plain decode): "
                             f"a {self.tree_shape} tree of {self.budget} nodes needs a tree-mask path")

    @property
    def rows(self) -> int:  # R
        return self.budget + 1

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"
