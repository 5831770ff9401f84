"""Measurements that cannot be right, flagged rather than reported as numbers: a cell whose output is one token
repeated, or whose target logits are not finite (or all equal: a model whose hidden state collapsed to zero, as
fp16 overflow in a norm once did, picks token 0 forever). Its row carries ``suspect`` (the reason, or None); the
table marks the cell and a warning line says why. Nothing here imports torch (``logits_problem`` takes a tensor).
"""
from __future__ import annotations

from typing import Sequence

from ...units import fmt_tokens

REPEAT_MIN = 8  # an output of at least this many tokens, all one id, is not text


def logits_problem(logits) -> str | None:
    """'not finite', 'all equal' or None for a logits tensor [..., V] (torch, duck-typed)."""
    if not bool(logits.isfinite().all()):
        return "not finite"
    if float(logits.max() - logits.min()) == 0.0:
        return "all equal"
    return None


def suspect(tokens: Sequence[int], logits: str | None = None) -> str | None:
    """Why a cell's numbers cannot be trusted, or None: ``tokens`` its output, ``logits`` what
    ``logits_problem`` found in the target's logits after it (None: fine or not checked)."""
    why = []
    if len(tokens) >= REPEAT_MIN and len(set(tokens)) == 1:
        why.append(f"every one of its {len(tokens)} output tokens is id {tokens[0]}")
    if logits:
        why.append(f"the target's logits are {logits}")
    return "; ".join(why) or None


def suspect_notes(rows: Sequence[dict]) -> list[str]:
    """One line per flagged row."""
    return [f"{r['text']} @ {fmt_tokens(r['ctx'])} is suspect: {r['suspect']} (dtype or weights broken?); its "
            "commit length is not a measurement" for r in rows if r.get("suspect")]
