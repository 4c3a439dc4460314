"""Gated activations on the vllm_volta._C ops."""

from __future__ import annotations

import torch
from torch import nn

from vllm_volta import _custom_ops as ops


class SiluAndMul(nn.Module):
    """x = [gate | up] (last dim 2d) -> silu(gate) * up (last dim d)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        out = torch.empty(x.shape[:-1] + (d,), dtype=x.dtype, device=x.device)
        ops.silu_and_mul(out, x.contiguous())
        return out


def get_act_and_mul_fn(hidden_act: str) -> nn.Module:
    """The fused gated activation for an HF ``hidden_act`` name."""
    if hidden_act in ("silu", "swish"):
        return SiluAndMul()
    raise ValueError(f"hidden_act {hidden_act!r} is not supported; supported: 'silu'")
