"""RMSNorm on the vllm_volta._C ops (vLLM's schemas: rms_norm, fused_add_rms_norm)."""

from __future__ import annotations

import torch
from torch import nn

from vllm_volta import _custom_ops as ops


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight over the last dimension.

    ``forward(x)`` returns the normalised tensor. ``forward(x, residual)`` is the fused
    pre-norm step of a decoder layer: it returns ``(norm(x + residual), x + residual)``, the sum
    written into ``residual``'s buffer (the native kernel also writes the norm into ``x``'s).

    Where the op's kernel would be the V100 adapter's (a CPU tensor, or CUDA in an adapter build),
    the layer calls the ATen norm the adapter wraps and keeps its result: the adapter must copy
    that result into the op's output tensor, one more pass over the activations per norm.
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
        if _adapter_kernel(x, self.weight):
            if residual is not None:
                residual.add_(x)
                return _aten_rms_norm(residual, self.weight, self.variance_epsilon), residual
            return _aten_rms_norm(x, self.weight, self.variance_epsilon)
        if residual is not None:
            ops.fused_add_rms_norm(x, residual, self.weight, self.variance_epsilon)
            return x, residual
        out = torch.empty_like(x)
        ops.rms_norm(out, x, self.weight, self.variance_epsilon)
        return out

    def extra_repr(self) -> str:
        return f"hidden_size={self.hidden_size}, eps={self.variance_epsilon}"


def _adapter_kernel(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the norm ops' kernel for ``x`` is the V100 adapter's (registered for CPU in every
    build, for CUDA in adapter builds). Inputs the ops would reject (dtype, device) go to the op
    for its error."""
    return (x.dtype == weight.dtype and x.device == weight.device
            and (x.device.type == "cpu" or (x.is_cuda and ops.v100_adapter_build())))


def _aten_rms_norm(x: torch.Tensor, weight: torch.Tensor, epsilon: float) -> torch.Tensor:
    """The adapter's rms_norm without its copy: ATen's fused norm (fp32 statistics, weight
    applied in fp32, rounded once), as a new tensor."""
    return torch.ops.aten._fused_rms_norm(x, [x.shape[-1]], weight, epsilon)[0]
