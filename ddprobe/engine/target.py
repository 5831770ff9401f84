"""Target model: decoder layers with MLA attention, RMSNorm, and a dense SwiGLU MLP or (``cfg.n_experts``,
after the first ``cfg.first_dense_layers``) a mixture of experts (``moe.MoE``).

``forward`` processes any set of new rows (a prefill chunk, one decode token, or [bonus, tree
nodes]) at explicit positions against the KV cache through one attention plan, and returns the
final hidden states plus the drafter features (outputs of ``cfg.feature_layers``, concatenated).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..physics.presets import TargetConfig
from .layers import RMSNorm, SwiGLU, init_random
from .mla import MLAttention, make_rope
from .moe import MoE, Experts
from .rope import attn_scale


def layer_pre(layer: "DecoderLayer", x, cos, sin, qs=None):
    """Everything of a layer before its attention: (cache rows [T, D], absorbed queries [T, H, D]).
    qs [T, 1, 1] or None: the queries' scale (NoPE layers, ``rope.attn_scale``)."""
    attn = layer.self_attn
    a, kv_a = attn.project(layer.input_layernorm(x))
    q = attn.absorbed_q_from(a, cos, sin)
    return attn.latent_rows_from(kv_a, cos, sin), q if qs is None else q * qs


def layer_post(layer: "DecoderLayer", x, o_lat):
    """Everything after it: the attention output back to the residual, then the MLP block."""
    return layer.finish(x + layer.self_attn.output(o_lat.to(x.dtype)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TargetConfig, experts: Experts | None = None):
        """experts: this layer's routed experts (a MoE layer), else None (a dense MLP)."""
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.self_attn = MLAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size) if experts is None else \
            MoE(cfg.hidden_size, experts, cfg.experts_per_tok, cfg.shared_intermediate_size, cfg.routed_scaling)

    def forward(self, x, cos, sin, kv_layer, write_idx, plan, path, fused=None, qs=None) -> torch.Tensor:
        """fused: (pre, post) replacing layer_pre / layer_post (torch.compile'd in graph mode);
        qs: the queries' scale [T, 1, 1] (NoPE layers) or None."""
        pre, post = fused or (layer_pre, layer_post)
        rows, q_abs = pre(self, x, cos, sin, qs)
        return post(self, x, self.self_attn.attend(q_abs, rows, kv_layer, write_idx, plan, path))

    def join_projections(self) -> None:
        """The GEMMs that read the same input as one each (layers.join_linears): attention's two input
        projections, and the MoE's router with its shared expert's gate and up."""
        self.self_attn.join_projections()
        if isinstance(self.mlp, MoE):
            self.mlp.join_projections()

    def causal(self, x, cos, sin, qs=None) -> torch.Tensor:
        """Whole sequences [B, T, hidden], causal, no cache (training)."""
        return self.finish(x + self.self_attn.causal(self.input_layernorm(x), cos, sin, qs))

    def finish(self, x) -> torch.Tensor:
        return x + self.mlp(self.post_attention_layernorm(x))


class TargetModel(nn.Module):
    def __init__(self, cfg: TargetConfig):
        super().__init__()
        for what, layers in (("feature", cfg.feature_layers), ("NoPE", cfg.nope_layers)):
            for i in layers:
                if not 0 <= i < cfg.num_layers:
                    raise ValueError(f"{what} layer {i} outside 0..{cfg.num_layers - 1}")
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, self._experts(cfg, i)) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rope = make_rope(cfg)

    def _experts(self, cfg: TargetConfig, i: int) -> Experts | None:
        """Layer i's routed experts: None for a dense layer; one bank for every MoE layer when
        ``cfg.moe_shared_bank`` (see ddprobe/physics/presets.py), else a bank per layer."""
        if not cfg.n_experts or i < cfg.first_dense_layers:
            return None
        if cfg.moe_shared_bank:
            if getattr(self, "bank", None) is None:
                self.bank = Experts(cfg.n_experts, cfg.hidden_size, cfg.moe_intermediate_size)
            return self.bank
        return Experts(cfg.n_experts, cfg.hidden_size, cfg.moe_intermediate_size)

    @property
    def feature_dim(self) -> int:
        return len(self.cfg.feature_layers) * self.cfg.hidden_size

    def init_weights(self, seed: int) -> None:
        init_random(self, seed)

    def join_projections(self) -> None:
        """Every layer's DecoderLayer.join_projections (Engine.init_weights and load_state_dict; a move joins again)."""
        for layer in self.layers:
            layer.join_projections()

    def forward(self, tokens, positions, kv_buffer, write_idx, plan, path, fused=None):
        """tokens [T] int64, positions [T] int64, kv_buffer [layers, slots, D] (written in place),
        write_idx [T] int64 (where this call's rows go), plan: VerifyPlan over the T rows;
        fused: compiled (layer_pre, layer_post) or None.
        Returns (hidden [T, hidden] after the final norm, features [T, n_feat * hidden])."""
        x = self.embed_tokens(tokens)  # [T, hidden]
        cs = self.cos_sin(positions, x.dtype)  # per layer: cos, sin [T, rope], query scale
        return self._run(x, lambda i, layer, x: layer(x, *cs[i][:2], kv_buffer[i], write_idx, plan, path, fused,
                                                      qs=cs[i][2]))

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> list[tuple]:
        """Per layer (cos, sin [T, rope], query scale [T, 1, 1] or None) for ``positions``: the rope's, or
        (1, 0) for a NoPE layer (its rope part passes through unrotated, exactly), whose queries are
        scaled by ``rope.attn_scale`` when ``nope_attn_floor`` is set."""
        cfg = self.cfg
        cos, sin = self.rope.cos_sin(positions, dtype)
        if not cfg.nope_layers:
            return [(cos, sin, None)] * cfg.num_layers
        qs = attn_scale(positions, cfg.nope_attn_floor, dtype) if cfg.nope_attn_floor > 0 else None
        nope = (torch.ones_like(cos), torch.zeros_like(sin), qs)
        return [nope if i in cfg.nope_layers else (cos, sin, None) for i in range(cfg.num_layers)]

    def forward_causal(self, tokens: torch.Tensor):
        """tokens [B, T] at positions 0..T-1, causal, no cache -> (hidden [B, T, hidden] after the final norm,
        features [B, T, n_feat * hidden]). The function ``forward`` computes over a prefix; training uses it."""
        x = self.embed_tokens(tokens)
        cs = self.cos_sin(torch.arange(tokens.shape[-1], device=tokens.device), x.dtype)
        return self._run(x, lambda i, layer, x: layer.causal(x, *cs[i]))  # cos, sin, query scale

    def _run(self, x, step):
        """Every layer in order (``step(i, layer, x)``), collecting the drafter features."""
        feats = {}
        for i, layer in enumerate(self.layers):
            x = step(i, layer, x)
            if i in self.cfg.feature_layers:
                feats[i] = x
        return self.norm(x), torch.cat([feats[i] for i in self.cfg.feature_layers], dim=-1)

    fp32_logits = False  # set by the engine from ModelConfig.fp32_logits

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [T, hidden] -> [T, V] float32+
        if self.fp32_logits and hidden.dtype in (torch.bfloat16, torch.float16):
            return F.linear(hidden.float(), self.lm_head.weight.float())  # no rounding of the logits to bf16
        out = self.lm_head(hidden)
        return out if out.dtype == torch.float64 else out.float()
