"""MLA attention in the absorbed form (DeepSeek-V3 / Kimi K2), for prefill, decode and verify.

Per token and layer the cache holds ONE shared latent row of D = kv_lora_rank + qk_rope_head_dim
values (576 for K2): the RMS-normed latent c_kv (V is exactly this part) followed by the roped k_pe.
Queries are absorbed into the latent space: q_lat = q_nope @ W_UK, so every head's query is a
D-wide row [q_lat, q_pe] scored against the latent rows; the attention output (a latent, v_dim =
kv_lora_rank wide) is mapped back per head by W_UV and then by o_proj.

Attention itself goes through the verify-attention seam (``ddprobe.engine.kernels``):
``path.run(q [R,H,D], kv [slots,D], plan, sm_scale) -> [R,H,kv_lora_rank]``. The new rows are
written into the cache BEFORE the call, at ``write_idx`` (pool slots or contiguous rows).
"""
from __future__ import annotations

import torch
from torch import nn

from ..physics.presets import TargetConfig
from .layers import RMSNorm, frozen, join_linears
from .rope import Rope, apply_rope


class MLAttention(nn.Module):
    def __init__(self, cfg: TargetConfig):
        super().__init__()
        self.cfg = cfg
        h, nope, rope = cfg.num_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim
        if cfg.q_lora_rank:
            self.q_a_proj = nn.Linear(cfg.hidden_size, cfg.q_lora_rank, bias=False)
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, cfg.rms_eps)
            self.q_b_proj = nn.Linear(cfg.q_lora_rank, h * (nope + rope), bias=False)
        else:
            self.q_proj = nn.Linear(cfg.hidden_size, h * (nope + rope), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(cfg.hidden_size, cfg.kv_dim, bias=False)
        self.kv_a_layernorm = RMSNorm(cfg.kv_lora_rank, cfg.rms_eps)
        # kv_b_proj holds W_UK [H, nope, C] and W_UV [H, v, C] (DeepSeek's weight layout).
        self.kv_b_proj = nn.Linear(cfg.kv_lora_rank, h * (nope + cfg.v_head_dim), bias=False)
        self.o_proj = nn.Linear(h * cfg.v_head_dim, cfg.hidden_size, bias=False)
        self.register_buffer("joined", None, persistent=False)  # join_projections: [q_a or q; kv_a] weights

    def _inputs(self) -> tuple[nn.Linear, nn.Linear]:
        """The two projections of the layer's input: q_a (or q) and kv_a."""
        return self.q_a_proj if self.cfg.q_lora_rank else self.q_proj, self.kv_a_proj_with_mqa

    def join_projections(self) -> None:
        """The two input projections as one GEMM (layers.join_linears; a no-op while already joined)."""
        self.joined = join_linears(self.joined, *self._inputs())

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        if self.joined is not None:  # a real move gave every tensor its own storage: join the moved weights again
            self.join_projections()
        return out

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [..., hidden] -> (q_a(x) or q(x), kv_a(x)): one GEMM once joined (and both weights frozen: the
        joined tensor carries no gradient), else two."""
        first, kv_a = self._inputs()
        if self.joined is None or not frozen(first, kv_a):
            return first(x), kv_a(x)
        y = nn.functional.linear(x, self.joined)
        return y[..., :first.out_features], y[..., first.out_features:]

    def _q(self, x: torch.Tensor) -> torch.Tensor:  # [..., hidden] -> [..., H, nope + rope]
        return self._q_from(self.q_a_proj(x) if self.cfg.q_lora_rank else self.q_proj(x))

    def _q_from(self, a: torch.Tensor) -> torch.Tensor:  # q_a(x) or q(x) -> [..., H, nope + rope]
        q = self.q_b_proj(self.q_a_layernorm(a)) if self.cfg.q_lora_rank else a
        return q.reshape(*a.shape[:-1], self.cfg.num_heads, -1)

    def _w_b(self) -> tuple[torch.Tensor, torch.Tensor]:
        """W_UK [H, nope, C] and W_UV [H, v, C] out of kv_b_proj."""
        cfg = self.cfg
        w_b = self.kv_b_proj.weight.view(cfg.num_heads, cfg.qk_nope_head_dim + cfg.v_head_dim, cfg.kv_lora_rank)
        return w_b[:, :cfg.qk_nope_head_dim], w_b[:, cfg.qk_nope_head_dim:]

    def latent_rows(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [..., T, hidden] -> cache rows [..., T, D] = [RMSNorm(c_kv) (C), rope(k_pe) (rope)]."""
        return self.latent_rows_from(self.kv_a_proj_with_mqa(x), cos, sin)

    def latent_rows_from(self, kv_a: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """kv_a(x) [..., T, D] -> the cache rows (latent_rows)."""
        c = self.cfg.kv_lora_rank
        c_kv = self.kv_a_layernorm(kv_a[..., :c])  # [..., T, C]
        k_pe = apply_rope(kv_a[..., None, c:], cos, sin)[..., 0, :]  # [..., T, rope] (one shared "head")
        return torch.cat([c_kv, k_pe], dim=-1)

    def absorbed_q(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [..., T, hidden] -> queries in the latent space [..., T, H, D] = [q_nope @ W_UK, rope(q_pe)]."""
        return self.absorbed_q_from(self.q_a_proj(x) if self.cfg.q_lora_rank else self.q_proj(x), cos, sin)

    def absorbed_q_from(self, a: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """q_a(x) or q(x) -> the absorbed queries (absorbed_q)."""
        nope = self.cfg.qk_nope_head_dim
        q = self._q_from(a)  # [..., T, H, nope + rope]
        w_uk, _ = self._w_b()
        q_lat = torch.einsum("...hn,hnc->...hc", q[..., :nope], w_uk)  # [..., T, H, C]
        return torch.cat([q_lat, apply_rope(q[..., nope:], cos, sin)], dim=-1)

    def output(self, o_lat: torch.Tensor) -> torch.Tensor:
        """Attention output in the latent space [..., T, H, C] -> [..., T, hidden] (W_UV, then o_proj)."""
        _, w_uv = self._w_b()
        o = torch.einsum("...hc,hvc->...hv", o_lat, w_uv)  # [..., T, H, v]
        return self.o_proj(o.flatten(-2))

    def attend(self, q_abs, rows, kv_layer, write_idx, plan, path) -> torch.Tensor:
        """Write the new rows [T, D] into kv_layer at write_idx [T], then the attention of q_abs
        [T, H, D] through ``path`` -> o_lat [T, H, C] in the cache's dtype."""
        kv_layer[write_idx] = rows.to(kv_layer.dtype)
        return path.run(q_abs.to(kv_layer.dtype).contiguous(), kv_layer, plan, self.cfg.sm_scale)

    def forward(self, x, cos, sin, kv_layer, write_idx, plan, path) -> torch.Tensor:
        """x [T, hidden]; cos/sin [T, rope]; kv_layer [slots, D] (this layer's cache, written in
        place at write_idx [T]); plan: VerifyPlan for the T rows; path: attention path module.
        Returns [T, hidden]."""
        o_lat = self.attend(self.absorbed_q(x, cos, sin), self.latent_rows(x, cos, sin), kv_layer, write_idx, plan, path)
        return self.output(o_lat.to(x.dtype))

    def causal(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, qs=None) -> torch.Tensor:
        """Dense causal self-attention over whole sequences, no cache: x [B, T, hidden] -> [B, T, hidden].
        The same function as ``forward`` over a prefix (training uses it); SDPA never materializes scores
        when its fused kernels apply."""
        import torch.nn.functional as F

        c = self.cfg.kv_lora_rank
        rows = self.latent_rows(x, cos, sin)  # [B, T, D]
        q = self.absorbed_q(x, cos, sin)
        q = (q if qs is None else q * qs).transpose(-3, -2)  # [B, H, T, D]
        k = rows.unsqueeze(-3).expand(*q.shape[:-2], *rows.shape[-2:])  # [B, H, T, D]: one row for all heads
        o = F.scaled_dot_product_attention(q, k, k[..., :c], is_causal=True, scale=self.cfg.sm_scale)
        return self.output(o.transpose(-3, -2))


def make_rope(cfg: TargetConfig) -> Rope:
    return Rope(cfg.qk_rope_head_dim, cfg.rope_theta, cfg.yarn, cfg.rope_max_wavelength)
