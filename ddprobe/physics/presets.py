"""Model configs and named presets (gpt-fast style): ``ModelConfig.from_name("tiny" | "k2")``.

``tiny``: a few layers, small widths, vocabulary 512; CPU-friendly, every width a power of two
>= 16 where the Triton paths need it (latent 64 + rope 32 = 96-wide latent row, v_dim 64);
trained weights ship in ddprobe/engine/weights/tiny.
``k2``: Kimi K2.6's attention shapes exactly (61 layers, latent 512 + rope 64 = 576-wide row,
qk_nope 128, v_head 128, heads as a parameter, vocabulary 163840, YaRN x64 from 4096) and its MoE at
one GPU's share under tp 8 / ep 8: 384 / 8 = 48 local experts of width 2048, top-8 of them per row
(of the 48, not of 384: about 4.7x the expert traffic a real ep-8 GPU sees; a heavy stand-in),
the shared expert's 2048 / 8 = 256 columns, the first layer dense (18432 / 8 = 2304); the hidden size
is shrunk to 1024. The 60 MoE layers share one bank of 48 experts (``moe_shared_bank``): what a layer
reads from memory is the same (its touched experts, ~0.5 GB, are ten times the H200's L2), while 60
banks would take 36 GB of GPU memory and 74 GB of fp32 host memory to initialize. See docs/engine.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property

from .shapes import AttnShape
from .step_shape import KIMI_K2_INTERMEDIATE, KIMI_K2_MOE, KIMI_K2_ROUTED_SCALING


@dataclass(frozen=True)
class YarnConfig:
    """YaRN rope scaling (DeepSeek-V3 / HF convention)."""

    factor: float
    original_max_position: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0  # scales cos/sin: get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
    mscale_all_dim: float = 0.0  # MLA: softmax scale *= get_mscale(factor, mscale_all_dim) ** 2


def get_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN attention-temperature correction: 0.1 * mscale * ln(factor) + 1 (1 when factor <= 1)."""
    return 1.0 if factor <= 1.0 else 0.1 * mscale * math.log(factor) + 1.0


@dataclass(frozen=True)
class TargetConfig:
    """Decoder-only target with MLA attention (DeepSeek-V3 / Kimi K2 layout)."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    kv_lora_rank: int  # latent width: V of the absorbed form, first part of K
    qk_rope_head_dim: int  # rope part of K, shared by all heads
    qk_nope_head_dim: int
    v_head_dim: int
    intermediate_size: int  # dense SwiGLU MLP (every layer, or the first ``first_dense_layers`` of a MoE)
    q_lora_rank: int = 0  # 0: one q projection, else q_a -> norm -> q_b
    rope_theta: float = 10000.0
    yarn: YarnConfig | None = None
    rms_eps: float = 1e-6
    feature_layers: tuple[int, ...] = (0,)  # layer outputs handed to the drafter
    # layers whose attention carries no position (NoPE: the rope part of the row is projected, never
    # rotated): content lookups that read the same at any distance, so they hold far beyond training
    nope_layers: tuple[int, ...] = ()
    nope_attn_floor: int = 0  # > 0: NoPE layers' queries scaled by rope.attn_scale(pos, this floor)
    rope_max_wavelength: float | None = None  # partial rope: longer-wavelength pairs do not rotate
    # mixture of experts (engine/moe.py); n_experts 0: dense MLPs only
    n_experts: int = 0  # routed experts on this GPU
    experts_per_tok: int = 0  # top-k of them per row
    moe_intermediate_size: int = 0
    shared_intermediate_size: int = 0  # the shared expert's width on this GPU (0: none)
    first_dense_layers: int = 0
    routed_scaling: float = 1.0
    moe_shared_bank: bool = False  # one bank of routed experts for every MoE layer

    @cached_property
    def attn_shape(self) -> AttnShape:
        """The attention shape in ddprobe's one vocabulary of facts (bytes per token, FLOPs, floors)."""
        return AttnShape("mla", num_layers=self.num_layers, num_heads=self.num_heads,
                         kv_lora_rank=self.kv_lora_rank, qk_rope_head_dim=self.qk_rope_head_dim,
                         qk_nope_head_dim=self.qk_nope_head_dim, v_head_dim=self.v_head_dim)

    @property
    def kv_dim(self) -> int:
        """Width of one latent cache row: D = kv_lora_rank + qk_rope_head_dim (576 for K2)."""
        return self.attn_shape.kv_row

    @property
    def sm_scale(self) -> float:
        """MLA softmax scale: 1/sqrt(nope + rope), times YaRN mscale^2."""
        s = self.attn_shape.sm_scale
        if self.yarn is not None:
            s *= get_mscale(self.yarn.factor, self.yarn.mscale_all_dim) ** 2
        return s


@dataclass(frozen=True)
class DrafterConfig:
    """DFlash-style block drafter; hidden size equals the target's (shared embedding and head)."""

    num_layers: int
    num_heads: int
    head_dim: int
    intermediate_size: int
    block_size: int = 8  # L + 1: bonus token + L mask tokens
    sliding_window: int = 2048  # context features seen by the windowed layers
    full_attn_layer: int = -1  # the one layer that sees the whole context
    rope_theta: float = 10000.0
    yarn: YarnConfig | None = None
    rms_eps: float = 1e-6
    rope_max_wavelength: float | None = None  # partial rope: longer-wavelength pairs do not rotate
    full_attn_floor: int = 0  # > 0: the full-attention layer's queries scaled by rope.attn_scale
    full_attn_nope: bool = False  # the full-attention layer's queries and keys are not rotated (content lookups)
    history: int = 0  # > 0: the full-attention layer's context key of token j also reads the context rows of
                      # the ``history`` tokens before it (j-1 .. j-history), so a block position can find where
                      # the bonus token stood that many tokens back and read the token that followed it
    bonus_all: bool = False  # every block position's input is the mask embedding plus the bonus token's embedding
                             # (not the mask alone): each position's query holds the token whose continuation it
                             # drafts, with no attention to learn first
    history_rotation: bool = False  # the history term of distance i is rotated by i * theta per head-dim pair and
                                    # the full layer's query at block position k by k * theta (theta_p = pi p / (hd/2
                                    # + 1)): block position k matches the bonus k back unrotated and the other
                                    # distances rotated away, so a periodic text cannot blur distances together

    @property
    def num_draft(self) -> int:
        """L: positions drafted after the bonus token."""
        return self.block_size - 1


@dataclass(frozen=True)
class ModelConfig:
    name: str
    target: TargetConfig
    drafter: DrafterConfig
    max_ctx: int = 4096  # default KV capacity (tokens, tree rows included)
    max_position: int | None = None  # positions the weights were checked to (else what the rope covers)
    # the target's logits in fp32 when the model runs in bf16/fp16 (SGLang's --enable-fp32-lm-head): a
    # small vocabulary with near-even choices (the tiny grammar) ties at the top of bf16 logits in most rows,
    # and argmax then picks the lowest id; k2 keeps bf16 logits, as serving engines do by default
    fp32_logits: bool = False

    @property
    def position_limit(self) -> int:
        """Longest context the preset holds: ``max_position`` when set (the range its weights were trained
        and checked for), else what its RoPE covers: YaRN factor x original length (else its KV default)."""
        if self.max_position is not None:
            return self.max_position
        y = self.target.yarn
        return int(y.factor * y.original_max_position) if y is not None else self.max_ctx

    @classmethod
    def from_name(cls, name: str, heads: int | None = None, **overrides) -> "ModelConfig":
        """Preset by name; ``heads`` sets the target's attention heads; ``overrides`` replace
        TargetConfig fields (``vocab_size=8``), DrafterConfig fields (``block_size=4``) or ``max_ctx``."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
        cfg = PRESETS[name]()
        if heads is not None:
            if heads < 1:
                raise ValueError(f"heads must be >= 1, got {heads}")
            overrides["num_heads"] = heads
        return cfg.with_overrides(**overrides)

    def with_overrides(self, **kw) -> "ModelConfig":
        t_fields = set(TargetConfig.__dataclass_fields__)
        d_fields = set(DrafterConfig.__dataclass_fields__)
        tk, dk, top = {}, {}, {}
        for k, v in kw.items():
            if k in ("max_ctx", "name", "max_position", "fp32_logits"):
                top[k] = v
            elif k in t_fields:  # shared names (num_heads, yarn, ...) go to the target
                tk[k] = v
            elif k.startswith("drafter_") and k[8:] in d_fields:
                dk[k[8:]] = v
            elif k in d_fields:
                dk[k] = v
            else:
                raise ValueError(f"unknown config field {k!r}")
        cfg = replace(self, target=replace(self.target, **tk), drafter=replace(self.drafter, **dk), **top)
        if cfg.drafter.block_size < 2:
            raise ValueError(f"block_size (L+1) must be >= 2 so that L >= 1, got {cfg.drafter.block_size}")
        return cfg


def _tiny() -> ModelConfig:
    # Trained and shipped (ddprobe/engine/weights/tiny, ddprobe/training/recall_curriculum.py) on sequences up to
    # 128k tokens, checked to 256k. No position it meets at 256k is new to it: layers 0 and 1 use partial
    # rope (only pairs of wavelength <= 2048 rotate: local order), layers 2 and 3 are NoPE (content
    # lookups: the refrain, the passage asked for) with queries sharpened slowly past 4k positions;
    # the drafter likewise, its full layer's keys reading the 7 rows before each (history, rotated per
    # distance) so one hop drafts a far copy a whole block at a time. See docs/tiny-model.md.
    target = TargetConfig(
        vocab_size=512, hidden_size=128, num_layers=4, num_heads=4,
        kv_lora_rank=64, qk_rope_head_dim=32, qk_nope_head_dim=32, v_head_dim=32,
        intermediate_size=256, rope_theta=10000.0, yarn=None, rope_max_wavelength=2048.0,
        feature_layers=(1, 3), nope_layers=(2, 3), nope_attn_floor=4096,
    )
    drafter = DrafterConfig(
        num_layers=2, num_heads=4, head_dim=32, intermediate_size=256, block_size=8,
        sliding_window=128, full_attn_layer=-1, rope_max_wavelength=2048.0, full_attn_floor=4096,
        full_attn_nope=True, history=7, bonus_all=True, history_rotation=True,
    )
    # 256k of context plus room for the decode and the tree (the checked range; positions carry no limit)
    return ModelConfig("tiny", target, drafter, max_ctx=4096, max_position=262144 + 8192, fp32_logits=True)


K2_TP = K2_EP = 8  # the k2 preset is one GPU of tp 8 / ep 8


def _k2() -> ModelConfig:
    moe = KIMI_K2_MOE
    target = TargetConfig(
        vocab_size=163840, hidden_size=1024, num_layers=61, num_heads=8,
        kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
        intermediate_size=KIMI_K2_INTERMEDIATE // K2_TP, q_lora_rank=0, rope_theta=50000.0,
        yarn=YarnConfig(factor=64.0, original_max_position=4096, mscale=1.0, mscale_all_dim=1.0),
        feature_layers=(1, 15, 30, 45, 59),
        n_experts=moe.n_routed_experts // K2_EP, experts_per_tok=moe.num_experts_per_tok,
        moe_intermediate_size=moe.moe_intermediate_size,
        shared_intermediate_size=moe.n_shared_experts * moe.moe_intermediate_size // K2_TP,
        first_dense_layers=moe.first_k_dense_replace, routed_scaling=KIMI_K2_ROUTED_SCALING, moe_shared_bank=True,
    )
    drafter = DrafterConfig(
        num_layers=5, num_heads=16, head_dim=64, intermediate_size=2048, block_size=8,
        sliding_window=2048, full_attn_layer=-1, rope_theta=50000.0,
        yarn=YarnConfig(factor=64.0, original_max_position=4096),
    )
    return ModelConfig("k2", target, drafter, max_ctx=262144)


PRESETS = {"tiny": _tiny, "k2": _k2}
