"""Model architecture specs for the floor calculator: presets and Hugging Face configs.

Only what the floor needs: layers, heads, the KV row each token leaves per layer (MLA
latent or GQA keys+values), and parameter counts (total, and active per token) derived
from the config, so a Hugging Face ``config.json`` works the same way as a preset.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from .shapes import KIMI_K2, AttnShape
from .step_shape import MoeShape, StepWeights, step_weights
from ..units import DDProbeError


@dataclass(frozen=True)
class ModelSpec:
    """A whole model for the floor: its attention shape (``ddprobe.physics.shapes.AttnShape``, the one place
    bytes and FLOPs per token are defined) plus what parameter counts need."""

    name: str
    attn: AttnShape
    hidden_size: int
    vocab_size: int
    q_lora_rank: int = 0
    # MLP / MoE
    intermediate_size: int = 0
    moe_intermediate_size: int = 0
    n_routed_experts: int = 0
    num_experts_per_tok: int = 0
    n_shared_experts: int = 0
    first_k_dense_replace: int = 0
    tie_word_embeddings: bool = False
    # an engine preset's shared expert is sized by the engine (its width on this GPU), not n_shared x moe width / tp
    shared_intermediate_size: int | None = None
    # "served": a whole model, sharded by --tp/--ep; "engine": a ddprobe engine preset, already one GPU's share
    kind: str = "served"

    @property
    def num_layers(self) -> int:
        return self.attn.num_layers

    @property
    def num_heads(self) -> int:
        return self.attn.num_heads

    # ---- parameters ---------------------------------------------------------
    def _attn_params(self) -> int:
        a, h, n, ql = self.attn, self.hidden_size, self.num_heads, self.q_lora_rank
        if a.kind == "mla":
            qk = a.qk_nope_head_dim + a.qk_rope_head_dim
            q = (h * ql + ql + ql * n * qk) if ql else h * n * qk
            kv = h * a.kv_row + a.kv_lora_rank + a.kv_lora_rank * n * (a.qk_nope_head_dim + a.v_head_dim)
            return q + kv + n * a.v_head_dim * h
        kvh, d = a.num_kv_heads, a.head_dim
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

    @property
    def moe(self) -> MoeShape:
        """The MoE facts (n_routed_experts 0: a dense model)."""
        return MoeShape(self.n_routed_experts, self.num_experts_per_tok, self.moe_intermediate_size,
                        self.n_shared_experts, self.first_k_dense_replace)

    def step_weights(self, rows: int = 9, tp: int = 1, ep: int = 1, dense_dtype: str = "bf16",
                     expert_dtype: str = "bf16") -> StepWeights:
        """Weights one GPU reads in one verify step of ``rows`` rows (``ddprobe.physics.step_shape``)."""
        return step_weights(self.attn, self.moe, hidden=self.hidden_size, vocab=self.vocab_size,
                            q_lora_rank=self.q_lora_rank, intermediate=self.intermediate_size, rows=rows, tp=tp,
                            ep=ep, dense_dtype=dense_dtype, expert_dtype=expert_dtype,
                            shared_intermediate=self.shared_intermediate_size)

    @classmethod
    def from_target(cls, t, name: str) -> "ModelSpec":
        """The spec of an engine target (``physics.presets.TargetConfig``): one GPU's share already (the k2
        preset: tp 8 / ep 8), so it is planned at tp = ep = 1: its local experts routed top-k among themselves,
        its shared expert at its own width, its whole lm_head. A bank of routed experts shared by the MoE layers
        (``moe_shared_bank``) is read by each of them, so it counts per layer. The drafter is not counted."""
        return cls(name=name, attn=t.attn_shape, hidden_size=t.hidden_size, vocab_size=t.vocab_size,
                   q_lora_rank=t.q_lora_rank, intermediate_size=t.intermediate_size,
                   moe_intermediate_size=t.moe_intermediate_size, n_routed_experts=t.n_experts,
                   num_experts_per_tok=t.experts_per_tok, n_shared_experts=1 if t.shared_intermediate_size else 0,
                   first_k_dense_replace=t.first_dense_layers if t.n_experts else 0,
                   shared_intermediate_size=t.shared_intermediate_size if t.n_experts else None, kind="engine")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _deepseek_v3_family(name: str, heads: int, experts: int, vocab: int, first_dense: int) -> ModelSpec:
    attn = replace(KIMI_K2, num_heads=heads)  # the family's attention: K2's with its own head count
    return ModelSpec(
        name=name, attn=attn, hidden_size=7168, vocab_size=vocab, q_lora_rank=1536,
        intermediate_size=18432, moe_intermediate_size=2048, n_routed_experts=experts, num_experts_per_tok=8,
        n_shared_experts=1, first_k_dense_replace=first_dense,
    )


def _gqa(name: str, layers: int, hidden: int, heads: int, kv_heads: int, vocab: int, inter: int) -> ModelSpec:
    attn = AttnShape("gqa", num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, head_dim=hidden // heads)
    return ModelSpec(name=name, attn=attn, hidden_size=hidden, vocab_size=vocab, intermediate_size=inter)


# Sources (Hugging Face config.json fields; copies under tests/data/configs, SOURCES.md there):
# - Kimi K2 / K2.6: moonshotai/Kimi-K2-Instruct and moonshotai/Kimi-K2.6 (text_config): num_hidden_layers 61,
#   hidden_size 7168, num_attention_heads 64, vocab_size 163840, q_lora_rank 1536, kv_lora_rank 512,
#   qk_rope_head_dim 64, qk_nope_head_dim 128, v_head_dim 128, intermediate_size 18432,
#   moe_intermediate_size 2048, n_routed_experts 384, num_experts_per_tok 8, n_shared_experts 1,
#   first_k_dense_replace 1.
# - DeepSeek-V3: deepseek-ai/DeepSeek-V3: the same but num_attention_heads 128, vocab_size 129280,
#   n_routed_experts 256, first_k_dense_replace 3.
PRESETS: dict[str, ModelSpec] = {
    "kimi-k2.6": _deepseek_v3_family("kimi-k2.6", heads=KIMI_K2.num_heads, experts=384, vocab=163840, first_dense=1),
    "kimi-k2": _deepseek_v3_family("kimi-k2", heads=KIMI_K2.num_heads, experts=384, vocab=163840, first_dense=1),
    "deepseek-v3": _deepseek_v3_family("deepseek-v3", heads=128, experts=256, vocab=129280, first_dense=3),
    "qwen3-8b": _gqa("qwen3-8b", 36, 4096, 32, 8, 151936, 12288),
    "llama-3.1-8b": _gqa("llama-3.1-8b", 32, 4096, 32, 8, 128256, 14336),
}


def get_model(name: str, heads: int | None = None) -> ModelSpec:
    """The one registry of models: a served model (``PRESETS``: a whole model, sharded by --tp/--ep) or a ddprobe
    engine preset (``physics.presets.PRESETS``: ``k2``, ``tiny``; one GPU's share already, ``heads`` its attention
    heads). The names cannot be confused: served models are named as their makers name them (``kimi-k2.6``), engine
    presets are short (``k2``) and their spec says ``kind`` "engine"."""
    from .presets import PRESETS as ENGINE, ModelConfig

    key = name.strip().lower()
    if key in ENGINE:
        if heads is not None and heads < 1:
            raise DDProbeError(f"--heads must be at least 1, got {heads}")
        return ModelSpec.from_target(ModelConfig.from_name(key, heads=heads).target, key)
    if key not in PRESETS:
        raise DDProbeError(f"unknown model {name!r}; served models: {', '.join(PRESETS)}; ddprobe engine presets: "
                           f"{', '.join(ENGINE)} (or pass --config config.json)")
    if heads is not None:
        raise DDProbeError(f"--heads sets an engine preset's heads; {key} has {PRESETS[key].num_heads} (use --tp)")
    return PRESETS[key]


SIZE_MAX = 1 << 24  # a config's size (layers, heads, widths, vocabulary, experts): 16M; beyond it, no model


def _need(cfg: dict[str, Any], key: str, source: str) -> int:
    if key not in cfg:
        raise DDProbeError(f"{source}: config has no {key!r}")
    value = cfg[key]
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= SIZE_MAX:
        raise DDProbeError(f"{source}: {key!r} must be a positive integer up to {SIZE_MAX:,}, got {value!r}")
    return value


def _opt(cfg: dict[str, Any], key: str, source: str, default: int = 0, *aliases: str) -> int:
    """An optional size: absent or null means ``default``; present, it must be a positive integer."""
    for k in (key, *aliases):
        if cfg.get(k) is not None:
            return _need(cfg, k, source)
    return default


def _experts(cfg: dict[str, Any], src: str) -> dict[str, int]:
    """The routed experts: ``n_routed_experts`` (DeepSeek), ``num_experts`` (Qwen) or ``num_local_experts``
    (Mixtral, whose expert width is ``intermediate_size``); with experts, a positive width and top-k."""
    mixtral = cfg.get("n_routed_experts") is None and cfg.get("num_experts") is None
    experts = _opt(cfg, "n_routed_experts", src, 0, "num_experts", "num_local_experts")
    width = _opt(cfg, "moe_intermediate_size", src, 0, *(("intermediate_size",) if mixtral else ()))
    top_k = _opt(cfg, "num_experts_per_tok", src)
    if experts:
        if not width:
            raise DDProbeError(f"{src}: {experts} routed experts but no positive 'moe_intermediate_size'"
                               + (" or 'intermediate_size'" if mixtral else ""))
        if not top_k:
            raise DDProbeError(f"{src}: {experts} routed experts but no positive 'num_experts_per_tok'")
    return dict(n_routed_experts=experts, moe_intermediate_size=width, num_experts_per_tok=top_k)


def _first_dense(cfg: dict[str, Any], src: str, layers: int) -> int:
    """``first_k_dense_replace``: the leading dense layers, an integer in 0..layers (absent or null: 0)."""
    value = cfg.get("first_k_dense_replace")
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= layers:
        raise DDProbeError(f"{src}: 'first_k_dense_replace' must be an integer in 0..{layers} (the layers), "
                           f"got {value!r}")
    return value


def model_from_config(path: str | Path) -> ModelSpec:
    """Read a Hugging Face style config.json (MLA when it has kv_lora_rank, else GQA).

    Multimodal configs that nest the language model under ``text_config`` are unwrapped. Every size
    must be a positive integer; a bad value is one error naming the file and the key."""
    from ..jsonfile import read_json

    path = Path(path)
    cfg = read_json(path, what="config")
    if not isinstance(cfg, dict):
        raise DDProbeError(f"{path}: expected a JSON object")
    if isinstance(cfg.get("text_config"), dict):
        cfg = cfg["text_config"]
    src = str(path)
    name = cfg.get("_name_or_path") or cfg.get("model_type") or path.stem
    layers, heads = _need(cfg, "num_hidden_layers", src), _need(cfg, "num_attention_heads", src)
    hidden = _need(cfg, "hidden_size", src)
    common = dict(
        name=str(name), hidden_size=hidden, vocab_size=_need(cfg, "vocab_size", src),
        intermediate_size=_opt(cfg, "intermediate_size", src),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        n_shared_experts=_opt(cfg, "n_shared_experts", src),
        first_k_dense_replace=_first_dense(cfg, src, layers),
        **_experts(cfg, src),
    )
    try:
        if cfg.get("kv_lora_rank") is not None:
            attn = AttnShape("mla", num_layers=layers, num_heads=heads, kv_lora_rank=_need(cfg, "kv_lora_rank", src),
                             qk_rope_head_dim=_need(cfg, "qk_rope_head_dim", src),
                             qk_nope_head_dim=_need(cfg, "qk_nope_head_dim", src),
                             v_head_dim=_need(cfg, "v_head_dim", src))
            return ModelSpec(attn=attn, q_lora_rank=_opt(cfg, "q_lora_rank", src), **common)
        attn = AttnShape("gqa", num_layers=layers, num_heads=heads,
                         num_kv_heads=_opt(cfg, "num_key_value_heads", src, heads),
                         head_dim=_opt(cfg, "head_dim", src, hidden // heads))
    except DDProbeError as e:
        if str(e).startswith(src):
            raise
        raise DDProbeError(f"{src}: {e}") from None
    return ModelSpec(attn=attn, **common)
