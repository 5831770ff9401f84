"""torch.compile of the model around the attention calls, for graph mode on CUDA.

After CUDA graphs remove the host, a verify step still runs about 53 small kernels per layer (norms,
rope, casts, concatenations, residual adds), a few microseconds each. Inductor fuses them. The
compiled functions are the engine's own (``target.layer_pre`` / ``layer_post``, the drafter layer,
the two heads), compiled once for all layers ("regional" compilation: the layer is an argument,
so the 61 layers share one graph), with fixed shapes (a static step always has R rows). The
attention path is never compiled: it runs between ``pre`` and ``post``. On CPU nothing is
compiled; the same functions run as written.
"""
from __future__ import annotations

import torch

from .target import layer_post, layer_pre


def drafter_head(drafter, x: torch.Tensor, head, k: int):
    """Drafter block output -> top-k (values, indices) of its log-probs [L, k]."""
    return torch.topk(drafter.logprobs(x, head).double(), k, dim=-1)


def verify_head(target, hidden: torch.Tensor):
    """Final hidden [R, hidden] -> (logits [R, V] float, greedy picks [R])."""
    logits = target.logits(hidden)
    return logits, logits.argmax(dim=-1)


def drafter_layer(layer, x, cos, sin, ctx_k, ctx_v, ctx_ok, qs=None, qrot=None):
    return layer(x, cos, sin, ctx_k, ctx_v, ctx_ok, qs, qrot)


# Shapes one process may compile each function for. Dynamo keeps its compiled graphs per code object, so every
# engine of a process shares them: each row count (plain decode 1, a tree budget + 1, a chain depth + 1) and each
# layer kind (qs or not) is one more. Past torch's default of 8 it stops compiling and runs the rest eagerly: `ddprobe
# advise` (budgets 4, 8, chain depths 4, 7 and plain decode: 10 for layer_pre) then timed its later cells (split_ws,
# the chain on FlashMLA) with ~50 unfused kernels a layer more than its first (H100, 2026-12-07: split_ws's budget-8
# step at 8k 26.6 ms, against 17.3 compiled on 2026-12-06 and 14.2 on an H200 with this limit).
RECOMPILE_LIMIT = 64


class Fused:
    """The compiled functions (or the plain ones: ``Fused(compile=False)``)."""

    def __init__(self, compile: bool = True):
        if compile:
            import torch._dynamo.config as dynamo_config

            dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, RECOMPILE_LIMIT)
        wrap = (lambda f: torch.compile(f, dynamic=False, fullgraph=True)) if compile else (lambda f: f)
        self.compiled = compile
        self.layer = (wrap(layer_pre), wrap(layer_post))
        self.drafter_layer = wrap(drafter_layer)
        self.drafter_head = wrap(drafter_head)
        self.verify_head = wrap(verify_head)
