"""RMSNorm on the vllm_volta._C ops (vLLM's schemas: rms_norm, fused_add_rms_norm)."""

from __future__ import annotations

import torch
from torch import nn

from vllm_volta import _custom_ops as ops


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight over the last dimension.

    ``forward(x)`` returns the normalised tensor. ``forward(x, residual)`` is the fused
    pre-norm step of a decoder layer: it returns ``(norm(x + residual), x + residual)``, computed
    in place in the buffers of ``x`` and ``residual``.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6,
                 params_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if hidden_size < 1:
            raise ValueError(f"hidden_size must be >= 1, got {hidden_size}")
        if not eps > 0:
            raise ValueError(f"eps must be > 0, got {eps}")
        self.hidden_size = hidden_size
        self.variance_epsilon = float(eps)
        self.weight = nn.Parameter(
            torch.ones(hidden_size, dtype=params_dtype or torch.get_default_dtype()),
            requires_grad=False)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        x = x.contiguous()
        if residual is not None:
            ops.fused_add_rms_norm(x, residual, self.weight, self.variance_epsilon)
            return x, residual
        out = torch.empty_like(x)
        ops.rms_norm(out, x, self.weight, self.variance_epsilon)
        return out

    def extra_repr(self) -> str:
        return f"hidden_size={self.hidden_size}, eps={self.variance_epsilon}"
