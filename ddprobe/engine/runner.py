"""The step runner (nano-vllm's ModelRunner role): the one owner of what decode steps run on.

    runner = StepRunner(spec, config, max_ctx)            # spec: the frozen spec.StepSpec
    c = runner.caches(models, prompt_ids, need, reuse)    # the request's cache, context, static step
    logits, feats = runner.forward(target, kv, tokens, positions, mask, path)
    runner.keep(prompt_ids, c)                            # reuse_prefix: keep the prompt's cache
    st, captured, ms = runner.decode_for(models, need)    # plain greedy: the static one-row step

Owned here: the KV cache and drafter context of a request (sized to it; for prefix reuse, sized for
max_ctx and kept after the call), the verify plan (a host plan per forward, or the static step's
device plan), and in graph mode the ``graphs.StaticStep`` kept per capacity with its CUDA graphs
and the torch.compile'd functions (``fuse.Fused``; should compiling fail, the plain functions take
over and ``compile_error`` says why), and the plain decode step (``graphs.DecodeStep``, on the static
step's cache when that one is large enough: a request runs one or the other). It holds no weights:
the models come with each call.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..physics.presets import ModelConfig
from .drafter import DrafterContext
from .fuse import Fused
from .graphs import DecodeStep, StaticStep
from .kv_cache import KVCache
from .spec import Models, StepSpec
from .target import TargetModel


@dataclass
class Caches:
    """What one request decodes on: its cache and drafter context, the static step holding them
    (graph mode; else None), what was captured for it (and in how many ms), prompt tokens reused."""

    kv: KVCache
    dctx: DrafterContext
    static: StaticStep | None = None
    captured: str = ""
    capture_ms: float = 0.0
    reused: int = 0


class StepRunner:
    def __init__(self, spec: StepSpec, config: ModelConfig, max_ctx: int):
        self.spec, self.config, self.max_ctx = spec, config, max_ctx
        self.static: StaticStep | None = None  # the captured step, reused while a request fits
        self.decode: DecodeStep | None = None  # the captured plain decode step, likewise
        self.fused: Fused | None = None
        self.compile_error: str | None = None  # why torch.compile was given up, if it was
        self.kept: tuple[list[int], KVCache, DrafterContext] | None = None  # reuse_prefix's prompt cache

    def new_cache(self, capacity: int | None = None) -> KVCache:
        """A fresh latent KV cache of ``capacity`` token rows (default max_ctx), rounded up to the path's row multiple
        (FlashMLA reads whole 64-row pages)."""
        t, s = self.config.target, self.spec
        m = getattr(s.path, "KV_ROWS_MULTIPLE", 1)
        return KVCache(t.num_layers, -(-(capacity or self.max_ctx) // m) * m, t.kv_dim, s.kv_layout, dtype=s.dtype, device=s.device,
                       shuffle=s.shuffle_slots, seed=s.seed, poison=s.poison)

    def require_finite(self, path, finite: Callable[[], bool]) -> None:
        """With poison on, a non-finite logit means the attention read a row outside the plan: raise.
        ``finite`` is asked only then (it may wait for the device)."""
        if self.spec.poison and not finite():
            raise RuntimeError(f"NaN in target logits (path {path.name}): attention read a row outside the plan")

    def forward(self, target: TargetModel, kv: KVCache, tokens: torch.Tensor, positions: torch.Tensor,
                tree_mask: torch.Tensor, path, last_only: bool = False):
        """The target on new rows (reserved, written, attended through a host plan); the caller commits.
        Returns (logits [T, V], features [T, F]); last_only: the logits of the last row only ([1, V]: a
        prefill chunk of 16k rows would otherwise hold 16k x V fp32 logits)."""
        prefix = kv.committed
        write_idx, slots = kv.reserve(tokens.numel())
        plan = path.plan(prefix, tree_mask, slots, self.config.target.kv_lora_rank)
        hidden, feats = target(tokens, positions, kv.buffer, write_idx, plan, path)
        logits = target.logits(hidden[-1:] if last_only else hidden)
        self.require_finite(path, lambda: bool(torch.isfinite(hidden).all() and torch.isfinite(logits).all()))
        return logits, feats

    def static_for(self, models: Models, need: int, reset: bool = True) -> tuple[StaticStep, str, float]:
        """The StaticStep for a request of ``need`` tokens: the held one when it fits (emptied unless
        ``reset`` is False), else a new one (captured on CUDA). Returns (step, what was captured, capture ms)."""
        st = self.static
        if st is not None and st.capacity >= need:
            if reset:
                st.reset()
            return st, "", 0.0
        st = None
        self.release()  # the old buffers and graphs go first (no reference may keep them); the kept cache with them
        cuda = self.spec.cuda
        if self.spec.fuse and self.fused is None:
            self.fused = Fused()
        st = self._new_static(models, need)
        cap_ms, what = 0.0, ""
        if cuda:
            try:
                cap_ms = st.capture() * 1e3
            except Exception as e:  # noqa: BLE001  torch.compile failed (its warm-up runs precede capture)
                if st.fused is None or not st.fused.compiled:
                    raise
                self.compile_error = f"{type(e).__name__}: {e}"[:300]
                self.fused = Fused(compile=False)
                st = None  # the failed step's buffers go before the plain one is built
                torch.cuda.empty_cache()
                st = self._new_static(models, need)
                cap_ms = st.capture() * 1e3
            what = "+".join(st.graphs)
        self.static = st
        return st, what, cap_ms

    def decode_for(self, models: Models, need: int) -> tuple[DecodeStep, str, float]:
        """The plain decode step for a request of ``need`` tokens, emptied: the held one when it fits, else a
        new one (captured on CUDA) on the static step's cache when that holds ``need`` rows, else on its own.
        Returns (step, what was captured, capture ms)."""
        st, what, cap_ms = self.decode, "", 0.0
        if st is None or st.capacity < need:
            self.decode = st = None  # the old buffers and graph go first
            if self.spec.fuse and self.fused is None:
                self.fused = Fused()
            try:
                st, cap_ms = self._new_decode(models, need)
            except Exception as e:  # noqa: BLE001  torch.compile failed (its warm-up runs precede capture)
                if self.fused is None or not self.fused.compiled:
                    raise
                self.compile_error = f"{type(e).__name__}: {e}"[:300]
                self.fused = Fused(compile=False)
                st, cap_ms = self._new_decode(models, need)
            self.decode, what = st, "+".join(st.graphs)
        if self.kept is not None and self.kept[1] is st.kv:  # the kept prompt's rows go with the reset
            self.kept = None
        st.reset()
        return st, what, cap_ms

    def _new_decode(self, models: Models, need: int) -> tuple[DecodeStep, float]:
        kv = self.static.kv if self.static is not None and self.static.capacity >= need else self.new_cache(need)
        st = DecodeStep(models, self.config, self.spec, kv, self.fused if self.spec.fuse else None)
        return st, (st.capture() * 1e3 if self.spec.cuda else 0.0)

    def _new_static(self, models: Models, capacity: int) -> StaticStep:
        return StaticStep(models, self.config, self.spec, self.new_cache(capacity), models.drafter.new_context(capacity),
                          self.fused if self.spec.fuse else None)

    def caches(self, models: Models, prompt_ids: list[int], need: int, reuse: bool) -> Caches:
        """The caches of a request of ``need`` tokens: the kept prompt cache truncated to its longest
        common prefix with ``prompt_ids`` (reuse), else empty ones (the kept one is dropped either way)."""
        kept, self.kept = self.kept, None
        c = None
        if self.spec.graphs:
            # a reusable step is sized for the largest request to come (max_ctx), as the warm-up's is
            st, captured, cap_ms = self.static_for(models, max(need, self.max_ctx) if reuse else need, reset=False)
            c = Caches(st.kv, st.dctx, st, captured, cap_ms)
            if not (reuse and kept is not None and kept[1] is st.kv):
                st.reset()
                kept = None
        elif reuse and kept is not None and kept[1].capacity >= need:
            c = Caches(kept[1], kept[2])
        else:  # a reusable cache is sized for the largest request to come (max_ctx)
            kept = None
            cap = max(need, self.max_ctx) if reuse else need
            c = Caches(self.new_cache(cap), models.drafter.new_context(cap))
        if kept is not None:
            old, n = kept[0], 0
            while n < min(len(old), len(prompt_ids)) and old[n] == prompt_ids[n]:
                n += 1
            n = min(n, len(prompt_ids) - 1)  # the last prompt token is always prefilled: its logits
            if self.spec.prefill_path.name == "prefill":  # back to the chunk grid: every kept row is then the
                n -= n % self.spec.prefill_max_rows       # row a fresh prefill computes, to the bit
            c.kv.truncate(n)
            c.dctx.n = n
            c.reused = n
        return c

    def keep(self, prompt_ids: list[int], c: Caches) -> None:
        """Keep ``c`` as the prompt cache of ``prompt_ids`` (truncated to the prompt when the next
        ``caches(reuse=True)`` starts)."""
        self.kept = (list(prompt_ids), c.kv, c.dctx)

    def forget(self) -> None:
        self.kept = None

    def release(self) -> None:
        """Drop the static steps (their buffers and CUDA graphs) and the kept prompt cache."""
        self.static = self.decode = self.kept = None
        if self.spec.cuda:
            torch.cuda.empty_cache()
