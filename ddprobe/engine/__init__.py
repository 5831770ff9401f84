"""Reference DDTree engine: configs, MLA target, DFlash-style drafter, KV cache, tree, generate loop.

Public API:
    ModelConfig.from_name("tiny" | "k2", heads=None, **overrides)
    Engine(config="tiny", attn="reference", kv_layout=None, budget=8, *, device, dtype, seed,
           shuffle_slots, poison, tree_shape, max_ctx, graphs=None)   # graphs: CUDA graphs (None: on for CUDA)
    Engine.warmup(capacity=None) -> {"warmup_s", "what", "capacity"}   # compile + capture before measuring
    Engine.generate(prompt_ids, max_new_tokens, temperature=0.0, seed=None) -> GenerateResult
    Engine.greedy_reference(prompt_ids, max_new_tokens) -> list[int]
    Engine.release()   # free the held static step, its CUDA graphs and the kept prompt cache
    build_tree(logp [L, V], budget, bonus, shape) -> DraftTree; walk(tree, picks) -> (path, bonus)
"""
from ..physics.presets import DrafterConfig, ModelConfig, TargetConfig, YarnConfig
from .generate import Engine
from .kv_cache import KVCache
from .records import GenerateResult, StepRecord
from .tree import DraftTree, build_tree, target_picks, walk

__all__ = [
    "DrafterConfig", "DraftTree", "Engine", "GenerateResult", "KVCache", "ModelConfig", "StepRecord",
    "TargetConfig", "YarnConfig", "build_tree", "target_picks", "walk",
]
