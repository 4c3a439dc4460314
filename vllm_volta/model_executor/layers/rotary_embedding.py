"""Rotary position embeddings (RoPE): default, linear, Llama 3, YaRN scaling and proportional.

The cos/sin table for every position is computed once in float32 and cast to the activation
dtype at use, matching transformers' numerics. On CUDA, ``forward`` runs the fused in-place
``_C::rotary_embedding`` kernel (bit-identical to ``forward_native``, the plain-PyTorch path used
on CPU and as the test reference).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from vllm_volta import _custom_ops as ops

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "proportional")


class RotaryEmbedding(nn.Module):
    """Plain RoPE. ``forward(positions [T], query [T, H*D], key [T, KH*D]) -> (query, key)``.

    On CUDA the rotation happens in place in ``query``/``key`` (which may be strided views, e.g.
    column slices of a fused qkv output) and views of them, shaped [T, H*D], are returned.
    """

    def __init__(self, head_size: int, rotary_dim: int, max_position: int, base: float,
                 is_neox_style: bool = True) -> None:
        super().__init__()
        if rotary_dim < 2 or rotary_dim % 2 or rotary_dim > head_size:
            raise ValueError(f"rotary_dim must be even and in [2, {head_size}], got {rotary_dim}")
        if max_position < 1:
            raise ValueError(f"max_position must be >= 1, got {max_position}")
        self.head_size = head_size
        self.rotary_dim = rotary_dim
        self.max_position = max_position
        self.base = float(base)
        self.is_neox_style = is_neox_style
        self.register_buffer("cos_sin_cache", self._compute_cos_sin_cache(), persistent=False)

    def _compute_inv_freq(self) -> torch.Tensor:
        exponents = torch.arange(0, self.rotary_dim, 2, dtype=torch.int64).float() / self.rotary_dim
        return 1.0 / (self.base ** exponents)

    def _cache_len(self) -> int:
        return self.max_position

    def _attention_factor(self) -> float:
        return 1.0

    def _compute_cos_sin_cache(self) -> torch.Tensor:
        """[positions, rotary_dim] float32: cos of each frequency, then sin."""
        inv_freq = self._compute_inv_freq()
        t = torch.arange(self._cache_len(), dtype=torch.int64).float()
        freqs = torch.outer(t, inv_freq)
        cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
        factor = self._attention_factor()
        return cache * factor if factor != 1.0 else cache

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        num_tokens, width = x.shape[0], math.prod(x.shape[1:])
        # Explicit sizes: reshape(0, -1, D) is ambiguous for an empty batch.
        x = x.reshape(num_tokens, width // self.head_size, self.head_size)
        rot, passthrough = x[..., : self.rotary_dim], x[..., self.rotary_dim:]
        if self.is_neox_style:  # halves pair up: (i, i + d/2)
            x1, x2 = rot.chunk(2, dim=-1)
        else:  # GPT-J style: neighbours pair up: (2i, 2i + 1)
            x1, x2 = rot[..., 0::2], rot[..., 1::2]
        o1 = x1 * cos - x2 * sin
        o2 = x2 * cos + x1 * sin
        if self.is_neox_style:
            rotated = torch.cat((o1, o2), dim=-1)
        else:
            rotated = torch.stack((o1, o2), dim=-1).flatten(-2)
        return torch.cat((rotated, passthrough), dim=-1).reshape(num_tokens, width)

    def forward(self, positions: torch.Tensor, query: torch.Tensor,
                key: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        if query.is_cuda and ops.has_cuda_kernel("rotary_embedding"):
            return self.forward_cuda(positions, query, key)
        return self.forward_native(positions, query, key)

    def forward_cuda(self, positions: torch.Tensor, query: torch.Tensor,
                     key: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One fused kernel, in place in ``query``/``key``; returns [T, H*D] views of them."""
        ops.rotary_embedding(positions, query, key, self.head_size, self.cos_sin_cache,
                             self.is_neox_style)
        return query.flatten(1), (None if key is None else key.flatten(1))

    def forward_native(self, positions: torch.Tensor, query: torch.Tensor,
                       key: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Plain PyTorch (new tensors; inputs untouched): the CPU path and the reference."""
        cos_sin = self.cos_sin_cache.index_select(0, positions.flatten().long())
        cos, sin = cos_sin.to(query.dtype).unsqueeze(1).chunk(2, dim=-1)  # [T, 1, rotary_dim/2]
        query = self._rotate(query, cos, sin)
        if key is not None:
            key = self._rotate(key, cos, sin)
        return query, key

    def extra_repr(self) -> str:
        return (f"head_size={self.head_size}, rotary_dim={self.rotary_dim}, "
                f"max_position={self.max_position}, base={self.base}, neox={self.is_neox_style}")


class LinearScalingRotaryEmbedding(RotaryEmbedding):
    """Position interpolation: frequencies divided by ``factor``; the table covers
    ``max_position * factor`` positions."""

    def __init__(self, head_size: int, rotary_dim: int, max_position: int, base: float,
                 is_neox_style: bool, factor: float) -> None:
        if not factor > 0:
            raise ValueError(f"rope_scaling.factor must be > 0, got {factor}")
        self.factor = float(factor)
        super().__init__(head_size, rotary_dim, max_position, base, is_neox_style)

    def _compute_inv_freq(self) -> torch.Tensor:
        return super()._compute_inv_freq() / self.factor

    def _cache_len(self) -> int:
        return int(math.ceil(self.max_position * max(self.factor, 1.0)))


class Llama3RotaryEmbedding(RotaryEmbedding):
    """Llama 3.1 frequency scaling: long wavelengths divided by ``factor``, short ones kept, a
    smooth blend between ``original_max_position / low_freq_factor`` and ``/ high_freq_factor``."""

    def __init__(self, head_size: int, rotary_dim: int, max_position: int, base: float,
                 is_neox_style: bool, factor: float, low_freq_factor: float,
                 high_freq_factor: float, original_max_position: int) -> None:
        if not factor > 0 or not high_freq_factor > low_freq_factor:
            raise ValueError(
                "llama3 rope_scaling needs factor > 0 and high_freq_factor > low_freq_factor, got "
                f"factor={factor}, low_freq_factor={low_freq_factor}, "
                f"high_freq_factor={high_freq_factor}")
        self.factor = float(factor)
        self.low_freq_factor = float(low_freq_factor)
        self.high_freq_factor = float(high_freq_factor)
        self.original_max_position = int(original_max_position)
        super().__init__(head_size, rotary_dim, max_position, base, is_neox_style)

    def _compute_inv_freq(self) -> torch.Tensor:
        inv_freq = super()._compute_inv_freq()
        low_freq_wavelen = self.original_max_position / self.low_freq_factor
        high_freq_wavelen = self.original_max_position / self.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / self.factor, inv_freq)
        smooth = ((self.original_max_position / wavelen - self.low_freq_factor)
                  / (self.high_freq_factor - self.low_freq_factor))
        smoothed = (1 - smooth) * scaled / self.factor + smooth * scaled
        is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
        return torch.where(is_medium, smoothed, scaled)


class YaRNScalingRotaryEmbedding(RotaryEmbedding):
    """YaRN (arXiv:2309.00071): frequencies whose wavelength exceeds the original context are
    interpolated by ``factor``, fast ones kept, a linear ramp in between (bounds from beta_fast /
    beta_slow rotations); cos/sin are scaled by ``0.1 * ln(factor) + 1``."""

    def __init__(self, head_size: int, rotary_dim: int, max_position: int, base: float,
                 is_neox_style: bool, factor: float, original_max_position: int,
                 beta_fast: float = 32.0, beta_slow: float = 1.0,
                 attention_factor: float | None = None, truncate: bool = True) -> None:
        if not factor > 0:
            raise ValueError(f"rope_scaling.factor must be > 0, got {factor}")
        self.factor = float(factor)
        self.original_max_position = int(original_max_position)
        self.beta_fast, self.beta_slow, self.truncate = beta_fast, beta_slow, truncate
        self.mscale = (attention_factor if attention_factor is not None
                       else (0.1 * math.log(self.factor) + 1.0 if self.factor > 1 else 1.0))
        super().__init__(head_size, rotary_dim, max_position, base, is_neox_style)

    def _correction_dim(self, num_rotations: float) -> float:
        # The dimension whose wavelength fits ``num_rotations`` times in the original context.
        return (self.rotary_dim * math.log(self.original_max_position
                                           / (num_rotations * 2 * math.pi))
                / (2 * math.log(self.base)))

    def _compute_inv_freq(self) -> torch.Tensor:
        extrapolated = super()._compute_inv_freq()
        interpolated = extrapolated / self.factor
        low, high = self._correction_dim(self.beta_fast), self._correction_dim(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, self.rotary_dim - 1)
        high = high + 0.001 if low == high else high  # avoid a zero-width ramp
        ramp = ((torch.arange(self.rotary_dim // 2, dtype=torch.float32) - low)
                / (high - low)).clamp(0, 1)
        keep = 1 - ramp  # 1 = keep the original (extrapolated) frequency
        return interpolated * (1 - keep) + extrapolated * keep

    def _cache_len(self) -> int:
        return max(self.max_position, int(self.original_max_position * self.factor))

    def _attention_factor(self) -> float:
        return float(self.mscale)


class ProportionalRotaryEmbedding(RotaryEmbedding):
    """Gemma 4's full-attention RoPE: the first ``partial_rotary_factor * head_size / 2`` frequency
    pairs keep the frequencies of a RoPE over the whole head (exponents ``2i / head_size``), the
    remaining pairs get frequency 0 (cos 1, sin 0: left as they are); all frequencies are divided
    by ``factor``. Pairs are (i, i + head_size / 2) across the whole head, so ``rotary_dim`` is the
    head size and the plain kernels apply it unchanged."""

    def __init__(self, head_size: int, max_position: int, base: float, is_neox_style: bool,
                 partial_rotary_factor: float, factor: float = 1.0) -> None:
        if not 0.0 <= partial_rotary_factor <= 1.0:
            raise ValueError(f"rope_parameters.partial_rotary_factor must be in [0, 1], "
                             f"got {partial_rotary_factor}")
        if not factor > 0:
            raise ValueError(f"rope_parameters.factor must be > 0, got {factor}")
        self.partial_rotary_factor = float(partial_rotary_factor)
        self.factor = float(factor)
        super().__init__(head_size, head_size, max_position, base, is_neox_style)

    def _compute_inv_freq(self) -> torch.Tensor:
        inv_freq = super()._compute_inv_freq()
        rotated = int(self.partial_rotary_factor * self.head_size // 2)
        inv_freq[rotated:] = 0.0
        return inv_freq / self.factor


def get_rope(head_size: int, rotary_dim: int, max_position: int, base: float,
             is_neox_style: bool = True,
             rope_scaling: dict[str, Any] | None = None) -> RotaryEmbedding:
    """The rotary embedding for an HF ``rope_scaling`` / ``rope_parameters`` dict (or None)."""
    scaling = dict(rope_scaling or {})
    rope_type = scaling.get("rope_type", scaling.get("type", "default")) or "default"
    if rope_type == "default":
        return RotaryEmbedding(head_size, rotary_dim, max_position, base, is_neox_style)
    if rope_type == "linear":
        return LinearScalingRotaryEmbedding(head_size, rotary_dim, max_position, base,
                                            is_neox_style, scaling["factor"])
    if rope_type == "llama3":
        return Llama3RotaryEmbedding(
            head_size, rotary_dim, max_position, base, is_neox_style, scaling["factor"],
            scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0),
            scaling.get("original_max_position_embeddings", 8192))
    if rope_type == "yarn":
        return YaRNScalingRotaryEmbedding(
            head_size, rotary_dim, max_position, base, is_neox_style, scaling["factor"],
            scaling.get("original_max_position_embeddings", max_position),
            scaling.get("beta_fast") or 32.0, scaling.get("beta_slow") or 1.0,
            scaling.get("attention_factor"), scaling.get("truncate", True))
    if rope_type == "proportional":
        return ProportionalRotaryEmbedding(head_size, max_position, base, is_neox_style,
                                           scaling.get("partial_rotary_factor", 1.0),
                                           scaling.get("factor", 1.0))
    raise ValueError(f"rope_scaling type {rope_type!r} is not supported; "
                     f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}")


def rope_params_from_config(hf_config: Any, layer_type: str | None = None
                            ) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, scaling dict or None) from an HF config, transformers 4.x or 5.x style.

    ``layer_type`` (an entry of ``config.layer_types``): the parameters of that kind of layer
    where kinds differ (Gemma 3: ``rope_parameters`` keyed by layer type in transformers 5;
    before, ``rope_local_base_freq`` for "sliding_attention" layers, unscaled); elsewhere the
    config's one setting."""
    params = getattr(hf_config, "rope_parameters", None)
    if isinstance(params, dict) and isinstance(params.get(layer_type), dict):
        params = params[layer_type]
    elif layer_type == "sliding_attention" and getattr(hf_config, "rope_local_base_freq", None):
        return float(hf_config.rope_local_base_freq), None
    if isinstance(params, dict) and params.get("rope_theta") is not None:
        theta = float(params["rope_theta"])
    else:
        theta = float(getattr(hf_config, "rope_theta", None) or 10000.0)
        params = getattr(hf_config, "rope_scaling", None)
    if not isinstance(params, dict):
        return theta, None
    scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    return theta, (None if rope_type in (None, "default") else scaling)
