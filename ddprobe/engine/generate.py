"""The engine: settings, models and the public API of DDTree decoding (draft, tree build, verify, walk, commit).

    eng = Engine("tiny", attn="reference", kv_layout="paged", budget=8)
    eng.warmup()                                              # {"warmup_s": ..., "what": ...}
    res = eng.generate([1, 2, 3], max_new_tokens=64)          # GenerateResult(tokens, steps, ...)
    ref = eng.greedy_reference([1, 2, 3], max_new_tokens=64)  # plain greedy, one token per step

Verify and single-token decode use the selected attention path (``kernels.get_path(attn)``; with graphs,
``greedy_reference`` runs the static one-row decode step, ``graphs.DecodeStep``);
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
Who does what: the engine checks requests and holds the settings and the models; a
``runner.StepRunner`` built for the frozen ``spec.StepSpec`` of the settings (rebuilt when they
change) owns the caches, the plans, the static step and its graphs; ``loop.prefill`` and
``loop.decode`` run a request over both, ``decode`` calling a step strategy of ``steps.py``.
"""
from __future__ import annotations

import time
from typing import Callable

import torch
from torch import nn

from .. import verify_paths
from . import kernels
from ..physics.presets import ModelConfig
from .drafter import Drafter, DrafterContext
from .kv_cache import LAYOUTS, KVCache
from .loop import decode, greedy, plain_step, prefill
from .records import GenerateResult
from .runner import StepRunner
from .spec import Models, StepSpec
from .target import TargetModel
from .tree import TREE_SHAPES, target_picks

Proposer = Callable[[int, int], torch.Tensor]  # (context_len, bonus) -> log-probs [L, V]


class Engine:
    def __init__(self, config: ModelConfig | str = "tiny", attn: str = "reference", kv_layout: str | None = None,
                 budget: int = 8, *, device="cpu", dtype: torch.dtype = torch.float32, seed: int = 0,
                 shuffle_slots: bool = False, poison: bool = False, tree_shape: str = "ddtree",
                 max_ctx: int | None = None, prefill_attn: str = "prefill",
                 prefill_score_bytes: float | None = None, graphs: bool | None = None, device_tree: bool = True,
                 compile: bool | None = None):
        self.config = ModelConfig.from_name(config) if isinstance(config, str) else config
        if budget < 1:
            raise ValueError(f"budget must be >= 1, got {budget}")
        if tree_shape not in TREE_SHAPES:
            raise ValueError(f"unknown tree shape {tree_shape!r}; known: {', '.join(TREE_SHAPES)}")
        self.path = kernels.get_path(attn)
        t = self.config.target
        why = verify_paths.rows_why_not(verify_paths.get(attn), (t.kv_lora_rank, t.qk_rope_head_dim))
        if why:  # before any weight is made, naming the model's real widths
            raise ValueError(f"attention path {attn!r} cannot run the {self.config.name} model: {why}")
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
        # static steps at temperature 0: tree build and walk on the device, one copy back per step
        self.device_tree = bool(device_tree)
        # graph mode on CUDA: the model around the attention goes through torch.compile (fuse.py), unless
        # ``compile`` is False (None: on). It saves small kernels per layer (tiny on the H200: 0.6 ms per step
        # instead of 0.9) for seconds of warm-up (13-15 s on a first run, about 5 s on a second)
        if compile and not (self.graphs and self.device.type == "cuda"):
            raise ValueError("compile fuses the CUDA-graph step: it needs graphs on a CUDA device")
        self.fuse = self.graphs and self.device.type == "cuda" and compile is not False
        self.max_ctx = max_ctx or self.config.max_ctx
        # prefill chunking: the reference path holds fp32 scores [chunk, H, prefix + chunk]; the
        # prefill path none (chunks only pace the progress report); the verify paths take 64 rows
        if prefill_score_bytes is None:
            prefill_score_bytes = 2e9 if self.device.type == "cuda" else 256e6
        self.prefill_score_bytes = prefill_score_bytes
        self.prefill_max_rows = {"reference": 512, "prefill": 16384 if self.device.type == "cuda" else 1024}.get(
            prefill_attn, 64)
        self._runner: StepRunner | None = None  # built for the settings' spec (``runner``)
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

    @property
    def models(self) -> Models:
        return Models(self.target, self.drafter)

    def init_weights(self, seed: int) -> None:
        """Random weights from ``seed`` (the target from seed, the drafter from seed + 1)."""
        self.model.to(device="cpu", dtype=torch.float32)
        self.target.init_weights(seed)
        self.drafter.init_weights(seed + 1)
        self.model.to(device=self.device, dtype=self.dtype).eval().requires_grad_(False)
        self.target.join_projections()  # the GEMMs that share an input as one each (joined again after a move)

    def load_state_dict(self, state_dict: dict, strict: bool = True):
        """Trained weights (keys ``target.*`` and ``drafter.*``), cast to the engine's dtype."""
        out = self.model.load_state_dict(state_dict, strict=strict)
        self.target.join_projections()  # a no-op after an in-place load; joins again where a load replaced tensors
        return out

    def state_dict(self) -> dict:
        return self.model.state_dict()

    # ---- the step plan and its runner -------------------------------------------------------
    def spec(self) -> StepSpec:
        """The frozen plan of this engine's decode steps, from its current settings."""
        return StepSpec(self.path, self.prefill_path, self.kv_layout, self.budget, self.tree_shape, self.device,
                        self.dtype, self.seed, self.shuffle_slots, self.poison, self.graphs, self.device_tree,
                        self.fuse, self.prefill_max_rows, self.prefill_score_bytes)

    @property
    def runner(self) -> StepRunner:
        """The StepRunner of the current settings: the held one (its static step, graphs and kept
        prompt cache) while they are unchanged, else a new one."""
        spec, r = self.spec(), self._runner
        if r is None or r.spec != spec or r.config is not self.config or r.max_ctx != self.max_ctx:
            self._runner = r = None  # the old runner's buffers and graphs go first (unless a copy holds them)
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            self._runner = r = StepRunner(spec, self.config, self.max_ctx)
        return r

    def release(self) -> None:
        """Free the static step (buffers, CUDA graphs) and the kept prompt cache; the next request
        builds them again (the compiled functions stay)."""
        if self._runner is not None:
            self._runner.release()

    @property
    def compile_error(self) -> str | None:
        """Why torch.compile was given up (graph mode on CUDA), if it was."""
        return self._runner.compile_error if self._runner is not None else None

    @property
    def compiled(self) -> bool:
        """Whether the captured step runs torch.compile'd functions: asked for (``fuse``) and not given up."""
        return bool(self.fuse) and self.compile_error is None

    @property
    def attn_fallback(self) -> str | None:
        """Why the held steps' verify plan runs the fp32 reference instead of its path's kernels (split on a GPU
        whose table does not fit the rows, or a kernel that did not build there), if it does."""
        r = self._runner
        for st in ((r.static, r.decode) if r is not None else ()):
            why = st is not None and (getattr(st.plan, "extra", None) or {}).get("fallback")
            if why:
                return why
        return None

    @property
    def fused_tree_fallback(self) -> str | None:
        """Why the captured step builds the draft tree with the plain device build, not the fused Triton kernel
        (CUDA graphs; ``tree_device.fused_tree_fallback``), if it does."""
        st = self._runner.static if self._runner is not None else None
        return st.fused_tree_fallback if st is not None else None

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
        return self.runner.new_cache(capacity)

    @torch.no_grad()
    def prefill(self, kv: KVCache, prompt_ids: list[int], dctx: DrafterContext | None = None,
                on_prefill: Callable[[int, int], None] | None = None) -> torch.Tensor:
        """Causal prefill of the prompt tokens not yet in ``kv`` (from ``kv.committed`` on), in chunks
        through ``prefill_attn`` -> logits [V] of the last token (``loop.prefill``). on_prefill(done, total)
        is called before the first chunk and after every chunk."""
        return prefill(self.runner, self.models, kv, prompt_ids, dctx, on_prefill)

    # ---- decoding ------------------------------------------------------------------------
    @torch.no_grad()
    def warmup(self, capacity: int | None = None, prompt_len: int = 8, plain: bool = False) -> dict:
        """Compile and (graphs on CUDA) capture, then run one throwaway step, before anything is
        measured: the DDTree step, or with ``plain`` the plain decode step (``greedy_reference``: serve
        --no-spec). capacity: the largest request (prompt + new tokens + budget + 1) to come (default
        max_ctx); later requests up to it replay the same graphs. Returns {"warmup_s": seconds, "what":
        "compile + capture" (CUDA graphs, torch.compile) | "kernels + capture" (CUDA graphs, compile off) |
        "kernels" (CUDA, eager) | "first step" (CPU), "capacity": tokens}; Triton's kernels compile in all CUDA cases
        (or load from the persistent cache, compile_cache.py)."""
        cap = min(self.max_ctx, capacity or self.max_ctx)
        need = prompt_len + 2 + self.budget + 1
        if cap < need:
            raise ValueError(f"warm-up capacity {cap} below one short request ({need} tokens)")
        t0 = time.perf_counter()
        prompt = [i % self.config.target.vocab_size for i in range(prompt_len)]
        if plain:
            if self.graphs:
                self.runner.decode_for(self.models, cap)
            self.greedy_reference(prompt, 2)
        else:
            if self.graphs:
                self.runner.static_for(self.models, cap)
            self.generate(prompt, 2)  # prefill and decode compile here (Triton, cuBLAS), one step runs
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        cuda = self.device.type == "cuda"
        what = ("first step" if not cuda else "compile + capture" if self.compiled else
                "kernels + capture" if self.graphs else "kernels")
        if self.fuse and not self.compiled:
            what += f" (torch.compile failed, the plain functions captured: {self.compile_error[:160]})"
        if self.attn_fallback:
            what += f" (attention: the fp32 reference runs, {self.attn_fallback[:160]})"
        return {"warmup_s": time.perf_counter() - t0, "what": what, "capacity": cap}

    def forget_prefix(self) -> None:
        """Drop the prompt cache kept by ``generate(reuse_prefix=True)``."""
        if self._runner is not None:
            self._runner.forget()

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
        runner, models = self.runner, self.models
        c = runner.caches(models, prompt_ids, need, reuse_prefix)
        t0 = self._now()
        last = prefill(runner, models, c.kv, prompt_ids, c.dctx, on_prefill)
        bonus = target_picks(last[None], temperature, gen)[0]
        prefill_ms = (self._now() - t0) * 1e3
        out, steps = decode(runner, models, c, bonus, max_new_tokens, temperature, gen, proposer, on_tokens)
        if reuse_prefix:  # truncated back to the prompt when the next call starts
            runner.keep(prompt_ids, c)
        return GenerateResult(out[:max_new_tokens], steps, prompt_len=len(prompt_ids), prefill_ms=prefill_ms,
                              attn=self.attn, kv_layout=self.kv_layout, budget=self.budget, graphs=self.graphs,
                              reused_tokens=c.reused)

    @torch.no_grad()
    def greedy_reference(self, prompt_ids: list[int], max_new_tokens: int,
                         on_token: Callable[[int], None] | None = None) -> list[int]:
        """Plain greedy decoding of the target: one token per step through the same attention path.
        With graphs: the static one-row decode step (``graphs.DecodeStep``, a CUDA graph replayed per token on a
        GPU; the same step eagerly on CPU); without: eager steps on host plans (the oracle the tests compare).
        on_token(token) (servers: streaming, cancellation) is called with each token as it is made;
        what it raises stops the decode and propagates."""
        self._check(prompt_ids, max_new_tokens, 1)
        runner, need = self.runner, len(prompt_ids) + max_new_tokens + 1
        if self.graphs:
            st = runner.decode_for(self.models, need)[0]
            first = int(prefill(runner, self.models, st.kv, prompt_ids).argmax())
            return greedy(runner, st, first, max_new_tokens, on_token)
        kv = runner.new_cache(need)
        tok = int(prefill(runner, self.models, kv, prompt_ids).argmax())
        out = [tok]
        if on_token is not None:
            on_token(tok)
        while len(out) < max_new_tokens:
            tok = int(plain_step(runner, self.models, kv, tok)[0].argmax())
            out.append(tok)
            if on_token is not None:
                on_token(tok)
        return out

    @torch.no_grad()
    def next_token_logits(self, ids: list[int]) -> torch.Tensor:
        """Full recompute: the target's logits [V] for the token after ``ids``."""
        self._check(ids, 1, 0)
        return self.prefill(self.new_cache(len(ids)), ids)
