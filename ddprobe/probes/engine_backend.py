"""The reference DDTree engine in-process, behind the probes' backend interface."""
from __future__ import annotations

import os
from typing import Any

from .backends import BackendError, GenStats

DTYPES = ("fp32", "bf16", "fp16", "fp64")
DEFAULT_MAX_CTX = 8192
WEIGHTS = ("auto", "trained", "random")  # auto: the preset's shipped weights when it has them


class EngineBackend:
    """Runs ``ddprobe.engine.generate.Engine`` in this process (torch imported here, lazily)."""

    name = "engine"

    def __init__(self, preset: str = "tiny", attn: str = "reference", budget: int = 8, device: str = "cpu",
                 dtype: str = "fp32", seed: int = 0, heads: int | None = None, max_ctx: int | None = None,
                 weights: str = "auto"):
        import torch

        from ..engine.config import ModelConfig
        from ..engine.generate import Engine
        from ..engine import weights as shipped
        from ..engine.tokenizer import WordTokenizer

        if weights not in WEIGHTS:
            raise BackendError(f"unknown weights {weights!r}; known: {', '.join(WEIGHTS)}")
        if dtype not in DTYPES:
            raise BackendError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPES)}")
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise BackendError(f"--device {device}: no CUDA GPU is visible to torch")
        if attn != "reference" and not device.startswith("cuda") and os.environ.get("TRITON_INTERPRET", "0") in ("",
                                                                                                          "0"):
            raise BackendError(f"--attn {attn} runs Triton kernels: use --device cuda (or TRITON_INTERPRET=1 to "
                               "run them slowly on the CPU)")
        try:
            cfg = ModelConfig.from_name(preset, heads=heads)
            self.limit = self._position_limit(cfg)
            if max_ctx is not None and max_ctx > self.limit:
                raise BackendError(f"the {preset} preset supports {self.limit} tokens of context, asked for {max_ctx}")
            # KV capacity is allocated up front: without a request, keep it modest
            cfg = cfg.with_overrides(max_ctx=max_ctx if max_ctx is not None else min(self.limit, DEFAULT_MAX_CTX))
            tdtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
                      "fp64": torch.float64}[dtype]
            self.engine = Engine(cfg, attn=attn, budget=budget, device=device, dtype=tdtype, seed=seed)
            misfit = shipped.config_mismatch(preset, cfg) if shipped.has_weights(preset) else None
            trained = weights == "trained" or (weights == "auto" and shipped.has_weights(preset) and misfit is None)
            # auto with shipped weights that do not fit this config: say so, never silently go random
            self.note = (f"random weights: the shipped {preset} weights do not fit this config ({misfit}); "
                         f"commit length will be near 1" if weights == "auto" and misfit else None)
            if trained:
                shipped.load_into(self.engine, preset)
        except ValueError as e:  # the engine's own checks: unknown preset/path, bad budget...
            if isinstance(e, BackendError):
                raise
            raise BackendError(str(e)) from None
        self.weights = "trained" if trained else f"random (seed {seed})"
        self.tokenizer = shipped.load_tokenizer(preset) if trained else WordTokenizer.default()
        self.preset, self.attn, self.budget, self.device, self.dtype, self.seed = preset, attn, budget, device, \
            dtype, seed

    @staticmethod
    def _position_limit(cfg) -> int:
        """Longest context the preset's RoPE covers: YaRN factor x original length (else its KV default)."""
        y = cfg.target.yarn
        return int(y.factor * y.original_max_position) if y is not None else cfg.max_ctx

    def tokenize(self, text: str) -> list[int]:
        vocab = self.engine.config.target.vocab_size
        return [i % vocab for i in self.tokenizer.encode(text)]

    def max_context(self) -> int | None:
        return min(self.limit, self.engine.max_ctx)

    def attention(self):
        """(AttnShape, KV dtype name, softmax scale) of the target: what floors and kernel comparisons need."""
        t = self.engine.config.target
        return t.attn_shape, self.dtype, t.sm_scale

    def describe(self) -> dict[str, Any]:
        t = self.engine.config.target
        return {"backend": self.name, "preset": self.preset, "attn": self.attn, "kv_layout": self.engine.kv_layout,
                "budget": self.budget, "block_size": self.engine.config.drafter.block_size, "device": self.device,
                "dtype": self.dtype, "seed": self.seed, "weights": self.weights, "layers": t.num_layers, "heads": t.num_heads,
                "kv_row": t.kv_dim, "vocab": t.vocab_size}

    def generate(self, input_ids: list[int], max_new_tokens: int) -> GenStats:
        try:
            res = self.engine.generate(input_ids, max_new_tokens, temperature=0.0)
        except ValueError as e:
            raise BackendError(str(e)) from None
        steps = res.steps
        return GenStats(
            prompt_tokens=res.prompt_len, completion_tokens=len(res.tokens), verify_steps=len(steps),
            commit_lens=[s.commit_len for s in steps],
            drafts_per_step=sum(s.tree_size for s in steps) / len(steps) if steps else None,
            prefill_s=res.prefill_ms / 1e3, decode_s=res.decode_ms / 1e3,
            e2e_s=(res.prefill_ms + res.decode_ms) / 1e3, tokens=list(res.tokens),
            step_times_s=[s.step_ms / 1e3 for s in steps],
            extra={"verify_ms_mean": sum(s.verify_ms for s in steps) / len(steps) if steps else None,
                   "draft_ms_mean": sum(s.draft_ms for s in steps) / len(steps) if steps else None},
        )
