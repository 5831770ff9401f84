"""Model architecture specs for the floor calculator: presets and Hugging Face configs.

Only what the floor needs: layers, heads, the KV row each token leaves per layer (MLA
latent or GQA keys+values), and parameter counts (total, and active per token) derived
from the config, so a Hugging Face ``config.json`` works the same way as a preset.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..units import DDProbeError


@dataclass(frozen=True)
class ModelSpec:
    name: str
    attention: str  # "mla" or "gqa"
    num_layers: int
    hidden_size: int
    num_heads: int
    vocab_size: int
    # MLA (DeepSeek-V3 family): one latent row of kv_lora_rank + qk_rope_head_dim per token per layer
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    q_lora_rank: int = 0
    # GQA: num_kv_heads keys and values of head_dim per token per layer
    num_kv_heads: int = 0
    head_dim: int = 0
    # MLP / MoE
    intermediate_size: int = 0
    moe_intermediate_size: int = 0
    n_routed_experts: int = 0
    num_experts_per_tok: int = 0
    n_shared_experts: int = 0
    first_k_dense_replace: int = 0
    tie_word_embeddings: bool = False

    # ---- KV cache -----------------------------------------------------------
    def kv_values_per_token_layer(self) -> int:
        """Values one token stores per layer: 576 for MLA (512 latent + 64 rope)."""
        if self.attention == "mla":
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.num_kv_heads * self.head_dim

    def kv_bytes_per_token(self, kv_bytes: float = 2.0, tp: int = 1) -> float:
        """KV bytes per token (all layers) held by ONE GPU under tensor parallel ``tp``.

        MLA's latent row is shared by all heads, so every GPU keeps all of it; GQA
        splits KV heads across GPUs (replicated once tp exceeds the KV heads)."""
        per_layer = self.kv_values_per_token_layer()
        if self.attention == "gqa":
            per_layer = 2 * self.head_dim * max(1, self.num_kv_heads // tp)
        return per_layer * kv_bytes * self.num_layers

    # ---- attention FLOPs ----------------------------------------------------
    def attn_flops_per_token(self, queries: int, tp: int = 1) -> float:
        """FLOPs per context token per step for ``queries`` rows on one GPU (all layers).

        MLA absorbed decode: every head does a 576-wide dot (QK) and a 512-wide
        accumulate (PV) per context token; GQA: head_dim each."""
        heads = max(1, self.num_heads // tp)
        if self.attention == "mla":
            per_head = 2 * (self.kv_lora_rank + self.qk_rope_head_dim) + 2 * self.kv_lora_rank
        else:
            per_head = 4 * self.head_dim
        return per_head * heads * queries * self.num_layers

    # ---- parameters ---------------------------------------------------------
    def _attn_params(self) -> int:
        h, n = self.hidden_size, self.num_heads
        if self.attention == "mla":
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            q = (h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * n * qk) if self.q_lora_rank else h * n * qk
            kv = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank \
                + self.kv_lora_rank * n * (self.qk_nope_head_dim + self.v_head_dim)
            return q + kv + n * self.v_head_dim * h
        kvh, d = self.num_kv_heads, self.head_dim
        return h * n * d + 2 * h * kvh * d + n * d * h

    def _layer_params(self, layer: int, active: bool) -> int:
        h = self.hidden_size
        norms = 2 * h
        if self.n_routed_experts and layer >= self.first_k_dense_replace:
            expert = 3 * h * self.moe_intermediate_size
            routed = self.num_experts_per_tok if active else self.n_routed_experts
            mlp = h * self.n_routed_experts + (routed + self.n_shared_experts) * expert
        else:
            mlp = 3 * h * self.intermediate_size
        return self._attn_params() + mlp + norms

    def params(self, active: bool = False) -> int:
        """Parameter count; ``active``: what one decoded token reads (routed experts top-k,
        output head, but not the embedding table, of which it reads one row)."""
        body = sum(self._layer_params(i, active) for i in range(self.num_layers)) + self.hidden_size
        head = self.vocab_size * self.hidden_size
        embed = 0 if (active or self.tie_word_embeddings) else self.vocab_size * self.hidden_size
        return body + head + embed

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _deepseek_v3_family(name: str, heads: int, experts: int, vocab: int, first_dense: int) -> ModelSpec:
    return ModelSpec(
        name=name, attention="mla", num_layers=61, hidden_size=7168, num_heads=heads, vocab_size=vocab,
        kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, q_lora_rank=1536,
        intermediate_size=18432, moe_intermediate_size=2048, n_routed_experts=experts, num_experts_per_tok=8,
        n_shared_experts=1, first_k_dense_replace=first_dense,
    )


PRESETS: dict[str, ModelSpec] = {
    "kimi-k2.6": _deepseek_v3_family("kimi-k2.6", heads=64, experts=384, vocab=163840, first_dense=1),
    "kimi-k2": _deepseek_v3_family("kimi-k2", heads=64, experts=384, vocab=163840, first_dense=1),
    "deepseek-v3": _deepseek_v3_family("deepseek-v3", heads=128, experts=256, vocab=129280, first_dense=3),
    "qwen3-8b": ModelSpec(name="qwen3-8b", attention="gqa", num_layers=36, hidden_size=4096, num_heads=32,
                          vocab_size=151936, num_kv_heads=8, head_dim=128, intermediate_size=12288),
    "llama-3.1-8b": ModelSpec(name="llama-3.1-8b", attention="gqa", num_layers=32, hidden_size=4096, num_heads=32,
                              vocab_size=128256, num_kv_heads=8, head_dim=128, intermediate_size=14336),
}


def get_model(name: str) -> ModelSpec:
    key = name.strip().lower()
    if key not in PRESETS:
        raise DDProbeError(f"unknown model {name!r}; known: {', '.join(PRESETS)} (or pass --config config.json)")
    return PRESETS[key]


def _need(cfg: dict[str, Any], key: str, source: str) -> int:
    if key not in cfg:
        raise DDProbeError(f"{source}: config has no {key!r}")
    value = cfg[key]
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise DDProbeError(f"{source}: {key!r} must be a positive integer, got {value!r}")
    return value


def model_from_config(path: str | Path) -> ModelSpec:
    """Read a Hugging Face style config.json (MLA when it has kv_lora_rank, else GQA).

    Multimodal configs that nest the language model under ``text_config`` are unwrapped."""
    path = Path(path)
    try:
        cfg = json.loads(path.read_text())
    except OSError as e:
        raise DDProbeError(f"cannot read config {path}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise DDProbeError(f"{path}: not valid JSON (line {e.lineno}: {e.msg})") from None
    if not isinstance(cfg, dict):
        raise DDProbeError(f"{path}: expected a JSON object")
    if isinstance(cfg.get("text_config"), dict):
        cfg = cfg["text_config"]
    src = str(path)
    name = cfg.get("_name_or_path") or cfg.get("model_type") or path.stem
    common = dict(
        name=str(name), num_layers=_need(cfg, "num_hidden_layers", src), hidden_size=_need(cfg, "hidden_size", src),
        num_heads=_need(cfg, "num_attention_heads", src), vocab_size=_need(cfg, "vocab_size", src),
        intermediate_size=int(cfg.get("intermediate_size") or 0),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
    )
    moe = dict(
        moe_intermediate_size=int(cfg.get("moe_intermediate_size") or 0),
        n_routed_experts=int(cfg.get("n_routed_experts") or cfg.get("num_experts") or 0),
        num_experts_per_tok=int(cfg.get("num_experts_per_tok") or 0),
        n_shared_experts=int(cfg.get("n_shared_experts") or 0),
        first_k_dense_replace=int(cfg.get("first_k_dense_replace") or 0),
    )
    if cfg.get("kv_lora_rank"):
        return ModelSpec(
            attention="mla", kv_lora_rank=_need(cfg, "kv_lora_rank", src),
            qk_rope_head_dim=_need(cfg, "qk_rope_head_dim", src), qk_nope_head_dim=_need(cfg, "qk_nope_head_dim", src),
            v_head_dim=_need(cfg, "v_head_dim", src), q_lora_rank=int(cfg.get("q_lora_rank") or 0), **common, **moe)
    kv_heads = int(cfg.get("num_key_value_heads") or common["num_heads"])
    head_dim = int(cfg.get("head_dim") or common["hidden_size"] // common["num_heads"])
    return ModelSpec(attention="gqa", num_kv_heads=kv_heads, head_dim=head_dim, **common, **moe)
