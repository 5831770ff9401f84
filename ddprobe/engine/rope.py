"""Rotary position embedding with optional YaRN scaling (DeepSeek-V3 / HF formulas).

Positions are always passed explicitly (tree nodes at equal depth share a position), and cos/sin
are computed on the fly in float64, so there is no table to outgrow at long context.
"""
from __future__ import annotations

import math

import torch

from ..physics.presets import YarnConfig, get_mscale


def _correction_dim(num_rotations: float, dim: int, base: float, max_pos: int) -> float:
    return (dim * math.log(max_pos / (num_rotations * 2 * math.pi))) / (2 * math.log(base))


def _correction_range(cfg: YarnConfig, dim: int, base: float) -> tuple[int, int]:
    low = math.floor(_correction_dim(cfg.beta_fast, dim, base, cfg.original_max_position))
    high = math.ceil(_correction_dim(cfg.beta_slow, dim, base, cfg.original_max_position))
    return max(low, 0), min(high, dim - 1)


def inv_freq(dim: int, base: float, yarn: YarnConfig | None = None,
             max_wavelength: float | None = None) -> torch.Tensor:
    """[dim/2] float64 inverse frequencies; YaRN blends interpolated and extrapolated ones.
    max_wavelength (partial rope): pairs whose wavelength 2 pi / freq exceeds it get frequency 0, so
    they never rotate: what a layer reads from them is content, the same at any position, and the
    pairs that do rotate turn many times within the training length (no angle is new at 256k)."""
    if dim % 2:
        raise ValueError(f"rope dim must be even, got {dim}")
    if max_wavelength is not None and yarn is not None:
        raise ValueError("partial rope (max_wavelength) and YaRN scaling do not combine; choose one")
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    extra = 1.0 / pos_freqs
    if max_wavelength is not None:
        return torch.where(2 * math.pi / extra > max_wavelength, torch.zeros_like(extra), extra)
    if yarn is None or yarn.factor <= 1.0:
        return extra
    inter = 1.0 / (yarn.factor * pos_freqs)
    low, high = _correction_range(yarn, dim, base)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extra_mask = 1.0 - ramp  # 1: keep the original (high-frequency) dims
    return inter * (1 - extra_mask) + extra * extra_mask


class Rope:
    """cos/sin for explicit positions. ``attn_factor`` is YaRN's cos/sin scale."""

    def __init__(self, dim: int, base: float, yarn: YarnConfig | None = None, max_wavelength: float | None = None):
        self.dim = dim
        self.inv_freq = inv_freq(dim, base, yarn, max_wavelength)  # [dim/2] float64, CPU
        self.attn_factor = 1.0
        if yarn is not None:
            self.attn_factor = get_mscale(yarn.factor, yarn.mscale) / get_mscale(yarn.factor, yarn.mscale_all_dim)
        self._dev_freq: dict[torch.device, torch.Tensor] = {}

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T] int -> cos, sin [T, dim] in ``dtype`` (rotate-half layout)."""
        dev = positions.device
        if dev not in self._dev_freq:
            self._dev_freq[dev] = self.inv_freq.to(dev)
        ang = positions.to(torch.float64)[:, None] * self._dev_freq[dev][None, :]  # [T, dim/2]
        ang = torch.cat([ang, ang], dim=-1)  # [T, dim]
        return (ang.cos() * self.attn_factor).to(dtype), (ang.sin() * self.attn_factor).to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., T, H, dim] or [..., T, dim]; cos/sin [..., T, dim] (or [T, dim]) -> rotated x, same shape.
    A head axis in x (one more dimension than cos) is broadcast over; the leading dims broadcast too."""
    if x.dim() > cos.dim():
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rot * sin


def attn_scale(positions: torch.Tensor, floor: int, dtype: torch.dtype) -> torch.Tensor:
    """Query scale per position for a layer without position information (Llama 4's attention temperature
    tuning): 1 + 0.1 ln(floor((pos + 1) / floor) + 1), so [T, 1, 1]. Beyond ``floor`` tokens the logits
    sharpen slowly with distance, against the dilution of a softmax over more and more keys; a function of
    the row's own position only, so a row scores the same in prefill, decode and a verify tree."""
    s = torch.log(torch.floor((positions.to(torch.float64) + 1.0) / floor) + 1.0) * 0.1 + 1.0
    return s.to(dtype)[:, None, None]
