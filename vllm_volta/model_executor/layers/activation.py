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


class GeluAndMul(nn.Module):
    """x = [gate | up] (last dim 2d) -> gelu(gate) * up (last dim d), with the erf GELU or its tanh
    approximation (``approximate="tanh"``), in one op (GeGLU: Gemma's MLP)."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate
        self._op = ops.gelu_tanh_and_mul if approximate == "tanh" else ops.gelu_and_mul

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        out = torch.empty(x.shape[:-1] + (d,), dtype=x.dtype, device=x.device)
        self._op(out, x.contiguous())
        return out


# HF ``hidden_act`` names of the gated activations, and how to build each.
_ACT_AND_MUL = {
    "silu": SiluAndMul, "swish": SiluAndMul,
    "gelu_pytorch_tanh": lambda: GeluAndMul("tanh"), "gelu_new": lambda: GeluAndMul("tanh"),
    "gelu": lambda: GeluAndMul("none"),
}


def get_act_and_mul_fn(hidden_act: str) -> nn.Module:
    """The gated activation for an HF ``hidden_act`` name."""
    if hidden_act not in _ACT_AND_MUL:
        raise ValueError(f"hidden_act {hidden_act!r} is not supported; supported: "
                         f"{', '.join(repr(a) for a in _ACT_AND_MUL)}")
    return _ACT_AND_MUL[hidden_act]()
