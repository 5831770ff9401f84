"""The engine: models + KV cache + the DDTree generate loop (draft, tree build, verify, walk, commit).

    eng = Engine("tiny", attn="reference", kv_layout="paged", budget=8)
    eng.warmup()                                              # {"warmup_s": ..., "what": ...}
    res = eng.generate([1, 2, 3], max_new_tokens=64)          # GenerateResult(tokens, steps, ...)
    ref = eng.greedy_reference([1, 2, 3], max_new_tokens=64)  # plain greedy, one token per step

Verify and single-token decode use the selected attention path (``kernels.get_path(attn)``);
prefill goes through ``prefill_attn`` ("prefill": PyTorch's fused attention, no score buffer; chunks of
1024 rows on CPU, 16384 on CUDA, on a grid fixed from position 0; prefix reuse truncates to that grid, so
a prompt prefilled in two calls gets the rows of one call, to the bit) with ``on_prefill(done, total)``
after every chunk.
Prefix reuse (``generate(..., reuse_prefix=True)``): the cache of the prompt is kept after the call;
the next such call keeps the longest common prefix with it and prefills only the rest.
graphs (default: on for CUDA, off on CPU): decode steps run on the static buffers and device plan
of a ``graphs.StaticStep`` kept per capacity and captured as CUDA graphs once; on CPU graphs=True
runs that same static step eagerly (what the tests compare with the eager loop).
device_tree (default on; static steps at temperature 0 only): the tree build and the walk run on
the device (``tree_device.py``), one device-to-host copy per step; sampling keeps them on the host.
"""
from __future__ import annotations

import time
from typing import Callable

import torch
from torch import nn

from . import kernels
from .config import ModelConfig
from .drafter import Drafter, DrafterContext
from .fuse import Fused
from .graphs import StaticStep
from .kv_cache import LAYOUTS, KVCache
from .loop import decode_eager, decode_static
from .records import GenerateResult
from .target import TargetModel
from .tree import TREE_SHAPES, target_picks

Proposer = Callable[[int, int], torch.Tensor]  # (context_len, bonus) -> log-probs [L, V]


class Engine:
    def __init__(self, config: ModelConfig | str = "tiny", attn: str = "reference", kv_layout: str | None = None,
                 budget: int = 8, *, device="cpu", dtype: torch.dtype = torch.float32, seed: int = 0,
                 shuffle_slots: bool = False, poison: bool = False, tree_shape: str = "ddtree",
                 max_ctx: int | None = None, prefill_attn: str = "prefill",
                 prefill_score_bytes: float | None = None, graphs: bool | None = None, device_tree: bool = True):
        self.config = ModelConfig.from_name(config) if isinstance(config, str) else config
        if budget < 1:
            raise ValueError(f"budget must be >= 1, got {budget}")
        if tree_shape not in TREE_SHAPES:
            raise ValueError(f"unknown tree shape {tree_shape!r}; known: {', '.join(TREE_SHAPES)}")
        self.path = kernels.get_path(attn)
        self.prefill_path = kernels.get_path(prefill_attn)
        want = self.path.layout
        if kv_layout is None:
            kv_layout = "paged" if want == "any" else want
        if kv_layout not in LAYOUTS:
            raise ValueError(f"unknown kv layout {kv_layout!r}; known: {', '.join(LAYOUTS)}")
        for name, p in ((attn, self.path), (prefill_attn, self.prefill_path)):
            if p.layout != "any" and kv_layout != p.layout:
                raise ValueError(f"attention path {name!r} needs kv_layout={p.layout!r}, got {kv_layout!r}")
        self.attn, self.kv_layout, self.budget, self.tree_shape = attn, kv_layout, budget, tree_shape
        self.device, self.dtype, self.seed = torch.device(device), dtype, seed
        self.shuffle_slots, self.poison = shuffle_slots, poison
        # graphs need a path that reads the prefix length from device memory (device plans)
        self.graphs = (self.device.type == "cuda" and self._device_plans()) if graphs is None else bool(graphs)
        if self.graphs and not self._device_plans():
            raise ValueError(f"attention path {attn!r} takes host plans only: use graphs=False")
        self._static: StaticStep | None = None  # the captured step, reused while a request fits
        # static steps at temperature 0: tree build and walk on the device, one copy back per step
        self.device_tree = bool(device_tree)
        # graph mode on CUDA: the model around the attention goes through torch.compile (fuse.py)
        self.fuse = self.graphs and self.device.type == "cuda"
        self._fused: Fused | None = None
        self.compile_error: str | None = None  # why torch.compile was given up, if it was
        self.max_ctx = max_ctx or self.config.max_ctx
        # prefill chunking: the reference path holds fp32 scores [chunk, H, prefix + chunk]; the
        # prefill path none (chunks only pace the progress report); the verify paths take 64 rows
        if prefill_score_bytes is None:
            prefill_score_bytes = 2e9 if self.device.type == "cuda" else 256e6
        self.prefill_score_bytes = prefill_score_bytes
        self.prefill_max_rows = {"reference": 512, "prefill": 16384 if self.device.type == "cuda" else 1024}.get(
            prefill_attn, 64)
        self._kept: tuple[list[int], KVCache, DrafterContext] | None = None  # reuse_prefix's prompt cache
        target = TargetModel(self.config.target)
        target.fp32_logits = self.config.fp32_logits
        drafter = Drafter(self.config.drafter, self.config.target)
        self.model = nn.ModuleDict({"target": target, "drafter": drafter})  # state_dict keys target.* / drafter.*
        self.init_weights(seed)

    def _device_plans(self) -> bool:
        """Does the verify path take device plans (what a captured step needs)? Its declared capability."""
        return bool(self.path.device_plans)

    # ---- weights -------------------------------------------------------------------------
    @property
    def target(self) -> TargetModel:
        return self.model["target"]

    @property
    def drafter(self) -> Drafter:
        return self.model["drafter"]

    def init_weights(self, seed: int) -> None:
        """Random weights from ``seed`` (the target from seed, the drafter from seed + 1)."""
        self.model.to(device="cpu", dtype=torch.float32)
        self.target.init_weights(seed)
        self.drafter.init_weights(seed + 1)
        self.model.to(device=self.device, dtype=self.dtype).eval().requires_grad_(False)

    def load_state_dict(self, state_dict: dict, strict: bool = True):
        """Trained weights (keys ``target.*`` and ``drafter.*``), cast to the engine's dtype."""
        return self.model.load_state_dict(state_dict, strict=strict)

    def state_dict(self) -> dict:
        return self.model.state_dict()

    # ---- helpers -------------------------------------------------------------------------
    @property
    def num_draft(self) -> int:  # L
        return self.config.drafter.num_draft

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _check(self, prompt_ids, max_new_tokens: int, rows: int) -> None:
        if len(prompt_ids) == 0:
            raise ValueError("empty prompt: give at least one token id")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        v = self.config.target.vocab_size
        if min(prompt_ids) < 0 or max(prompt_ids) >= v:
            raise ValueError(f"prompt token ids must be in [0, {v}), got min {min(prompt_ids)} max {max(prompt_ids)}")
        need = len(prompt_ids) + max_new_tokens + rows
        if need > self.max_ctx:
            raise ValueError(f"context beyond the cache: prompt {len(prompt_ids)} + max_new_tokens {max_new_tokens} "
                             f"+ {rows} verify rows = {need} > max_ctx {self.max_ctx}")

    def new_cache(self, capacity: int | None = None) -> KVCache:
        """A fresh latent KV cache of ``capacity`` token rows (default max_ctx)."""
        t = self.config.target
        return KVCache(t.num_layers, capacity or self.max_ctx, t.kv_dim, self.kv_layout, dtype=self.dtype, device=self.device,
                       shuffle=self.shuffle_slots, seed=self.seed, poison=self.poison)

    def _forward(self, kv: KVCache, tokens: torch.Tensor, positions: torch.Tensor, tree_mask: torch.Tensor, path,
                 last_only: bool = False):
        """Run the target on new rows (reserved, written, attended); the caller commits.
        Returns (logits [T, V], features [T, F]); last_only: the logits of the last row only ([1, V]: a
        prefill chunk of 16k rows would otherwise hold 16k x V fp32 logits)."""
        prefix = kv.committed
        write_idx, slots = kv.reserve(tokens.numel())
        plan = path.plan(prefix, tree_mask, slots, self.config.target.kv_lora_rank)
        hidden, feats = self.target(tokens, positions, kv.buffer, write_idx, plan, path)
        logits = self.target.logits(hidden[-1:] if last_only else hidden)
        if self.poison and not bool(torch.isfinite(hidden).all() and torch.isfinite(logits).all()):
            raise RuntimeError(f"NaN in target logits (path {path.name}): attention read a row outside the plan")
        return logits, feats

    @torch.no_grad()
    def prefill(self, kv: KVCache, prompt_ids: list[int], dctx: DrafterContext | None = None,
                on_prefill: Callable[[int, int], None] | None = None) -> torch.Tensor:
        """Causal prefill of the prompt tokens not yet in ``kv`` (from ``kv.committed`` on), in chunks
        through ``prefill_attn`` -> logits [V] of the last token. on_prefill(done, total) is called before
        the first chunk and after every chunk."""
        t = self.config.target
        ids = torch.tensor(prompt_ids, dtype=torch.int64, device=self.device)
        n, logits = ids.numel(), None
        if kv.committed >= n:
            raise ValueError(f"nothing to prefill: {kv.committed} tokens cached for a {n}-token prompt")
        if on_prefill is not None:
            on_prefill(kv.committed, n)
        grid = self.prefill_path.name == "prefill"  # chunks on a grid fixed from position 0
        while kv.committed < n:
            c0 = kv.committed
            if grid:  # up to the next grid line
                limit = self.prefill_max_rows - c0 % self.prefill_max_rows
            else:  # fp32 score bytes of the reference path: per query row H x 4 x (prefix + chunk)
                limit = self.prefill_score_bytes // (t.num_heads * 4 * (c0 + 512) + 1)
            chunk = int(max(1, min(self.prefill_max_rows, n - c0, limit)))
            mask = torch.ones(chunk, chunk, dtype=torch.bool, device=self.device).tril_()
            pos = torch.arange(c0, c0 + chunk, dtype=torch.int64, device=self.device)
            logits, feats = self._forward(kv, ids[c0: c0 + chunk], pos, mask, self.prefill_path, last_only=True)
            kv.commit(torch.arange(chunk))
            if dctx is not None:
                self.drafter.append_context(dctx, feats, pos)
            if on_prefill is not None:
                on_prefill(kv.committed, n)
        return logits[-1]

    # ---- decoding ------------------------------------------------------------------------
    def _static_for(self, need: int, reset: bool = True) -> tuple[StaticStep, str, float]:
        """The StaticStep for a request of ``need`` tokens: the held one when it fits (emptied unless
        ``reset`` is False), else a new one (captured on CUDA). Returns (step, what was captured, capture ms)."""
        st = self._static
        if st is not None and st.capacity >= need:
            if reset:
                st.reset()
            return st, "", 0.0
        self._kept = None  # its cache goes with the old step
        self._static = st = None  # free the old buffers and graphs first (no reference may keep them)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        if self.fuse and self._fused is None:
            self._fused = Fused()
        st = StaticStep(self, need, self._fused if self.fuse else None)
        cap_ms, what = 0.0, ""
        if self.device.type == "cuda":
            try:
                cap_ms = st.capture() * 1e3
            except Exception as e:  # noqa: BLE001  torch.compile failed (its warm-up runs precede capture)
                if st.fused is None or not st.fused.compiled:
                    raise
                self.compile_error = f"{type(e).__name__}: {e}"[:300]
                self._fused = Fused(compile=False)
                st = None  # the failed step's buffers go before the plain one is built
                torch.cuda.empty_cache()
                st = StaticStep(self, need, self._fused)
                cap_ms = st.capture() * 1e3
            what = "+".join(st.graphs)
        self._static = st
        return st, what, cap_ms

    @torch.no_grad()
    def warmup(self, capacity: int | None = None, prompt_len: int = 8) -> dict:
        """Compile and (graphs on CUDA) capture, then run one throwaway step, before anything is
        measured. capacity: the largest request (prompt + new tokens + budget + 1) to come
        (default max_ctx); later requests up to it replay the same graphs. Returns
        {"warmup_s": seconds, "what": "compile + capture" (CUDA graphs) | "compile" (CUDA, eager) |
        "first step" (CPU), "capacity": tokens}."""
        cap = min(self.max_ctx, capacity or self.max_ctx)
        need = prompt_len + 2 + self.budget + 1
        if cap < need:
            raise ValueError(f"warm-up capacity {cap} below one short request ({need} tokens)")
        t0 = time.perf_counter()
        if self.graphs:
            self._static_for(cap)
        prompt = [i % self.config.target.vocab_size for i in range(prompt_len)]
        self.generate(prompt, 2)  # prefill and decode compile here (Triton, cuBLAS), one step runs
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        cuda = self.device.type == "cuda"
        what = ("compile + capture" if self.graphs else "compile") if cuda else "first step"
        return {"warmup_s": time.perf_counter() - t0, "what": what, "capacity": cap}

    def forget_prefix(self) -> None:
        """Drop the prompt cache kept by ``generate(reuse_prefix=True)``."""
        self._kept = None

    def _caches(self, prompt_ids: list[int], need: int, reuse: bool):
        """(kv, dctx, static step or None, capture what, capture ms, reused tokens) for a request: the
        kept prompt cache truncated to the longest common prefix (reuse), else empty ones."""
        kept, self._kept = self._kept, None
        st, captured, cap_ms = None, "", 0.0
        if self.graphs:
            # a reusable step is sized for the largest request to come (max_ctx), as the warm-up's is
            st, captured, cap_ms = self._static_for(max(need, self.max_ctx) if reuse else need, reset=False)
            kv, dctx = st.kv, st.dctx
            if not (reuse and kept is not None and kept[1] is kv):
                st.reset()
                kept = None
        elif reuse and kept is not None and kept[1].capacity >= need:
            kv, dctx = kept[1], kept[2]
        else:  # a reusable cache is sized for the largest request to come (max_ctx)
            kept = None
            cap = max(need, self.max_ctx) if reuse else need
            kv, dctx = self.new_cache(cap), self.drafter.new_context(cap)
        n = 0
        if kept is not None:
            old = kept[0]
            while n < min(len(old), len(prompt_ids)) and old[n] == prompt_ids[n]:
                n += 1
            n = min(n, len(prompt_ids) - 1)  # the last prompt token is always prefilled: its logits
            if self.prefill_path.name == "prefill":  # back to the chunk grid: every kept row is then the row
                n -= n % self.prefill_max_rows       # a fresh prefill computes, to the bit
            kv.truncate(n)
            dctx.n = n
        return kv, dctx, st, captured, cap_ms, n

    @torch.no_grad()
    def generate(self, prompt_ids: list[int], max_new_tokens: int, temperature: float = 0.0,
                 seed: int | None = None, proposer: Proposer | None = None,
                 on_tokens: Callable[[list[int], int], None] | None = None, *, reuse_prefix: bool = False,
                 on_prefill: Callable[[int, int], None] | None = None) -> GenerateResult:
        """DDTree speculative decoding. ``proposer`` (tests) replaces the drafter: called with
        (context_len, bonus) it returns log-probs [L, V] for the L positions after the bonus.
        on_tokens(tokens, tree_size) (servers: streaming, cancellation) is called with the prefill's
        token (tree size 0), then after every verify step with the tokens it committed; what it raises
        stops the generation and propagates. reuse_prefix: start from the prompt cache the last such call
        kept (its longest common prefix with this prompt; ``reused_tokens`` in the result) and keep this
        prompt's cache afterwards. on_prefill(done, total): prefill progress (``prefill``)."""
        self._check(prompt_ids, max_new_tokens, self.budget + 1)
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        gen = None
        if temperature > 0:
            gen = torch.Generator(device=self.device).manual_seed(self.seed if seed is None else seed)
        need = len(prompt_ids) + max_new_tokens + self.budget + 1  # sized to the request, <= max_ctx
        kv, dctx, st, captured, cap_ms, reused = self._caches(prompt_ids, need, reuse_prefix)
        t0 = self._now()
        last = self.prefill(kv, prompt_ids, dctx, on_prefill)
        bonus = target_picks(last[None], temperature, gen)[0]
        prefill_ms = (self._now() - t0) * 1e3
        if self.graphs:
            out, steps = decode_static(self, st, bonus, max_new_tokens, temperature, gen, proposer, captured, cap_ms,
                                       on_tokens=on_tokens)
        else:
            out, steps = decode_eager(self, kv, dctx, bonus, max_new_tokens, temperature, gen, proposer,
                                      on_tokens=on_tokens)
        if reuse_prefix:  # truncated back to the prompt when the next call starts
            self._kept = (list(prompt_ids), kv, dctx)
        return GenerateResult(out[:max_new_tokens], steps, prompt_len=len(prompt_ids), prefill_ms=prefill_ms,
                              attn=self.attn, kv_layout=self.kv_layout, budget=self.budget, graphs=self.graphs,
                              reused_tokens=reused)

    @torch.no_grad()
    def greedy_reference(self, prompt_ids: list[int], max_new_tokens: int,
                         on_token: Callable[[int], None] | None = None) -> list[int]:
        """Plain greedy decoding of the target: one token per step through the same attention path.
        on_token(token) (servers: streaming, cancellation) is called with each token as it is made;
        what it raises stops the decode and propagates."""
        self._check(prompt_ids, max_new_tokens, 1)
        kv = self.new_cache(len(prompt_ids) + max_new_tokens + 1)
        tok = int(self.prefill(kv, prompt_ids).argmax())
        out = [tok]
        if on_token is not None:
            on_token(tok)
        one = torch.ones(1, 1, dtype=torch.bool, device=self.device)
        while len(out) < max_new_tokens:
            pos = torch.tensor([kv.committed], dtype=torch.int64, device=self.device)
            logits, _ = self._forward(kv, torch.tensor([tok], device=self.device), pos, one, self.path)
            kv.commit([0])
            tok = int(logits[0].argmax())
            out.append(tok)
            if on_token is not None:
                on_token(tok)
        return out

    @torch.no_grad()
    def next_token_logits(self, ids: list[int]) -> torch.Tensor:
        """Full recompute: the target's logits [V] for the token after ``ids``."""
        self._check(ids, 1, 0)
        return self.prefill(self.new_cache(len(ids)), ids)
